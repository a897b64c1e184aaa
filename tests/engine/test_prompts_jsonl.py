"""JSON Lines prompt files (met.engine.prompts): what editors and json.dumps write is read as they mean it."""

import json

import pytest

from met.engine.prompts import PromptError, PromptsMissing, read_jsonl_prompts


def _write(tmp_path, text: str):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(text.encode("utf-8"))
    return path


def test_strings_and_prompt_objects_crlf_and_blank_lines(tmp_path):
    path = _write(tmp_path, '"a"\r\n\r\n  \n{"prompt": "b\\nc"}\r\n')
    assert read_jsonl_prompts(path) == ["a", "b\nc"]


def test_a_byte_order_mark_is_not_part_of_the_first_line(tmp_path):
    # Windows editors (Notepad, PowerShell's Out-File) start UTF-8 files with a BOM
    path = _write(tmp_path, '\ufeff"a"\n{"prompt": "b"}\n')
    assert read_jsonl_prompts(path) == ["a", "b"]


@pytest.mark.parametrize("char", ["\u2028", "\u2029", "\x85", "\x1c", "\x1d", "\x1e"])
def test_only_newlines_end_a_line(tmp_path, char):
    # json.dumps(ensure_ascii=False) writes U+2028, U+2029 and NEL raw; str.splitlines splits at them
    text = f"x{char}y"
    lines = [json.dumps(text, ensure_ascii=False), json.dumps({"prompt": text}, ensure_ascii=False)]
    path = _write(tmp_path, "\n".join(lines) + "\n")
    assert read_jsonl_prompts(path) == [text, text]


def test_a_huge_line(tmp_path):
    big = "x" * 3_000_000
    assert read_jsonl_prompts(_write(tmp_path, json.dumps({"prompt": big}) + "\n")) == [big]


@pytest.mark.parametrize("text, where", [
    ('"a"\nnot json\n', ":2: not JSON"),
    ('"a"\n{"text": "b"}\n', ":2: expected a non-empty string"),
    ('""\n', ":1: expected a non-empty string"),
    ('"\\ud800"\n', ":1: is not valid Unicode text"),
    ("\n \n", ": holds no prompts"),
])
def test_bad_lines_are_named(tmp_path, text, where):
    with pytest.raises(PromptError, match=where):
        read_jsonl_prompts(_write(tmp_path, text))


def test_missing_file(tmp_path):
    with pytest.raises(PromptsMissing):
        read_jsonl_prompts(tmp_path / "none.jsonl")

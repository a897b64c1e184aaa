"""Chat templates: a checkpoint folder's rendered prompt is transformers' apply_chat_template on the same folder."""

import json

import pytest

from checkpoint_helpers import tokenizer
from met.model.chat_template import EMBEDDED, TemplateError, load_template
from met.model.hf_tokenizer import HfTokenizer

transformers = pytest.importorskip("transformers")

# ChatML as Qwen2's, with what real templates use: namespace, loop controls, raise_exception, tojson, tools,
# strftime_now, bos_token, a {% generation %} block, whitespace control
CHATML = """{{ bos_token }}{%- set ns = namespace(system=false) %}
{%- if tools %}<|im_start|>system
# Tools
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}<|im_end|>
{% endif %}
{%- for message in messages %}
    {%- if message['role'] not in ['system', 'user', 'assistant'] %}
        {{- raise_exception('roles are system, user and assistant; got ' + message['role']) }}
    {%- endif %}
    {%- if message.role == 'system' %}{% set ns.system = true %}{% endif %}
    {%- if loop.index0 > 8 %}{% break %}{% endif %}
<|im_start|>{{ message['role'] }}
{% if message.role == 'assistant' %}{% generation %}{{ message['content'] | trim }}{% endgeneration %}
{%- else %}{{ message['content'] }}{% endif %}<|im_end|>
{% endfor %}
{%- if not ns.system %}<|im_start|>system
Today is {{ strftime_now('%Y') }}; {{ {'a': '<b>&</b>', 'n': none} | tojson }}<|im_end|>
{% endif %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}{{ eos_token if false }}"""

CHATS = [
    [{"role": "user", "content": "def add(a, b):"}],
    [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "café 日本語 😀"},
     {"role": "assistant", "content": "  x = 1  ", "tool_calls": None}, {"role": "user", "content": "again"}],
]


def _folder(tmp_path, jinja_file: bool):
    folder = tmp_path / "chat"
    tokenizer(folder)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
              "eos_token": {"content": "</s>", "special": True, "__type": "AddedToken"}}
    if jinja_file:
        (folder / "chat_template.jinja").write_text(CHATML, encoding="utf-8")
    else:
        config["chat_template"] = CHATML
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


@pytest.mark.parametrize("jinja_file", [False, True], ids=["tokenizer_config", "chat_template.jinja"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_rendered_prompt_is_transformers_apply_chat_template(tmp_path, jinja_file, add_generation_prompt):
    # the text and, tokenized without special tokens, the ids: both transformers' own
    folder = _folder(tmp_path, jinja_file)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    ours = load_template(folder)
    tok = HfTokenizer(folder / "tokenizer.json", ())
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"a": "int"}}}]
    for chat in CHATS:
        for t in (None, tools):
            want = hf.apply_chat_template(chat, tools=t, tokenize=False, add_generation_prompt=add_generation_prompt)
            got = ours.render(chat, add_generation_prompt, tools=t)
            assert got == want
            ids = hf.apply_chat_template(chat, tools=t, tokenize=True, add_generation_prompt=add_generation_prompt)
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
            assert tok.encode(got, add_special_tokens=False) == list(ids)
    assert ours.end_of_turn == "</s>"


def test_a_template_that_raises_is_a_template_error_with_its_message(tmp_path):
    # raise_exception's message reaches the client
    with pytest.raises(TemplateError, match="roles are system, user and assistant; got tool"):
        load_template(_folder(tmp_path, False)).render([{"role": "tool", "content": "x"}])


def test_a_folder_without_a_template_has_none_and_a_broken_one_is_refused(tmp_path):
    folder = tmp_path / "plain"
    tokenizer(folder)
    assert load_template(folder) is None
    (folder / "chat_template.jinja").write_text("{% for m in messages %}", encoding="utf-8")
    with pytest.raises(TemplateError, match="not valid Jinja"):
        load_template(folder)


def test_the_embedded_template_is_the_documented_one():
    # each message a comment line naming its role, then its text; the generation prompt opens the assistant's
    chat = [{"role": "user", "content": "Write add."}]
    assert EMBEDDED.render(chat) == "# user:\nWrite add.\n# assistant:\n"
    assert EMBEDDED.render(chat, add_generation_prompt=False) == "# user:\nWrite add.\n"

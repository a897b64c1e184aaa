"""scripts/docs_results.py: results pages from benchmarks/results JSON, each table with its command and box."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script(monkeypatch, results: Path, docs: Path):
    """The script as a module, reading results from `results` and writing pages under `docs`."""
    spec = importlib.util.spec_from_file_location("docs_results", ROOT / "scripts" / "docs_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "ROOT", results.parent)
    monkeypatch.setattr(module, "RESULTS", results)
    monkeypatch.setattr(module, "DOCS", docs)
    return module


def policies_json(box: str) -> dict:
    """A two-policy `met bench policies` record at one concurrency."""
    rows = [{"policy": p, "concurrency": 1, "tokens_per_s": t, "spread": 0.1, "modes": [["plain", 1.0]]}
            for p, t in (("off", 100.0), ("measured", 150.0))]
    return {"meta": {"command": "met bench policies --prompts 2", "when": "2026-01-01T00:00:00+00:00",
                     "machine": {"box_class": box, "device": "Some CPU"}, "workload": {"repeats": 3}},
            "rows": rows, "checks": [{"name": "a check", "passed": True, "figures": "1.5x"}],
            "outputs_identical": True, "mismatches": [], "runs": []}


def test_a_policies_table_names_its_command_box_and_figures(tmp_path, monkeypatch):
    # the box comes from the record itself, not the folder it sits in
    results = tmp_path / "results"
    (results / "elsewhere" / "run").mkdir(parents=True)
    (results / "elsewhere" / "run" / "policies.json").write_text(json.dumps(policies_json("cpu-x-1t")))
    script = load_script(monkeypatch, results, tmp_path / "docs")
    page = script.pages()[tmp_path / "docs" / "cpu-x-1t.md"]
    assert "Command: `met bench policies --prompts 2`" in page
    assert "box `cpu-x-1t`" in page
    assert "| measured planner | **150.0** |" in page and "| off | 100.0 |" in page
    assert "| a check | PASS | 1.5x |" in page


def test_a_record_without_its_box_takes_its_folder(tmp_path, monkeypatch):
    # older scripts recorded only their command: the box-class folder names the box
    results = tmp_path / "results"
    (results / "cpu-y-1t").mkdir(parents=True)
    record = {"command": "benchmarks/decode.py", "rows": [{"width": 1, "spec": "off", "depth": 0,
              "tokens_per_s": 10.0, "spread": 0.0, "vs_plain": 1.0, "accepted_per_step": 0.0}]}
    (results / "cpu-y-1t" / "decode.json").write_text(json.dumps(record))
    script = load_script(monkeypatch, results, tmp_path / "docs")
    page = script.pages()[tmp_path / "docs" / "cpu-y-1t.md"]
    assert "Command: `python3 benchmarks/decode.py`" in page and "box `cpu-y-1t`" in page
    assert "| 1 | off | 0 | 10.0 |" in page



def test_a_machine_named_in_words_and_a_llamacpp_peer_get_their_pages(monkeypatch, tmp_path):
    # a report whose "machine" is a string takes its box from its folder; the llama.cpp peer's per-repeat
    # ratios are shown as a median with their range
    results, docs = tmp_path / "benchmarks" / "results", tmp_path / "docs" / "results"
    (results / "box-a").mkdir(parents=True)
    (results / "box-a" / "hostile.json").write_text(json.dumps({"machine": "Linux, 2 CPUs", "cases": 3}))
    peer = {"command": "benchmarks/peer_llamacpp.py --repeats 3", "llama_cpp_python": "0.3", "median": {
        "met plain": 180.0, "llama.cpp plain": 320.0}, "ratios": {"met plain / llama.cpp plain": [0.5, 0.6, 0.55]}}
    (results / "box-a" / "peer_llamacpp.json").write_text(json.dumps(peer))
    module = load_script(monkeypatch, results, docs)
    page = module.pages()[docs / "box-a.md"]
    assert "Linux, 2 CPUs" in page and "box `box-a`" in page
    assert "| met plain / llama.cpp plain | 0.55x [0.50, 0.60] |" in page

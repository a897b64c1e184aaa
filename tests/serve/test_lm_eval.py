"""lm-eval's local-completions model against met serve: a multiple-choice and a generate_until task from local JSONL.

The tokenizer goes through the server's /tokenizer_info, /tokenize and /detokenize (nothing is
downloaded); the loglikelihoods lm-eval reads out of echo's prompt log-probabilities equal the
model's own log-softmax over context + continuation. Skipped where lm-eval is not installed.
"""

import json

import pytest
import torch

from met.model.tokenizer import encode
from serve_helpers import MODEL, serving

lm_eval = pytest.importorskip("lm_eval")
pytest.importorskip("tenacity")  # lm-eval's API models need it (its [api] extra)

MC = [{"q": "def add(a, b):\n    return a", "choices": ["+ b", "- b", "* b"], "label": 0},
      {"q": "import os\nimport", "choices": ["sys", "numpy"], "label": 0}]
GEN = [{"q": "x = [1, 2,", "a": " 3]"}, {"q": "import", "a": " os"}]


def _tasks(folder) -> None:
    (folder / "mc.jsonl").write_text("".join(json.dumps(d) + "\n" for d in MC))
    (folder / "gen.jsonl").write_text("".join(json.dumps(d) + "\n" for d in GEN))
    (folder / "met_mc.yaml").write_text(f"""task: met_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {folder / 'mc.jsonl'}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{q}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - metric: acc
""")
    (folder / "met_gen.yaml").write_text(f"""task: met_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {folder / 'gen.jsonl'}
test_split: test
output_type: generate_until
doc_to_text: "{{{{q}}}}"
doc_to_target: "{{{{a}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
""")


def test_lm_eval_local_completions_scores_as_the_model_does(model, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _tasks(tmp_path)
    from lm_eval.tasks import TaskManager

    with serving(model, "mtp") as srv:
        out = lm_eval.simple_evaluate(
            model="local-completions",
            model_args=f"model={MODEL},base_url={srv.url}/v1/completions,tokenizer_backend=remote,"
                       "tokenized_requests=True,num_concurrent=2,max_retries=1",
            tasks=["met_mc", "met_gen"], task_manager=TaskManager(include_path=str(tmp_path)), log_samples=True)
    assert set(out["results"]) == {"met_mc", "met_gen"}
    assert len(out["samples"]["met_gen"]) == 2 and len(out["samples"]["met_mc"]) == 2
    worst = 0.0
    for sample in out["samples"]["met_mc"]:
        for args, resp in zip(sample["arguments"], sample["resps"]):
            context, continuation = encode(args[0]), encode(args[1])
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([context + continuation]))[0].double(), -1)
            want = sum(float(logp[len(context) - 1 + j, t]) for j, t in enumerate(continuation))
            worst = max(worst, abs(want - float(resp[0][0])))
    assert worst < 1e-4

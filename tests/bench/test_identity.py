"""Box class, plan digests and the serve's TableKey (met.engine.identity)."""

import dataclasses
import re

import pytest
import torch

from met.engine import identity
from met.engine.identity import (RunSettings, box_class, cpu_signature, device_name, mtp_drafter_key, plan_digest,
                                 serve_table_key)
from met.model.recipes import embedded
from met.model.config import ModelConfig
from met.model.transformer import Transformer

MICRO = ModelConfig.from_name("micro")
BASE = dict(mode="verify", model_config=MICRO, dtype="float32", device_name="AMD EPYC", torch_version="2.13.0",
            threads=2, attention_impl="sdpa", compile_setting="eager", verify_arms=(), cached_path=3)


def test_plan_digest_is_stable_and_short():
    # the same inputs give the same 16-hex digest
    a, b = plan_digest(**BASE), plan_digest(**BASE)
    assert a == b and len(a) == 16 and int(a, 16) >= 0


@pytest.mark.parametrize("change", [
    {"mode": "decode"},  # each mode has its own digest
    {"dtype": "bfloat16"},
    {"threads": 4},
    {"torch_version": "2.14.0"},
    {"device_name": "NVIDIA H200"},
    {"attention_impl": "eager-math"},
    {"compile_setting": "cuda-graphs"},
    {"verify_arms": (2, 3, 4)},
    {"cached_path": 2},  # the engine's packed path changed: old tables are refused
    {"model_config": MICRO.with_(n_layers=3)},
    {"model_config": MICRO.with_(mtp_depth=2)},
])
def test_plan_digest_changes_with_anything_that_moves_cost(change):
    assert plan_digest(**{**BASE, **change}) != plan_digest(**BASE)


def test_plan_digest_ignores_arm_order_and_dtype_prefix():
    # (4, 2) and (2, 4) are the same arms; torch.float32 and "float32" the same dtype
    assert plan_digest(**{**BASE, "verify_arms": (4, 2)}) == plan_digest(**{**BASE, "verify_arms": [2, 4, 4]})
    assert plan_digest(**{**BASE, "dtype": torch.float32}) == plan_digest(**BASE)


def test_plan_digest_refuses_unknown_mode():
    with pytest.raises(ValueError, match="mode 'turbo'"):
        plan_digest(**{**BASE, "mode": "turbo"})


def test_box_class_cpu_names_model_and_threads(monkeypatch, tmp_path):
    # the slug drops vendor noise and clock speed; threads come from torch
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7B13 64-Core Processor @ 2.45GHz\n")
    monkeypatch.setattr(identity, "_CPUINFO", info)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    assert box_class("cpu") == "cpu-amd-epyc-7b13-3t"


def _caches(root, sizes):
    for i, (level, size) in enumerate(sizes):
        (root / f"index{i}").mkdir(parents=True)
        (root / f"index{i}" / "level").write_text(f"{level}\n")
        (root / f"index{i}" / "size").write_text(f"{size}\n")
    return root


def test_cpus_a_hypervisor_names_alike_get_different_device_names_and_plan_digests(tmp_path, monkeypatch):
    # two "AMD EPYC" guests: the family, model and last-level cache tell them apart, and the digest with them
    info = tmp_path / "cpuinfo"
    monkeypatch.setattr(identity, "_CPUINFO", info)
    names = []
    for model, l3 in (("1", "8192K"), ("49", "32768K")):
        info.write_text(f"model name\t: AMD EPYC\ncpu family\t: 23\nmodel\t\t: {model}\nstepping\t: 2\n")
        monkeypatch.setattr(identity, "_CPU_CACHES", _caches(tmp_path / model, [(1, "32K"), (2, "512K"), (3, l3)]))
        names.append(device_name("cpu"))
    assert names == ["AMD EPYC (family 23 model 1 stepping 2, 8 MiB L3)",
                     "AMD EPYC (family 23 model 49 stepping 2, 32 MiB L3)"]
    assert box_class("cpu", threads=1) == "cpu-amd-epyc-1t"  # one class of box, its tables' folder
    cfg = embedded().config
    digests = {plan_digest("verify", cfg, "float32", name, "2.13.0", 1, "sdpa", "off", [1], 7) for name in names}
    assert len(digests) == 2


def test_a_cpu_signature_leaves_out_what_cannot_be_read(tmp_path, monkeypatch):
    info = tmp_path / "cpuinfo"
    info.write_text("model name\t: Some CPU\n")
    monkeypatch.setattr(identity, "_CPUINFO", info)
    monkeypatch.setattr(identity, "_CPU_CACHES", tmp_path / "no-such-folder")
    assert cpu_signature() == "" and device_name("cpu") == "Some CPU"
    monkeypatch.setattr(identity, "_CPU_CACHES", _caches(tmp_path / "c", [(2, "1536K"), (1, "48K")]))
    assert cpu_signature() == "1536 KiB L2"


def test_a_long_cpu_name_keeps_its_thread_count_in_the_box_class(monkeypatch):
    # the 64-character cut falls in the name, not on the count: 2 and 16 threads are two box classes
    monkeypatch.setattr(identity, "cpu_model", lambda: "Vendor " + "Experimental Family " * 5 + "Model 9")
    two, sixteen = box_class("cpu", threads=2), box_class("cpu", threads=16)
    assert two.endswith("-2t") and sixteen.endswith("-16t") and two != sixteen
    assert len(sixteen) == 64 and "--" not in two + sixteen and box_class("cpu", sixteen) == sixteen


def test_box_class_override_is_validated():
    assert box_class("cpu", "my-box.1") == "my-box.1"
    with pytest.raises(ValueError, match="not a name"):
        box_class("cpu", "../etc")  # it becomes a folder under tables/


def test_run_settings_of_model_and_validation():
    model = Transformer(MICRO).to(torch.bfloat16)
    s = RunSettings.of(model, threads=2)
    assert (s.dtype, s.device, s.threads) == ("bfloat16", "cpu", 2)
    with pytest.raises(ValueError, match="dtype"):
        RunSettings("float99", "cpu", 1)
    with pytest.raises(ValueError, match="threads"):
        RunSettings("float32", "cpu", 0)


def test_serve_table_key_matches_itself_and_detects_threads():
    s = RunSettings("float32", "cpu", 2)
    key = serve_table_key("micro@0", MICRO, s, "none")
    assert key.modes == ("decode", "draft_mtp", "verify")
    assert key.check(serve_table_key("micro@0", MICRO, s, "none")) == []
    # another thread count is another CPU box class (cpu-...-1t) and another plan digest
    other = serve_table_key("micro@0", MICRO, dataclasses.replace(s, threads=1), "none", modes=("verify",))
    assert [m.field for m in key.check(other)] == ["box_class", "plan_digests.verify"]
    assert key.box_class.endswith("-2t") and other.box_class.endswith("-1t")


def test_mtp_drafter_key():
    @dataclasses.dataclass
    class R:
        name: str = "met-tiny-py"
        digest: str = "abcd"

    key = mtp_drafter_key(R())
    assert (key.kind, key.name, key.digest) == ("mtp", "met-tiny-py", "abcd")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_box_class_cuda():
    # e.g. nvidia-h200x1: the device's slug and how many of it the box has
    assert re.fullmatch(r"nvidia-[a-z0-9-]+x\d+", box_class("cuda"))


def test_defaults_on_this_box():
    # float32 on a CPU, bfloat16 on a GPU; the device is cuda only where torch sees one
    assert identity.default_dtype("cpu") == "float32"
    assert identity.default_dtype("cuda:0") == "bfloat16"
    assert identity.default_device() == ("cuda" if torch.cuda.is_available() else "cpu")


def test_resolve_run_checks_each_option_against_this_box():
    # what every command's --device / --dtype / --threads go through: a ValueError naming the option
    settings = identity.resolve_run("cpu", None, 0, set_threads=False)
    assert (settings.device, settings.dtype, settings.threads) == ("cpu", "float32", 1)
    for device, dtype, threads, words in [
        ("bogus", None, 0, "--device 'bogus' is not a torch device"),
        ("meta", None, 0, "met runs on cpu or cuda"),
        ("cpu", "int8", 0, "--dtype 'int8' is not one of float32, bfloat16, float16, float64"),
        ("cpu", None, identity.MAX_THREADS + 1, "--threads 1025 is outside 0..1024"),
        ("cpu", None, -1, "is outside"),
    ]:
        with pytest.raises(ValueError, match=re.escape(words)):
            identity.resolve_run(device, dtype, threads, set_threads=False)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="torch sees no CUDA device here"):
            identity.resolve_run("cuda")

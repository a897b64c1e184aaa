"""What a cost table is measured under: the box class, each mode's plan digest, the serve's TableKey.

`met bench spec-cost` and `met serve` both build their keys here, so a table measured on a box
matches a serve on the same box exactly when nothing that moves a step's cost has changed:
the model config, dtype, device, torch version, threads, attention implementation, compile
setting or verify arms each change the plan digest of every mode.
"""

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import torch

from met.exit_codes import EX_DATAERR, EX_NOINPUT
from met.model.config import ModelConfig
from met.model.cpuinfo import CPU_CACHES as _CPU_CACHES
from met.model.cpuinfo import CPUINFO as _CPUINFO
from met.model.cpuinfo import cpuinfo_field
from met.model.dflash import DrafterError
from met.model.digest_cache import cached_digest
from met.model.eagle3 import read_eagle3_config
from met.model.errors import RecipeError
from met.model.hf_checkpoint import files_digest, weight_files
from met.model.transformer import cached_path_version
from met.speculative.spec_cost import DrafterKey, TableKey

MODES = ("decode", "verify", "draft_mtp")
"""The step modes a table measures: plain decode (k = 0), verify of k drafts, the MTP draft step."""
DRAFTER_MODES = ("draft_dflash", "draft_model", "draft_eagle")  # draft steps of drafters that are not part of the model
KNOWN_MODES = MODES + DRAFTER_MODES  # draft_dflash: a DFlash block drafter's step; draft_model: a draft model's;
# draft_eagle: an EAGLE-3 head's
DRAFT_MODEL_MODES = ("decode", "verify", "draft_model")  # what a serve drafting with a draft model runs
EAGLE_MODES = ("decode", "verify", "draft_eagle")  # what a serve drafting with an EAGLE-3 head runs

_BOX_CLASS = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")  # also a folder name under tables/
# Words of a CPU or GPU name that say nothing about its speed.
_NOISE = {"r", "tm", "cpu", "processor", "core", "with", "radeon", "graphics", "corporation"}


class Recipeish(Protocol):
    """What a drafter key needs of a recipe: its name, weights digest and config (met.model.recipes.Recipe)."""

    name: str
    digest: str
    config: ModelConfig


@dataclass(frozen=True, slots=True)
class RunSettings:
    """How the model runs, beyond its config and the mode: everything else that moves a step's cost."""

    dtype: str  # torch dtype name without "torch.", e.g. "float32"
    device: str  # "cpu", "cuda", "cuda:1"
    threads: int  # torch intra-op threads (host work: CPU steps, launch overhead on GPU)
    attention_impl: str = "sdpa"  # F.scaled_dot_product_attention, as met.model.transformer uses
    compile_setting: str = "eager"  # no torch.compile, no CUDA graphs
    verify_arms: tuple[int, ...] = ()  # depths the verify path is built for; () = any depth (eager)
    cached_path: int = 0  # the engine's packed, cached path (met.model.transformer); 0: this device's now

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", str(self.dtype).removeprefix("torch."))
        if not hasattr(torch, self.dtype) or not isinstance(getattr(torch, self.dtype), torch.dtype):
            raise ValueError(f"dtype {self.dtype!r} is not a torch dtype (e.g. float32, bfloat16)")
        try:
            torch.device(self.device)
        except (RuntimeError, TypeError):
            raise ValueError(f"device {self.device!r} is not a torch device (e.g. cpu, cuda, cuda:0)") from None
        if not self.cached_path:
            object.__setattr__(self, "cached_path", cached_path_version(self.device))
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1:
            raise ValueError(f"threads {self.threads!r} is not a positive whole number")
        arms = tuple(self.verify_arms)
        if any(isinstance(a, bool) or not isinstance(a, int) or a < 0 for a in arms):
            raise ValueError(f"verify_arms {arms!r} are not depths (whole numbers >= 0)")
        object.__setattr__(self, "verify_arms", tuple(sorted(set(arms))))

    @classmethod
    def of(cls, model: torch.nn.Module, threads: int | None = None, **settings) -> "RunSettings":
        """The settings of a loaded model: its parameters' dtype and device, torch's thread count now."""
        p = next(model.parameters())
        return cls(str(p.dtype), str(p.device), threads or torch.get_num_threads(), **settings)


RUN_DTYPES = ("float32", "bfloat16", "float16", "float64")  # what the model runs in; an int dtype cannot hold weights
MAX_THREADS = 1024  # far above any box's cores; asking torch for 100000 threads crashed the process


def resolve_run(device: str | None = None, dtype: str | None = None, threads: int = 0,
                set_threads: bool = True) -> RunSettings:
    """A command's --device / --dtype / --threads, checked usable on this box; sets torch's threads (unless told not).

    ValueError, naming the option and its value, for a device torch cannot parse or does not see
    here, a dtype the model cannot run in, or threads outside 0..=MAX_THREADS (0: the default).
    """
    device = device or default_device()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"--device {device!r} is not a torch device (e.g. cpu, cuda, cuda:1)") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"--device {device}: torch sees no CUDA device here; pass --device cpu")
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"--device {device}: torch sees {count} CUDA device(s), cuda:0..cuda:{count - 1}")
    elif dev.type != "cpu":
        raise ValueError(f"--device {device}: met runs on cpu or cuda")
    dtype = dtype or default_dtype(device)
    if dtype not in RUN_DTYPES:
        raise ValueError(f"--dtype {dtype!r} is not one of {', '.join(RUN_DTYPES)}")
    if isinstance(threads, bool) or not 0 <= threads <= MAX_THREADS:
        raise ValueError(f"--threads {threads} is outside 0..{MAX_THREADS} (0: the default, 1 on a CPU)")
    n = apply_threads(device, threads) if set_threads else threads or default_threads(device)
    return RunSettings(dtype, device, n)


def default_device() -> str:
    """Where met runs unless told: the first CUDA device if there is one, else the CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def apply_threads(device: str, threads: int = 0) -> int:
    """Set torch's intra-op threads for a run on device and return them: threads if given, else the default.

    The default on a CPU is 1: small-batch decode steps are hundreds of tiny kernels, and on this
    project's boxes one thread ran them faster and steadier than two, most of all on the serve's
    scheduler thread (a worker thread with 2 intra-op threads ran MTP steps about 1.7x slower than
    with 1). On a GPU torch's default stands (threads there only feed kernel launches).
    """
    n = threads or default_threads(device)
    torch.set_num_threads(n)
    return n


def default_threads(device: str) -> int:
    """The intra-op thread count met runs with on device unless told (see apply_threads)."""
    return 1 if torch.device(device).type == "cpu" else torch.get_num_threads()


EXACT_DTYPES = ("float32", "float64")  # a verify's logits round close enough to a one-token step's to keep greedy text
DRIFT = "a verify rounds otherwise than a one-token step, so a near tie can flip"  # in a half-precision dtype


def speculation_drift_warning(dtype: str, spec: str) -> str | None:
    """A warning for speculation in a half-precision dtype, where greedy text can change, else None.

    A verify scores k + 1 positions in one pass and rounds them otherwise than a one-token step does;
    in bfloat16 a near tie then flips: on an H200 the policies benchmark's greedy texts differed from
    plain decode's in 135 of 864 requests under every speculating policy, and in none of 4,224 in
    float32 (docs/getting-started.md, "On a GPU").
    """
    if spec == "off" or dtype in EXACT_DTYPES:
        return None
    return (f"warning: --spec {spec} in {dtype}: greedy text can differ from --spec off ({DRIFT}; on an H200 in "
            "bfloat16 135 of 864 benchmark requests did); --dtype float32 keeps it identical")


def default_dtype(device: str) -> str:
    """The dtype met runs in unless told: bfloat16 on a GPU, float32 on a CPU (bf16 matmuls are slow there)."""
    return "bfloat16" if torch.device(device).type == "cuda" else "float32"


def box_class(device: str = "cpu", override: str | None = None, threads: int | None = None) -> str:
    """The class of box a table is measured on: `nvidia-h200x1`, `cpu-amd-epyc-2t`, or the override.

    A GPU box is named by its device and how many of them it has; a CPU box by its CPU model and
    thread count (threads, default torch's now, change CPU step costs more than anything else on the box).
    """
    if override is not None:
        if not _BOX_CLASS.fullmatch(override):
            raise ValueError(f"box class {override!r} is not a name of lower-case letters, digits, '.', '_' "
                             "and '-' (at most 64, starting with a letter or digit), e.g. nvidia-h200x1")
        return override
    dev = torch.device(device)
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
        same = sum(torch.cuda.get_device_name(i) == name for i in range(torch.cuda.device_count()))
        return _fit("", _slug(name), f"x{same}")
    if dev.type == "cpu":
        return _fit("cpu-", _slug(cpu_model()), f"-{threads or torch.get_num_threads()}t")
    return f"{dev.type}x1"


def _fit(prefix: str, slug: str, suffix: str) -> str:
    """prefix + slug + suffix in a box class's 64 characters: a long name is cut, never the count that ends it.

    Cutting the whole name instead dropped `-16t` from a long CPU name, so its 2- and 16-thread
    boxes shared one box class (and one default table path).
    """
    room = 64 - len(prefix) - len(suffix)
    return f"{prefix}{slug[:room].rstrip('-')}{suffix}"


def device_name(device: str = "cpu") -> str:
    """The device's model name as its driver reports it; a CPU's from /proc/cpuinfo, with its cpu_signature.

    A plan digest covers it, so that a table measured on one CPU is refused on another. A hypervisor
    may name unlike CPUs alike: two 2-core "AMD EPYC" guests, both AVX2 without AVX-512, one with an
    8 MiB last-level cache, took 1,059 and 357 us for the same 24 products of a decode step
    (benchmarks/studies/results/gemm_kernels_amd_avx2*.md).
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    if dev.type == "cpu":
        signature = cpu_signature()
        return f"{cpu_model()} ({signature})" if signature else cpu_model()
    return dev.type


def cpu_signature() -> str:
    """`family 23 model 1 stepping 2, 8 MiB L3`: the CPU's family, model and stepping (/proc/cpuinfo) and its
    last-level cache (sysfs), each part left out where it cannot be read; "" when none can."""
    ids = [(key, cpuinfo_field((key,), _CPUINFO)) for key in ("cpu family", "model", "stepping")]
    parts = [" ".join(f"{key.removeprefix('cpu ')} {value}" for key, value in ids if value), last_level_cache()]
    return ", ".join(p for p in parts if p)


def last_level_cache() -> str:
    """The size and level of cpu0's last-level cache from sysfs (`8 MiB L3`), or "" where sysfs does not say."""
    best: tuple[int, int] | None = None
    try:
        for index in _CPU_CACHES.glob("index*"):
            level, size = (index / "level").read_text().strip(), (index / "size").read_text().strip()
            match = re.fullmatch(r"(\d+)([KMG]?)", size)
            if level.isdigit() and match:
                kib = int(match[1]) * {"": 1 / 1024, "K": 1, "M": 1024, "G": 1 << 20}[match[2]]
                best = max(best or (0, 0), (int(level), int(kib)))
    except OSError:
        return ""
    if best is None:
        return ""
    level, kib = best
    return f"{kib // 1024} MiB L{level}" if kib % 1024 == 0 else f"{kib} KiB L{level}"


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, or the platform's processor name where there is none."""
    name = cpuinfo_field(("model name", "Model", "cpu model"), _CPUINFO)
    if name:
        return name
    import platform  # not at the top: only boxes without /proc/cpuinfo get here

    return platform.processor() or platform.machine() or "unknown"


def _slug(name: str) -> str:
    """`AMD EPYC 7B13 64-Core Processor` -> `amd-epyc-7b13`; `NVIDIA H200` -> `nvidia-h200`."""
    name = re.sub(r"@.*$", "", name.lower())  # a clock speed says nothing the model name does not
    words = [w for w in re.split(r"[^a-z0-9]+", name) if w and w not in _NOISE and not re.fullmatch(r"\d+", w)]
    return "-".join(words) or "unknown"


def plan_digest(mode: str, model_config: ModelConfig, dtype: str, device_name: str, torch_version: str,
                threads: int, attention_impl: str, compile_setting: str, verify_arms: Iterable[int],
                cached_path: int, drafter: dict | None = None) -> str:
    """sha256 (16 hex) of a canonical JSON of the mode and everything that changes its cost.

    drafter: the config of a drafter that is not part of the model (DFlash's for draft_dflash, a draft model's
    recipe and config for draft_model: draft_model_config).
    """
    if mode not in KNOWN_MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(KNOWN_MODES)}")
    doc = {"mode": mode, "model_config": model_config.identity(), "dtype": str(dtype).removeprefix("torch."),
           "device_name": device_name, "torch_version": torch_version, "threads": threads,
           "attention_impl": attention_impl, "compile_setting": compile_setting,
           "verify_arms": sorted(set(verify_arms)), "cached_path": cached_path}
    if drafter is not None:
        doc["drafter"] = drafter
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def plan_digests(config: ModelConfig, settings: RunSettings, modes: Iterable[str] = MODES,
                 drafter: dict | None = None) -> dict[str, str]:
    """The plan digest of each mode, for this box's device and this torch (a drafter mode's: and the drafter's)."""
    name = device_name(settings.device)
    return {mode: plan_digest(mode, config, settings.dtype, name, torch.__version__, settings.threads,
                              settings.attention_impl, settings.compile_setting, settings.verify_arms,
                              settings.cached_path, drafter if mode in DRAFTER_MODES else None)
            for mode in modes}


def serve_table_key(recipe_id: str, config: ModelConfig, settings: RunSettings, energy_source: str,
                    modes: Iterable[str] = MODES, box_class_override: str | None = None,
                    drafter: dict | None = None) -> TableKey:
    """The key a table must have to be used here: what the bench writes and the serve checks at boot."""
    return TableKey(box_class(settings.device, box_class_override, settings.threads), recipe_id, energy_source,
                    plan_digests(config, settings, modes, drafter))


def mtp_drafter_key(recipe: Recipeish) -> DrafterKey:
    """The key of a recipe's MTP drafter: the MTP module ships in the recipe's weights, so their digest."""
    return DrafterKey("mtp", recipe.name, recipe.digest)


def dflash_drafter_key(recipe: Recipeish, drafter_digest: str) -> DrafterKey:
    """The key of a recipe's DFlash drafter: its own weights file, so that file's digest."""
    return DrafterKey("dflash", recipe.name, drafter_digest)


def draft_model_config(draft: Recipeish) -> dict:
    """What a draft model's step cost depends on beyond the run settings: its recipe id and its config."""
    return {"recipe": f"{draft.name}@{draft.digest}", "model_config": draft.config.identity()}


def draft_model_drafter_key(draft: Recipeish) -> DrafterKey:
    """The key of a draft model as a drafter: its recipe's name and weights digest."""
    return DrafterKey("draft", draft.name, draft.digest)


@dataclass(frozen=True, slots=True)
class EagleHead:
    """An EAGLE-3 head as tables know it: its folder's name, the digest of its files, its config (Eagle3Config)."""

    folder: Path
    name: str  # the folder's name: what the default table's file name and the calibration's drafter carry
    digest: str  # files_digest of config.json and its safetensors: a retrained or edited head is another head
    config: dict  # asdict(Eagle3Config) as met reads it for this target

    @property
    def id(self) -> str:
        return f"{self.name}@{self.digest}"


def eagle_head(folder: Path, target: ModelConfig) -> EagleHead:
    """The identity of the EAGLE-3 head in folder for this target; DrafterError (65, 66) if it is none or not this
    target's (met.model.eagle3.read_eagle3_config)."""
    if not folder.is_dir():
        raise DrafterError(EX_NOINPUT, f"no EAGLE-3 head folder at {folder}; pass the folder of one (config.json and "
                           "model.safetensors)")
    cfg, _ = read_eagle3_config(folder, target)
    try:
        weights = weight_files(folder)
        files = [folder / "config.json", *weights]
        digest = cached_digest(folder, files, files_digest) if weights else ""
    except (RecipeError, OSError) as exc:
        raise DrafterError(EX_DATAERR, f"{folder}: {exc}") from None
    if not weights:
        raise DrafterError(EX_NOINPUT, f"{folder} holds no *.safetensors weights")
    return EagleHead(folder, folder.resolve().name, digest, asdict(cfg))


def eagle_config(head: EagleHead) -> dict:
    """What an EAGLE-3 head's step cost depends on beyond the run settings: its name and digest, and its config."""
    return {"head": head.id, "config": head.config}


def eagle_drafter_key(head: EagleHead) -> DrafterKey:
    """The key of an EAGLE-3 head as a drafter: its folder's name and the digest of its files."""
    return DrafterKey("eagle", head.name, head.digest)


@dataclass(frozen=True, slots=True)
class OwnDrafter:
    """A drafter that is not part of the model (a draft model, an EAGLE-3 head): what its table is keyed by.

    The draft model and the EAGLE-3 head are measured, calibrated, booted and checked alike; this
    record is the one place where they differ: the mode their draft step is measured under, what
    its plan digest covers, the calibration's drafter key, and the default table's file name.
    """

    kind: str  # "draft" (a draft model) or "eagle" (an EAGLE-3 head): the DrafterKey kind
    name: str
    id: str  # name@digest, as the table's [meta] records it
    mode: str  # draft_model or draft_eagle
    config: dict  # the plan digest's drafter (draft_model_config, eagle_config)
    key: DrafterKey

    @property
    def modes(self) -> tuple[str, ...]:
        """The modes a serve drafting with it runs: decode, verify and its draft step."""
        return ("decode", "verify", self.mode)

    @property
    def suffix(self) -> str:
        """What the default table's file name adds to the recipe's: `.draft-<name>` or `.eagle-<name>`."""
        return f".{self.kind}-{self.name}"

    @property
    def meta_field(self) -> str:
        """The table's [meta] field that names it: draft_model or eagle_head."""
        return "draft_model" if self.kind == "draft" else "eagle_head"


def own_drafter(drafter: Recipeish | EagleHead | OwnDrafter) -> OwnDrafter:
    """The OwnDrafter of a draft model's recipe or an EAGLE-3 head (itself if it is one)."""
    if isinstance(drafter, OwnDrafter):
        return drafter
    if isinstance(drafter, EagleHead):
        return OwnDrafter("eagle", drafter.name, drafter.id, "draft_eagle", eagle_config(drafter),
                          eagle_drafter_key(drafter))
    return OwnDrafter("draft", drafter.name, f"{drafter.name}@{drafter.digest}", "draft_model",
                      draft_model_config(drafter), draft_model_drafter_key(drafter))

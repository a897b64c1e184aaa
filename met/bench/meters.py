"""Meters: what a measured window of steps cost, in wall seconds and (where a counter exists) joules.

One small interface (`start()`, then `stop()` -> Reading) behind three sources: wall time only
("none"), NVML's total-energy counter of a GPU ("nvml"), and the CPU packages' RAPL counters
("rapl"). On CUDA every meter synchronizes the device at both ends of a window, so the window
holds exactly the work of its steps. `open_meter` picks and checks the source; a source that
does not work here raises EnergyUnavailable with the reason.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

ENERGY_CHOICES = ("auto", "nvml", "rapl", "none")
NVML_UPDATE_S = 0.1  # NVML refreshes its energy counter about every 100 ms
RAPL_ROOT = Path("/sys/class/powercap")


class EnergyUnavailable(Exception):
    """The energy source asked for does not work on this box; the message says why."""


class EnergyReadError(Exception):
    """A window's energy reading cannot be trusted (a zero or negative counter delta)."""


@dataclass(frozen=True, slots=True)
class Reading:
    """One window: wall seconds, and joules (None when measured without an energy source)."""

    seconds: float
    joules: float | None = None


class Meter(Protocol):
    """Measures windows: `start()` opens one, `stop()` closes it and returns what it cost."""

    source: str  # "none", "nvml" or "rapl": what the table's energy_source records
    min_window_s: float  # the shortest window whose reading can be trusted

    def start(self) -> None: ...

    def stop(self) -> Reading: ...

    def info(self) -> dict[str, object]: ...


def device_sync(device: str) -> Callable[[], None]:
    """What makes the host wait for the device's queued work: cuda synchronize, or nothing on CPU."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return lambda: torch.cuda.synchronize(dev)
    return lambda: None


class WallMeter:
    """Wall time only (energy_source "none"), the device synchronized at both ends of a window."""

    source = "none"
    min_window_s = 0.0

    def __init__(self, sync: Callable[[], None] = lambda: None, note: str = "") -> None:
        self.sync = sync
        self.note = note  # why `--energy auto` measured without energy, if it did
        self._t0: float | None = None

    def info(self) -> dict[str, object]:
        """What the table's [meta] records about this meter."""
        return {"energy_note": self.note} if self.note else {}

    def start(self) -> None:
        self.sync()
        self._t0 = time.perf_counter()

    def stop(self) -> Reading:
        self.sync()
        if self._t0 is None:
            raise RuntimeError("stop() without start()")
        seconds, self._t0 = time.perf_counter() - self._t0, None
        return Reading(seconds)


class NvmlMeter:
    """One GPU's NVML total-energy counter (millijoules since driver load; Volta and newer), by UUID.

    The counter moves about every NVML_UPDATE_S, so a window must last many of those periods
    for its delta to be accurate; a window whose delta is zero or negative is refused.
    """

    source = "nvml"
    min_window_s = 10 * NVML_UPDATE_S  # the counter's granularity is then at most ~10% of a window

    def __init__(self, uuid: str, sync: Callable[[], None] = lambda: None) -> None:
        try:
            import pynvml
        except ImportError:
            raise EnergyUnavailable("the pynvml module (package nvidia-ml-py) is not installed") from None
        self.nvml, self.uuid, self.sync = pynvml, uuid, sync
        self._t0: float | None = None
        self._e0 = 0
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise EnergyUnavailable(f"NVML does not start here ({_nvml_reason(exc)}); is the NVIDIA driver "
                                    "loaded?") from None
        try:
            self.handle = pynvml.nvmlDeviceGetHandleByUUID(uuid.encode())
        except pynvml.NVMLError as exc:
            raise EnergyUnavailable(f"NVML has no device with UUID {uuid} ({_nvml_reason(exc)})") from None
        try:
            self._read()
        except pynvml.NVMLError as exc:
            raise EnergyUnavailable(f"device {uuid} does not report total energy consumption "
                                    f"({_nvml_reason(exc)}; NVML has it on Volta and newer)") from None

    def _read(self) -> int:
        return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))  # millijoules

    def info(self) -> dict[str, object]:
        """Driver version, temperature and SM clock where NVML reads them (for the table's [meta])."""
        found: dict[str, object] = {"nvml_device_uuid": self.uuid}
        nvml = self.nvml
        reads = {"driver_version": lambda: nvml.nvmlSystemGetDriverVersion(),
                 "gpu_temperature_c": lambda: nvml.nvmlDeviceGetTemperature(self.handle, nvml.NVML_TEMPERATURE_GPU),
                 "sm_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(self.handle, nvml.NVML_CLOCK_SM),
                 "power_limit_w": lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1000.0}
        for name, read in reads.items():
            try:
                value = read()
            except Exception:  # best effort: a field this driver or device does not report is left out
                continue
            found[name] = value.decode() if isinstance(value, bytes) else value
        return found

    def start(self) -> None:
        self.sync()
        self._e0 = self._read()
        self._t0 = time.perf_counter()

    def stop(self) -> Reading:
        self.sync()
        seconds = time.perf_counter() - self._t0 if self._t0 is not None else 0.0
        try:
            e1 = self._read()
        except self.nvml.NVMLError as exc:
            raise EnergyReadError(f"NVML energy read failed on {self.uuid} ({_nvml_reason(exc)})") from None
        self._t0 = None
        if e1 <= self._e0:
            raise EnergyReadError(f"NVML energy counter of {self.uuid} moved by {e1 - self._e0} mJ over a "
                                  f"{seconds:.3f} s window; refusing a zero or negative reading")
        return Reading(seconds, (e1 - self._e0) / 1000.0)


def _nvml_reason(exc: Exception) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class RaplMeter:
    """The CPU packages' RAPL energy counters (microjoules, wrapping at max_energy_range_uj), summed."""

    source = "rapl"
    min_window_s = 0.05  # RAPL updates about every millisecond; a window far longer is plenty

    def __init__(self, root: Path = RAPL_ROOT) -> None:
        # Top-level package zones only (intel-rapl:0, not its subzones intel-rapl:0:0), and not the
        # platform zone ("psys", top-level on many Intel boxes): it holds the packages' energy too.
        zones = sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1 and _zone_name(p) != "psys")
        if not zones:
            raise EnergyUnavailable(f"no RAPL package zones under {root} (not an x86 box with powercap, "
                                    "or not exposed in this container)")
        self.zones: list[tuple[Path, int]] = []
        for zone in zones:
            try:
                limit = int((zone / "max_energy_range_uj").read_text())
                int((zone / "energy_uj").read_text())
            except (OSError, ValueError) as exc:
                raise EnergyUnavailable(f"{zone / 'energy_uj'} is not readable ({exc}); RAPL needs root "
                                        "or a readable powercap") from None
            self.zones.append((zone / "energy_uj", limit))
        self._e0: list[int] = []
        self._t0: float | None = None

    def info(self) -> dict[str, object]:
        """The zones summed (for the table's [meta])."""
        return {"rapl_zones": [path.parent.name for path, _ in self.zones]}

    def _read(self) -> list[int]:
        return [int(path.read_text()) for path, _ in self.zones]

    def start(self) -> None:
        self._e0 = self._read()
        self._t0 = time.perf_counter()

    def stop(self) -> Reading:
        seconds = time.perf_counter() - self._t0 if self._t0 is not None else 0.0
        try:
            e1 = self._read()
        except (OSError, ValueError) as exc:
            raise EnergyReadError(f"RAPL energy read failed ({exc})") from None
        self._t0 = None
        # One wrap of a counter per window at most (a package counter wraps after minutes).
        delta = sum((b - a) % (limit + 1) for a, b, (_, limit) in zip(self._e0, e1, self.zones))
        if delta <= 0:
            raise EnergyReadError(f"RAPL counters moved by {delta} uJ over a {seconds:.3f} s window; "
                                  "refusing a zero reading")
        return Reading(seconds, delta / 1e6)


def _zone_name(zone: Path) -> str:
    """A powercap zone's `name` (package-0, psys, ...); "" where it cannot be read."""
    try:
        return (zone / "name").read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def cuda_uuid(device: str) -> str:
    """The NVML UUID (`GPU-...`) of a CUDA device: indices change with CUDA_VISIBLE_DEVICES, UUIDs do not."""
    uuid = str(torch.cuda.get_device_properties(torch.device(device)).uuid)
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def open_meter(energy: str, device: str) -> Meter:
    """The meter for `--energy` on `device`: EnergyUnavailable if that source does not work here.

    "auto" takes NVML on a CUDA device and RAPL on a CPU where it works, else wall time only;
    the meter's `source` says which it took.
    """
    if energy not in ENERGY_CHOICES:
        raise ValueError(f"energy source {energy!r} is not one of {', '.join(ENERGY_CHOICES)}")
    on_cuda = torch.device(device).type == "cuda"
    sync = device_sync(device)
    if energy == "none":
        return WallMeter(sync)
    if energy == "nvml" or (energy == "auto" and on_cuda):
        if not on_cuda:
            where = "run on --device cuda or" if torch.cuda.is_available() else "torch sees no CUDA device here;"
            raise EnergyUnavailable(f"NVML measures a CUDA device, and this sweep runs on {device}; "
                                    f"{where} pass --energy none")
        try:
            return NvmlMeter(cuda_uuid(device), sync)
        except EnergyUnavailable as exc:
            if energy == "nvml":
                raise
            return WallMeter(sync, f"auto: NVML unavailable ({exc})")
    # rapl, or auto on a CPU
    if on_cuda and energy == "rapl":
        raise EnergyUnavailable("RAPL measures the CPU packages, and this sweep runs on a CUDA device; "
                                "pass --energy nvml")
    try:
        return RaplMeter(RAPL_ROOT)
    except EnergyUnavailable as exc:
        if energy == "rapl":
            raise
        return WallMeter(sync, f"auto: RAPL unavailable ({exc})")

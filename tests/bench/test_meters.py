"""Meters (met.bench.meters): wall time, NVML against a fake pynvml, RAPL against a fake powercap folder."""

import sys
import time
import types

import pytest
import torch

from met.bench import meters
from met.bench.meters import (EnergyReadError, EnergyUnavailable, NvmlMeter, RaplMeter, WallMeter, open_meter)

UUID = "GPU-0f0e0d0c-0000-1111-2222-333344445555"


class NVMLError(Exception):
    """pynvml's error: str() is the driver's message."""


def fake_pynvml(counter=(1000, 2500), init_error=None, uuids=(UUID,), energy_error=None, stop_error=None):
    """A pynvml module whose energy counter gives the values of `counter` in turn (mJ), then its last forever."""
    values = list(counter)
    reads = {"n": 0}
    mod = types.ModuleType("pynvml")
    mod.NVMLError = NVMLError
    mod.NVML_TEMPERATURE_GPU = 0
    mod.NVML_CLOCK_SM = 1

    def init():
        if init_error:
            raise NVMLError(init_error)

    def handle(uuid: bytes):
        if uuid.decode() not in uuids:
            raise NVMLError("Not Found")
        return uuid.decode()

    def energy(h):
        if energy_error:
            raise NVMLError(energy_error)
        reads["n"] += 1
        if stop_error and reads["n"] > 2:
            raise NVMLError(stop_error)
        return values.pop(0) if len(values) > 1 else values[0]

    mod.nvmlInit = init
    mod.nvmlDeviceGetHandleByUUID = handle
    mod.nvmlDeviceGetTotalEnergyConsumption = energy
    mod.nvmlSystemGetDriverVersion = lambda: b"570.86"
    mod.nvmlDeviceGetTemperature = lambda h, sensor: 41
    mod.nvmlDeviceGetClockInfo = lambda h, clock: 1980
    mod.nvmlDeviceGetEnforcedPowerLimit = lambda h: (_ for _ in ()).throw(NVMLError("Not Supported"))
    return mod


def install(monkeypatch, module) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", module)


def test_wall_meter_syncs_at_both_ends_and_times_the_window():
    calls = []
    meter = WallMeter(lambda: calls.append("sync"))
    meter.start()
    time.sleep(0.01)
    reading = meter.stop()
    assert calls == ["sync", "sync"]
    assert 0.009 < reading.seconds < 1.0 and reading.joules is None


def test_nvml_counter_delta_is_joules(monkeypatch):
    # construction reads 1000 (the probe), start reads 1000, stop 2500: 1.5 J over the window
    install(monkeypatch, fake_pynvml(counter=(1000, 1000, 2500)))
    synced = []
    meter = NvmlMeter(UUID, lambda: synced.append(1))
    meter.start()
    reading = meter.stop()
    assert reading.joules == pytest.approx(1.5)
    assert len(synced) == 2 and meter.source == "nvml" and meter.min_window_s >= 1.0


@pytest.mark.parametrize("after", [1000, 900], ids=["zero", "negative"])
def test_nvml_refuses_zero_and_negative_deltas(monkeypatch, after):
    install(monkeypatch, fake_pynvml(counter=(1000, 1000, after)))
    meter = NvmlMeter(UUID)
    meter.start()
    with pytest.raises(EnergyReadError, match="refusing a zero or negative reading"):
        meter.stop()


def test_nvml_unsupported_device_is_unavailable(monkeypatch):
    # a pre-Volta GPU: the energy counter read fails at once
    install(monkeypatch, fake_pynvml(energy_error="Not Supported"))
    with pytest.raises(EnergyUnavailable, match="does not report total energy.*Not Supported.*Volta"):
        NvmlMeter(UUID)


def test_nvml_driver_error_is_unavailable(monkeypatch):
    install(monkeypatch, fake_pynvml(init_error="Driver Not Loaded"))
    with pytest.raises(EnergyUnavailable, match="NVML does not start here \\(Driver Not Loaded\\)"):
        NvmlMeter(UUID)


def test_nvml_unknown_uuid_is_unavailable(monkeypatch):
    install(monkeypatch, fake_pynvml(uuids=()))
    with pytest.raises(EnergyUnavailable, match=f"no device with UUID {UUID}"):
        NvmlMeter(UUID)


def test_nvml_read_error_mid_run_refuses_the_window(monkeypatch):
    install(monkeypatch, fake_pynvml(counter=(1000, 1000, 2000), stop_error="GPU is lost"))
    meter = NvmlMeter(UUID)
    meter.start()
    with pytest.raises(EnergyReadError, match="GPU is lost"):
        meter.stop()


def test_nvml_without_pynvml_is_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    with pytest.raises(EnergyUnavailable, match="not installed"):
        NvmlMeter(UUID)


def test_nvml_info_keeps_what_the_driver_reports(monkeypatch):
    # the power limit raises Not Supported and is left out, not a failure
    install(monkeypatch, fake_pynvml())
    info = NvmlMeter(UUID).info()
    assert info == {"nvml_device_uuid": UUID, "driver_version": "570.86", "gpu_temperature_c": 41,
                    "sm_clock_mhz": 1980}


def powercap(tmp_path, *zones: tuple[str, int, int]):
    """A fake /sys/class/powercap with (zone name, energy_uj, max_energy_range_uj) zones."""
    for name, energy, limit in zones:
        zone = tmp_path / name
        zone.mkdir()
        (zone / "energy_uj").write_text(f"{energy}\n")
        (zone / "max_energy_range_uj").write_text(f"{limit}\n")
    return tmp_path


def test_rapl_sums_packages_and_handles_a_wrap(tmp_path):
    # package 0 moves 2 J; package 1 wraps from 999_000 to 1_000 (range 1e6): 2.001 J; subzones are skipped
    root = powercap(tmp_path, ("intel-rapl:0", 5_000_000, 10**8), ("intel-rapl:1", 999_000, 999_999),
                    ("intel-rapl:0:0", 1, 10**8))
    meter = RaplMeter(root)
    meter.start()
    (root / "intel-rapl:0" / "energy_uj").write_text("7000000\n")
    (root / "intel-rapl:1" / "energy_uj").write_text("1000\n")
    reading = meter.stop()
    assert reading.joules == pytest.approx(2.0 + 0.002)
    assert meter.info() == {"rapl_zones": ["intel-rapl:0", "intel-rapl:1"]}


def test_rapl_leaves_out_the_platform_zone_which_holds_the_packages_energy(tmp_path):
    # intel-rapl:1 is "psys" (a laptop, some Xeons): it counts the package's 2 J again, and more
    root = powercap(tmp_path, ("intel-rapl:0", 5_000_000, 10**8), ("intel-rapl:1", 1_000_000, 10**8))
    (root / "intel-rapl:0" / "name").write_text("package-0\n")
    (root / "intel-rapl:1" / "name").write_text("psys\n")
    meter = RaplMeter(root)
    meter.start()
    (root / "intel-rapl:0" / "energy_uj").write_text("7000000\n")
    (root / "intel-rapl:1" / "energy_uj").write_text("4000000\n")
    assert meter.stop().joules == pytest.approx(2.0)
    assert meter.info() == {"rapl_zones": ["intel-rapl:0"]}


def test_rapl_refuses_a_zero_delta_and_a_missing_folder(tmp_path):
    (tmp_path / "zones").mkdir()
    meter = RaplMeter(powercap(tmp_path / "zones", ("intel-rapl:0", 5, 100)))
    meter.start()
    with pytest.raises(EnergyReadError, match="zero"):
        meter.stop()
    with pytest.raises(EnergyUnavailable, match="no RAPL package zones"):
        RaplMeter(tmp_path / "empty")


def test_open_meter_nvml_on_a_cpu_is_unavailable():
    with pytest.raises(EnergyUnavailable, match="NVML measures a CUDA device, and this sweep runs on cpu"):
        open_meter("nvml", "cpu")


def test_open_meter_auto_on_a_cpu_without_rapl_says_why(monkeypatch, tmp_path):
    monkeypatch.setattr(meters, "RAPL_ROOT", tmp_path)  # no zones there
    meter = open_meter("auto", "cpu")
    assert meter.source == "none" and "RAPL unavailable" in meter.info()["energy_note"]
    with pytest.raises(EnergyUnavailable, match="no RAPL package zones"):
        open_meter("rapl", "cpu")
    assert open_meter("none", "cpu").source == "none"


def test_open_meter_auto_on_a_cpu_takes_rapl_when_it_works(monkeypatch, tmp_path):
    root = powercap(tmp_path, ("intel-rapl:0", 5, 10**8))
    monkeypatch.setattr(meters, "RAPL_ROOT", root)
    assert open_meter("auto", "cpu").source == "rapl"


def test_open_meter_refuses_an_unknown_source():
    with pytest.raises(ValueError, match="'joules'"):
        open_meter("joules", "cpu")


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
def test_wall_meter_waits_for_the_gpu():
    # 50 queued matmuls take measurable time only if the window waits for them
    x = torch.randn(4096, 4096, device="cuda")
    meter = WallMeter(meters.device_sync("cuda"))
    meter.start()
    for _ in range(50):
        x = x @ x
        x = x / x.norm()
    assert meter.stop().seconds > 1e-3


@pytest.mark.gpu
@needs_cuda
def test_nvml_on_this_gpu_reads_positive_joules():
    try:
        meter = open_meter("nvml", "cuda")
    except EnergyUnavailable as exc:
        pytest.skip(f"NVML energy is not available on this GPU: {exc}")
    x = torch.randn(4096, 4096, device="cuda")
    meter.start()
    start = time.perf_counter()
    while time.perf_counter() - start < meter.min_window_s:
        x = (x @ x) / 4096
    reading = meter.stop()
    assert reading.joules > 0 and reading.seconds >= meter.min_window_s
    assert meters.cuda_uuid("cuda").startswith(("GPU-", "MIG-"))

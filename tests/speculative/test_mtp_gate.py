"""Tests for the MTP gate: settles on the faster mode, re-probes the other, and does not flap on noise."""

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from met.speculative.mtp_gate import GateParams, Mode, MtpGate


def run(gate: MtpGate, rates: dict[Mode, float], steps: int, noise: float = 0.0, seed: int = 0) -> list[Mode]:
    """Drive the gate on a synthetic stream: each step emits 1 token in 1/rate s (+-noise); returns the modes run."""
    rng = random.Random(seed)
    modes = []
    for _ in range(steps):
        m = gate.mode()
        seconds = (1.0 / rates[m]) * (1.0 + rng.uniform(-noise, noise))
        gate.observe(m, 1, seconds)
        modes.append(m)
    return modes


def exploit_switches(gate: MtpGate, rates: dict[Mode, float], steps: int, noise: float, seed: int) -> int:
    """How many times the exploited mode changed over the stream."""
    rng = random.Random(seed)
    switches, last = 0, gate.exploit
    for _ in range(steps):
        m = gate.mode()
        gate.observe(m, 1, (1.0 / rates[m]) * (1.0 + rng.uniform(-noise, noise)))
        switches += gate.exploit is not last
        last = gate.exploit
    return switches


P = GateParams(window_steps=8, margin=0.10, probe_every=4)


def test_first_windows_measure_both_modes() -> None:
    # one window of the start mode, then one probe window of the other, then the better one
    gate = MtpGate(P)
    modes = run(gate, {Mode.MTP: 100.0, Mode.PLAIN: 300.0}, 24)
    assert modes == [Mode.MTP] * 8 + [Mode.PLAIN] * 8 + [Mode.PLAIN] * 8
    assert gate.exploit is Mode.PLAIN


def test_reprobes_the_other_every_probe_every_windows() -> None:
    # MTP 2x faster: after settling, exactly one plain window per probe_every MTP windows
    gate = MtpGate(P)
    modes = run(gate, {Mode.MTP: 200.0, Mode.PLAIN: 100.0}, 16 + 8 * 5 * 10)
    tail = modes[16:]
    assert tail.count(Mode.PLAIN) == 8 * 10
    assert tail[4 * 8 : 5 * 8] == [Mode.PLAIN] * 8  # the probe comes after 4 exploit windows


def test_follows_a_change_in_the_faster_mode() -> None:
    # MTP faster, then acceptance collapses and plain becomes faster: the gate moves to plain
    gate = MtpGate(P)
    run(gate, {Mode.MTP: 200.0, Mode.PLAIN: 100.0}, 200)
    assert gate.exploit is Mode.MTP
    run(gate, {Mode.MTP: 50.0, Mode.PLAIN: 100.0}, 48)  # at most one MTP window + the early probe
    assert gate.exploit is Mode.PLAIN


def test_ignores_steps_of_the_other_mode() -> None:
    # a step the caller forced into plain during an MTP window measures neither
    gate = MtpGate(P)
    for _ in range(20):
        gate.observe(Mode.PLAIN, 1, 0.001)
    assert gate.mode() is Mode.MTP and gate.rates == {}


@pytest.mark.parametrize(("tokens", "seconds"), [(-1, 0.01), (1, 0.0), (1, float("nan")), (1, -0.5)])
def test_observe_rejects_bad_measurements(tokens: int, seconds: float) -> None:
    # negative tokens or a non-positive/non-finite duration is a caller bug
    with pytest.raises(ValueError):
        MtpGate(P).observe(Mode.MTP, tokens, seconds)


@pytest.mark.parametrize("kwargs", [{"window_steps": 0}, {"margin": -0.1}, {"probe_every": 0}])
def test_params_reject_nonsense(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        GateParams(**kwargs)


@given(st.floats(20.0, 500.0), st.floats(1.25, 4.0), st.sampled_from(list(Mode)), st.integers(0, 2**32))
def test_settles_on_the_faster_mode_under_noise(base: float, ratio: float, faster: Mode, seed: int) -> None:
    # one mode >= 1.25x the other, +-5% per-step noise: the faster is exploited and runs most steps
    gate = MtpGate(P)
    modes = run(gate, {faster: base * ratio, faster.other: base}, 400, noise=0.05, seed=seed)
    assert gate.exploit is faster
    assert modes[-320:].count(faster) >= 320 * 4 // 5 - 8


@given(st.floats(20.0, 500.0), st.floats(1.0, 1.05), st.sampled_from(list(Mode)), st.integers(0, 2**32))
def test_no_flap_within_the_margin(base: float, ratio: float, faster: Mode, seed: int) -> None:
    # modes within 5% of each other (default window and margin 10%), +-5% noise: the exploited mode never changes
    prm = GateParams(probe_every=4)
    gate = MtpGate(prm)
    assert exploit_switches(gate, {faster: base * ratio, faster.other: base}, 32 * 5 * 6, 0.05, seed) == 0
    assert gate.exploit is prm.start and set(gate.rates) == set(Mode)

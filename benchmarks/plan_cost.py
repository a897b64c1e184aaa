"""What the measured planner's own arithmetic costs per call, on the shipped table and calibration.

The planner runs in Python on the scheduler's thread: a first plan before each step (outside the
step's draft + verify seconds) and a replan after each MTP pass but the last (inside the draft).
This times both with SpecCostState.plan at widths 1, 4 and 16, every sequence with a previous
first draft, caught up, 100 tokens left: the best of 5 rounds of --calls calls, in microseconds.

    python3 benchmarks/plan_cost.py   # prints a markdown table; --out FILE also writes it
"""

import argparse
import platform
import sys
import time
from pathlib import Path

from met.engine.identity import box_class
from met.speculative.spec_cost import AcceptanceCalibration, CostTable, SpecCostState


def best_us(call, calls: int) -> float:
    """The fastest of 5 rounds of `calls` calls, per call, in microseconds."""
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", type=Path, help="default: tables/<this box's class>/met-tiny-py.toml")
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    table_path = args.table or Path("tables") / box_class("cpu", threads=1) / "met-tiny-py.toml"
    table = CostTable.parse(table_path.read_text())
    cal_path = table_path.with_name(table_path.name.removesuffix(".toml") + ".calibration.toml")
    calibration = AcceptanceCalibration.parse(cal_path.read_text())
    state = SpecCostState(table, calibration, 0.1, table.key, calibration.drafter)
    lines = ["# The measured planner's arithmetic per call", "",
             f"Command: `python3 {' '.join(sys.argv)}`; table `{table_path}`; `{platform.platform()}`, "
             f"Python {platform.python_version()}; best of 5 rounds of {args.calls} calls.", "",
             "| width | first plan us | replan after one draft us |", "|---:|---:|---:|"]
    for width in (1, 4, 16):
        previous, behind, left = [-0.3] * width, [2] * width, [100] * width
        first = best_us(lambda: state.plan(width, None, table.kmax, previous=previous, behind=behind,
                                           remaining=left), args.calls)
        again = best_us(lambda: state.plan(width, [[-0.3]] * width, table.kmax, 1, previous), args.calls)
        lines.append(f"| {width} | {first:.1f} | {again:.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`met bench policies`' plot: median tokens/s by concurrency, one line per policy, min..max as error bars (PNG)."""

from collections.abc import Sequence
from pathlib import Path

from met.bench.policies_report import Row


class PlotUnavailable(Exception):
    """matplotlib is not installed, so no PNG can be drawn."""


def plot(rows: Sequence[Row], title: str, path: Path) -> None:
    """Write the PNG to path; PlotUnavailable without matplotlib."""
    try:
        import matplotlib  # not at the top: only this command draws, and it says what to do when it cannot

        matplotlib.use("Agg")  # files only: no display on a server
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable("matplotlib is not installed; pip install matplotlib to get the PNG") from None
    policies = list(dict.fromkeys(r.policy for r in rows))
    concurrencies = sorted({r.concurrency for r in rows})
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    for policy in policies:
        mine = sorted((r for r in rows if r.policy == policy), key=lambda r: r.concurrency)
        xs = [r.concurrency for r in mine]
        ys = [r.tokens_per_s for r in mine]
        err = [[r.tokens_per_s - r.tokens_per_s_min for r in mine], [r.tokens_per_s_max - r.tokens_per_s for r in mine]]
        bold = policy == "measured"
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=policy, linewidth=2.5 if bold else 1.2,
                    zorder=3 if bold else 2)
    ax.set_xscale("log", base=2)
    ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("tokens/s (median over repeats; bars: min..max)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)

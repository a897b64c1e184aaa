"""`met bench policies`' figures: runs summarised per policy and concurrency, the planner's checks, JSON and markdown.

Counting is met.bench.policies'; this module only derives figures from its runs and formats them.
What each figure includes is said where it is made and repeated in the markdown's notes.
"""

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from met.bench.policies import CHOICE_POLICIES, FIXED_DEPTHS, Run, policy_drafters
from met.bench.policies_identity import Mismatch
from met.engine.runner import RECURSIVE_DRAFTERS
from met.speculative.spec_cost import CostTable

WITHIN_BEST = 0.97  # the planner's tokens/s at least this share of the best fixed depth's, at every concurrency
AHEAD_OF_AVERAGE = 1.10  # ... and this many times the fixed depth that is best on average
WIDTH1_SPEEDUP = 1.8  # ... and this many times speculation off at concurrency 1
CHOICE_FLOOR = 1.0  # a choice among drafters at least this many times the best single drafter's planner, everywhere
CHOICE_AHEAD = 1.05  # ... and this many times it on average (geometric mean over the concurrencies)
INTERVAL_LEVEL = 0.9  # least coverage of the interval given beside each paired ratio (median_interval)


@dataclass(frozen=True, slots=True)
class Row:
    """One policy at one concurrency over its repeats."""

    policy: str
    concurrency: int
    repeats: int
    tokens_per_s: float  # median over repeats of completion tokens / wall seconds
    tokens_per_s_min: float
    tokens_per_s_max: float
    spread: float  # (max - min) / median over repeats
    step_tokens_per_s: float  # median over repeats of tokens emitted by steps / their draft + verify seconds
    joules_per_token: float | None  # priced from the table (see price); None: no energy in the table, or not priced
    mean_accepted_length: float | None  # accepted drafts per sequence-step that verified a draft; bonus NOT counted
    emitted_per_verify: float | None  # the same with the bonus counted: accepted drafts + 1
    acceptance_at: tuple[float, ...]  # position i: share of drafts verified there with drafts 0..=i all accepted
    steps: int  # decode/verify steps in all repeats
    modes: tuple[tuple[str, float], ...] = ()  # (mode, share of steps): plain, mtp, lookup (copies, host drafts), dflash


@dataclass(frozen=True, slots=True)
class Check:
    """One of the planner's checks: its statement, the figures, and whether they meet it."""

    name: str
    passed: bool | None  # None: a policy the check needs was not run
    figures: str


def price(run: Run, table: CostTable | None) -> float | None:
    """Joules of a run's steps priced from the table; None without joules there or a step deeper than it prices.

    Each step costs its cell at (width, deepest drafts verified): verify joules, plus for MTP (or
    draft model) steps the draft joules of the cell at the width the drafter drafted for (a mixed
    step's copies are verified, not drafted), as the scheduler prices its steps. Prefill and host
    (prompt-lookup) drafting are not priced.
    """
    if table is None or not table.has_energy:
        return None
    joules = 0.0
    for mode, width, k, drafted, count in run.steps:
        if k > (table.kmax if mode in RECURSIVE_DRAFTERS and drafted else table.verify_depth(width)):  # copies: verify cells
            return None
        joules += count * table.step_joules(width, k, drafted=mode in RECURSIVE_DRAFTERS, draft_width=drafted)
    return joules


def summarise(runs: Sequence[Run], table: CostTable | None, draft_table: CostTable | None = None,
              eagle_table: CostTable | None = None) -> list[Row]:
    """A row per (policy, concurrency), in the runs' order; the draft-* policies' joules priced from draft_table (the
    draft model's), the eagle-* ones' from eagle_table (the EAGLE-3 head's), the others' from table."""
    tables = {"mtp": table, "draft": draft_table, "eagle": eagle_table}
    groups: dict[tuple[str, int], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.policy, run.concurrency), []).append(run)
    rows = []
    for (policy, c), group in groups.items():
        rates = [r.tokens / r.seconds for r in group]
        median = statistics.median(rates)
        # a choice's steps are priced by several tables, which no one run's price can say apart: not priced
        drafters = policy_drafters(policy) or ("mtp",)
        priced = [None if len(drafters) > 1 else price(r, tables[drafters[0]]) for r in group]
        tokens = sum(r.tokens for r in group)
        jpt = sum(priced) / tokens if tokens and all(p is not None for p in priced) else None
        verify = sum(r.verify_seq_steps for r in group)
        depth = max((len(r.proposed_at) for r in group), default=0)
        proposed = [sum(r.proposed_at[i] for r in group if i < len(r.proposed_at)) for i in range(depth)]
        accepted = [sum(r.accepted_at[i] for r in group if i < len(r.accepted_at)) for i in range(depth)]
        in_steps = statistics.median(r.step_tokens / r.step_seconds if r.step_seconds else 0.0 for r in group)
        rows.append(Row(policy, c, len(group), median, min(rates), max(rates),
                        (max(rates) - min(rates)) / median if median else 0.0, in_steps, jpt,
                        sum(r.accepted for r in group) / verify if verify else None,
                        sum(r.emitted_in_verify for r in group) / verify if verify else None,
                        tuple(a / p for a, p in zip(accepted, proposed) if p),
                        sum(n for r in group for *_, n in r.steps), _mode_shares(group)))
    return rows


def _mode_shares(runs: Sequence[Run]) -> tuple[tuple[str, float], ...]:
    """Each step mode's share of the runs' steps, in the order the modes first ran."""
    counts: dict[str, int] = {}
    for r in runs:
        for mode, *_, n in r.steps:
            counts[mode] = counts.get(mode, 0) + n
    total = sum(counts.values())
    return tuple((mode, n / total) for mode, n in counts.items()) if total else ()


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values and min(values) > 0 else 0.0


def paired_ratios(runs: Sequence[Run], a: str, b: str, concurrency: int) -> list[float]:
    """Per repeat both ran and both finished a request in: policy a's tokens/s over policy b's in that repeat.

    Runs are interleaved, so the two runs of a repeat were made minutes apart at most: the box's
    drift between repeats, which moves every policy together, cancels out of each ratio. A run whose
    requests all failed (0 tokens/s; the command exits 70 naming them) has no ratio.
    """
    rate = {(r.policy, r.repeat): r.tokens / r.seconds for r in runs if r.concurrency == concurrency}
    return [rate[a, k] / rate[b, k] for (p, k) in rate if p == a and rate.get((b, k)) and rate[a, k]]


def paired_ratio(runs: Sequence[Run], a: str, b: str, concurrency: int) -> float | None:
    """The median of paired_ratios; None if the two policies share no repeat."""
    ratios = paired_ratios(runs, a, b, concurrency)
    return statistics.median(ratios) if ratios else None


def median_interval(values: Sequence[float], level: float = INTERVAL_LEVEL) -> tuple[float, float, float] | None:
    """A distribution-free interval for the median of values: (low, high, its coverage), or None if too few.

    The order statistics x(j) <= x(n+1-j) bracket the median with probability 1 - 2 P(B < j), B ~
    Binomial(n, 1/2), whatever the values' distribution; j is the largest whose coverage is at least
    `level`. Fewer than 5 values cannot reach 90%.
    """
    xs, n = sorted(values), len(values)
    below, found = 0, None  # below: P(B < j) * 2**n
    for j in range(1, n // 2 + 1):
        below += math.comb(n, j - 1)
        coverage = 1 - 2 * below / 2**n
        if coverage < level:
            break
        found = (xs[j - 1], xs[n - j], coverage)
    return found


def _interval(runs: Sequence[Run], b: str, c: int, a: str = "measured") -> str:
    """The interval of a's (the planner's) paired ratio over b at concurrency c: " [0.910, 0.990] 93%" ("": too few)."""
    interval = median_interval(paired_ratios(runs, a, b, c))
    return f" [{interval[0]:.3f}, {interval[1]:.3f}] {interval[2]:.0%}" if interval else ""


def checks(rows: Sequence[Row], runs: Sequence[Run]) -> list[Check]:
    """The planner's three checks, and one per choice among drafters that ran, decided on paired ratios
    (paired_ratio), each with the figures behind it."""
    rate = {(r.policy, r.concurrency): r.tokens_per_s for r in rows if r.tokens_per_s > 0}  # 0: every run failed
    concurrencies = sorted({r.concurrency for r in rows})
    fixed = [f"fixed-{k}" for k in FIXED_DEPTHS if all((f"fixed-{k}", c) in rate for c in concurrencies)]
    have_planner = all(("measured", c) in rate for c in concurrencies)
    out = []

    def vs(b: str, c: int) -> float:
        return paired_ratio(runs, "measured", b, c) or 0.0

    name = f"measured planner within {1 - WITHIN_BEST:.0%} of every fixed depth (so of the best) at every concurrency"
    if have_planner and fixed:
        parts, ok = [], True
        for c in concurrencies:
            worst = min(fixed, key=lambda f: vs(f, c))
            best = max(fixed, key=lambda f: rate[f, c])
            ok &= vs(worst, c) >= WITHIN_BEST
            planner = rate["measured", c]
            parts.append(f"c={c}: {vs(worst, c):.3f}{_interval(runs, worst, c)} of {worst} (of the best median, "
                         f"{best}: {planner:.1f} vs {rate[best, c]:.1f} tok/s = {planner / rate[best, c]:.3f})")
        out.append(Check(name, ok, f"{'; '.join(parts)} (needs >= {WITHIN_BEST})"))
    else:
        out.append(Check(name, None, "needs the measured planner and fixed depths at every concurrency"))

    name = (f"measured planner >= {AHEAD_OF_AVERAGE - 1:.0%} ahead of the fixed depth best on average "
            "(geometric mean over the concurrencies)")
    if have_planner and fixed:
        means = {f: _geomean([rate[f, c] for c in concurrencies]) for f in fixed}
        best = max(fixed, key=lambda f: means[f])
        ratio = _geomean([vs(best, c) for c in concurrencies])
        each = ", ".join(f"c={c} {vs(best, c):.3f}{_interval(runs, best, c)}" for c in concurrencies)
        planner = _geomean([rate["measured", c] for c in concurrencies])
        out.append(Check(name, ratio >= AHEAD_OF_AVERAGE,
                         f"{ratio:.3f} of {best} (needs >= {AHEAD_OF_AVERAGE}); per concurrency: {each}; "
                         f"medians: planner {planner:.1f} vs {best} {means[best]:.1f} tok/s = "
                         f"{planner / means[best]:.3f}"))
    else:
        out.append(Check(name, None, "needs the measured planner and fixed depths at every concurrency"))

    name = f"measured planner at concurrency 1 >= {WIDTH1_SPEEDUP}x speculation off"
    if ("measured", 1) in rate and ("off", 1) in rate:
        ratio = vs("off", 1)
        out.append(Check(name, ratio >= WIDTH1_SPEEDUP, f"{ratio:.2f}x{_interval(runs, 'off', 1)} (needs >= "
                         f"{WIDTH1_SPEEDUP}x); medians: "
                         f"{rate['measured', 1]:.1f} vs {rate['off', 1]:.1f} tok/s = "
                         f"{rate['measured', 1] / rate['off', 1]:.2f}x"))
    else:
        out.append(Check(name, None, "needs policies off and measured at concurrency 1"))
    for choice in [p for p in dict.fromkeys(r.policy for r in rows) if p in CHOICE_POLICIES]:
        out.append(_choice_check(choice, rate, concurrencies, runs))
    return out


def _choice_check(choice: str, rate: dict, concurrencies: Sequence[int], runs: Sequence[Run]) -> Check:
    """A choice among drafters against the best of its drafters' own planners at each concurrency (the one with
    the most median tokens/s there): at least CHOICE_FLOOR of it everywhere, CHOICE_AHEAD on average."""
    singles = ["measured" if d == "mtp" else f"{d}-measured" for d in policy_drafters(choice)]
    name = (f"{choice} >= {CHOICE_FLOOR}x the best of {', '.join(singles)} at every concurrency and >= "
            f"{CHOICE_AHEAD}x it on average (geometric mean over the concurrencies)")
    if not all((p, c) in rate for p in (choice, *singles) for c in concurrencies):
        return Check(name, None, f"needs {choice} and {', '.join(singles)} at every concurrency")
    ratios, parts = [], []
    for c in concurrencies:
        best = max(singles, key=lambda p: rate[p, c])
        ratios.append(paired_ratio(runs, choice, best, c) or 0.0)
        parts.append(f"c={c}: {ratios[-1]:.3f}{_interval(runs, best, c, choice)} of {best}")
    mean = _geomean(ratios)
    return Check(name, min(ratios) >= CHOICE_FLOOR and mean >= CHOICE_AHEAD,
                 f"{'; '.join(parts)}; on average {mean:.3f} (needs >= {CHOICE_FLOOR} at each, >= {CHOICE_AHEAD} "
                 "on average)")


def verdict_lines(results: Sequence[Check]) -> list[str]:
    """`PASS: ...`, `FAIL: ...` or `N/A: ...` per check, with its figures."""
    word = {True: "PASS", False: "FAIL", None: "N/A"}
    return [f"{word[c.passed]}: {c.name}: {c.figures}" for c in results]


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def markdown(meta: dict, rows: Sequence[Row], results: Sequence[Check], problems: Sequence[Mismatch]) -> str:
    """The report: where and how it was run, one table row per policy and concurrency, notes, the checks."""
    off = {r.concurrency: r.tokens_per_s for r in rows if r.policy == "off"}
    w = meta["workload"]
    lines = [f"# met bench policies: {meta['recipe']} on {meta['machine']['box_class']}", "",
             f"Command: `{meta['command']}`", "",
             "Machine: " + ", ".join(f"{k} `{v}`" for k, v in meta["machine"].items()), "",
             f"Table: `{meta['table'] or 'none'}` (energy source `{meta['energy_source'] or 'n/a'}`); "
             f"calibration: `{meta['calibration'] or 'none'}`; when: {meta['when']}", "",
             *([f"Draft model: `{meta['draft_model']}` (the draft-* policies); its table: "
                f"`{meta.get('draft_table') or 'none'}`, calibration: `{meta.get('draft_calibration') or 'none'}`",
                ""] if meta.get("draft_model") else []),
             *([f"EAGLE-3 head: `{meta['eagle_head']}` (the eagle-* policies); its table: "
                f"`{meta.get('eagle_table') or 'none'}`, calibration: `{meta.get('eagle_calibration') or 'none'}`",
                ""] if meta.get("eagle_head") else []),
             f"Workload: {w['prompts']} held-out code prompts ({w['prompt_source']}), {w['max_tokens']} tokens each, "
             f"greedy; concurrency {', '.join(map(str, w['concurrencies']))}; {w['repeats']} repeats, policies "
             f"interleaved (order reversed every other repeat); verify pools: {meta['pools']}.", "",
             "| policy | concurrency | tok/s (median) | min..max | spread | vs off | tok/s in steps | J/token "
             "| mean accepted length | emitted per verify | acceptance per position | steps by mode |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        vs_off = f"{r.tokens_per_s / off[r.concurrency]:.2f}x" if off.get(r.concurrency) else "n/a"
        accept = " ".join(f"{a:.2f}" for a in r.acceptance_at) or "-"
        lines.append(f"| {r.policy} | {r.concurrency} | {r.tokens_per_s:.1f} | {r.tokens_per_s_min:.1f}.."
                     f"{r.tokens_per_s_max:.1f} | {r.spread:.1%} | {vs_off} | {r.step_tokens_per_s:.1f} | "
                     f"{_fmt(r.joules_per_token, '.4g')} | "
                     f"{_fmt(r.mean_accepted_length, '.2f')} | {_fmt(r.emitted_per_verify, '.2f')} | {accept} | "
                     f"{', '.join(f'{m} {share:.0%}' for m, share in r.modes) or '-'} |")
    lines += ["", "Notes:", "",
              "- tok/s: completion tokens over wall seconds from the first submit to the last finish, through the "
              "scheduler in-process (no HTTP), prefill and admission included; median over repeats; spread = "
              "(max - min) / median.",
              "- the checks compare policies by paired ratios: per repeat, the planner's tok/s over the other "
              "policy's in the same repeat (runs minutes apart at most), the median over repeats; the ratio of "
              "medians is given beside each. [low, high] p%: a distribution-free interval for that median "
              "(order statistics of the per-repeat ratios, covering the true median with probability p whatever "
              "their distribution; none with fewer than 5 repeats); a PASS or FAIL whose interval spans the "
              "threshold is within this box's noise.",
              "- tok/s in steps: tokens emitted by decode/verify steps over those steps' draft + verify seconds "
              "(no prefill, admission or streaming): what the steps alone deliver.",
              "- J/token: " + (f"priced from the table ({meta['energy_source']} joules; the draft-* policies' from "
                               "the draft model's table): each step at its width and deepest depth, verify joules "
                               "plus the drafter's draft joules (a step of copies or host drafts: the "
                               "verify's alone; a step that mixed copies with drafts: the draft of the width "
                               "that drafted, as the scheduler prices it), over every completion token "
                               "(each request's first comes from its prefill); prefill and host lookup drafting "
                               "are not priced, so every figure is a lower bound, prompt-lookup's the more so."
                               if meta["energy_source"] not in (None, "none") else
                               "n/a: the table was measured without an energy source (or no table was given)."),
              "- mean accepted length: accepted drafts per sequence-step that verified at least one draft, the bonus "
              "token NOT counted; emitted per verify counts it (accepted + 1).",
              "- acceptance per position i: of sequence-steps that verified a draft at position i, the share whose "
              "drafts 1..i were all accepted.",
              "- steps by mode: plain (no draft verified), mtp (MTP drafts), draft (the draft model's drafts), "
              "eagle (an EAGLE-3 head's), lookup (host drafts; the measured planners' copies from the histories and "
              "other requests), dflash; "
              "the accepted lengths and rates count every mode's drafts together.",
              "- fixed-k (and draft-fixed-k, eagle-fixed-k) asks k drafts every step; the verify pools clamp "
              "it (widths 9..=16 verify one draft unless the wide tier is lifted), as they clamp every policy in "
              "the serve.", "",
              "Checks:", ""]
    lines += [f"- {line}" for line in verdict_lines(results)]
    failed = sum(p.failed for p in problems)
    lines += ["", "Greedy outputs identical across policies and concurrencies: "
              + ("yes" if not problems else f"NO ({len(problems) - failed} differ, {failed} failed; first: "
                 f"{problems[0].message()})"), ""]
    return "\n".join(lines)


def document(meta: dict, rows: Sequence[Row], results: Sequence[Check], runs: Sequence[Run],
             problems: Sequence[Mismatch]) -> dict:
    """The JSON report: meta, rows, checks, every run's figures (not its texts) and any output mismatches."""
    return {
        "meta": meta,
        "rows": [asdict(r) for r in rows],
        "checks": [asdict(c) for c in results],
        "outputs_identical": not problems,
        "mismatches": [asdict(m) | {"message": m.message()} for m in problems],
        "runs": [{"policy": r.policy, "concurrency": r.concurrency, "repeat": r.repeat, "tokens": r.tokens,
                  "seconds": r.seconds, "proposed": r.proposed, "accepted": r.accepted,
                  "verify_seq_steps": r.verify_seq_steps, "emitted_in_verify": r.emitted_in_verify,
                  "proposed_at": list(r.proposed_at),
                  "accepted_at": list(r.accepted_at), "steps": [list(s) for s in r.steps],
                  "step_tokens": r.step_tokens, "step_seconds": r.step_seconds} for r in runs],
    }

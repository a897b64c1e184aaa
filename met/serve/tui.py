"""The live dashboard (rich) of a scheduler snapshot: `met serve --tui` in-process, `met top --url` over HTTP.

Both render the same JSON form of the snapshot (report.snapshot_doc), so what `met top` shows
of a remote server is exactly what `--tui` shows locally.
"""

import json
import time
from collections.abc import Callable

import httpx
from rich.console import Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from met.speculative.snapshot import SnapshotCell
from met.serve.report import snapshot_doc
from met.serve.schemas import json_type


def render(doc: dict, source: str = "") -> Panel:
    """One frame: what the tick did (width, queue, mode, depth and why) and the run's figures.

    Strings from the snapshot and the source (a URL, maybe IPv6 with brackets) are drawn as Text, never
    parsed as rich markup.
    """
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("spec", Text(str(doc.get("spec", "?"))))
    head.add_row("tick", f"{doc.get('tick', 0)}   width {doc.get('width', 0)}   active {doc.get('active', 0)}"
                 f"/{doc.get('max_batch', 0)} slots   queued {doc.get('queued', 0)}")
    head.add_row("mode", Text(f"{doc.get('mode', 'idle')}   planned depth {doc.get('depth', 0)}"))
    head.add_row("why", Text(str(doc.get("why") or "-")))
    rate = f"{doc.get('tokens_per_s', 0.0):.1f} tok/s (recent steps)"
    if doc.get("planned_tokens_per_s") is not None:
        rate += f"   planner expects {doc['planned_tokens_per_s']:.1f}"
    head.add_row("rate", rate)
    jpt = doc.get("joules_per_token")
    energy = doc.get("energy_j")
    if jpt is None and energy is None:
        why = "its table has no energy source" if str(doc.get("spec", "")).endswith("measured") else "no cost table"
        head.add_row("energy", f"not measured ({why})")
    else:
        # an idle tick plans no step: no J/token to show (was "nan"), while the run's joules stay
        planned = f"{jpt:.4g} J/token planned" if jpt is not None else "no step planned this tick"
        head.add_row("energy", f"{planned}, {energy or 0.0:.4g} J as the table prices the steps run")
    proposed, accepted = doc.get("drafts_proposed", 0), doc.get("drafts_accepted", 0)
    head.add_row("drafts", f"{accepted}/{proposed} accepted"
                 + (f" ({accepted / proposed:.1%})" if proposed else "")
                 + f"   emitted {doc.get('emitted_tokens', 0)} tokens")
    finished = doc.get("finished") or {}
    done = ", ".join(f"{k} {v}" for k, v in sorted(finished.items())) or "none finished"
    head.add_row("requests", Text(done + (f"   failed ticks {doc['failed_ticks']}" if doc.get("failed_ticks") else "")))
    pos = Table(title="acceptance per draft position (drafts 0..=i all accepted)", title_justify="left",
                show_edge=False)
    pos.add_column("position", justify="right")
    pos.add_column("accepted", justify="right")
    pos.add_column("verified", justify="right")
    pos.add_column("rate", justify="right")
    pos.add_column("")
    for i, (a, p) in enumerate(zip(doc.get("accepted_at") or [], doc.get("proposed_at") or [])):
        rate_i = a / p if p else 0.0
        bar = "█" * round(20 * min(max(rate_i, 0.0), 1.0))  # a server's counts past 1 would not fit the screen
        pos.add_row(str(i + 1), str(a), str(p), f"{rate_i:.1%}", bar)
    title = Text("met" + (f" · {source}" if source else ""))
    return Panel(Group(head, pos), title=title, title_align="left")


def live_local(cell: SnapshotCell, refresh_per_second: float = 4.0) -> Live:
    """A Live display of an in-process scheduler's snapshots; start it with `with` or .start()."""
    return Live(get_renderable=lambda: render(snapshot_doc(cell.latest()), "local"),
                refresh_per_second=refresh_per_second, screen=False)


class NotASnapshot(httpx.HTTPError):
    """The URL answered, but not with a met snapshot (or is no URL); an httpx.HTTPError so `met top` exits 69."""


# every /v1/snapshot has carried these since met top shipped (report.snapshot_doc of SchedulerSnapshot)
REQUIRED = ("tick", "width", "active", "queued", "mode", "depth", "why", "tokens_per_s", "drafts_proposed",
            "drafts_accepted", "emitted_tokens")
NUMBER = (int, float)
COUNT_MAX = 1 << 63  # no met serve counts this far; a larger JSON integer overflows a float in render
# the type of each field render does arithmetic or formatting on, checked when present (None: may be null)
TYPES = {"tick": int, "width": int, "active": int, "queued": int, "max_batch": int, "depth": int, "mode": str,
         "spec": str, "why": str, "tokens_per_s": NUMBER, "drafts_proposed": int, "drafts_accepted": int,
         "emitted_tokens": int, "failed_ticks": int, "accepted_at": list, "proposed_at": list, "finished": dict,
         "joules_per_token": (*NUMBER, type(None)), "energy_j": (*NUMBER, type(None)),
         "planned_tokens_per_s": (*NUMBER, type(None))}


def snapshot_problem(doc: object) -> str | None:
    """Why a decoded JSON document is not a met snapshot, or None if it is one render can draw."""
    if not isinstance(doc, dict):
        return f"a JSON {json_type(doc)}, not an object"
    missing = [k for k in REQUIRED if k not in doc]
    if missing:
        return f"no {', '.join(missing)}"
    for key, kind in TYPES.items():
        if key in doc and (not isinstance(doc[key], kind) or isinstance(doc[key], bool) or _huge(doc[key])):
            return f"{key} is {json.dumps(doc[key])[:40]}"
    for key in ("accepted_at", "proposed_at"):
        if not all(isinstance(n, int) and not isinstance(n, bool) and not _huge(n) for n in doc.get(key, [])):
            return f"{key} is {json.dumps(doc[key])[:40]}"
    return None


def _huge(value: object) -> bool:
    return isinstance(value, int) and abs(value) >= COUNT_MAX


def fetch(url: str, api_key: str | None = None, timeout: float = 5.0) -> dict:
    """GET <url>/v1/snapshot as a dict; httpx errors propagate, NotASnapshot if the answer is no met snapshot."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(url.rstrip("/") + "/v1/snapshot", headers=headers, timeout=timeout)
    except httpx.InvalidURL as exc:  # not an httpx.HTTPError
        raise NotASnapshot(f"invalid URL {url} ({exc}); pass --url http://HOST:PORT of a met serve") from None
    response.raise_for_status()
    try:
        doc = response.json()
    except ValueError as exc:  # not JSON, or not UTF-8
        problem = f"not JSON: {exc}"
    else:
        problem = snapshot_problem(doc)
    if problem is not None:
        raise NotASnapshot(f"{url} did not answer a met snapshot ({problem}); is it a met serve?")
    return doc


def watch(url: str, api_key: str | None, interval: float, frames: int | None = None,
          sleep: Callable[[float], None] = time.sleep) -> None:
    """Poll a server's snapshot and redraw until interrupted (or for `frames` frames)."""
    with Live(render(fetch(url, api_key), url), refresh_per_second=max(1.0, 1.0 / interval)) as live:
        shown = 1
        while frames is None or shown < frames:
            sleep(interval)
            live.update(render(fetch(url, api_key), url))
            shown += 1

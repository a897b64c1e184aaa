"""Hostile table files: a valid cost table and calibration, and hypothesis strategies that mutate them.

Shared by tests/reliability/test_fuzz_tables.py (a few hundred cases in CI) and
`benchmarks/soak.py --fuzz N` (many more); table_oracle.judge says whether each case ended as
documented. Mutations: truncation, invalid UTF-8, flipped and deleted bytes, duplicated, swapped
and dropped lines and [[blocks]] (the table's [[cells]] and [[verify_cells]]), NaN/inf/negative/
zero/huge values, type swaps, deep nesting (values and table headers), unknown and renamed fields,
schemas from the future, a BOM, CRLF.
"""

import copy
import datetime as dt
import math
import re
import tomllib

import tomli_w
from hypothesis import strategies as st

from met.speculative.spec_cost import (AcceptanceCalibration, Cell, CostTable, DrafterKey, LookupBin, TableKey,
                                       VerifyCell)

# --- the valid files every mutation starts from --------------------------------------------------


def valid_table() -> bytes:
    """A small metered table (two widths, depths 0..=1, spreads) with a non-ASCII meta value (UTF-8 multi-byte),
    and verify cells (copies' verify) past kmax: width 1 to k = 2, width 4 to k = 3."""
    key = TableKey("cpu-epyc-2t", "met-tiny-py@0e39", "rapl", {"decode": "d1", "verify": "v1", "draft_mtp": "m1"})
    cells = [Cell(n, k, 0.01 * n + 0.002 * k, 0.001 * k, 0.5 * n, 0.1 * k, 1e-4, 2e-5 if k else None,
                  catchup_s=2e-5 * n if k else None) for n in (1, 4) for k in (0, 1)]
    verify_cells = [VerifyCell(n, k, 0.01 * n + 0.002 * k, 0.5 * n + 0.05 * k, 1e-4, 2e-5 if n == 4 else None)
                    for n, k in ((1, 2), (4, 2), (4, 3))]
    return CostTable(key, cells, {"device": "AMD EPYC™ 7B13", "repeats": 3}, verify_cells).to_toml().encode()


def valid_calibration() -> bytes:
    """A calibration with two confidence bins, two position priors, a two-bin carry-over (two positions in one)
    and copy bins: two of the history's own (from match length 1), one of other requests' (from 2)."""
    sure, unsure = math.log(0.95), math.log(0.2)  # the previous step's first drafts
    rows = ([(math.log(0.9), i < 90, 1, sure) for i in range(100)]
            + [(math.log(0.3), i < 30, 2, sure) for i in range(100)]
            + [(math.log(0.3), i < 60, 1, unsure) for i in range(100)])
    lookup = [LookupBin(1, 3, (0.25, 0.5), (300, 120)), LookupBin(4, 12, (0.875,), (100,))]
    shared = [LookupBin(2, 12, (0.5, 0.75, 0.8), (400, 200, 150))]
    return AcceptanceCalibration.fit(rows, DrafterKey("mtp", "met-tiny-py", "0e39"),
                                     {"when": "2026-10-04", "prompts": 16}, lookup, shared).to_toml().encode()


# --- the mutations --------------------------------------------------------------------------------

INVALID_UTF8 = [b"\xff", b"\xc3", b"\xe2\x84", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80",
                b"\xf4\x90\x80\x80"]  # stray byte, cut sequences, overlong, surrogate, 5-byte, continuation, > U+10FFFF
NASTY_VALUES = [
    "nan", "+nan", "-nan", "inf", "+inf", "-inf",  # not finite
    "0", "0.0", "-0.0", "-1", "-0.2", "-1e-300", "5e-324",  # zero, negative, subnormal
    "1e308", "1e309", "-1e309", "1.7976931348623157e308", "9223372036854775807", "9223372036854775808",
    "1" + "0" * 400, "9" * 4400,  # huge: beyond float, beyond tomllib's 4300-digit limit
    "true", "false", '""', '" "', '"x\\ny"', '"0.0074"', "'literal'", "0x10", "0o7", "0b1", "1_000", "1e2",
    "[]", "[1, 2]", "[[1], [2]]", '["a", 1]', "{}", "{ a = 1 }", "1979-05-27T07:32:00Z", "1979-05-27", "07:32:00",
    "", "=", '"unterminated', "1 2", '"\\ud800"',
]
_ASSIGNMENT = re.compile(rb"^([^\[=\n][^=\n]*?=[ \t]*)(.*)$", re.M)
_BLOCK = re.compile(rb"^\[\[[a-z_]+\]\]\n(?:[^\[\n].*\n)*", re.M)


def nested(kind: str, depth: int) -> str:
    """A TOML value nested `depth` deep: arrays, inline tables, or arrays of inline tables."""
    if kind == "array":
        return "[" * depth + "1" + "]" * depth
    if kind == "table":
        return "{ a = " * depth + "1" + " }" * depth
    return "[{ a = " * depth + "1" + " }]" * depth


def toml_value(value: object) -> str:
    """`value` as the right-hand side of a TOML assignment."""
    return tomli_w.dumps({"v": value}).partition("=")[2].strip()


scalars = (st.integers() | st.floats() | st.text(max_size=12) | st.booleans()
           | st.datetimes(timezones=st.just(dt.UTC)) | st.dates())
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text("abcxyz_", min_size=1, max_size=4), inner, max_size=3), max_leaves=6)


def _paths(doc: object, at: tuple = ()) -> list[tuple]:
    """Every path (keys and indices) to a value in a parsed document, containers included."""
    found = [at] if at else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            found += _paths(v, (*at, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            found += _paths(v, (*at, i))
    return found


def _parent(doc: dict, path: tuple) -> tuple[dict | list, object]:
    node = doc
    for part in path[:-1]:
        node = node[part]
    return node, path[-1]


@st.composite
def text_mutation(draw, base: bytes) -> tuple[str, bytes]:
    """A byte- or line-level mutation of `base`: (what was done, the mutated bytes)."""
    kind = draw(st.sampled_from(["truncate", "invalid_utf8", "flip_byte", "delete_span", "duplicate_line",
                                 "duplicate_block", "drop_block", "swap_lines", "value", "nest", "future_schema",
                                 "deep_header", "bom", "crlf"]))
    lines = base.splitlines(keepends=True)
    if kind == "truncate":
        return kind, base[: draw(st.integers(0, len(base)))]
    if kind == "invalid_utf8":
        at = draw(st.integers(0, len(base)))
        return kind, base[:at] + draw(st.sampled_from(INVALID_UTF8)) + base[at:]
    if kind == "flip_byte":
        at = draw(st.integers(0, len(base) - 1))
        return kind, base[:at] + bytes([base[at] ^ draw(st.integers(1, 255))]) + base[at + 1:]
    if kind == "delete_span":
        at = draw(st.integers(0, len(base) - 1))
        return kind, base[:at] + base[at + draw(st.integers(1, 64)):]
    if kind in ("duplicate_line", "swap_lines"):
        i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
        if kind == "duplicate_line":
            lines.insert(j, lines[i])
        else:
            lines[i], lines[j] = lines[j], lines[i]
        return kind, b"".join(lines)
    if kind in ("duplicate_block", "drop_block"):
        blocks = list(_BLOCK.finditer(base))
        b = blocks[draw(st.integers(0, len(blocks) - 1))]
        if kind == "drop_block":
            return kind, base[: b.start()] + base[b.end():]
        at = draw(st.sampled_from([b.end(), len(base)]))
        return kind, base[:at] + (b"\n" if at == len(base) else b"") + b.group() + base[at:]
    if kind == "future_schema":
        version = draw(st.sampled_from([0, 2, 3, 99, 2**31, 2**63 - 1, -1]))
        return kind, base.replace(b"schema = 1", f"schema = {version}".encode(), 1)
    if kind == "bom":  # a Windows editor's byte-order mark: UTF-8, but not TOML
        return kind, b"\xef\xbb\xbf" + base
    if kind == "crlf":  # Windows line endings: the same table
        return kind, base.replace(b"\n", b"\r\n")
    if kind == "deep_header":  # a table header nested thousands of keys deep
        depth = draw(st.sampled_from([2, 64, 1000, 5000]))
        return kind, base + ("\n[" + ".".join(["a"] * depth) + "]\nx = 1\n").encode()
    spots = list(_ASSIGNMENT.finditer(base))
    spot = spots[draw(st.integers(0, len(spots) - 1))]
    if kind == "nest":
        new = nested(draw(st.sampled_from(["array", "table", "mixed"])),
                     draw(st.sampled_from([1, 2, 3, 10, 100, 500, 1000, 3000, 10_000])))
    else:
        new = draw(st.sampled_from(NASTY_VALUES) | values.map(toml_value))
    return f"{kind}", base[: spot.start(2)] + new.encode() + base[spot.end(2):]


@st.composite
def doc_mutation(draw, base: bytes) -> tuple[str, bytes]:
    """A structural mutation of the parsed document, written back as TOML: (what was done, the bytes)."""
    doc = tomllib.loads(base.decode())
    kind = draw(st.sampled_from(["drop", "type_swap", "scale", "replace", "duplicate_item", "drop_item",
                                 "swap_items", "add_field", "rename_field", "schema"]))
    paths = _paths(doc)
    arrays = [p for p in paths if isinstance(_parent(doc, p)[0], list)]
    path = draw(st.sampled_from(arrays if kind in ("duplicate_item", "drop_item", "swap_items") else paths))
    node, last = _parent(doc, path)
    value = node[last]
    if kind == "drop":
        del node[last]
    elif kind == "type_swap":
        node[last] = draw(st.sampled_from([str(value), [value], {"v": value}, True, dt.date(2026, 1, 1)]
                                          + ([float(value)] if isinstance(value, int) and abs(value) < 2**53 else [])
                                          + ([int(value)] if isinstance(value, float) and math.isfinite(value)
                                             else [])))
    elif kind == "scale":
        factor = draw(st.sampled_from([0, -1, 1e-300, 1e300, math.inf, math.nan, 2, 0.5]))
        node[last] = value * factor if isinstance(value, int | float) and not isinstance(value, bool) else factor
    elif kind == "replace":
        node[last] = draw(values)
    elif kind == "duplicate_item":
        node.insert(draw(st.integers(0, len(node))), copy.deepcopy(value))
    elif kind == "drop_item":
        del node[last]
    elif kind == "swap_items":
        other = draw(st.integers(0, len(node) - 1))
        node[last], node[other] = node[other], node[last]
    elif kind in ("add_field", "rename_field"):
        target = node if isinstance(node, dict) else doc
        name = draw(st.sampled_from(["verfy_s", "extra", "k", "n", "schema", "drafter", "bins", "Verify_S", "é"]))
        if kind == "rename_field" and isinstance(node, dict):
            target[name] = target.pop(last)
        else:
            target[name] = draw(values)
    else:
        doc["schema"] = draw(st.sampled_from([2, 0, -1, 1.0, "1", True, 2**64]))
    try:
        return kind, tomli_w.dumps(doc).encode()
    except (TypeError, ValueError):  # tomli-w refuses (e.g. a key it cannot write): keep the file as it was
        return f"{kind} (unwritable)", base


def mutations(base: bytes) -> st.SearchStrategy[tuple[str, bytes]]:
    """Every kind of mutation of one valid file."""
    return text_mutation(base) | doc_mutation(base)

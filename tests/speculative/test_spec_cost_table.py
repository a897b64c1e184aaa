"""CostTable, Cell and VerifyCell: parse/to_toml round trip, refusal of malformed tables, interpolation in width."""

import math

import pytest
import tomli_w
from hypothesis import assume, find, given
from hypothesis import strategies as st

from met.speculative.spec_cost import (
    ENERGY_SOURCES, MAX_DEPTH, MAX_WIDTH, Cell, CostTable, TableKey, TableParseError, VerifyCell,
)

KEY = TableKey("nvidia-h200x1", "met-tiny-py@abc123", "nvml", {"decode": "d1", "verify": "v1", "draft_mtp": "m1"})
NO_METER = TableKey("cpu-epyc-2t", "met-tiny-py@abc123", "none", {"decode": "d1", "verify": "v1"})


def make_table(widths=(1, 4), kmax=2, key=KEY, verify=lambda n, k: 0.01 * n + 0.001 * k) -> CostTable:
    """A small valid table: draft costs 1 ms and 0.5 J per draft; joules only when the key has a meter."""
    cells = []
    for n in widths:
        for k in range(kmax + 1):
            joules = (1.0 + n + k, 0.5 * k) if key.energy_source != "none" else (None, None)
            cells.append(Cell(n, k, verify(n, k), 0.001 * k, *joules))
    return CostTable(key, cells, {"when": "2026-10-04T12:00:00Z", "repeats": 5})


# -- valid tables, as a strategy ------------------------------------------------------------

costs = st.floats(min_value=1e-6, max_value=1e3, allow_nan=False, allow_infinity=False)  # 1 us: a step's least
spreads = st.none() | st.floats(min_value=0.0, max_value=1e3)
meta_values = st.text(max_size=20) | st.integers(-(2**63), 2**63 - 1) | st.booleans() | costs


@st.composite
def tables(draw, energy_source=None) -> CostTable:
    """Any valid table: 1-4 widths, depths 0..=kmax, verify cells at some (from 1 or past kmax), random costs, meta."""
    source = energy_source or draw(st.sampled_from(["nvml", "rapl", "none"]))
    digests = draw(st.dictionaries(st.sampled_from(["decode", "verify", "draft_mtp", "draft_dflash"]),
                                   st.text("0123456789abcdef", min_size=1, max_size=16), min_size=1))
    key = TableKey(draw(st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=20)),
                   draw(st.text(min_size=1, max_size=20).filter(lambda s: s.strip() and "\n" not in s
                                                                and "\r" not in s)),
                   source, digests)
    widths = draw(st.lists(st.integers(1, 512), min_size=1, max_size=4, unique=True))
    kmax = draw(st.integers(0, 4))
    cells = []
    for n in widths:
        for k in range(kmax + 1):
            draft = 0.0 if k == 0 else draw(costs)
            joules = (None, None) if source == "none" else (draw(costs), 0.0 if k == 0 else draw(costs))
            cells.append(Cell(n, k, draw(costs), draft, *joules, draw(spreads), draw(spreads),
                              *((None, None) if source == "none" else (draw(spreads), draw(spreads)))))
    order = draw(st.permutations(cells))
    meta = draw(st.dictionaries(st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=10).filter(lambda k: k != "when"),
                                meta_values, max_size=4))  # `when` has its own rule (test_meta_when_...)
    verify_cells = []
    for n in widths:  # each width's run from 1 or kmax + 1 to its deepest; none at some widths
        first = draw(st.sampled_from([1, kmax + 1]))
        for k in range(first, draw(st.integers(first - 1, kmax + 3)) + 1):
            joules = (None, None) if source == "none" else (draw(costs), draw(spreads))
            verify_cells.append(VerifyCell(n, k, draw(costs), joules[0], draw(spreads), joules[1]))
    return CostTable(key, order, meta, draw(st.permutations(verify_cells)))


@given(tables())
def test_to_toml_round_trips(table):
    # Parsing what to_toml wrote gives back an equal table, and writing it again the same text.
    text = table.to_toml()
    again = CostTable.parse(text)
    assert again == table
    assert again.to_toml() == text


def test_to_toml_writes_the_documented_layout():
    # One [[cells]] block per cell, sorted by (n, k); [key.plan_digests] as a sub-table.
    text = make_table().to_toml()
    assert text.startswith("schema = 1\n")
    assert "[key.plan_digests]" in text
    assert text.count("[[cells]]") == 6
    assert text.index("n = 1\nk = 2") < text.index("n = 4\nk = 0")


def test_meta_is_preserved():
    # [meta] is free: its strings and numbers come back as written.
    table = CostTable.parse(make_table().to_toml())
    assert dict(table.meta) == {"when": "2026-10-04T12:00:00Z", "repeats": 5}


@pytest.mark.parametrize("when", [
    "2026-11-30T02:11:06Z",  # ISO text, as tests and hand-written tables have it
    "2026-11-30",  # a date alone: its midnight
])
def test_meta_when_in_iso_text_is_read(when):
    table = CostTable.parse(make_table().to_toml().replace('"2026-10-04T12:00:00Z"', f'"{when}"'))
    assert table.meta["when"] == when


@pytest.mark.parametrize("when", [
    "2026-11-30 02:11:06+00:00",  # what met writes: a TOML offset date-time
    "2026-11-30T02:11:06",  # a local date-time (met reads it as UTC)
    "2026-11-30",  # a TOML date
])
def test_meta_when_as_a_toml_date_time_is_read(when):
    CostTable.parse(make_table().to_toml().replace('"2026-10-04T12:00:00Z"', when))


@pytest.mark.parametrize(("when", "message"), [
    ('"last tuesday"', "'last tuesday' is not an ISO 8601 date-time"),  # text that says no moment
    ("1764468666", "1764468666 is not a date-time"),  # epoch seconds: a number, not a date
    ("02:11:06", "02:11:06 is not a date-time"),  # a TOML time of day without its date
    ('["2026-11-30"]', "is not a date-time"),  # an array
])
def test_meta_when_that_is_no_date_time_is_refused(when, message):
    # `tables show` and the serve's boot line tell a table's age from it; one that says no moment was
    # accepted and the age silently left out.
    with pytest.raises(TableParseError, match="^meta.when: .*" + message.replace("[", r"\[")):
        CostTable.parse(make_table().to_toml().replace('"2026-10-04T12:00:00Z"', when))


def test_table_without_meter_has_no_joule_fields():
    text = make_table(key=NO_METER).to_toml()
    assert "_j" not in text
    assert not CostTable.parse(text).has_energy


# -- malformed tables: refused with TableParseError, never another exception ---------------------

junk = (st.text(max_size=8) | st.booleans() | st.sampled_from([math.nan, math.inf, -math.inf, 0.0, 0, -0.2, -1])
        | st.floats(max_value=-1e-300, allow_nan=False, allow_infinity=False) | st.just(10**400)
        | st.lists(st.integers(), max_size=2) | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def doc_of(table: CostTable) -> dict:
    doc = {"schema": 1, "key": table.key.to_dict(), "meta": dict(table.meta),
           "cells": [c.to_dict() for c in table.cells]}
    if table.verify_cells:
        doc["verify_cells"] = [c.to_dict() for c in table.verify_cells]
    return doc


@st.composite
def malformed(draw) -> tuple[str, str]:
    """(mutation, TOML text) where the mutation is sure to make a valid table invalid."""
    table = draw(tables(energy_source="nvml"))
    doc = doc_of(table)
    cells = doc["cells"]
    i = draw(st.integers(0, len(cells) - 1))
    kind = draw(st.sampled_from(["drop_top", "drop_key", "drop_cell_field", "bad_cost", "bad_int", "bad_key_field",
                                 "missing_depth", "duplicate", "schema", "joules_under_none", "no_joules",
                                 "typo", "not_a_table", "verify_shallow", "verify_stray_width", "verify_gap",
                                 "verify_no_joules", "verify_draft"]))
    if kind == "drop_top":
        del doc[draw(st.sampled_from(["schema", "key", "cells"]))]
    elif kind == "drop_key":
        del doc["key"][draw(st.sampled_from(["box_class", "recipe", "energy_source", "plan_digests"]))]
    elif kind == "drop_cell_field":
        del cells[i][draw(st.sampled_from(["n", "k", "verify_s", "draft_s", "verify_j", "draft_j"]))]
    elif kind == "bad_cost":
        cells[i][draw(st.sampled_from(["verify_s", "verify_j"]))] = draw(junk)
    elif kind == "bad_int":
        value = draw(junk)
        assume(not (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 512))
        cells[i]["n"] = value
    elif kind == "bad_key_field":
        value = draw(junk)
        field = draw(st.sampled_from(["box_class", "recipe", "energy_source"]))
        assume(not (isinstance(value, str) and value.strip() and field != "energy_source"))
        assume(value not in ENERGY_SOURCES)
        doc["key"][field] = value
    elif kind == "missing_depth":
        assume(table.kmax >= 1)
        lower = [j for j, c in enumerate(cells) if c["k"] < table.kmax]
        del cells[draw(st.sampled_from(lower))]
    elif kind == "duplicate":
        cells.append(dict(cells[i]))
    elif kind == "schema":
        doc["schema"] = draw(junk.filter(lambda v: v != 1 or isinstance(v, bool)))
    elif kind == "joules_under_none":
        doc["key"]["energy_source"] = "none"
    elif kind == "no_joules":
        del cells[i]["verify_j"], cells[i]["draft_j"]
    elif kind == "typo":
        name = draw(st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=10))
        assume(name not in Cell.__dataclass_fields__)
        cells[i][name] = cells[i].pop("verify_s")
    elif kind == "not_a_table":
        doc["key"] = draw(junk.filter(lambda v: not isinstance(v, dict)))
    else:  # one verify cell that breaks a rule, in place of any the table had
        n, k = draw(st.sampled_from(table.widths)), table.kmax + 1
        if kind == "verify_shallow":  # a run that starts inside the cells' depths past 1 (0 is no depth at all)
            k = draw(st.sampled_from([0, *range(2, table.kmax + 1)]))
        elif kind == "verify_stray_width":
            n = max(table.widths) + 1
        elif kind == "verify_gap":
            k += 1
        entry = {"n": n, "k": k, "verify_s": 0.01, "verify_j": 1.0}
        if kind == "verify_no_joules":
            del entry["verify_j"]
        elif kind == "verify_draft":
            entry["draft_s"] = 0.001  # a verify cell prices no draft
        doc["verify_cells"] = [entry]
    return kind, tomli_w.dumps(doc)


@given(malformed())
def test_malformed_tables_are_refused_with_a_one_line_parse_error(case):
    kind, text = case
    with pytest.raises(TableParseError) as caught:
        CostTable.parse(text)
    message = str(caught.value)
    assert message and "\n" not in message, (kind, message)


toml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=12,
)


@given(st.dictionaries(st.sampled_from(["schema", "key", "cells", "meta", "verify_cells", "x"]), toml_values,
                      max_size=4))
def test_any_toml_document_is_either_a_table_or_a_parse_error(doc):
    # Arbitrary nested junk under the table's own field names: never any other exception.
    doc = _drop_none(doc)
    try:
        text = tomli_w.dumps(doc)
    except (TypeError, ValueError):
        assume(False)
    try:
        CostTable.parse(text)
    except TableParseError:
        pass


def _drop_none(value):
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value if v is not None]
    return value


@given(st.text(max_size=200))
def test_any_text_is_either_a_table_or_a_parse_error(text):
    try:
        CostTable.parse(text)
    except TableParseError:
        pass


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("schema = [", "not valid TOML"),  # broken TOML
        ("x = " + "[" * 5000, "not valid TOML"),  # nesting deep enough to exhaust recursion
        ("x = " + "9" * 5000, "not valid TOML"),  # an integer Python refuses to convert
        ("schema = 2", "schema: 2 is not a supported schema version (this met reads 1)"),
        ("schema = true", "schema: true is not a supported schema version"),  # bool is an int in Python
        ("shema = 1", "shema: unknown field (did you mean schema?)"),
    ],
)
def test_refusals_name_what_is_wrong(text, message):
    with pytest.raises(TableParseError, match="^" + message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        CostTable.parse(text)


def test_bytes_are_not_text():
    with pytest.raises(TableParseError, match="is not text"):
        CostTable.parse(b"schema = 1")  # type: ignore[arg-type]


def test_message_names_the_field_path_and_value():
    # The fourth cell in file order is cells[3], whatever order the table sorts them in.
    doc = doc_of(make_table())
    doc["cells"][3]["verify_s"] = -0.2
    with pytest.raises(TableParseError) as caught:
        CostTable.parse(tomli_w.dumps(doc))
    assert str(caught.value) == "cells[3].verify_s: -0.2 is not a finite positive cost"
    assert (caught.value.path, caught.value.value) == ("cells[3].verify_s", -0.2)


@pytest.mark.parametrize(
    ("cell", "message"),
    [
        (dict(n=1, k=0, verify_s=0.01, draft_s=0.001), "draft_s: 0.001 must be 0 at k = 0"),  # k = 0 drafts nothing
        (dict(n=1, k=1, verify_s=0.01, draft_s=0.0), "draft_s: 0.0 is not a finite positive cost"),
        (dict(n=0, k=0, verify_s=0.01, draft_s=0.0), "n: 0 is out of range"),  # a step has a sequence
        (dict(n=1, k=-1, verify_s=0.01, draft_s=0.0), "k: -1 is out of range"),
        (dict(n=1, k=0, verify_s=math.nan, draft_s=0.0), "verify_s: nan is not a finite positive cost"),
        (dict(n=1, k=0, verify_s=0.01, draft_s=0.0, verify_j=1.0), "draft_j: is missing"),  # joules come in pairs
        (dict(n=1, k=0, verify_s=0.01, draft_s=0.0, verify_s_spread=-1.0), "verify_s_spread: -1.0 is not a spread"),
        (dict(n=1, k=0, verify_s=0.01, draft_s=0.0, verify_j_spread=0.1), "verify_j_spread: 0.1 is given for a cell"),
        (dict(n=1, k=0, verify_s=0.01, draft_s=0.0, catchup_s=1e-5), "catchup_s: 1e-05 is given at k = 0"),
        (dict(n=1, k=1, verify_s=0.01, draft_s=0.001, catchup_s=-1e-5), "catchup_s: -1e-05 is not a cost per row"),
        (dict(n=1, k=1, verify_s=0.01, draft_s=0.001, catchup_s=math.inf), "catchup_s: inf is not a finite number"),
    ],
)
def test_cell_validates_itself(cell, message):
    with pytest.raises(TableParseError, match="^" + message.replace("(", r"\(")):
        Cell(**cell)


def test_table_refuses_a_width_missing_a_depth_and_duplicates():
    cells = list(make_table().cells)
    with pytest.raises(TableParseError, match=r"^cells: width n=4 has no cell at k=1 \(every width needs"):
        CostTable(KEY, [c for c in cells if (c.n, c.k) != (4, 1)])
    with pytest.raises(TableParseError, match=r"^cells\[6\]: duplicates the cell n=1 k=0 at cells\[0\]"):
        CostTable(KEY, [*cells, cells[0]])
    with pytest.raises(TableParseError, match="^cells: is empty"):
        CostTable(KEY, [])


def test_energy_fields_must_match_the_energy_source():
    metered, bare = make_table(), make_table(key=NO_METER)
    with pytest.raises(TableParseError, match=r'^cells\[0\]\.verify_j: is missing \(key.energy_source is "nvml"'):
        CostTable(KEY, bare.cells)
    with pytest.raises(TableParseError, match=r'^cells\[0\]\.verify_j: 2.0 is given but key.energy_source is "none"'):
        CostTable(NO_METER, metered.cells)


# -- cell(n, k): linear in width, nearest width outside ----------------------------------------


def test_cell_interpolates_linearly_in_width():
    # Widths 1 and 5: verify 1.0 and 3.0 s at k = 1, joules 2.0 and 6.0. At n = 2 (a quarter of the
    # way): 1.0 + 0.25 * 2.0 = 1.5 s and 2.0 + 0.25 * 4.0 = 3.0 J; at n = 3 the midpoint exactly.
    key = KEY
    table = CostTable(key, [Cell(1, 0, 1.0, 0.0, 2.0, 0.0), Cell(1, 1, 1.0, 0.5, 2.0, 1.0),
                            Cell(5, 0, 3.0, 0.0, 6.0, 0.0), Cell(5, 1, 3.0, 0.25, 6.0, 1.0)])
    assert table.cell(2, 1) == Cell(2, 1, 1.5, 0.4375, 3.0, 1.0)
    assert table.cell(3, 1) == Cell(3, 1, 2.0, 0.375, 4.0, 1.0)
    assert table.cell(2, 1) is table.cell(2, 1)  # made once: the planner asks several times a step
    for bad in (True, 2.0, "2"):  # a width that hashes like a cached one is still refused
        with pytest.raises(ValueError, match="is not a whole number in 1"):
            table.cell(bad, 1)
    assert table.cell(3, 0).draft_s == 0.0  # k = 0 stays a plain decode at every width
    # a catch-up cost per row interpolates too (1e-5 and 3e-5 s: 1.5e-5 at n = 2), and stays absent where it is
    caught = CostTable(key, [Cell(1, 0, 1.0, 0.0, 2.0, 0.0), Cell(1, 1, 1.0, 0.5, 2.0, 1.0, catchup_s=1e-5),
                             Cell(5, 0, 3.0, 0.0, 6.0, 0.0), Cell(5, 1, 3.0, 0.25, 6.0, 1.0, catchup_s=3e-5)])
    assert caught.cell(2, 1).catchup_s == pytest.approx(1.5e-5) and caught.cell(2, 0).catchup_s is None
    assert table.cell(2, 1).catchup_s is None
    assert CostTable.parse(caught.to_toml()) == caught


def test_cell_at_a_measured_width_is_the_measured_cell():
    table = make_table()
    assert table.cell(4, 2) is table.cells[-1]


def test_cell_outside_the_measured_range_takes_the_nearest_width():
    table = make_table(widths=(2, 8))
    below, above = table.cell(1, 1), table.cell(64, 1)
    assert (below.n, below.verify_s, below.verify_j) == (1, table.cell(2, 1).verify_s, table.cell(2, 1).verify_j)
    assert (above.n, above.verify_s, above.draft_s) == (64, table.cell(8, 1).verify_s, table.cell(8, 1).draft_s)
    assert table.cell(MAX_WIDTH, 1).verify_s == table.cell(8, 1).verify_s  # as far as a table may list
    with pytest.raises(ValueError, match=r"is not a whole number in 1\.\.=65536"):
        table.cell(MAX_WIDTH + 1, 1)  # past any width a table may list: a caller bug, not a parse error


@given(tables(), st.integers(1, 600), st.data())
def test_interpolated_costs_lie_between_their_neighbours(table, n, data):
    k = data.draw(st.integers(0, table.kmax))
    widths = table.widths
    below = max((w for w in widths if w <= n), default=widths[0])
    above = min((w for w in widths if w >= n), default=widths[-1])
    got, lo, hi = table.cell(n, k), table.cell(below, k), table.cell(above, k)
    assert got.n == n
    for attr in ("verify_s", "draft_s"):
        a, b = sorted((getattr(lo, attr), getattr(hi, attr)))
        assert a * (1 - 1e-12) <= getattr(got, attr) <= b * (1 + 1e-12)


@pytest.mark.parametrize(("n", "k"), [(0, 0), (1, 3), (1, -1), (True, 0)])
def test_cell_refuses_a_width_or_depth_the_table_cannot_answer(n, k):
    with pytest.raises(ValueError):
        make_table().cell(n, k)


# -- verify cells: the verify of copies, from 1 or past kmax ------------------------------------


def verify_cells_for(depths: dict[int, int], kmax=2, key=KEY) -> list[VerifyCell]:
    """Verify cells k = kmax + 1..=depths[n] at each width, priced as make_table's cells continue."""
    joules = key.energy_source != "none"
    return [VerifyCell(n, k, 0.01 * n + 0.001 * k, 1.0 + n + k if joules else None)
            for n, deepest in depths.items() for k in range(kmax + 1, deepest + 1)]


def deep_table(depths: dict[int, int], widths=(1, 4), key=KEY) -> CostTable:
    """make_table's cells (kmax 2) and verify cells as deep as `depths` says, per width."""
    return CostTable(key, make_table(widths, key=key).cells, {}, verify_cells_for(depths, key=key))


def test_verify_depth_at_a_measured_width_is_its_own_deepest():
    # Width 4 measures copies to k = 4, width 1 none (kmax 2): at n = 4 the table prices k = 4, so the
    # planner may copy that deep there. The lesser of two widths is for widths between them only
    # (verify_depth(4) was min(width 1's, width 4's) = 2).
    table = deep_table({4: 4})
    assert table.verify_depth(4) == 4
    assert table.verify_depth(1) == 2
    assert table.verify_cell(4, 4).verify_s == pytest.approx(0.044)


@pytest.mark.parametrize("bad", [0, -3, MAX_WIDTH + 1, True, 2.0, "2", [2]])
def test_verify_depth_refuses_what_is_no_width(bad):
    # As cell() does: a caller bug, refused, not answered with a neighbour's depth (0 and True were).
    table = deep_table({1: 3})
    table.verify_depth(1)  # cached: True hashes as 1 and must not find it
    with pytest.raises(ValueError, match="is not a whole number in 1"):
        table.verify_depth(bad)


def test_the_table_strategy_generates_verify_cells():
    # The round trip and interpolation properties above see verify cells, at widths of differing depth.
    deep = find(tables(), lambda t: len({t.verify_depth(n) for n in t.widths}) > 1 and len(t.verify_cells) >= 2)
    assert deep.verify_cells


def test_verify_cells_round_trip_in_the_documented_layout():
    # One [[verify_cells]] block per verify cell, after the [[cells]], sorted by (n, k), whatever the order given.
    table = CostTable(KEY, make_table().cells, {}, list(reversed(verify_cells_for({1: 4, 4: 3}))))
    text = table.to_toml()
    assert text.count("[[verify_cells]]") == 3 and text.index("[[cells]]") < text.index("[[verify_cells]]")
    assert [(c.n, c.k) for c in table.verify_cells] == [(1, 3), (1, 4), (4, 3)]
    again = CostTable.parse(text)
    assert again == table and again.verify_cells == table.verify_cells and again.to_toml() == text
    assert "verify_cells" not in make_table().to_toml()  # none: no empty array written
    spread = CostTable(NO_METER, make_table(key=NO_METER).cells, {}, [VerifyCell(4, 3, 0.05, verify_s_spread=0.0)])
    assert CostTable.parse(spread.to_toml()).verify_cells == (VerifyCell(4, 3, 0.05, verify_s_spread=0.0),)


def _verify_doc(key=KEY) -> dict:
    """deep_table({1: 4, 4: 3}) as a document: verify_cells[0..=2] are (1, 3), (1, 4), (4, 3); kmax is 2."""
    return doc_of(deep_table({1: 4, 4: 3}, key=key))


def _set(i, field, value):
    def mutate(doc):
        doc["verify_cells"][i][field] = value
    return mutate


def _drop(i, field=None):
    def mutate(doc):
        if field is None:
            del doc["verify_cells"][i]
        else:
            del doc["verify_cells"][i][field]
    return mutate


def _rename(i, old, new):
    def mutate(doc):
        doc["verify_cells"][i][new] = doc["verify_cells"][i].pop(old)
    return mutate


def _whole_array(value):
    def mutate(doc):
        doc["verify_cells"] = value
    return mutate


def _append_copy(i):
    def mutate(doc):
        doc["verify_cells"].append(dict(doc["verify_cells"][i]))
    return mutate


@pytest.mark.parametrize(("key", "mutate", "message"), [
    (KEY, _set(2, "k", 2), "verify_cells: width n=4 has no verify cell at k=1"),  # inside kmax, a run starts at 1
    (KEY, _set(0, "k", 0), "verify_cells[0].k: 0 is out of range (expected 1..=64)"),
    (KEY, _set(0, "k", MAX_DEPTH + 1), "verify_cells[0].k: 65 is out of range"),
    (KEY, _set(2, "n", 2), "verify_cells[2].n: 2 is not a width of the cells (1, 4)"),  # nothing to price it beside
    (KEY, _append_copy(1), "verify_cells[3]: duplicates the verify cell n=1 k=4 at verify_cells[1]"),
    (KEY, _drop(0), "verify_cells: width n=1 has no verify cell at k=3"),  # k = 4 without k = 3: a gap
    (KEY, _drop(1, "verify_j"), 'verify_cells[1].verify_j: must be given under key.energy_source "nvml"'),
    (NO_METER, _set(0, "verify_j", 4.0), 'verify_cells[0].verify_j: 4.0 must be absent under key.energy_source "none"'),
    (NO_METER, _set(0, "verify_j_spread", 0.1),
     "verify_cells[0].verify_j_spread: 0.1 is given for a cell without joules"),
    (KEY, _set(0, "draft_s", 0.001), "verify_cells[0].draft_s: unknown field"),  # a verify cell prices no draft
    (KEY, _set(0, "catchup_s", 1e-5), "verify_cells[0].catchup_s: unknown field"),
    (KEY, _rename(0, "verify_s", "verfy_s"), "verify_cells[0].verfy_s: unknown field (did you mean verify_s?)"),
    (KEY, _drop(0, "verify_s"), "verify_cells[0].verify_s: is missing"),
    (KEY, _drop(2, "n"), "verify_cells[2].n: is missing"),
    (KEY, _set(0, "verify_s", 0), "verify_cells[0].verify_s: 0 is not a finite positive cost"),
    (KEY, _set(0, "verify_s", -0.5), "verify_cells[0].verify_s: -0.5 is not a finite positive cost"),
    (KEY, _set(0, "verify_s", math.nan), "verify_cells[0].verify_s: nan is not a finite positive cost"),
    (KEY, _set(0, "verify_s", "0.1"), "verify_cells[0].verify_s: '0.1' is not a number"),
    (KEY, _set(1, "verify_j", math.inf), "verify_cells[1].verify_j: inf is not a finite positive cost"),
    (KEY, _set(1, "verify_j", 0.0), "verify_cells[1].verify_j: 0.0 is not a finite positive cost"),
    (KEY, _set(0, "verify_s_spread", -0.1), "verify_cells[0].verify_s_spread: -0.1 is not a spread"),
    (KEY, _set(0, "verify_j_spread", math.inf), "verify_cells[0].verify_j_spread: inf is not a finite number"),
    (KEY, _set(0, "n", 1.0), "verify_cells[0].n: 1.0 is not a whole number"),
    (KEY, _set(0, "k", True), "verify_cells[0].k: true is not a whole number"),
    (KEY, _whole_array(3), r"verify_cells: 3 is not an array of tables ([[verify_cells]])"),
    (KEY, _whole_array([1]), "verify_cells[0]: 1 is not a table"),
])
def test_verify_cells_breaking_a_rule_are_refused_naming_the_field(key, mutate, message):
    doc = _verify_doc(key)
    CostTable.parse(tomli_w.dumps(doc))  # valid before the mutation
    mutate(doc)
    with pytest.raises(TableParseError) as caught:
        CostTable.parse(tomli_w.dumps(doc))
    assert str(caught.value).startswith(message), str(caught.value)


def test_a_width_may_have_no_verify_cells_and_an_empty_array_is_none():
    assert deep_table({4: 3}).verify_depth(1) == 2  # width 1 has none: its verify goes as deep as its cells
    doc = doc_of(make_table())
    doc["verify_cells"] = []
    assert CostTable.parse(tomli_w.dumps(doc)) == make_table()


@pytest.mark.parametrize(("cell", "message"), [
    (dict(n=1, k=0, verify_s=0.01), "k: 0 is out of range"),  # a plain step verifies no copy
    (dict(n=0, k=3, verify_s=0.01), "n: 0 is out of range"),
    (dict(n=1, k=3, verify_s=0.0), "verify_s: 0.0 is not a finite positive cost"),
    (dict(n=1, k=3, verify_s=0.01, verify_j=-1.0), "verify_j: -1.0 is not a finite positive cost"),
    (dict(n=1, k=3, verify_s=0.01, verify_s_spread=math.nan), "verify_s_spread: nan is not a finite number"),
    (dict(n=1, k=3, verify_s=0.01, verify_j_spread=0.1), "verify_j_spread: 0.1 is given for a cell without joules"),
])
def test_verify_cell_validates_itself(cell, message):
    with pytest.raises(TableParseError, match="^" + message):
        VerifyCell(**cell)


def test_a_table_refuses_what_is_not_a_verify_cell():
    cells = make_table().cells
    with pytest.raises(TableParseError, match=r"^verify_cells\[0\]: .* is not a VerifyCell"):
        CostTable(KEY, cells, {}, [cells[2]])  # a Cell at k = 2 is not a verify cell


def test_verify_depth_at_measured_between_and_outside_widths():
    # Widths 1, 4, 16 with verify cells to k = 5, 3 and none (kmax 2).
    table = CostTable(KEY, make_table((1, 4, 16)).cells, {}, verify_cells_for({1: 5, 4: 3}))
    assert [table.verify_depth(n) for n in (1, 4, 16)] == [5, 3, 2]  # measured: its own
    assert [table.verify_depth(n) for n in (2, 3)] == [3, 3]  # between 1 and 4: the lesser, 4's
    assert [table.verify_depth(n) for n in (5, 15)] == [2, 2]  # between 4 and 16: 16's kmax
    assert table.verify_depth(MAX_WIDTH) == 2  # above: the largest width's
    rising = CostTable(KEY, make_table((2, 8)).cells, {}, verify_cells_for({2: 3, 8: 6}))
    assert (rising.verify_depth(1), rising.verify_depth(5), rising.verify_depth(100)) == (3, 3, 6)
    assert make_table().verify_depth(3) == make_table().kmax  # no verify cells: kmax everywhere


def test_verify_cell_interpolates_linearly_in_width():
    # Widths 1 and 5, kmax 1; verify cells at k = 2: 1.0 and 3.0 s, 2.0 and 6.0 J (spreads at both).
    # At n = 2 (a quarter of the way): 1.5 s and 3.0 J, no spreads; at n = 3 the midpoint.
    cells = [Cell(n, k, 1.0, 0.5 * k, 2.0, 1.0 * k) for n in (1, 5) for k in (0, 1)]
    table = CostTable(KEY, cells, {}, [VerifyCell(1, 2, 1.0, 2.0, 0.1, 0.2), VerifyCell(1, 3, 1.1, 2.1),
                                       VerifyCell(5, 2, 3.0, 6.0, 0.3, 0.4)])
    assert table.verify_cell(2, 2) == VerifyCell(2, 2, 1.5, 3.0)
    assert table.verify_cell(3, 2) == VerifyCell(3, 2, 2.0, 4.0)
    assert table.verify_cell(2, 2) is table.verify_cell(2, 2)  # made once, as cell()'s are
    assert table.verify_cell(5, 2) is table.verify_cells[-1]  # measured: the cell itself, spreads and all
    assert table.verify_cell(9, 2) == VerifyCell(9, 2, 3.0, 6.0, 0.3, 0.4)  # above: the largest width's
    assert table.verify_cell(2, 1) == table.cell(2, 1) and isinstance(table.verify_cell(2, 1), Cell)  # to kmax: a Cell
    assert table.verify_cell(1, 3).verify_s == 1.1  # width 1 is priced to k = 3 ...
    for n, k in ((2, 3), (5, 3), (9, 3), (1, 4)):  # ... but not between it and width 5, nor at or past 5
        with pytest.raises(ValueError, match=f"depth {k} is outside the table's 0..={table.verify_depth(n)}"):
            table.verify_cell(n, k)
    for n, k in ((0, 2), (True, 2), (2.0, 2), (2, -1), (2, True)):
        with pytest.raises(ValueError):
            table.verify_cell(n, k)


@given(tables(), st.integers(1, 600), st.data())
def test_interpolated_verify_costs_lie_between_their_neighbours(table, n, data):
    k = data.draw(st.integers(0, table.verify_depth(n)))
    widths = table.widths
    below = max((w for w in widths if w <= n), default=widths[0])
    above = min((w for w in widths if w >= n), default=widths[-1])
    got, lo, hi = table.verify_cell(n, k), table.verify_cell(below, k), table.verify_cell(above, k)
    assert got.n == n and isinstance(got, Cell) == (isinstance(lo, Cell) and isinstance(hi, Cell))
    assert k > table.kmax or isinstance(got, Cell) or not (isinstance(lo, Cell) and isinstance(hi, Cell))
    for attr in ("verify_s", "verify_j"):
        if getattr(got, attr) is not None:
            a, b = sorted((getattr(lo, attr), getattr(hi, attr)))
            assert a * (1 - 1e-12) <= getattr(got, attr) <= b * (1 + 1e-12)


def test_cell_still_refuses_a_depth_past_kmax():
    # cell() is the drafter's cost: no draft is priced past kmax, even where a verify cell is measured
    # there or an interpolated one was made before.
    table = deep_table({1: 4, 4: 3})
    table.verify_cell(2, 3)
    for n in (1, 2, 4, 8):
        with pytest.raises(ValueError, match=r"depth 3 is outside the table's 0\.\.=2"):
            table.cell(n, 3)


def test_step_joules_at_a_verify_only_depth():
    # verify_j = 1 + n + k: (1, 4) is 6 J, (4, 3) is 8 J; at n = 2, k = 3, a third of the way from 5 to 8 J.
    table = deep_table({1: 4, 4: 3})
    assert table.step_joules(1, 4, drafted=False) == 6.0
    assert table.step_joules(4, 3, draft_width=0) == 8.0  # drafted for none of its sequences: copies only
    assert table.step_joules(2, 3, drafted=False) == pytest.approx(6.0)
    with pytest.raises(ValueError, match=r"depth 3 is outside the table's 0\.\.=2"):
        table.step_joules(1, 3)  # the drafter drafts to kmax only
    with pytest.raises(ValueError, match=r"depth 4 is outside the table's 0\.\.=3"):
        table.step_joules(4, 4, drafted=False)  # past width 4's verify cells
    assert deep_table({1: 4}, key=NO_METER).step_joules(1, 4, drafted=False) is None


def test_verify_cells_from_one_price_copies_where_the_cells_price_drafting_steps():
    # Width 1 measures copies at k = 1..3 (kmax 2): a copy 1 or 2 deep is priced at its verify cell, not at
    # the drafting step's verify; drafting still pays the cell's; width 4 has none, so its cells price copies.
    copies = [VerifyCell(1, k, 0.005 + 0.001 * k, 0.5 + k) for k in (1, 2, 3)]
    table = CostTable(KEY, make_table().cells, {}, copies)
    assert [table.verify_cell(1, k).verify_s for k in (1, 2, 3)] == [0.006, 0.007, 0.008]
    assert table.cell(1, 1).verify_s == 0.011 and table.verify_cell(1, 0) is table.cell(1, 0)
    assert table.verify_cell(4, 2) is table.cell(4, 2) and table.verify_depth(1) == 3
    # n = 2, a third of the way to width 4: the copy's verify cell and width 4's cell, interpolated
    between = table.verify_cell(2, 1)
    assert isinstance(between, VerifyCell) and between.n == 2
    assert (between.verify_s, between.verify_j) == (pytest.approx(0.006 + (0.041 - 0.006) / 3), pytest.approx(3.0))
    assert table.step_joules(1, 2, drafted=False) == 2.5  # copies: the verify cell's joules
    assert table.step_joules(1, 2) == 4.0 + 1.0  # drafted: the cell's verify and draft
    # a run from 1 that stops inside kmax (a narrow copy pool) is whole; the cells price the rest
    narrow = CostTable(KEY, make_table().cells, {}, [VerifyCell(4, 1, 0.03, 2.0)])
    assert narrow.verify_depth(4) == 2 and narrow.verify_cell(4, 2) is narrow.cell(4, 2)
    assert CostTable.parse(table.to_toml()) == table

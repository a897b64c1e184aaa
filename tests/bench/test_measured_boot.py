"""The measured planner's boot: every key mismatch refuses with 78 naming its field; bad files refuse with 65."""

import pytest

from met.bench import measured_boot as boot
from met.bench.measured_boot import BootError, MeasuredBoot
from met.engine.identity import mtp_drafter_key
from met.speculative.spec_cost import DrafterKey, SpecCostState, TableKey
from met.speculative.spec_cost.plan import unknown

from boot_tables import BOX, calibration, serve_key, settings, table, with_fields


@pytest.fixture
def recipe(micro_embedded):
    """An embedded recipe of a micro model, in a temporary weights folder."""
    return micro_embedded[1]


def _variants(key: TableKey) -> dict[str, TableKey]:
    digests = dict(key.plan_digests)
    return {
        "schema": with_fields(key, schema=2),  # written by another schema version
        "box_class": with_fields(key, box_class="nvidia-h200x1"),  # another class of box
        "recipe": with_fields(key, recipe="micro-t@0000000000000000"),  # other weights
        "energy_source": with_fields(key, energy_source="nvml"),  # measured with a meter this serve does not plan with
        "plan_digests.verify": with_fields(key, plan_digests=digests | {"verify": "0" * 16}),  # another plan
        "plan_digests.draft_mtp": with_fields(key, plan_digests={m: d for m, d in digests.items() if m != "draft_mtp"}),
    }


@pytest.mark.parametrize("field", ["schema", "box_class", "recipe", "energy_source", "plan_digests.verify",
                                   "plan_digests.draft_mtp", "drafter"])
def test_every_mismatch_refuses_with_78_naming_its_field(recipe, field):
    # one field differs: exit status 78, one mismatch listed, the field named with both values
    key = serve_key(recipe)
    drafter = mtp_drafter_key(recipe)
    t = table(_variants(key).get(field, key))
    cal = calibration(DrafterKey("mtp", "other-drafter", "abc") if field == "drafter" else drafter)
    with pytest.raises(BootError) as err:
        boot.check(t, cal, key, drafter, 0.1)
    assert err.value.code == 78
    assert len(err.value.lines) == 2 and err.value.lines[1].strip().startswith(f"{field}:")
    assert "this serve has" in err.value.lines[1]


def test_all_mismatches_are_listed_at_once(recipe):
    # box, recipe and drafter all differ: three lines, one each
    key = serve_key(recipe)
    t = table(with_fields(key, box_class="other", recipe="other@1"))
    with pytest.raises(BootError) as err:
        boot.check(t, calibration(DrafterKey("mtp", "x", "y")), key, mtp_drafter_key(recipe), 0.1)
    fields = [line.strip().split(":")[0] for line in err.value.lines[1:]]
    assert fields == ["box_class", "recipe", "drafter"]


def test_matching_files_boot(recipe, tmp_path):
    # the bench's key and drafter: a SpecCostState that plans
    key = serve_key(recipe)
    (tmp_path / "t.toml").write_text(table(key).to_toml())
    (tmp_path / "t.calibration.toml").write_text(calibration(mtp_drafter_key(recipe)).to_toml())
    state = boot.boot_measured(recipe, settings(), MeasuredBoot(tmp_path / "t.toml", tmp_path / "t.calibration.toml",
                                                                 0.1, "none", BOX))
    assert isinstance(state, SpecCostState) and state.plan(unknown(1)).k in (0, 1, 2)


@pytest.mark.parametrize("problem", ["missing", "invalid", "calibration missing"])
def test_missing_or_invalid_files_exit_65(recipe, tmp_path, problem):
    # nothing is approximated: a table or calibration that cannot be read is refused with 65
    key = serve_key(recipe)
    t, c = tmp_path / "t.toml", tmp_path / "t.calibration.toml"
    if problem != "missing":
        t.write_text(table(key).to_toml() if problem == "calibration missing" else "schema = 1\n[key]\n")
    c.write_text(calibration(mtp_drafter_key(recipe)).to_toml()) if problem != "calibration missing" else None
    with pytest.raises(BootError) as err:
        boot.boot_measured(recipe, settings(), MeasuredBoot(t, c, 0.1, "none", BOX))
    assert err.value.code == 65 and ("calibration" in err.value.lines[0]) == (problem == "calibration missing")


def test_default_paths_are_the_bench_defaults():
    # tables/<box_class>/<recipe>.toml and the calibration beside it
    t = boot.default_table("cpu-x-2t", "met-tiny-py")
    assert str(t) == "tables/cpu-x-2t/met-tiny-py.toml"
    assert str(boot.default_calibration(t)) == "tables/cpu-x-2t/met-tiny-py.calibration.toml"

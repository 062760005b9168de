"""Comparisons that change one thing: knobs that change nothing are refused, the matrix's include,
exclude and compare, and the shipped ablations' steps each differ from the one they are measured
against in one mechanism."""
import numpy as np
import pandas as pd
import pytest
import yaml

from experiments.effects import effects, placement_share
from experiments.spec import SpecError, load_spec, parse_spec
from experiments.summary import in_words
from experiments.spec.checks import changed_mechanisms
from helpers import REPO

SHIPPED = sorted((REPO / "experiments").glob("*.yaml"))


@pytest.mark.parametrize("overrides,message", [
    ({"controller": {"lb": "spray"}}, r"controller\.lb: 'spray' is not allowed \(ecmp or single with job\.transport "
                                      r"tcp: a TCP connection keeps its 5-tuple"),
    ({"job": {"fusion": "ddp", "send_order": "caramel"}}, r"job\.fusion: 'ddp' is not allowed \('none' here: "),
    ({"job": {"mode": "ps", "fusion": "ddp"}}, r"job\.fusion: 'ddp' is not allowed"),
    ({"job": {"partition_bytes": 196608}}, r"job\.partition_bytes: 196608 is not allowed \(65536 here: only "
                                           r"caramel's and bytescheduler's"),
    ({"job": {"mode": "ps", "send_order": "best", "partition_bytes": 196608}}, r"job\.partition_bytes"),
    ({"job": {"send_order": "caramel", "credit_bytes": 1024}}, r"job\.credit_bytes: 1024 is not allowed"),
    ({"job": {"ps_slice_bytes": 65536}}, r"job\.ps_slice_bytes: 65536 is not allowed \(0 here: only a parameter "
                                         r"server slices layers"),
])
def test_a_knob_that_changes_nothing_is_refused_with_one_line(overrides, message):
    with pytest.raises(SpecError, match=f"^spec error: {message}") as error:
        parse_spec(overrides)
    assert "\n" not in str(error.value) and "would change nothing" in str(error.value)


@pytest.mark.parametrize("path", SHIPPED, ids=[path.stem for path in SHIPPED])
def test_no_shipped_scheme_sets_a_knob_that_changes_nothing(path):
    """Every run of every shipped spec validates with the refusals on, and each knob its point
    sets away from the base changes a mechanism or the job (a control, the baseline again, sets
    nothing)."""
    spec = load_spec(path)
    for run in spec.runs:
        reference = spec.reference(run.axes)
        if reference is None:
            continue
        other = next((r for r in spec.runs if r.rep == run.rep and r.axes == reference), None)
        if other is None or run.config != other.config:
            continue
        assert run.axes[spec.baseline[0]] != reference[spec.baseline[0]]
        assert not any(spec.header.matrix[spec.baseline[0]]["values"][run.axes[spec.baseline[0]]] or {}), \
            f"{run.run_id} sets knobs and runs its reference's configuration"


@pytest.mark.parametrize("name", ["headline", "ablation", "default", "spraying"])
def test_each_step_differs_from_the_one_it_is_measured_against_in_one_mechanism(name):
    spec = load_spec(REPO / "experiments" / f"{name}.yaml")
    axis = spec.baseline[0]
    steps = 0
    for run in spec.runs:
        reference = spec.reference(run.axes)
        if reference is None or run.rep > 1 or run.axes[axis] == "control":
            continue
        other = next(r for r in spec.runs if r.rep == 1 and r.axes == reference)
        changed = changed_mechanisms(other.config, run.config)
        explicit = run.axes[axis] in next(a for a in spec.axes if a.name == axis).compare
        if explicit or name != "ablation":
            # An ablation's leave-one-out without the loss bound also leaves out drop marking, which needs it.
            allowed = {("loss bound", "drop marking")} if name == "ablation" else set()
            assert len(changed) == 1 or tuple(changed) in allowed, (run.run_id, changed)
            steps += 1
    assert steps >= 4


LADDER = """
repetitions: 2
job: {transport: mlt}
matrix:
  scheme:
    baseline: base
    values:
      base: {job.transport: tcp}
      mlt: {}
      spray: {controller.lb: spray}
      sliced: {controller.lb: spray}
    compare: {spray: mlt, sliced: spray}
  mode: {field: job.mode, values: [allreduce, ps]}
include:
  - {where: {scheme: sliced, mode: ps}, set: {job.ps_slice_bytes: 65536}}
exclude:
  - {scheme: sliced, mode: allreduce}
"""


def test_include_exclude_and_compare_make_a_ladder():
    spec = parse_spec(yaml.safe_load(LADDER))
    points = {tuple(run.axes.values()) for run in spec.runs}
    assert ("sliced", "allreduce") not in points and ("sliced", "ps") in points
    sliced = next(run for run in spec.runs if run.axes == {"scheme": "sliced", "mode": "ps"})
    assert sliced.job.ps_slice_bytes == 65536
    assert spec.reference({"scheme": "sliced", "mode": "ps"}) == {"scheme": "spray", "mode": "ps"}
    assert spec.reference({"scheme": "spray", "mode": "ps"}) == {"scheme": "mlt", "mode": "ps"}
    assert spec.reference({"scheme": "mlt", "mode": "allreduce"}) == {"scheme": "base", "mode": "allreduce"}
    assert spec.reference({"scheme": "base", "mode": "ps"}) is None
    again = parse_spec(yaml.safe_load(yaml.safe_dump(spec.resolved_document(), sort_keys=False)))
    assert again.runs == spec.runs and again.references == spec.references


def test_a_step_whose_reference_is_excluded_is_measured_against_that_step_s_own():
    document = yaml.safe_load(LADDER)
    document["exclude"].append({"scheme": "spray", "mode": "ps"})
    spec = parse_spec(document)
    assert spec.reference({"scheme": "sliced", "mode": "ps"}) == {"scheme": "mlt", "mode": "ps"}


@pytest.mark.parametrize("change,message", [
    (lambda d: d["matrix"]["scheme"]["compare"].update(spray="sliced"),
     r"matrix\.scheme\.compare: 'spray -> sliced -> spray' is not allowed \(comparisons that lead to the baseline"),
    (lambda d: d["matrix"]["scheme"]["compare"].update(spray="nope"),
     r"matrix\.scheme\.compare\.spray: 'nope' is not allowed \(another label of"),
    (lambda d: d["matrix"]["scheme"]["compare"].update(base="mlt"),
     r"matrix\.scheme\.compare: 'base' is not allowed \(a label of .* but the baseline base\)"),
    (lambda d: d["include"].clear(),
     r"matrix\.scheme\.compare\.sliced: 'spray' is not allowed \(a label whose runs differ from sliced's \(with "
     r"mode=ps\): the two run the same configuration, the step would change nothing\)"),
    (lambda d: d["exclude"].append({"scheme": "base"}),
     r"matrix\.scheme\.baseline: 'base' is not allowed \(a label run wherever mlt is"),
    (lambda d: d["exclude"].append({"schema": "base"}), r"exclude\.1\.schema: unknown field"),
    (lambda d: d["exclude"].append({"scheme": "bass"}), r"exclude\.1\.scheme: 'bass' is not allowed \(a label of"),
    (lambda d: d["exclude"].append({"mode": ["allreduce", "ps"]}),
     r"exclude: .* is not allowed \(points that leave some to run\)"),
    (lambda d: d["include"].append({"where": {"mode": "ps"}}),
     r"include\.1: \{where: \{mode: ps\}\} is not allowed \(a mapping with where and set, repetitions or both\)"),
    (lambda d: d["include"].append({"where": {"mode": "ps"}, "set": {}}), r"include\.1\.set: \{\} is not allowed"),
    (lambda d: d["include"].append({"where": {"mode": "ps"}, "repetitions": 0}),
     r"include\.1\.repetitions: 0 is not allowed \(an integer 1\.\.100\)"),
    (lambda d: d["include"].append({"where": {"mode": "ps"}, "repetitions": True}),
     r"include\.1\.repetitions: true is not allowed"),
    (lambda d: d["include"].append({"where": {"mode": "ps"}, "repetitions": 2000}),
     r"include\.1\.repetitions: 2000 is not allowed"),
    (lambda d: d["include"].append({"where": {"mode": "ps"}, "set": {"repetitions": 3}}),
     r"include\.1\.set: 'repetitions' is not allowed \(fields of "),
    (lambda d: d.update(confidence=1), r"confidence: 1 is not allowed \(a level between 0 and 1"),
    (lambda d: d.update(confidence=0), r"confidence: 0 is not allowed"),
    (lambda d: d["matrix"]["scheme"].update(baseline="Base"), r"matrix\.scheme\.baseline: 'Base' is not allowed"),
])
def test_a_bad_ladder_is_refused_with_one_line(change, message):
    document = yaml.safe_load(LADDER)
    change(document)
    with pytest.raises(SpecError, match=f"^spec error: {message}") as error:
        parse_spec(document)
    assert "\n" not in str(error.value)


def _runs(spec, times: dict[str, list[float]]) -> pd.DataFrame:
    """A runs table: each scheme's iteration time per repetition (both modes alike)."""
    rows = [{"run_id": run.run_id, "iter_time_mean_s": times[run.axes["scheme"]][run.rep - 1],
             "final_accuracy": 0.9, "fidelity_ok": True} for run in spec.runs]
    return pd.DataFrame(rows)


def test_effects_give_each_step_its_interval_and_the_summary_says_it_in_words():
    spec = parse_spec(yaml.safe_load(LADDER))
    runs = _runs(spec, {"base": [2.0, 2.4], "mlt": [1.9, 2.3], "spray": [1.0, 1.2], "sliced": [0.99, 1.21]})
    table = effects(runs, spec)
    spray = table[(table["scheme"] == "scheme=spray") & (table["metric"] == "speedup")
                  & (table["mode"] == "ps")].set_index("comparison")
    assert spray.loc["baseline", "against"] == "scheme=base" and spray.loc["step", "against"] == "scheme=mlt"
    assert spray.loc["step", "estimate"] == pytest.approx(1.9, rel=0.01) and spray.loc["step", "significant"]
    sliced = table[(table["scheme"] == "scheme=sliced") & (table["comparison"] == "step")
                   & (table["metric"] == "speedup")]
    assert list(sliced["mode"]) == ["ps"] and sliced.iloc[0]["verdict"] == "not significant"
    lines = in_words(table, spec.header.confidence)
    assert lines[0].startswith("Speedups at 95% confidence, paired by repetition where the two schemes' flows")
    ps = [line for line in lines if line.startswith("- ps, ")]
    assert ps[0].startswith("- ps, significant: spray vs base 2x [") and "spray vs mlt 1.91x [1.81, 2.02]" in ps[0]
    assert ps[1].startswith("- ps, not significant: mlt vs base 1.05x [") and "sliced vs spray 1x [" in ps[1]


def test_a_run_that_failed_the_guard_leaves_its_pair_out():
    spec = parse_spec(yaml.safe_load(LADDER))
    runs = _runs(spec, {"base": [2.0, 2.4], "mlt": [1.9, 2.3], "spray": [1.0, 1.2], "sliced": [0.99, 1.21]})
    runs.loc[runs["run_id"] == "scheme=base,mode=ps,rep=2", "fidelity_ok"] = False
    table = effects(runs, spec)
    mlt = table[(table["scheme"] == "scheme=mlt") & (table["mode"] == "ps") & (table["metric"] == "speedup")]
    assert mlt.iloc[0]["pairs"] == 1 and mlt.iloc[0]["verdict"] == "not judged (one repetition)"


def test_placement_explains_what_varies_between_its_classes():
    runs = pd.DataFrame({"mode": ["ps"] * 6, "scheme": ["scheme=base"] * 6,
                         "iter_time_mean_s": [1.0, 1.02, 0.98, 2.0, 2.02, 1.98],
                         "max_flows_per_uplink": [1, 1, 1, 2, 2, 2], "fidelity_ok": [True] * 6})
    (row,) = placement_share(runs).itertuples(index=False)
    logs = np.log(runs["iter_time_mean_s"])
    within = sum(((part - part.mean()) ** 2).sum() for part in (logs[:3], logs[3:]))
    assert row.runs == 6 and row.classes == "1 flows: 3 run(s), 1 s; 2 flows: 3 run(s), 2 s"
    assert row.placement_share == pytest.approx(1 - (within / 4) / logs.var(ddof=1), rel=1e-9)
    assert row.run_sd == pytest.approx(np.sqrt(within / 4), rel=1e-9)
    alike = runs.assign(max_flows_per_uplink=1)
    assert placement_share(alike).iloc[0]["classes"] == "1 flows: 6 run(s), 1.5 s"
    assert pd.isna(placement_share(alike).iloc[0]["placement_share"])


def test_placement_groups_by_the_measured_placement_and_needs_one_drawn_twice():
    runs = pd.DataFrame({"mode": ["allreduce"] * 4, "scheme": ["scheme=base"] * 4,
                         "iter_time_mean_s": [0.6, 1.2, 1.3, 0.62], "max_flows_per_uplink": [3] * 4,
                         "placement": ["leaf1>spine2: w0", "leaf1>spine1: w0", "leaf1>spine1: w0", "leaf1>spine2: w0"],
                         "fidelity_ok": [True] * 4})
    (row,) = placement_share(runs).itertuples(index=False)
    assert row.classes == "A: 2 run(s), 0.61 s; B: 2 run(s), 1.25 s" and row.placement_share > 0.95
    once = runs.assign(placement=["a", "b", "c", "d"])
    assert pd.isna(placement_share(once).iloc[0]["placement_share"])


def test_include_repetitions_gives_its_points_more_runs_with_the_next_seeds():
    document = yaml.safe_load(LADDER)
    document["include"].append({"where": {"scheme": "base"}, "repetitions": 4})
    spec = parse_spec(document)
    base = sorted((run.rep, run.job.seed) for run in spec.runs if run.axes == {"scheme": "base", "mode": "ps"})
    mlt = sorted((run.rep, run.job.seed) for run in spec.runs if run.axes == {"scheme": "mlt", "mode": "ps"})
    assert base == [(1, 0), (2, 1), (3, 2), (4, 3)] and mlt == [(1, 0), (2, 1)]
    assert len(spec.runs) == 7 * 2 + 2 * 2
    # repetitions outermost still: every point's repetition 2 before any repetition 3
    assert max(run.index for run in spec.runs if run.rep == 2) < min(run.index for run in spec.runs if run.rep == 3)
    again = parse_spec(yaml.safe_load(yaml.safe_dump(spec.resolved_document(), sort_keys=False)))
    assert again.runs == spec.runs


def _placed_runs(spec, times: dict[str, list[float]], placement: dict[str, list[str]]) -> pd.DataFrame:
    runs = _runs(spec, times)
    by_id = {run.run_id: placement[run.axes["scheme"]][run.rep - 1] for run in spec.runs}
    return runs.assign(placement=runs["run_id"].map(by_id))


def test_schemes_on_the_same_placement_are_paired_and_on_others_compared_as_two_samples():
    document = yaml.safe_load(LADDER)
    document["include"].append({"where": {"scheme": "base"}, "repetitions": 6})
    spec = parse_spec(document)
    # base's time is its placement's (1 or 2 s); mlt sends other 5-tuples, spray sprays the job
    base_placement = ["a", "b", "a", "b", "b", "a"]
    times = {"base": [1.0, 2.0, 1.02, 1.98, 2.02, 0.98], "mlt": [0.9, 1.1], "spray": [0.5, 0.505],
             "sliced": [0.5, 0.5]}
    placement = {"base": base_placement, "mlt": ["c", "d"], "spray": ["", ""], "sliced": ["", ""]}
    table = effects(_placed_runs(spec, times, placement), spec)
    speed = table[(table["metric"] == "speedup") & (table["mode"] == "ps")].set_index(["scheme", "comparison"])
    spray = speed.loc[("scheme=spray", "baseline")]
    assert spray["design"] == "unpaired" and (spray["runs_against"], spray["runs_scheme"]) == (6, 2)
    geometric = float(np.exp(np.mean(np.log(times["base"])) - np.mean(np.log(times["spray"]))))
    assert spray["estimate"] == pytest.approx(geometric) and spray["significant"]
    sliced = speed.loc[("scheme=sliced", "step")]  # same (no) placement as spray: paired
    assert sliced["design"] == "paired" and sliced["pairs"] == 2
    accuracy = table[(table["metric"] == "accuracy_delta_pt") & (table["scheme"] == "scheme=spray")
                     & (table["comparison"] == "baseline") & (table["mode"] == "ps")]
    assert accuracy.iloc[0]["design"] == "paired" and accuracy.iloc[0]["pairs"] == 2


def test_without_placements_every_comparison_stays_paired():
    document = yaml.safe_load(LADDER)
    document["include"].append({"where": {"scheme": "base"}, "repetitions": 3})
    spec = parse_spec(document)
    times = {"base": [2.0, 2.4, 2.2], "mlt": [1.9, 2.3], "spray": [1.0, 1.2], "sliced": [0.99, 1.21]}
    table = effects(_runs(spec, times), spec)
    assert set(table["design"]) == {"paired"} and set(table["pairs"]) == {2}

"""effects.csv: every scheme's effect with its confidence interval, against the baseline and, where
the spec's matrix says so (`compare`), against the step it adds to: the speedup (iteration times)
and the change of final accuracy (percentage points, `paired_difference`).

Speedups are paired by repetition (`paired_ratio`: repetition r of a scheme with repetition r of
the one it is measured against, the same other axes, the same seed) where the two schemes' runs
of each repetition took the same placement (runs.csv's `placement`: the same 5-tuples on the same
uplinks, or none measured). Where they did not (TCP against mlt's datagrams, or per-flow ECMP
against a fabric that sprays the job), the pair shares only the data order, and each scheme's
placements are part of what it is: the two are compared as independent samples over all their runs
(`unpaired_ratio`), so a placement-dependent scheme given more repetitions (`include` with
`repetitions`) narrows the interval. Accuracy changes stay paired (they follow the data order). A
run that failed or failed the fidelity guard leaves its pair, or itself, out: its times measure the
machine, not the network.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from experiments.spec import Spec
from experiments.statistics import Effect, paired_difference, paired_ratio, unpaired_ratio

EFFECT_COLUMNS = ["mode", "scheme", "against", "comparison", "metric", "design", "estimate", "low", "high",
                  "pairs", "runs_against", "runs_scheme", "level", "significant", "verdict"]
EFFECT_NUMERIC = ["estimate", "low", "high", "pairs", "runs_against", "runs_scheme", "level"]


def _scheme(axes: dict[str, str]) -> str:
    """A point's scheme, as scheme_of names it from a run_id (its axes but the mode)."""
    return ",".join(f"{name}={label}" for name, label in axes.items() if name != "mode") or "base"


def _row(mode: str, scheme: str, against: str, comparison: str, metric: str, effect: Effect) -> dict:
    return {"mode": mode, "scheme": scheme, "against": against, "comparison": comparison, "metric": metric,
            "design": effect.design, "estimate": effect.estimate, "low": effect.low, "high": effect.high,
            "pairs": effect.pairs, "runs_against": effect.runs[0], "runs_scheme": effect.runs[1],
            "level": effect.level, "significant": effect.significant, "verdict": effect.verdict()}


def effects(runs: pd.DataFrame, spec: Spec) -> pd.DataFrame:
    """The effects table of a results folder's runs table (one row per run, as runs.csv)."""
    if spec.baseline is None or runs.empty:
        return pd.DataFrame(columns=EFFECT_COLUMNS)
    axis, baseline = spec.baseline
    trusted = runs[runs["fidelity_ok"].ne(False)]  # a failed run has no times: its pair drops out too
    values = trusted.set_index("run_id")[["iter_time_mean_s", "final_accuracy"]]
    placed = _placement_texts(runs).set_axis(runs["run_id"])
    points: dict[tuple, dict[str, str]] = {}
    run_ids: dict[tuple, dict[int, str]] = {}
    for run in spec.runs:
        points.setdefault(tuple(run.axes.values()), run.axes)
        run_ids.setdefault(tuple(run.axes.values()), {})[run.rep] = run.run_id

    def series(axes: dict[str, str], column: str, reps: list[int]) -> list[float]:
        ids = run_ids[tuple(axes.values())]
        return [values[column].get(ids[rep], float("nan")) for rep in reps]

    def speedup(before: dict[str, str], after: dict[str, str], shared: list[int]) -> Effect:
        ids_before, ids_after = run_ids[tuple(before.values())], run_ids[tuple(after.values())]
        alike = all(placed.get(ids_before[rep], "") == placed.get(ids_after[rep], "") for rep in shared)
        if alike and shared:
            return paired_ratio(series(before, "iter_time_mean_s", shared), series(after, "iter_time_mean_s", shared),
                                spec.header.confidence)
        return unpaired_ratio(series(before, "iter_time_mean_s", sorted(ids_before)),
                              series(after, "iter_time_mean_s", sorted(ids_after)), spec.header.confidence)

    rows = []
    for axes in points.values():
        if axes[axis] == baseline:
            continue
        mode = axes.get("mode") or next(run.job.mode for run in spec.runs if run.axes == axes)
        against = {"baseline": {**axes, axis: baseline}, "step": spec.reference(axes)}
        if against["step"] == against["baseline"]:
            del against["step"]
        for comparison, other in against.items():
            if other is None or tuple(other.values()) not in points:
                continue
            scheme, other_scheme = _scheme(axes), _scheme(other)
            shared = sorted(set(run_ids[tuple(other.values())]) & set(run_ids[tuple(axes.values())]))
            rows.append(_row(mode, scheme, other_scheme, comparison, "speedup", speedup(other, axes, shared)))
            rows.append(_row(mode, scheme, other_scheme, comparison, "accuracy_delta_pt",
                             _in_points(paired_difference(series(other, "final_accuracy", shared),
                                                          series(axes, "final_accuracy", shared),
                                                          spec.header.confidence))))
    return pd.DataFrame(rows, columns=EFFECT_COLUMNS)


def _in_points(effect: Effect) -> Effect:
    """An accuracy difference (fractions) in percentage points."""
    return Effect(effect.estimate * 100, effect.low * 100, effect.high * 100, effect.pairs, effect.level, 0.0,
                  effect.design, effect.runs)


def describe(effect: pd.Series) -> str:
    """One effect in words, e.g. '1.83x [1.74, 1.92]' or '+0.4 pt [-0.2, +1.0]'."""
    if pd.isna(effect["estimate"]):
        return "—"
    if effect["metric"] == "speedup":
        interval = "" if pd.isna(effect["low"]) else f" [{effect['low']:.3g}, {effect['high']:.3g}]"
        return f"{effect['estimate']:.3g}x{interval}"
    interval = "" if pd.isna(effect["low"]) else f" [{effect['low']:+.1f}, {effect['high']:+.1f}]"
    return f"{effect['estimate']:+.1f} pt{interval}"


def _placement_texts(runs: pd.DataFrame) -> pd.Series:
    """runs.csv's `placement` per row as text, "" where none was measured (or the table has none)."""
    if "placement" not in runs:
        return pd.Series("", index=runs.index)
    return runs["placement"].astype(object).fillna("").astype(str)


def placement_share(runs: pd.DataFrame) -> pd.DataFrame:
    """Per mode and scheme, how much of the runs' iteration-time variance their placement explains.
    The runs are grouped by their measured placement (runs.csv's `placement`: the same 5-tuples on
    the same uplinks; where a table has none, by the most flows ECMP put on one uplink) and their log
    iteration times' variance split into components: run to run (pooled within the placements drawn
    more than once) and the rest, the placements' share. With no placement drawn twice the split
    is not defined (NaN). Columns: runs, classes (each placement, named A, B, ... by first
    appearance, with its runs and mean time), placement_share, run_sd (the pooled within-placement
    standard deviation of the log times)."""
    columns = ["mode", "scheme", "runs", "classes", "placement_share", "run_sd"]
    runs = runs.assign(placement=_placement_texts(runs).to_numpy())
    by_placement = runs["placement"].ne("").any()
    key = "placement" if by_placement else "max_flows_per_uplink"
    known = runs.dropna(subset=["iter_time_mean_s", key])
    if by_placement:
        known = known[known["placement"].ne("")]
    if "fidelity_ok" in known:
        known = known[known["fidelity_ok"].ne(False)]
    rows = []
    for (mode, scheme), group in known.groupby(["mode", "scheme"], sort=False):
        logs = np.log(group["iter_time_mean_s"].astype(float))
        total = float(((logs - logs.mean()) ** 2).sum())
        classes = group[key].astype(str) if by_placement else group[key]
        by_class = logs.groupby(classes.to_numpy(), sort=not by_placement)
        within = float(sum(((values - values.mean()) ** 2).sum() for _, values in by_class))
        within_df = int(sum(len(values) - 1 for _, values in by_class))
        times = group["iter_time_mean_s"].groupby(classes.to_numpy(), sort=not by_placement)
        names = ([chr(ord("A") + i) if i < 26 else f"P{i}" for i in range(by_class.ngroups)] if by_placement
                 else [f"{int(flows)} flows" for flows in times.mean().index])
        text = "; ".join(f"{name}: {count} run(s), {mean:.3g} s"
                         for name, count, mean in zip(names, times.count(), times.mean()))
        # variance components: run to run from the placements drawn more than once, the rest of
        # the runs' variance is the placements' (a placement drawn once adds nothing to `within`)
        defined = total > 0 and by_class.ngroups > 1 and within_df > 0
        share = max(0.0, 1 - (within / within_df) / (total / (len(logs) - 1))) if defined else float("nan")
        run_sd = float(np.sqrt(within / within_df)) if within_df > 0 else float("nan")
        rows.append([mode, scheme, len(group), text, share, run_sd])
    return pd.DataFrame(rows, columns=columns)

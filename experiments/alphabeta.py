"""Which collective, when: each all-reduce run's alpha-beta model, with alpha and beta measured on the
fabric, against what the run measured, and the message sizes at which two algorithms cross
(experiments/collectives.yaml asks; `python -m experiments.alphabeta OUT` answers, from OUT's spec.yaml
and runs.csv).

The model of one all-reduce of the whole model (the spec fuses it into one unit) by an algorithm on a
fabric is T = ticks x alpha + bytes x beta: `ticks` are the rounds its workers run, one segment of a
pipeline a round behind the one before (experiments/traffic.allreduce_ticks); `bytes` is the time its
busiest link direction of each tick takes at the links' rates (the fabric's uplinks included, so that an
algorithm that crosses an oversubscribed fabric at once pays for it), summed over the ticks and counted
in bytes of the host link (experiments/traffic.tick_seconds). A run measures T as its mean iteration
time less its compute: with one unit, the next iteration's forward pass waits for the whole all-reduce.

Measured per fabric (every matrix point but the algorithm and the model size): an alpha per algorithm
(seconds a round) and one beta (seconds a byte), fitted together to every algorithm's runs of its
smallest and its largest model (non-negative least squares of the relative errors: the sizes span 300x,
and in absolute seconds the largest models would set alpha for the small ones, where alpha is all there
is); the sizes between are predicted.  A round does not cost the same in every algorithm: the ring's
are sequential sends of one small message each, whose software costs (the wake-ups of the sender, the
receiver and the next send) nothing hides, where a halving-doubling round is a two-way exchange and a
pipeline's rounds overlap.  beta is the fabric's: a beta per algorithm, fitted to its 1.2 MB runs, takes
in what per-flow ECMP's collisions cost large transfers and not small ones, and would need a negative
alpha to meet the small runs.  One alpha and one beta for the whole fabric (the fabric_* columns) are
kept beside for comparison: where the algorithms' rounds cost different amounts it cannot place their
crossings.

OUT/alphabeta.csv: per fabric, algorithm and model size, the measured and predicted seconds, the
analytical bound (experiments/traffic.comm_bound_s) and measured / bound, with the algorithm's alpha and
the fabric's beta, and the fabric-wide fit's.
OUT/crossovers.csv: per fabric and pair of algorithms, the model size at which the per-algorithm model
predicts their times cross (the first crossing over the spec's sizes), the fabric-wide model's, the size
at which the runs' times cross (linear in log size between the two sizes they change order at), and
measured / predicted for each model.
"""
from __future__ import annotations

import argparse
import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from experiments import runplan, traffic
from experiments.results import Damaged, read_spec_document, read_tables, write_csv
from experiments.spec import Run, Spec, SpecError, parse_spec

SEARCH_POINTS = 64      # model sizes the predicted crossing is first looked for at, log-spaced over the spec's
SEARCH_HALVINGS = 30    # then bisected in log size
ALPHABETA_COLUMNS = ["fabric", "collective", "model_bytes", "ticks", "bandwidth_bytes", "measured_s", "predicted_s",
                     "bound_s", "measured_over_bound", "alpha_s", "beta_s_per_byte", "fabric_alpha_s",
                     "fabric_beta_s_per_byte", "fabric_predicted_s", "fitted_on"]
CROSSOVER_COLUMNS = ["fabric", "first", "second", "predicted_bytes", "fabric_predicted_bytes", "measured_bytes",
                     "measured_over_predicted", "measured_over_fabric_predicted"]


def fabric_axes(spec: Spec) -> list[str]:
    """The axes that are neither the algorithm nor the model: a fabric is a point of them."""
    return [axis.name for axis in spec.axes
            if not any(key == "job.collective" or key.startswith("job.model") for overrides in axis.values.values()
                       for key in overrides)]


def terms(run: Run, model_bytes: int) -> tuple[int, float]:
    """(ticks, bytes) of the model of `run`'s all-reduce of a unit of model_bytes."""
    costs = traffic.tick_seconds(run, traffic.allreduce_ticks(run, model_bytes))
    return len(costs), sum(busiest for _, busiest in costs) * run.topology.host_bw * 1e6 / 8


class Prediction:
    """The model of one algorithm on one fabric (a run of it tells which), alpha and beta fitted."""

    def __init__(self, run: Run, alpha: float, beta: float):
        self.run, self.alpha, self.beta = run, alpha, beta
        self._seconds: dict[int, float] = {}

    def seconds(self, model_bytes: float) -> float:
        """The predicted seconds of an all-reduce of a model of about model_bytes (whole floats)."""
        rounded = 4 * max(1, round(model_bytes / 4))
        if rounded not in self._seconds:
            ticks, nbytes = terms(self.run, rounded)
            self._seconds[rounded] = ticks * self.alpha + nbytes * self.beta
        return self._seconds[rounded]


def fit(points: list[tuple[int, float, float]]) -> tuple[float, float]:
    """alpha, beta >= 0 of T = ticks x alpha + bytes x beta, least squares of the relative errors over
    (ticks, bytes, T) points: the sizes span 300x, and in absolute seconds the largest models' residues
    (a pipeline's fill at 1.2 MB) would set alpha for the small ones, where alpha is all there is."""
    weights = np.array([1 / seconds if seconds > 0 else 0.0 for _, _, seconds in points])
    design = np.array([[ticks, nbytes] for ticks, nbytes, _ in points], dtype=float) * weights[:, None]
    measured = np.array([seconds for _, _, seconds in points]) * weights
    (alpha, beta), *_ = np.linalg.lstsq(design, measured, rcond=None)
    if alpha >= 0 and beta >= 0:
        return float(alpha), float(beta)
    # one of them would be negative: the other alone
    fits = [(column, float(design[:, column] @ measured / (design[:, column] @ design[:, column])))
            for column in (0, 1) if design[:, column].any()]
    if not fits:  # nothing was sent (one worker)
        return 0.0, 0.0
    residual = {column: float(np.sum((measured - design[:, column] * value) ** 2)) for column, value in fits}
    column, value = min(fits, key=lambda item: residual[item[0]])
    value = max(0.0, value)
    return (value, 0.0) if column == 0 else (0.0, value)


def fit_rounds(points: list[tuple[str, int, float, float]]) -> tuple[dict[str, float], float]:
    """An alpha >= 0 per algorithm and one beta >= 0 of T = ticks x alpha[algorithm] + bytes x beta, least
    squares of the relative errors over (algorithm, ticks, bytes, T) points (see fit)."""
    names = list(dict.fromkeys(name for name, *_ in points))
    if not names:
        return {}, 0.0
    weights = np.array([1 / seconds if seconds > 0 else 0.0 for *_, seconds in points])
    design = np.array([[ticks if name == other else 0 for other in names] + [nbytes]
                       for name, ticks, nbytes, _ in points], dtype=float) * weights[:, None]
    measured = np.array([seconds for *_, seconds in points]) * weights
    solution, _ = nnls(design, measured)
    return dict(zip(names, map(float, solution[:-1]))), float(solution[-1])


def runs_table(spec: Spec, runs: pd.DataFrame) -> pd.DataFrame:
    """One row per all-reduce run that measured an iteration and did not fail the fidelity guard (one that
    did measured the machine: a late timer costs a small model's rounds more than the network does): its
    fabric, algorithm, model bytes, model terms, measured seconds and bound."""
    axes = fabric_axes(spec)
    measured = runs.set_index("run_id")
    rows = []
    for run in spec.runs:
        if run.job.mode != "allreduce" or run.run_id not in measured.index:
            continue
        row = measured.loc[run.run_id]
        if pd.notna(row["fidelity_ok"]) and not bool(row["fidelity_ok"]):
            continue
        seconds = float(row["iter_time_mean_s"]) - float(row["compute_s"])
        if not math.isfinite(seconds):
            continue
        sizes = runplan.layer_table(run)
        model_bytes = sum(layer["bytes"] for layer in sizes)
        ticks, nbytes = terms(run, model_bytes)
        rows.append({"fabric": ",".join(f"{axis}={run.axes[axis]}" for axis in axes), "collective": run.job.collective,
                     "model_bytes": model_bytes, "ticks": ticks, "bandwidth_bytes": nbytes, "measured_s": seconds,
                     "bound_s": traffic.comm_bound_s(run, [layer["bytes"] for layer in sizes]), "run": run})
    return pd.DataFrame(rows)


def _ends(runs: pd.DataFrame) -> pd.Series:
    """Whether each row is its algorithm's smallest or largest model (rows of one fabric)."""
    sizes = runs.groupby("collective")["model_bytes"]
    return (runs["model_bytes"] == sizes.transform("min")) | (runs["model_bytes"] == sizes.transform("max"))


def alphabeta(table: pd.DataFrame) -> pd.DataFrame:
    """table (runs_table), averaged over repetitions, with each algorithm's alpha and its fabric's beta and the
    prediction, and the fabric-wide fit's (see the module)."""
    if table.empty:
        return pd.DataFrame(columns=ALPHABETA_COLUMNS)
    keys = ["fabric", "collective", "model_bytes"]
    means = table.groupby(keys, sort=False).agg(
        ticks=("ticks", "first"), bandwidth_bytes=("bandwidth_bytes", "first"), measured_s=("measured_s", "mean"),
        bound_s=("bound_s", "first")).reset_index()
    frames = []
    for _, fabric in means.groupby("fabric", sort=False):
        ends = _ends(fabric)
        fitted = fabric[ends]
        fabric_alpha, fabric_beta = fit(list(zip(fitted["ticks"], fitted["bandwidth_bytes"], fitted["measured_s"])))
        alphas, beta = fit_rounds(list(zip(fitted["collective"], fitted["ticks"], fitted["bandwidth_bytes"],
                                           fitted["measured_s"])))
        alpha = fabric["collective"].map(alphas)
        frames.append(fabric.assign(
            alpha_s=alpha, beta_s_per_byte=beta, predicted_s=fabric["ticks"] * alpha + fabric["bandwidth_bytes"] * beta,
            fabric_alpha_s=fabric_alpha, fabric_beta_s_per_byte=fabric_beta,
            fabric_predicted_s=fabric["ticks"] * fabric_alpha + fabric["bandwidth_bytes"] * fabric_beta,
            fitted_on=ends))
    result = pd.concat(frames, ignore_index=True)
    result["measured_over_bound"] = result["measured_s"] / result["bound_s"]
    return result[ALPHABETA_COLUMNS]


def predicted_crossing(first: Prediction, second: Prediction, low: float, high: float) -> float:
    """The smallest model size in [low, high] at which two predicted times cross (NaN if they keep their
    order)."""
    def gap(size: float) -> float:
        return first.seconds(size) - second.seconds(size)
    grid = np.geomspace(low, high, SEARCH_POINTS)
    gaps = [gap(size) for size in grid]
    for (below, gap_below), (above, gap_above) in itertools.pairwise(zip(grid, gaps)):
        if gap_below == 0:
            return float(below)
        if gap_below * gap_above < 0:
            for _ in range(SEARCH_HALVINGS):
                middle = math.sqrt(below * above)
                if gap(middle) * gap_below > 0:
                    below = middle
                else:
                    above = middle
            return math.sqrt(below * above)
    return math.nan


def measured_crossing(sizes: list[float], first: list[float], second: list[float]) -> float:
    """The smallest size at which two measured curves change order, linear in log size between the
    two sizes around it (NaN if they keep their order)."""
    gaps = [a - b for a, b in zip(first, second)]
    for (size, gap), (next_size, next_gap) in itertools.pairwise(zip(sizes, gaps)):
        if gap == 0:
            return size
        if gap * next_gap < 0:
            share = gap / (gap - next_gap)
            return math.exp(math.log(size) + share * (math.log(next_size) - math.log(size)))
    return math.nan


def crossovers(table: pd.DataFrame, fitted: pd.DataFrame) -> pd.DataFrame:
    """Per fabric and pair of algorithms, the predicted crossings (per-algorithm and fabric-wide alpha and beta)
    and the measured one (see the module)."""
    rows = []
    for fabric, runs in table.groupby("fabric", sort=False):
        model = fitted[fitted["fabric"] == fabric]
        low, high = float(runs["model_bytes"].min()), float(runs["model_bytes"].max())
        curves = model.pivot_table(index="model_bytes", columns="collective", values="measured_s")
        fits = model.groupby("collective")[["alpha_s", "beta_s_per_byte", "fabric_alpha_s",
                                            "fabric_beta_s_per_byte"]].first()
        examples = runs.groupby("collective")["run"].first()
        own = {name: Prediction(run, *fits.loc[name, ["alpha_s", "beta_s_per_byte"]]) for name, run in examples.items()}
        shared = {name: Prediction(run, *fits.loc[name, ["fabric_alpha_s", "fabric_beta_s_per_byte"]])
                  for name, run in examples.items()}
        for first, second in itertools.combinations(list(dict.fromkeys(runs["collective"])), 2):
            predicted = predicted_crossing(own[first], own[second], low, high)
            fabric_predicted = predicted_crossing(shared[first], shared[second], low, high)
            both = curves[[first, second]].dropna()
            measured = measured_crossing(list(both.index), list(both[first]), list(both[second]))
            rows.append({"fabric": fabric, "first": first, "second": second, "predicted_bytes": predicted,
                         "fabric_predicted_bytes": fabric_predicted, "measured_bytes": measured,
                         "measured_over_predicted": measured / predicted,
                         "measured_over_fabric_predicted": measured / fabric_predicted})
    return pd.DataFrame(rows, columns=CROSSOVER_COLUMNS)


def write_alphabeta(out_dir: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """OUT/alphabeta.csv and OUT/crossovers.csv from OUT/spec.yaml and runs.csv (see the module)."""
    out = Path(out_dir)
    spec = parse_spec(read_spec_document(out))
    table = runs_table(spec, read_tables(out)["runs"])
    fitted = alphabeta(table)
    crossed = crossovers(table, fitted) if not table.empty else pd.DataFrame(columns=CROSSOVER_COLUMNS)
    write_csv(fitted, out / "alphabeta.csv")
    write_csv(crossed, out / "crossovers.csv")
    return fitted, crossed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.alphabeta", description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path, help="results directory (holding spec.yaml and runs.csv)")
    args = parser.parse_args(argv)
    try:
        fitted, crossed = write_alphabeta(args.dir)
    except (Damaged, SpecError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(fitted.drop(columns=["fitted_on"]).to_string(index=False))
        print()
        print(crossed.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())

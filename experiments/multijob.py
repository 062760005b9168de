"""Several jobs on one fabric: what each job loses to its neighbours and what the cluster gets done.

Per job (runs.csv's rows of a run of several jobs, `job` their name):
- `alone_iter_time_s`: its mean iteration time run alone (its alone run of the same repetition,
  experiments/spec/runs.py), and `slowdown_vs_alone`, its iteration time beside the others over that;
- `jct_s`: its completion time, from its arrival (the common start plus its start_s; a job run alone
  arrives with its first iteration) to its workers' last iteration's end: a time-shift offset counts
  against the policy that gave it;
- `compute_util`: its workers' compute over their wall time (the job's completion time each).

Per run (multijob.csv): the average and the tail (largest) completion time over its jobs, the
cluster's compute utilization (every worker's compute over every worker's wall time, its job's
completion time: Crux's objective), and each one's gain against the baseline's run of the same
repetition. Per scheme, on each of its rows: each gain over the repetitions, paired by repetition
(experiments/statistics.py `paired_ratio`: the geometric mean of the pairs' ratios and its Student-t
interval at the spec's confidence; `<gain>_paired`, `_low`, `_high`), a run that failed or failed the
fidelity guard (any of its jobs) leaving its pair out, as effects.csv does.
"""
from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from typing import Callable

import pandas as pd

from experiments import metrics
from experiments.spec import ALONE, Spec
from experiments.statistics import Effect, paired_ratio

GAINS = ["jct_mean_gain", "jct_max_gain", "util_gain"]
INTERVAL_COLUMNS = [f"{gain}_{part}" for gain in GAINS for part in ("paired", "low", "high")]
MULTIJOB_COLUMNS = ["run_id", "scheme", "rep", "jobs", "jct_mean_s", "jct_max_s", "cluster_util", "slowdown_mean",
                    "slowdown_max", "trusted", *GAINS, *INTERVAL_COLUMNS]


def job_row(iterations: pd.DataFrame, arrival_s: float | None) -> dict[str, float]:
    """A job's completion time and compute utilization from its iterations (iterations.csv rows of
    its processes); arrival_s None: its workers' first iteration start."""
    workers = iterations[iterations["role"] == "worker"]
    if workers.empty:
        return {"jct_s": math.nan, "compute_util": math.nan}
    arrival = float(workers["start_s"].min()) if arrival_s is None else float(arrival_s)
    jct = float(workers["end_s"].max()) - arrival
    count = workers["rank"].nunique()
    compute = float(workers["compute_s"].sum())
    return {"jct_s": jct, "compute_util": compute / (count * jct) if jct > 0 else math.nan}


def measured_timing(iterations: pd.DataFrame, tensors: pd.DataFrame) -> dict[str, float] | None:
    """A job's iteration as its run alone measured it, what the time-shift policy places (the job
    document's period_ms, period_p99_ms, comm_ms, comm_start_ms): the mean steady iteration time and its
    99th percentile (how late an iteration may come: the pace's margin); the arc during
    which it communicates, from a worker's first transfer of an iteration to its last (the span, not
    the time some transfer was in flight: a job whose layers' messages trickle through its backward
    pass holds the link in that whole arc, with gaps too short for another job's phase); and the
    mean time from a worker's iteration start to its first transfer. None without steady iterations
    or transfers."""
    times = metrics.iteration_times_s(iterations)
    period = times.mean()
    workers = iterations[iterations["role"] == "worker"]
    transfers = tensors[tensors["role"] == "worker"]
    if transfers.empty or workers.empty or not (period > 0):
        return None
    by_iteration = transfers.groupby(["rank", "iteration"])
    first, last = by_iteration["start_s"].min(), by_iteration["end_s"].max()
    steady = first.index.get_level_values("iteration") > workers["iteration"].min()
    starts = workers.set_index(["rank", "iteration"])["start_s"]
    lead = (first[steady] - starts.reindex(first[steady].index)).dropna()
    span = (last[steady] - first[steady]).dropna()
    if lead.empty or span.empty:
        return None
    return {"period_ms": round(float(period) * 1000, 3),
            "period_p99_ms": round(max(float(times.quantile(0.99)), float(period)) * 1000, 3),
            "comm_ms": round(min(float(span.mean()), period) * 1000, 3),
            "comm_start_ms": round(max(0.0, float(lead.mean())) * 1000, 3)}


JOB_UPLINK_COLUMNS = ["job", "switch", "uplink", "time_s", "bytes"]
UPLINK_BIN_S = 0.1


def pinned_placement(placed: dict, flows: list[tuple[str, str, str]], jobs: list[dict]) -> dict:
    """The measured ECMP placement (run.json's) with each flow of a pinned host pair moved to its
    pinned path's first uplink: under a sharing policy that chooses paths the controller pins every
    packet between two of a job's hosts (GET /jobs `paths`), which the probes, sent before the jobs
    are registered, do not see. flows: (what, src address, dst address) as the placement names them."""
    via = {(path["src"], path["dst"]): path["via"] for job in jobs for path in job.get("paths") or ()
           if len(path["via"]) > 1}
    moved = {what: via[src, dst] for what, src, dst in flows if (src, dst) in via}
    if not moved:
        return placed
    uplinks: dict[str, dict[str, list[str]]] = {}
    for switch, by_uplink in (placed.get("uplinks") or {}).items():
        for uplink, whats in by_uplink.items():
            kept = [what for what in whats if what not in moved]
            if kept:
                uplinks.setdefault(switch, {})[uplink] = kept
    for what, (switch, uplink, *_) in moved.items():
        uplinks.setdefault(switch, {}).setdefault(uplink, []).append(what)
    shares = [len(whats) for by_uplink in uplinks.values() for whats in by_uplink.values()]
    return {**placed, "uplinks": uplinks, "max_flows_per_uplink": max(shares, default=0)}


def job_uplink_bytes(tensors: pd.DataFrame, placement: dict | None, job: str,
                     bin_s: float = UPLINK_BIN_S) -> pd.DataFrame:
    """job_uplinks.csv's rows of one job of a run: the bytes of its messages on each leaf uplink,
    per bin_s from the epoch. The port counters do not tell jobs apart, so a job's share is its own
    record: each message its processes received (tensors.csv, direction recv) is on the uplink the
    run's measured ECMP placement put its flow on (run.json's placement: per leaf and spine the
    flows it carried, named "<job> <sender>-><receiver>"), its bytes spread evenly over its arrival
    [start, end]. Application bytes, without headers or retransmissions; a flow inside a leaf, or
    one left to ephemeral ports (not placed), is on no uplink."""
    where = {what: (switch, uplink) for switch, by_uplink in ((placement or {}).get("uplinks") or {}).items()
             for uplink, whats in by_uplink.items() for what in whats}
    binned: dict[tuple[str, str, int], float] = defaultdict(float)
    received = tensors[tensors["direction"] == "recv"] if "direction" in tensors else tensors.iloc[:0]
    for row in received.itertuples(index=False):
        found = where.get(f"{job} {row.peer}->{row.role}{row.rank}")
        if found is None or not row.bytes > 0:
            continue
        start, end = float(row.start_s), max(float(row.start_s), float(row.end_s))
        for index in range(math.floor(start / bin_s), math.floor(end / bin_s) + 1):
            share = 1.0 if end == start else (min(end, (index + 1) * bin_s) - max(start, index * bin_s)) / (end - start)
            if share > 0:
                binned[(*found, index)] += float(row.bytes) * share
    return pd.DataFrame([{"job": job, "switch": switch, "uplink": uplink, "time_s": round(index * bin_s, 6),
                          "bytes": value} for (switch, uplink, index), value in sorted(binned.items())],
                        columns=JOB_UPLINK_COLUMNS)


def with_alone(runs: pd.DataFrame, alone: dict[tuple[str, str], str]) -> pd.DataFrame:
    """runs.csv with each job's alone iteration time and slowdown filled in; `alone`: (run_id, job)
    -> its alone run's id (experiments/spec/runs.alone_runs)."""
    runs = runs.copy()
    alone_time = {(row.run_id, row.job): row.iter_time_mean_s for row in runs.itertuples()}
    for index, row in runs.iterrows():
        reference = alone.get((row["run_id"], row["job"]))
        if reference is None and str(row["run_id"]).startswith(f"{ALONE}="):
            reference = row["run_id"]
        if reference is None:
            continue
        time_alone = alone_time.get((reference, row["job"]), math.nan)
        runs.at[index, "alone_iter_time_s"] = time_alone
        runs.at[index, "slowdown_vs_alone"] = row["iter_time_mean_s"] / time_alone if time_alone else math.nan
    return runs


def effects_by_job(runs: pd.DataFrame, spec: Spec, effects: Callable[[pd.DataFrame, Spec], pd.DataFrame]
                   ) -> pd.DataFrame:
    """effects.csv (experiments/effects.py): for a spec of several jobs, each job's effects apart,
    its name in the mode column ("allreduce mlp"), the alone runs left out (they are no scheme)."""
    if not any(run.config.jobs for run in spec.runs):
        return effects(runs, spec)
    shared = dataclasses.replace(spec, runs=[run for run in spec.runs if not run.alone])
    frames = []
    for name in dict.fromkeys(name for run in shared.runs for name in run.job_names):
        found = effects(runs[runs["job"] == name], shared)
        frames.append(found.assign(mode=found["mode"] + f" {name}"))
    return pd.concat(frames, ignore_index=True) if frames else effects(runs.iloc[:0], spec)


def runs_table(runs: pd.DataFrame, spec: Spec) -> pd.DataFrame:
    """multijob.csv: a row per run of several jobs (see the module's docstring)."""
    several = {run.run_id: run for run in spec.runs if run.config.jobs}
    rows = []
    for run_id, jobs in runs[runs["run_id"].isin(several)].groupby("run_id", sort=False):
        run = several[run_id]
        complete = jobs["jct_s"].notna().all() and len(jobs) == len(run.config.jobs)
        wall = (jobs["workers"] * jobs["jct_s"]).sum()
        compute = (jobs["workers"] * jobs["jct_s"] * jobs["compute_util"]).sum()
        rows.append({
            "run_id": run_id, "scheme": ",".join(f"{axis}={label}" for axis, label in run.axes.items()) or "base",
            "rep": run.rep, "jobs": len(run.config.jobs),
            "jct_mean_s": jobs["jct_s"].mean() if complete else math.nan,
            "jct_max_s": jobs["jct_s"].max() if complete else math.nan,
            "cluster_util": compute / wall if complete and wall > 0 else math.nan,
            "slowdown_mean": jobs["slowdown_vs_alone"].mean(), "slowdown_max": jobs["slowdown_vs_alone"].max(),
            "trusted": bool(jobs["fidelity_ok"].ne(False).all()) if "fidelity_ok" in jobs else True})
    table = pd.DataFrame(rows, columns=MULTIJOB_COLUMNS)
    if spec.baseline and not table.empty:
        axis, label = spec.baseline
        base_of = {}
        for index, row in table.iterrows():
            run = several[row["run_id"]]
            base_axes = {**run.axes, axis: label}
            base = table[(table["rep"] == row["rep"]) & (table["scheme"] == ",".join(
                f"{name}={value}" for name, value in base_axes.items()))]
            if base.empty:
                continue
            base = base.iloc[0]
            base_of[index] = base
            table.at[index, "jct_mean_gain"] = base["jct_mean_s"] / row["jct_mean_s"]
            table.at[index, "jct_max_gain"] = base["jct_max_s"] / row["jct_max_s"]
            table.at[index, "util_gain"] = row["cluster_util"] / base["cluster_util"] - 1
        for indices in table.groupby("scheme", sort=False).groups.values():
            paired = [index for index in indices  # the baseline's own rows have no gain to judge
                      if index in base_of and base_of[index]["run_id"] != table.at[index, "run_id"]]
            if not paired:
                continue
            for gain, effect in scheme_gains(table.loc[paired], [base_of[index] for index in paired],
                                             spec.header.confidence).items():
                shift = 1.0 if gain == "util_gain" else 0.0  # utilization's gain is the ratio - 1
                for part, value in (("paired", effect.estimate), ("low", effect.low), ("high", effect.high)):
                    table.loc[indices, f"{gain}_{part}"] = value - shift
    return table


def scheme_gains(rows: pd.DataFrame, bases: list[pd.Series], level: float) -> dict[str, Effect]:
    """A scheme's gains over its repetitions against the baseline's run of each (`bases`, in the
    order of `rows`), paired by repetition; an untrusted run on either side leaves its pair out.
    JCT gains are baseline / scheme, the utilization's scheme / baseline (its gain that ratio - 1)."""
    keep = [bool(row["trusted"]) and bool(base["trusted"]) for (_, row), base in zip(rows.iterrows(), bases)]
    rows = rows[keep]
    bases = [base for base, kept in zip(bases, keep) if kept]

    def base(column: str) -> list[float]:
        return [float(b[column]) for b in bases]

    return {"jct_mean_gain": paired_ratio(base("jct_mean_s"), rows["jct_mean_s"].tolist(), level),
            "jct_max_gain": paired_ratio(base("jct_max_s"), rows["jct_max_s"].tolist(), level),
            "util_gain": paired_ratio(rows["cluster_util"].tolist(), base("cluster_util"), level)}


def _gain_cell(row: pd.Series, gain: str) -> str:
    """A scheme's gain over its repetitions and its paired interval, n.s. where the interval holds
    no gain; the baseline's own row is '—'."""
    estimate, low, high = (row.get(f"{gain}_{part}", math.nan) for part in ("paired", "low", "high"))
    if pd.isna(estimate):
        return "—"
    if gain == "util_gain":
        text, null = f"{estimate:+.1%}", 0.0
        interval = "" if pd.isna(low) else f" [{low:+.1%}, {high:+.1%}]"
    else:
        text, null = f"{estimate:.2f}x", 1.0
        interval = "" if pd.isna(low) else f" [{low:.2f}, {high:.2f}]"
    judged = not (pd.isna(low) or pd.isna(high))
    return text + interval + (" n.s." if judged and low <= null <= high else "")


def summary_lines(table: pd.DataFrame, runs: pd.DataFrame) -> list[str]:
    """summary.md's section: per scheme, the mean over repetitions of each job's slowdown, the
    completion times and the utilization; their gains against the baseline paired by repetition,
    each with its interval (n.s. where it holds no gain)."""
    if table.empty:
        return []
    jobs = runs[runs["job"].astype("string").fillna("") != ""].copy()
    jobs["scheme"] = jobs["run_id"].map(lambda run_id: run_id.rsplit(",rep=", 1)[0])
    slowdowns = jobs.groupby(["scheme", "job"], sort=False)["slowdown_vs_alone"].mean().unstack("job")
    lines = ["## Jobs sharing the fabric", "",
             "Each job's slowdown is its mean iteration time over its time run alone (same seed); completion "
             "times (JCT) from each job's arrival; utilization is every worker's compute over its wall time; "
             "gains against the baseline's run of the same repetition, paired by repetition: the geometric "
             "mean of the pairs' ratios and its paired Student-t interval at the spec's confidence "
             "(experiments/statistics.py), n.s. where the interval holds no gain; a run that failed the "
             "fidelity guard leaves its pair out, and a gain without an interval had one pair left (not "
             "judged). The other columns are means over the repetitions.", "",
             "| scheme | " + " | ".join(f"slowdown {job}" for job in slowdowns.columns)
             + " | JCT mean (s) | JCT tail (s) | utilization | JCT mean gain | JCT tail gain | utilization gain |",
             "|---" * (7 + len(slowdowns.columns)) + "|"]
    for scheme, rows in table.groupby("scheme", sort=False):
        cells = [f"{slowdowns.loc[scheme, job]:.2f}x" if scheme in slowdowns.index
                 and pd.notna(slowdowns.loc[scheme, job]) else "—" for job in slowdowns.columns]
        means = rows[["jct_mean_s", "jct_max_s", "cluster_util"]].mean()
        shown = [f"{means['jct_mean_s']:.2f}", f"{means['jct_max_s']:.2f}", f"{means['cluster_util']:.1%}"]
        gains = [_gain_cell(rows.iloc[0], gain) for gain in GAINS]
        lines.append(f"| {scheme} | " + " | ".join(cells + [cell.replace("nan", "—") for cell in shown] + gains)
                     + " |")
    return [*lines, ""]

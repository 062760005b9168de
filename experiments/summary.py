"""summary.md: first, in words, which effects were significant and which were not; a legend of the
columns; per training mode, one row per scheme comparing it with the others, with the baseline
(and with the step it adds to, in an ablation), each effect with its interval, and with the
analytical lower bound; then notes on saturated (low-fidelity) and failed runs."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from experiments import metrics, multijob
from experiments.fidelity import (APP_LAG_P99_MS_LIMIT, CPU_LIMIT, LINK_RATE_MIN,
                                  OUTSIDE_DROPS_LIMIT, VSWITCHD_THREAD_LIMIT)
from experiments.effects import describe, placement_share
from experiments.metrics import per_run
from experiments.results import Damaged, one_line, read_json_object, read_run_record, read_tables, real_folder
from experiments.spec import Spec, load_spec, scheme_of
from common.files import write_text
from topologies.shaping import BURST

# A run faster than its analytical lower bound by more than this has measured the emulation's
# shapers, not the bound's link (the note says why); above it, the iteration times' own noise.
BELOW_BOUND = 0.98

COLUMNS = ["scheme", "iter time (s)", "speedup", "step", "samples/s", "final acc", "acc delta", "time-to-acc (s)",
           "p99 tensor (ms)", "delivered fraction", "uplink imbalance", "lower bound (s)", "tight bound (s)",
           "overlap E", "straggler (ms)", "fidelity"]

# One line per column (but scheme): what it is and how it is computed.
LEGEND = [
    "iter time: each run's mean interval between the last worker's completions of consecutive "
    "iterations (neither the first iteration, start-up, nor the last, which drains its own "
    "communication); mean ± std over repetitions.",
    "speedup: the baseline's iteration time over the scheme's, paired by repetition (same mode and "
    "other axes, same seed: same data order and, with per-flow ECMP, the same placement of the same "
    "flows) where the two runs of each repetition took the same placement: the geometric mean of the "
    "pairs' ratios and its paired Student-t interval on the log scale; where they did not (other "
    "5-tuples, or a sprayed job against a placed one), the ratio of the two schemes' geometric means "
    "over all their runs and its Welch t interval (marked unpaired in the lines above), at the "
    "spec's confidence (experiments/statistics.py); n.s. where the interval holds 1 (not "
    "significant); a run that failed or failed the fidelity guard leaves its pair out.",
    "step: in an ablation, the same against the step the scheme adds to (the spec's compare), with "
    "that step's name.",
    "samples/s: global batch / mean iteration time.",
    "final acc: the workers' mean test accuracy after the last iteration.",
    "acc delta: final acc minus the baseline's (same mode and other axes, same repetition), in "
    "percentage points: the mean difference and its paired t interval; n.s. where it holds 0.",
    "time-to-acc: seconds from the first iteration's start until a worker first reaches the "
    "target accuracy; how many repetitions reached it when not all did.",
    "p99 tensor: 99th percentile of single tensor transfer times, the tail tensor-transfer time.",
    "delivered fraction: the share of the received messages' bytes that arrived (byte-weighted; "
    "1 with TCP, below 1 with the loss-tolerant transport), and the smallest share of one message.",
    "uplink imbalance: per leaf, max / mean of the bytes sent on its spine uplinks; mean over the "
    "leaves weighted by their uplink bytes (1 is an even spread).",
    "lower bound: max(analytical communication bound, measured compute) per iteration (all-reduce: the "
    "busiest link direction carrying all its algorithm's bytes, or one unit's rounds each paying its "
    "slowest message's last frame stored and forwarded at the MTU, whichever is longer; parameter server: "
    "the fluid bound, host links only, framing at the MTU, equal shards).",
    "tight bound: max(the busiest link direction of the fabric carrying the iteration's traffic, "
    "uplinks at fabric_bw and shards by their real bytes; measured compute + the front layer's "
    "communication that can only start after it) (experiments/traffic.py).",
    f"overlap E: TicTac's efficiency (comm + comp - T) / min(comm, comp) from the measured times; "
    f"empty, with the reason, where communication or compute is below "
    f"{metrics.OVERLAP_SHARE_MIN:.0%} of the iteration.",
    "straggler: TicTac's straggler effect, the spread between the first and the last worker's end of an "
    "iteration (the first iteration excluded).",
    f"fidelity: the runs that failed the guard, where the times measure the machine rather than the "
    f"network: machine CPU > {CPU_LIMIT}, ovs-vswitchd's forwarding thread >= {VSWITCHD_THREAD_LIMIT} "
    f"cores, backlogged links below {LINK_RATE_MIN} of their rate, drops outside the class queues "
    f"above {OUTSIDE_DROPS_LIMIT:g} of the packets sent, host-app timers late by > "
    f"{APP_LAG_P99_MS_LIMIT:g} ms (p99); the notes name each run's reasons.",
]


def _number(value: float, digits: int = 3) -> str:
    return "—" if pd.isna(value) else f"{value:.{digits}g}"


def _overlap(group: pd.DataFrame) -> str:
    """TicTac's E over the repetitions, or why it is not defined."""
    if group["tictac_efficiency"].notna().any():
        return _number(group["tictac_efficiency"].mean())
    if group.empty:
        return "—"
    why = metrics.overlap_undefined(group["comm_s"].mean(), group["compute_s"].mean(),
                                    group["iter_time_mean_s"].mean())
    return f"— ({why})" if why else "—"


def _fidelity(flags: pd.Series) -> str:
    """Over the runs the guard could judge (failed runs have no samples)."""
    known = flags.dropna().astype(bool)
    if known.empty:
        return "unknown"
    failed = int((~known).sum())
    return f"failed {failed}/{len(known)}" if failed else "ok"


def _time_to_accuracy(values: pd.Series, final_accuracy: pd.Series) -> str:
    reached = values.dropna()
    if final_accuracy.isna().all():
        return "—"  # a layer profile has no accuracy to reach
    if reached.empty:
        return "never"
    partly = "" if len(reached) == len(values) else f" ({len(reached)}/{len(values)} reached)"
    return _number(reached.mean()) + partly


def _mean_spread(values: pd.Series) -> str:
    """mean ± std over repetitions (the std only with two or more)."""
    values = values.dropna()
    spread = "" if values.count() < 2 else f" ± {_number(values.std())}"
    return _number(values.mean()) + spread


def _delivered(means: pd.Series, minimums: pd.Series) -> str:
    if means.isna().all():
        return "—"
    return f"{_number(means.mean(), 4)} (min {_number(minimums.min(), 4)})"


def _scheme_name(scheme: str) -> str:
    """A scheme as the words name it: its label on a single axis, its axes otherwise."""
    return scheme.split("=", 1)[1] if scheme.count("=") == 1 else scheme


def _effect(effects: pd.DataFrame, mode: str, scheme: str, comparison: str, metric: str) -> str:
    """One effect's cell: estimate [interval], n.s. where not significant; a step names its step."""
    rows = effects[(effects["mode"] == mode) & (effects["scheme"] == scheme)
                   & (effects["comparison"] == comparison) & (effects["metric"] == metric)]
    if rows.empty:
        return "—"
    row = rows.iloc[0]
    text = describe(row) + (" n.s." if row["verdict"] == "not significant" else "")
    return f"vs {_scheme_name(row['against'])}: {text}" if comparison == "step" else text


def in_words(effects: pd.DataFrame, level: float) -> list[str]:
    """The summary's first lines: per mode, the speedups that were significant and those that were not."""
    speedups = effects[effects["metric"] == "speedup"]
    if speedups.empty:
        return []
    lines = [f"Speedups at {level:.0%} confidence, paired by repetition where the two schemes' flows took the "
             "same placement, else as two samples (unpaired, with each side's runs), a scheme against the "
             "baseline, a step against the step it adds to:", ""]
    for mode, rows in speedups.groupby("mode", sort=False):
        parts = {"significant": [], "not significant": [], "not judged": []}
        for row in rows.itertuples(index=False):
            verdict = row.verdict if row.verdict in parts else "not judged"
            faster = "faster" if row.estimate > 1 else "slower"
            notes = [faster] if verdict == "significant" else []
            if getattr(row, "design", "paired") == "unpaired":
                notes.append(f"unpaired, {row.runs_against:.0f} and {row.runs_scheme:.0f} runs")
            parts[verdict].append(f"{_scheme_name(row.scheme)} vs {_scheme_name(row.against)} "
                                  f"{describe(pd.Series(row._asdict()))}"
                                  + (f" ({', '.join(notes)})" if notes else ""))
        for verdict, items in parts.items():
            if items:
                lines.append(f"- {mode}, {verdict}: " + "; ".join(items) + ".")
    return lines + [""]


def scheme_rows(tables: dict[str, pd.DataFrame], spec: Spec) -> dict[str, pd.DataFrame]:
    """Per mode, the summary table as strings: schemes in spec order, repetitions averaged.
    Failed runs have no metrics and only show in the notes."""
    runs = tables["runs"].copy()
    tensors = tables["tensors"]
    effects = tables["effects"]
    runs["tensor_p99_ms"] = runs["run_id"].map(per_run(tensors, metrics.tensor_time_p99_s) * 1000)
    runs["delivered"] = runs["run_id"].map(per_run(tensors, metrics.delivered_fraction))
    runs["delivered_min"] = runs["run_id"].map(per_run(tensors, metrics.min_delivered_fraction))
    by_mode = {}
    for mode, mode_runs in runs.groupby("mode", sort=False):
        rows = []
        for scheme, all_reps in mode_runs.groupby("scheme", sort=False):
            group = all_reps.dropna(subset=["iter_time_mean_s"])
            rows.append([
                scheme, _mean_spread(group["iter_time_mean_s"]),
                _effect(effects, str(mode), scheme, "baseline", "speedup"),
                _effect(effects, str(mode), scheme, "step", "speedup"),
                _number(group["samples_per_s"].mean(), 4), _number(group["final_accuracy"].mean()),
                _effect(effects, str(mode), scheme, "baseline", "accuracy_delta_pt"),
                _time_to_accuracy(group["time_to_accuracy_s"], group["final_accuracy"]),
                _number(group["tensor_p99_ms"].mean()), _delivered(group["delivered"], group["delivered_min"]),
                _number(group["uplink_imbalance"].mean()), _number(group["lower_bound_s"].mean()),
                _number(group["tight_bound_s"].mean()), _overlap(group),
                _number(group["straggler_s"].mean() * 1000), _fidelity(group["fidelity_ok"]),
            ])
        by_mode[str(mode)] = pd.DataFrame(rows, columns=COLUMNS)
    return by_mode


def _markdown(table: pd.DataFrame) -> list[str]:
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    return lines + ["| " + " | ".join(row) + " |" for row in table.itertuples(index=False)]


def render(out_dir: str | Path) -> str:
    """The summary as markdown."""
    tables = read_tables(out_dir)
    spec = load_spec(Path(out_dir) / "spec.yaml")
    runs = tables["runs"]
    baseline = ("compared with the baseline {}={}".format(*spec.baseline) if spec.baseline
                else "the spec marks no baseline, so speedup and acc delta are —")
    lines = ["# Experiment summary", "", *in_words(tables["effects"], spec.header.confidence),
             f"Per training mode, one row per scheme, repetitions averaged; {baseline}.", "",
             *[f"- {line}" for line in LEGEND], ""]
    for mode, table in scheme_rows(tables, spec).items():
        lines += [f"## {mode}", "", *_markdown(table), ""]
    notes = []
    for run in runs.itertuples(index=False):
        record = read_run_record(out_dir, run.run_id) or {}
        if record.get("status") == "failed":
            notes.append(f"- {run.run_id}: failed: {record.get('error') or 'no error recorded'}")
        elif pd.notna(run.fidelity_ok) and not run.fidelity_ok:
            notes.append(f"- {run.run_id}: failed the fidelity guard ({run.fidelity_reason}): its times "
                         "measure the machine rather than the network")
        elif math.isnan(run.iter_time_mean_s):
            notes.append(f"- {run.run_id}: no iteration times recorded")
        if run.iter_time_mean_s < BELOW_BOUND * run.lower_bound_s:
            notes.append(f"- {run.run_id}: ran in {run.iter_time_mean_s / run.lower_bound_s:.2f} of its lower bound: "
                         f"the bound sends every frame at its link's rate, and each link's shaper lets up to "
                         f"{BURST}B through at once (topologies/shaping.py), so messages this small crossed "
                         "faster than that rate")
        if isinstance(run.faults, str) and run.faults:
            notes.append(f"- {run.run_id}: survived faults: {run.faults}")
        if isinstance(run.data_gaps, str) and run.data_gaps:
            notes.append(f"- {run.run_id}: metrics left empty: {run.data_gaps}")
    lines += _placement(runs, spec)
    if (Path(out_dir) / "multijob.csv").exists():
        lines += multijob.summary_lines(pd.read_csv(Path(out_dir) / "multijob.csv"), runs)
    if notes:  # a run of several jobs has a row per job, its notes once
        lines += ["## Notes", "", *dict.fromkeys(notes), ""]
    return "\n".join(lines + _fabrics(Path(out_dir)))


def _placement(runs: pd.DataFrame, spec: Spec) -> list[str]:
    """A table of how the measured ECMP placements grouped each scheme's runs and how much of their
    iteration times' variance the placement explains (the rest is run-to-run). Schemes that run the
    same configuration (a control and its baseline) are one row: each repetition's placement is then
    drawn twice, which is what tells placement from run-to-run noise."""
    alike = _alike_schemes(spec)
    runs = runs.assign(scheme=[alike.get((mode, scheme), scheme) for mode, scheme in zip(runs["mode"], runs["scheme"])])
    shares = placement_share(runs)
    shares = shares[shares["classes"].str.contains(";")]  # schemes whose runs drew different placements
    if shares.empty:
        return []
    rows = [[mode, scheme, str(count), classes, "—" if pd.isna(share) else f"{share:.0%}",
             "—" if pd.isna(run_sd) else f"{run_sd:.3f}"]
            for mode, scheme, count, classes, share, run_sd in shares.itertuples(index=False)]
    table = pd.DataFrame(rows, columns=["mode", "scheme", "runs", "by placement", "variance placement explains",
                                        "run-to-run sd (log)"])
    return ["## Placement", "", "Per-flow ECMP's placement of each run's flows, measured before the run "
            "(emulation/placement.py): the runs grouped by placement (A, B, ...: the same flows on the same "
            "uplinks; schemes that run one configuration together), the run-to-run sd of their log iteration "
            "times within the placements drawn more than once, and the share of the runs' variance that is "
            "the placements' beyond it (— where no placement ran twice).", "", *_markdown(table), ""]


def _alike_schemes(spec: Spec) -> dict[tuple[str, str], str]:
    """(mode, scheme) -> the schemes that run its configuration in that mode, joined
    ("scheme=baseline+control"), for the schemes that share theirs with another (repetition 1)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for run in spec.runs:
        if run.rep == 1 and not run.alone:
            scheme = scheme_of(run.run_id)
            names = groups.setdefault((run.job.mode, repr(run.config)), [])
            if scheme not in names:
                names.append(scheme)
    joined = {}
    for (mode, _), names in groups.items():
        if len(names) > 1:
            label = names[0] + "".join("+" + name.split("=", 1)[-1] for name in names[1:])
            joined.update({(mode, name): label for name in names})
    return joined


FABRIC_COLUMNS = ["first run", "hosts", "switches", "links", "servers", "crossing links", "build (s)", "start (s)",
                  "stop (s)", "ovs-vswitchd RSS (MB)", "machine memory idle (MB)", "machine memory peak (MB)"]


def _cell(value: object) -> str:
    """A table cell: one line, no column separator."""
    return one_line(value, 60).replace("|", "/")


def _fabrics(out: Path) -> list[str]:
    """A table of the fabrics the runs used (fabrics/*/fabric.json): size, servers and the links
    between them, set-up times, memory; a line for each record that cannot be read."""
    rows, damaged = [], []
    for path in sorted(out.glob("fabrics/*/fabric.json")):
        try:
            record = read_json_object(real_folder(path.parent) / path.name)
        except Damaged as error:
            damaged.append(f"- {error}; left out")
            continue
        servers = record.get("servers")
        record["servers"] = (len(servers) if isinstance(servers, (dict, list)) else 0) or "—"
        rows.append([_cell(path.parent.name), *(_cell(record.get(key, "—")) for key in
                                                 ("hosts", "switches", "links", "servers", "crossing_links", "build_s",
                                                  "start_s", "stop_s", "vswitchd_rss_mb", "machine_used_mb",
                                                  "machine_peak_mb"))])
    if not rows and not damaged:
        return []
    table = _markdown(pd.DataFrame(rows, columns=FABRIC_COLUMNS)) if rows else []
    return ["## Fabrics", "", *table, *([""] if rows and damaged else []), *damaged, ""]


def write_summary(out_dir: str | Path) -> str:
    """Write OUT/summary.md and return its text (the runner prints it)."""
    text = render(out_dir)
    write_text(Path(out_dir) / "summary.md", text)
    return text

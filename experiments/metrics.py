"""Per-run metrics from the host apps' and controller's raw records: iteration times, the
analytical lower bounds, TicTac overlap efficiency, time-to-accuracy, comparisons with the
baseline, delivered fractions, link utilization and uplink imbalance.

All functions are pure: DataFrames and numbers in, numbers or DataFrames out.

Definitions (the report's vocabulary):
- Iteration time T_i: the interval between the completions of iterations i-1 and i of the
  job, completion being the last worker's end_s, over the steady iterations. The first iteration
  (start-up, first connections, cold caches) has no predecessor. The last one's interval also
  drains the final round: its gradients go out and its parameters come back before it ends,
  where every other iteration's communication overlaps the next one's: n iterations put n
  rounds into n - 1 intervals (about 5% on the headline, in every scheme). Neither counts; the
  mean of T_i is the steady throughput, each interval holding one round and one compute.
- compute and comm are likewise averaged over the workers' steady iterations (all but the
  first). comm is *measured*: per worker and iteration, the time at least one of its tensor
  transfers was in flight (the union of their start..end intervals in tensors.csv: network
  wait + transfer). TicTac efficiency is computed from it, not from the analytical bound.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping

import numpy as np
import pandas as pd

from experiments.columns import METRIC_COLUMNS, PHASE_DELIVERED_COLUMNS  # noqa: F401 (runs.csv's, moved)
from experiments.traffic import comm_lower_bound_s, wire_bytes_per_payload_byte  # noqa: F401 (moved)
from topologies.layout import LEAF_ROLES

# TicTac's E is only defined where both parts matter: below this share of the iteration, one of
# them is noise and E = (comm + comp - T) / min(comm, comp) divides by it (-88.85 on an MLP run).
OVERLAP_SHARE_MIN = 0.1


def tight_bound_s(link_bound_s: float, compute_s: float, tail_comm_s: float) -> float:
    """The iteration bound with the fabric's busiest link and the synchronous tail: no faster than
    that link carries the iteration's traffic, nor than the compute followed by the communication
    that can only start after it (experiments/traffic.py). NaN when either part is unknown."""
    parts = [link_bound_s, compute_s + tail_comm_s]
    return math.nan if any(math.isnan(part) for part in parts) else float(max(parts))


def tictac_efficiency(comm_s: float, compute_s: float, iter_time_s: float) -> float:
    """TicTac's overlap efficiency E = (comm + comp - T) / (comm + comp - max(comm, comp)).

    1 when communication hides completely behind computation (T = max), 0 when they run
    back to back (T = comm + comp). Not clipped: values outside [0, 1] mean T was below the
    max or above the sum, i.e. the measurements disagree. NaN when either part is unknown or
    below OVERLAP_SHARE_MIN of T (overlap_undefined says which), where overlap means nothing.
    """
    if overlap_undefined(comm_s, compute_s, iter_time_s):
        return math.nan
    return (comm_s + compute_s - iter_time_s) / (comm_s + compute_s - max(comm_s, compute_s))


def overlap_undefined(comm_s: float, compute_s: float, iter_time_s: float) -> str:
    """Why TicTac's E is not defined for these times ('' when it is)."""
    for name, part in (("communication", comm_s), ("compute", compute_s)):
        if math.isnan(part) or math.isnan(iter_time_s):
            return f"{name} unknown"
        if not part >= OVERLAP_SHARE_MIN * iter_time_s:
            return f"{name} {part / iter_time_s:.0%} of the iteration"
    return ""


def iteration_times_s(iterations: pd.DataFrame) -> pd.Series:
    """T_i per steady iteration (indexed by iteration; neither the first nor the last) from the
    workers' rows of iterations.csv."""
    workers = iterations[iterations["role"] == "worker"]
    completion = workers.groupby("iteration")["end_s"].max().sort_index()
    return completion.diff().iloc[1:-1]


def _steady(rows: pd.DataFrame) -> pd.DataFrame:
    """Workers' rows without the first iteration (see the module docstring)."""
    workers = rows[rows["role"] == "worker"]
    return workers[workers["iteration"] > workers["iteration"].min()]


def comm_time_s(tensors: pd.DataFrame) -> float:
    """Mean over worker-iterations of the time any of their tensor transfers was in flight."""
    steady = _steady(tensors).sort_values(["rank", "iteration", "start_s"])
    if steady.empty:
        return math.nan
    # Walking the intervals by start time, each adds what lies beyond the furthest end so far.
    reach = steady.groupby(["rank", "iteration"])["end_s"].transform(lambda ends: ends.cummax().shift())
    added = (steady["end_s"] - np.fmax(steady["start_s"], reach)).clip(lower=0)
    return float(added.groupby([steady["rank"], steady["iteration"]]).sum().mean())


def straggler_s(iterations: pd.DataFrame) -> float:
    """TicTac's straggler effect: the spread of the workers' ends of an iteration (last - first),
    averaged over the steady iterations; NaN with one worker."""
    steady = _steady(iterations)
    if steady["rank"].nunique() < 2:
        return math.nan
    ends = steady.groupby("iteration")["end_s"]
    return float((ends.max() - ends.min()).mean())


def tensor_time_p99_s(tensors: pd.DataFrame) -> float:
    """99th percentile of single tensor transfer times (any role, any direction)."""
    durations = tensors["end_s"] - tensors["start_s"]
    return float(durations.quantile(0.99)) if len(durations) else math.nan


def time_to_accuracy_s(iterations: pd.DataFrame, target: float) -> float:
    """Seconds from the first iteration's start until a worker first reports test accuracy
    >= target; NaN if it never does."""
    workers = iterations[iterations["role"] == "worker"]
    reached = workers[workers["test_accuracy"] >= target]
    if reached.empty:
        return math.nan
    return float(reached["end_s"].min() - workers["start_s"].min())


def replica_divergence(models: list[Mapping[str, np.ndarray]]) -> float:
    """The largest difference between two workers' final parameters (name -> array each): 0 when the
    replicas are identical, as synchronous training must leave them; NaN without models."""
    if not models:
        return math.nan
    first = models[0]
    return float(max((np.abs(model[name] - first[name]).max(initial=0.0) for model in models[1:] for name in first),
                     default=0.0))


def per_run(table: pd.DataFrame, metric: Callable[[pd.DataFrame], float]) -> pd.Series:
    """metric of each run's rows of a combined table (one with a run_id column)."""
    if table.empty:
        return pd.Series(dtype=float)
    return table.groupby("run_id").apply(metric)


def training_window_s(iterations: pd.DataFrame) -> tuple[float, float]:
    """From the workers' first iteration start to their last end: the host apps' start-up (imports,
    connections) keeps the CPU busy but is not the emulation."""
    workers = iterations[iterations["role"] == "worker"]
    return float(workers["start_s"].min()), float(workers["end_s"].max())


def run_metrics(iterations: pd.DataFrame, tensors: pd.DataFrame, summaries: pd.DataFrame, *,
                mode: str, workers: int, servers: int, batch: int, host_bw_mbps: float,
                target_accuracy: float, mtu: int, transport: str, link_bound_s: float = math.nan,
                tail_comm_s: float = math.nan, comm_bound_s: float = math.nan) -> dict[str, float]:
    """The performance columns of one run's runs.csv row (not speedup_vs_baseline, not the guard's).

    iterations/tensors: the run's rows of the combined CSVs; summaries: one row per host-app
    process with role and the summary.json fields. batch is the global batch. link_bound_s and
    tail_comm_s (experiments/traffic.py) make the tight bound: max(link bound, compute + tail);
    comm_bound_s (experiments/traffic.py: an all-reduce's link and latency bound) is the lower bound's
    communication, the fluid comm_lower_bound_s for a run recorded without it.
    """
    iter_times = iteration_times_s(iterations)
    iter_mean = float(iter_times.mean()) if len(iter_times) else math.nan
    compute = float(_steady(iterations)["compute_s"].mean())
    worker_summaries = summaries[summaries["role"] == "worker"]
    model_bytes = float(worker_summaries["bytes_per_iteration"].iloc[0]) if len(worker_summaries) else math.nan
    comm_bound = (comm_bound_s if not math.isnan(comm_bound_s) else
                  comm_lower_bound_s(mode, model_bytes, host_bw_mbps, workers, servers, mtu, transport))
    comm = comm_time_s(tensors)
    lower = float(np.fmax(comm_bound, compute))
    return {
        "iter_time_mean_s": iter_mean,
        "iter_time_p50_s": float(iter_times.quantile(0.5)) if len(iter_times) else math.nan,
        "iter_time_p99_s": float(iter_times.quantile(0.99)) if len(iter_times) else math.nan,
        "samples_per_s": batch / iter_mean,
        "final_accuracy": float(worker_summaries["final_accuracy"].mean()),
        "time_to_accuracy_s": time_to_accuracy_s(iterations, target_accuracy),
        "bytes_sent": float(iterations["bytes_sent"].sum()),
        "lower_bound_s": lower,
        # no looser than the lower bound, whose all-reduce part also counts each round's latency
        "tight_bound_s": tight if math.isnan(tight := tight_bound_s(link_bound_s, compute, tail_comm_s))
        else max(tight, lower),
        "compute_s": compute,
        "comm_s": comm,
        "tictac_efficiency": tictac_efficiency(comm, compute, iter_mean),
        "straggler_s": straggler_s(iterations),
        # Mean over the process-iterations that received messages of the phase (pandas skips the empty ones).
        **{column: float(iterations[column].mean()) for column in PHASE_DELIVERED_COLUMNS},
    }


def _baseline_value(runs: pd.DataFrame, axes: list[str], baseline_axis: str, baseline_label: str,
                    column: str) -> pd.Series:
    """Per run, column in the baseline's run with the same values on every other axis and the same
    repetition (rep): the same seed, so the same data order and ECMP placement
    (experiments/source_ports.py).  Where that run has no value (it failed), or runs carry no rep,
    the mean over the baseline's repetitions."""
    others = [axis for axis in axes if axis != baseline_axis]
    baseline_rows = runs[runs[baseline_axis].astype(str) == str(baseline_label)]
    if others:
        mean = runs.join(baseline_rows.groupby(others)[column].mean().rename("baseline"), on=others)["baseline"]
    else:
        mean = pd.Series(baseline_rows[column].mean(), index=runs.index)
    if "rep" not in runs:
        return mean
    same_rep = baseline_rows.groupby([*others, "rep"])[column].mean().rename("paired")
    return runs.join(same_rep, on=[*others, "rep"])["paired"].fillna(mean)


def speedup_vs_baseline(runs: pd.DataFrame, axes: list[str], baseline_axis: str | None,
                        baseline_label: str | None) -> pd.Series:
    """the baseline's mean iteration time in the same repetition (same values on every other axis;
    _baseline_value) / this run's; NaN without a baseline.  Per repetition, not over the baseline's
    mean: a scheme identical to the baseline then scores 1 in every repetition, where baseline mean /
    run time gave it 1.2 over the headline's placements (0.33-0.95 s)."""
    if baseline_axis is None:
        return pd.Series(math.nan, index=runs.index)
    column = "iter_time_mean_s"
    return _baseline_value(runs, axes, baseline_axis, baseline_label, column) / runs[column]


def _received(tensors: pd.DataFrame) -> pd.DataFrame:
    """The receivers' rows: only they know how much of a message arrived (senders log 1)."""
    return tensors[tensors["direction"] == "recv"]


def delivered_fraction(tensors: pd.DataFrame) -> float:
    """Fraction of the received messages' bytes that arrived: the byte-weighted mean of
    delivered_fraction over the recv rows (1 with TCP; below 1 only with a loss-tolerant
    transport); NaN without received bytes."""
    received = _received(tensors)
    total = received["bytes"].sum()
    return float((received["delivered_fraction"] * received["bytes"]).sum() / total) if total > 0 else math.nan


def min_delivered_fraction(tensors: pd.DataFrame) -> float:
    """The smallest delivered_fraction of a single received message (a tensors.csv recv row)."""
    return float(_received(tensors)["delivered_fraction"].min())


# links.csv columns (after run_id): one row per switch port and sampling interval.
LINK_COLUMNS = [
    "time_s", "interval_s", "switch", "role", "port", "peer", "tier", "rate_mbps",
    "tx_bytes", "rx_bytes", "tx_pkts", "rx_pkts", "tx_mbps", "rx_mbps",
    "tx_util_frac", "rx_util_frac", "tx_dropped_pkts", "rx_dropped_pkts",
    "queue_drops_pkts", "socket_drops_pkts",
]


def link_utilization(ports: pd.DataFrame, port_rates: pd.DataFrame, queues: pd.DataFrame,
                     sockets: pd.DataFrame) -> pd.DataFrame:
    """links.csv rows of one run: per port and sampling interval, the bytes, rates,
    utilization (of the port's configured rate) and drops from cumulative port counters
    (ports.csv, the controller's), and what the port's class queues and its OVS socket dropped
    (queues.csv, sockets.csv: the runner's samples).

    Ports without a configured rate (the switch's LOCAL port, say) are left out, and so are
    intervals whose counters went backwards (a switch reconnected and reset them).
    """
    rates = port_rates.astype({"switch": str, "port": str})
    samples = ports.astype({"switch": str, "port": str}).merge(rates, on=["switch", "port"])
    samples = samples.sort_values(["switch", "port", "time_s"])
    counters = ["tx_bytes", "rx_bytes", "tx_packets", "rx_packets", "tx_dropped", "rx_dropped"]
    deltas = samples.groupby(["switch", "port"])[["time_s", *counters]].diff()
    links = samples[["time_s", "switch", "role", "port", "peer", "tier", "rate_mbps"]].assign(
        interval_s=deltas["time_s"],
        tx_bytes=deltas["tx_bytes"], rx_bytes=deltas["rx_bytes"],
        tx_pkts=deltas["tx_packets"], rx_pkts=deltas["rx_packets"],
        tx_dropped_pkts=deltas["tx_dropped"], rx_dropped_pkts=deltas["rx_dropped"],
    )
    valid = (links["interval_s"] > 0) & (deltas[counters] >= 0).all(axis=1)
    links = links[valid].copy()
    for direction in ("tx", "rx"):
        links[f"{direction}_mbps"] = links[f"{direction}_bytes"] * 8 / links["interval_s"] / 1e6
        links[f"{direction}_util_frac"] = links[f"{direction}_mbps"] / links["rate_mbps"]
    queue_drops = queues.groupby(["switch", "port", "time_s"], as_index=False)["dropped_pkts"].sum()
    links["queue_drops_pkts"] = _counter_deltas(links, queue_drops, "dropped_pkts")
    links["socket_drops_pkts"] = _counter_deltas(links, sockets, "socket_drops")
    return links[LINK_COLUMNS].reset_index(drop=True)


def _counter_deltas(links: pd.DataFrame, samples: pd.DataFrame, counter: str) -> pd.Series:
    """Per links row, how much a cumulative per-port counter sampled at other times grew over the
    row's interval (the last sample at or before each end); NaN before the first sample."""
    if samples.empty or links.empty:
        return pd.Series(math.nan, index=links.index)
    samples = samples.astype({"switch": str, "port": str, "time_s": float}).sort_values("time_s")[
        ["time_s", "switch", "port", counter]]

    def value_at(times: pd.Series) -> pd.Series:
        at = links[["switch", "port"]].assign(time_s=times.to_numpy(dtype=float), row=range(len(links)))
        found = pd.merge_asof(at.sort_values("time_s"), samples, on="time_s", by=["switch", "port"])
        return found.sort_values("row")[counter].to_numpy()

    return pd.Series(value_at(links["time_s"]) - value_at(links["time_s"] - links["interval_s"]),
                     index=links.index)


def fabric_link_utilization(links: pd.DataFrame) -> pd.Series:
    """Mean transmit utilization of each fabric port (one direction of a fabric link)."""
    fabric = links[links["tier"] == "fabric"]
    return fabric.groupby(["switch", "port"])["tx_util_frac"].mean()


def link_imbalance(links: pd.DataFrame) -> float:
    """max / mean of the fabric ports' mean utilization: 1 is a perfectly even spread."""
    per_port = fabric_link_utilization(links)
    mean = per_port.mean()
    return float(per_port.max() / mean) if mean > 0 else math.nan


def uplink_imbalance(links: pd.DataFrame) -> float:
    """How unevenly the leaves spread their traffic over their uplinks (links.csv rows of one
    run): 1 is a perfectly even spread, u (a leaf's uplink count) all on one uplink.

    Per leaf switch (one that hosts hang off: role leaf, or edge in a fat-tree or a fabric file;
    topologies/layout.py; its fabric ports are its uplinks), the bytes each uplink transmitted
    over the run, and max / mean of those; the result is the mean over the leaves weighted by
    their uplink bytes, so idle leaves do not count. NaN when no uplink transmitted anything.
    """
    uplinks = links[(links["tier"] == "fabric") & links["role"].isin(LEAF_ROLES)]
    per_port = uplinks.groupby(["switch", "port"])["tx_bytes"].sum()
    per_leaf = per_port.groupby(level="switch").agg(["max", "mean", "sum"])
    per_leaf = per_leaf[per_leaf["sum"] > 0]
    if per_leaf.empty:
        return math.nan
    return float(np.average(per_leaf["max"] / per_leaf["mean"], weights=per_leaf["sum"]))

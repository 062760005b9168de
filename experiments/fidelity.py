"""The fidelity guard: did a run measure the emulated network, or the machine emulating it?

Each check is judged on its own, over the run's training window (first iteration start to last
end), from what the runner sampled (experiments/sampler.py) and the host apps reported:

- machine CPU: mean utilization of all cores <= CPU_LIMIT (time the hypervisor stole from them counts
  as used: the emulation did not get it);
- ovs-vswitchd: its busiest thread (the one that forwards every packet of every switch) below
  VSWITCHD_THREAD_LIMIT of a core on average;
- links: a switch port found holding B bytes must send min(B, rate x t) in the next t seconds
  (work conservation, whatever the traffic's burstiness); over the run's drain probes the ports
  sent >= LINK_RATE_MIN of that (a starved forwarding thread or a coarse qdisc timer shows up as
  a queue that drains slower than its link);
- drops outside the class queues: the switches' port sockets, OVS transmit errors and datapath
  drops together <= OUTSIDE_DROPS_LIMIT of the packets the switch ports sent (such drops are
  class-blind: priority cannot protect against them);
- host-app timing: the 99th percentile of how late the host apps' timed sleeps (emulated compute,
  mlt's pacer) woke <= APP_LAG_P99_MS_LIMIT, or PACED_APP_LAG_P99_MS_LIMIT in a run where mlt paces
  (app_lag_limit_ms).

`fidelity_ok` holds only when every check passes; `fidelity_reason` names each one that failed.
`cpu_steal_mean` is the share of the CPUs the hypervisor gave other guests over the window; a reason
for the CPU or the timers says how much it stole when that was STEAL_NOTE_MIN or more, so that a run
failed by the machine's neighbours is told from one failed by its own load.

On a fabric across servers every server is judged on its own samples (each has its own switches,
queues, ovs-vswitchd and CPUs; experiments/sampler.py samples each), the host-app timing once
(`judge_servers`): the run is green only when every server is, `fidelity_reason` has one part per
failing server (`<server>: <its reasons>`, parts joined by ` | `), and the figures are the worst
server's (the highest CPU and thread, the lowest drain fraction, the drops summed). A server
without samples in the training window fails.
All functions are pure (DataFrames and dicts in, numbers and strings out).
"""
from __future__ import annotations

import math

import pandas as pd

from experiments.columns import FIDELITY_COLUMNS  # noqa: F401 (runs.csv's, moved)
from hostapps.mlt.pacing import PACING_BURST_S

CPU_LIMIT = 0.9
VSWITCHD_THREAD_LIMIT = 0.9
LINK_RATE_MIN = 0.9
OUTSIDE_DROPS_LIMIT = 1e-4
APP_LAG_P99_MS_LIMIT = 10.0
# mlt's pacer lets a sender that woke late run PACING_BURST_S ahead of its rate, no more: a wake-up
# later than twice that is link time the sender does not make up, so a run where mlt paces measures
# the machine well before emulated compute would (the measurements behind it: docs/results.md).
PACED_APP_LAG_P99_MS_LIMIT = 2 * PACING_BURST_S * 1000
# Steal worth naming beside a failed CPU or timer check: on this VM an idle minute steals ~0.2%.
STEAL_NOTE_MIN = 0.02


def window(samples: pd.DataFrame, start_s: float, end_s: float) -> pd.DataFrame:
    return samples[(samples["time_s"] >= start_s) & (samples["time_s"] <= end_s)]


def covering(samples: pd.DataFrame, start_s: float, end_s: float) -> pd.DataFrame:
    """The CPU samples whose interval (since the sample before) overlaps the window: a window shorter
    than the sampling interval is judged by the sample that covers it."""
    ordered = samples.sort_values("time_s")
    since = ordered["time_s"].shift(fill_value=-math.inf)
    return ordered[(ordered["time_s"] >= start_s) & (since < end_s)]


def port_totals(queues: pd.DataFrame) -> pd.DataFrame:
    """Per sample and switch port, its class queues summed: sent bytes and packets, drops, backlog."""
    columns = ["sent_bytes", "sent_pkts", "dropped_pkts", "backlog_bytes"]
    return queues.groupby(["switch", "port", "time_s"], as_index=False)[columns].sum()


def drain_fraction(drains: pd.DataFrame, port_rates: pd.DataFrame) -> float:
    """Over the drain probes (drain.csv rows), what the ports sent as a fraction of what a faithful
    link must have sent: min(the backlog found, rate x probe) each (capped at that, as HTB's bursts
    may send more); NaN without probes."""
    rates = port_rates.astype({"port": int}).set_index(["switch", "port"])["rate_mbps"]
    probes = drains.astype({"port": int}).join(rates, on=["switch", "port"])
    owed = (probes["rate_mbps"] * 1e6 / 8 * probes["probe_s"]).clip(upper=probes["backlog_bytes"])
    return float(probes["sent_bytes"].clip(upper=owed).sum() / owed.sum()) if owed.sum() > 0 else math.nan


def run_deltas(samples: pd.DataFrame, keys: list[str], columns: list[str]) -> pd.DataFrame:
    """Per key, the last sample's counters minus the first's (counters are cumulative)."""
    ordered = samples.sort_values("time_s").groupby(keys)[columns]
    return (ordered.last() - ordered.first()).reset_index()


def app_lag_limit_ms(transports: set[str]) -> float:
    """The host-app timer limit of a run whose jobs use these transports."""
    return PACED_APP_LAG_P99_MS_LIMIT if "mlt" in transports else APP_LAG_P99_MS_LIMIT


def judge(cpu: pd.DataFrame, queues: pd.DataFrame, drains: pd.DataFrame, sockets: pd.DataFrame,
          ovs: dict, port_rates: pd.DataFrame, timing_p99_ms: list[float], start_s: float,
          end_s: float, lag_limit_ms: float = APP_LAG_P99_MS_LIMIT) -> dict[str, object]:
    """The FIDELITY_COLUMNS of one run. cpu, queues, drains, sockets: the sampler's CSVs; ovs: its
    ovs.json; port_rates: port_rates.csv; timing_p99_ms: each host-app process's lag_ms_p99, judged
    against lag_limit_ms (app_lag_limit_ms); start_s, end_s: the training window."""
    cpu = covering(cpu, start_s, end_s)
    cpu_mean = float(cpu["cpu_util"].mean())
    # cpu.csv files written before the sampler recorded steal have no such column
    steal = cpu["steal_util"] if "steal_util" in cpu.columns else pd.Series(dtype=float)
    steal_mean, steal_peak = float(steal.mean()), float(steal.max())
    thread_mean = float(cpu["vswitchd_thread_util"].mean())
    link_frac = drain_fraction(window(drains, start_s, end_s), port_rates)
    queue_deltas = run_deltas(port_totals(queues), ["switch", "port"], ["sent_pkts", "dropped_pkts"])
    class_drops = int(queue_deltas["dropped_pkts"].sum())
    sent = int(queue_deltas["sent_pkts"].sum())
    socket_drops = int(run_deltas(sockets, ["switch", "port"], ["socket_drops"])["socket_drops"].sum())
    transmit_errors = sum(ovs.get("tx_errors_by_port", {}).values()) + ovs.get("tx_errors_suppressed", 0)
    outside = socket_drops + transmit_errors + ovs.get("datapath_drops", 0)
    lag = max(timing_p99_ms, default=math.nan)
    reasons = []
    if cpu_mean > CPU_LIMIT:
        stolen = f" ({steal_mean:.2f} of it stolen by the hypervisor)" if steal_mean >= STEAL_NOTE_MIN else ""
        reasons.append(f"machine CPU {cpu_mean:.2f} > {CPU_LIMIT}{stolen}")
    if thread_mean >= VSWITCHD_THREAD_LIMIT:
        reasons.append(f"ovs-vswitchd's forwarding thread at {thread_mean:.2f} cores (>= {VSWITCHD_THREAD_LIMIT})")
    if link_frac < LINK_RATE_MIN:
        reasons.append(f"backlogged ports drained at {link_frac:.2f} of their rate (< {LINK_RATE_MIN})")
    if outside > OUTSIDE_DROPS_LIMIT * max(sent, 1):
        reasons.append(f"{outside} packets dropped outside the class queues (port sockets {socket_drops}, "
                       f"OVS transmit {transmit_errors}, datapath {ovs.get('datapath_drops', 0)}; "
                       f"{sent} sent)")
    if lag > lag_limit_ms:
        stolen = f", the hypervisor stole up to {steal_peak:.0%} of the CPUs" if steal_peak >= STEAL_NOTE_MIN else ""
        reasons.append(f"host-app timers woke {lag:.1f} ms late (p99 > {lag_limit_ms:g} ms{stolen})")
    known = not (math.isnan(cpu_mean) or math.isnan(thread_mean))
    return {
        "cpu_util_mean": cpu_mean, "cpu_steal_mean": steal_mean, "vswitchd_thread_util_mean": thread_mean,
        "link_rate_frac": link_frac,
        "class_queue_drops_pkts": class_drops, "outside_queue_drops_pkts": outside, "app_lag_ms_p99": lag,
        "fidelity_ok": (not reasons) if known else pd.NA,
        "fidelity_reason": "; ".join(reasons) if known else "no CPU samples in the training window",
    }


SERVER_SEPARATOR = " | "


def judge_servers(samples: dict[str, dict | None], port_rates: pd.DataFrame, timing_p99_ms: list[float],
                  start_s: float, end_s: float, lag_limit_ms: float = APP_LAG_P99_MS_LIMIT) -> dict[str, object]:
    """The FIDELITY_COLUMNS of one run on one or several servers. samples: per server in
    cluster.servers' order (this machine first), its sampler's records (`cpu`, `queues`, `drains`,
    `sockets`: DataFrames; `ovs`: dict), or None when there are none. This machine's verdict alone
    may be unknown (no CPU sample in the window, as on one machine); another server's fails."""
    verdicts, parts, failed, unknown = {}, [], False, False
    for index, (server, records) in enumerate(samples.items()):
        if records is None:
            parts.append(f"{server}: no samples from its sampler")
            failed = True
            continue
        verdict = judge(records["cpu"], records["queues"], records["drains"], records["sockets"], records["ovs"],
                        port_rates, timing_p99_ms if index == 0 else [], start_s, end_s,  # host apps judged once
                        lag_limit_ms)
        verdicts[server] = verdict
        if verdict["fidelity_ok"] is not True:
            parts.append(f"{server}: {verdict['fidelity_reason']}")
            unknown |= index == 0 and verdict["fidelity_ok"] is pd.NA
            failed |= index > 0 or verdict["fidelity_ok"] is False
    if len(samples) == 1 and verdicts:
        return next(iter(verdicts.values()))
    judged = list(verdicts.values())

    def worst(column: str, pick) -> float:
        values = [float(verdict[column]) for verdict in judged if not pd.isna(verdict[column])]
        return pick(values) if values else math.nan

    first = verdicts.get(next(iter(samples)))
    return {
        "cpu_util_mean": worst("cpu_util_mean", max),
        "cpu_steal_mean": worst("cpu_steal_mean", max),
        "vswitchd_thread_util_mean": worst("vswitchd_thread_util_mean", max),
        "link_rate_frac": worst("link_rate_frac", min),
        "class_queue_drops_pkts": sum(int(verdict["class_queue_drops_pkts"]) for verdict in judged),
        "outside_queue_drops_pkts": sum(int(verdict["outside_queue_drops_pkts"]) for verdict in judged),
        "app_lag_ms_p99": first["app_lag_ms_p99"] if first else max(timing_p99_ms, default=math.nan),
        "fidelity_ok": False if failed else (pd.NA if unknown else True),
        "fidelity_reason": SERVER_SEPARATOR.join(parts),
    }

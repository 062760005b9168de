"""runs.csv's columns: the contract between the spec (a matrix axis becomes a column, so it may not
take another column's name), the runner (whose run records fill the rows) and experiments/results.py
(which writes the table). Plain names, no pandas: validating a spec reads them.
"""
from __future__ import annotations

from hostapps.collectives import PHASES

# The fidelity guard's columns, in order (experiments/fidelity.py fills them).
FIDELITY_COLUMNS = [
    "cpu_util_mean", "cpu_steal_mean", "vswitchd_thread_util_mean", "link_rate_frac", "class_queue_drops_pkts",
    "outside_queue_drops_pkts", "app_lag_ms_p99", "fidelity_ok", "fidelity_reason",
]
# iterations.csv's (and runs.csv's) delivered fraction of each collective phase (hostapps.records).
PHASE_DELIVERED_COLUMNS = [f"delivered_fraction_{phase}" for phase in PHASES]
# The per-run metric columns, in order (experiments/metrics.py: run_metrics, speedup_vs_baseline, the guard's).
METRIC_COLUMNS = [
    "iter_time_mean_s", "iter_time_p50_s", "iter_time_p99_s", "samples_per_s",
    "final_accuracy", "time_to_accuracy_s", "bytes_sent", "lower_bound_s", "tight_bound_s",
    "compute_s", "comm_s", "tictac_efficiency", "straggler_s", *PHASE_DELIVERED_COLUMNS, "replica_divergence",
    "speedup_vs_baseline", "uplink_imbalance", "max_flows_per_uplink", "placement", *FIDELITY_COLUMNS,
]
# A run of several jobs has a row per job (`job` its name; "" in a run of one job), and these
# columns (experiments/multijob.py): the job's iteration time alone and its slowdown beside the
# others, its completion time from its arrival and its workers' compute over their wall time.
JOB_COLUMNS = ["alone_iter_time_s", "slowdown_vs_alone", "jct_s", "compute_util"]
# Columns that echo a config field. An axis may share one of these names only when it is the
# scalar axis over that very field (the column then shows the axis value).
CONFIG_COLUMNS = {
    "mode": "job.mode", "lb": "controller.lb", "sched": "controller.sched",
    "transport": "job.transport", "loss_bound": "job.loss_bound", "iterations": "job.iterations",
}
# The faults a run survived (its record's) and the data its metrics lack.
RECORD_COLUMNS = ["faults", "data_gaps"]
# Names no matrix axis may take.
RESERVED_COLUMNS = {"run_id", "job", "rep", "workers", *RECORD_COLUMNS, *METRIC_COLUMNS, *JOB_COLUMNS}


def runs_columns(axes: list[str]) -> list[str]:
    """runs.csv header: run_id, job, the axes (but those that are config columns), rep, config, metrics,
    the job's among others, then the faults the run survived and the data its metrics lack."""
    axis_columns = [axis for axis in axes if axis not in CONFIG_COLUMNS]
    config_columns = ["mode", "lb", "sched", "transport", "loss_bound", "workers", "iterations"]
    return ["run_id", "job", *axis_columns, "rep", *config_columns, *METRIC_COLUMNS, *JOB_COLUMNS, *RECORD_COLUMNS]

"""The results directory: its layout, the per-run input contracts, and the tidy CSVs
aggregated from them.

    OUT/spec.yaml                  resolved spec (defaults filled, --set applied)
    OUT/meta.json                  git revision, tool versions, kernel, CPU, seed
    OUT/runs.csv                   one row per run (columns: runs_columns)
    OUT/iterations.csv, tensors.csv, links.csv   every run's rows, run_id first
    OUT/queues.csv                 per run, switch port and class: packets sent and dropped
    OUT/summary.md, OUT/plots/*.png
    OUT/runs/<run_id>/run.json     the run's config, start/end, status (write_run_record)
    OUT/runs/<run_id>/ports.csv, port_rates.csv                   controller and runner
    OUT/runs/<run_id>/cpu.csv, queues.csv, drain.csv, sockets.csv, ovs.json   runner (sampler.py)
    OUT/runs/<run_id>/<host>-<role><rank>/iterations.csv, tensors.csv, summary.json  host apps
        (and model.npz, trace.json; stdout.log, stderr.log: the process's output)
    OUT/runs/<run_id>/flow<i>-<src>-<dst>.log     iperf3 output of background flows
    OUT/fabrics/<first run_id>/    controller log and port statistics of a fabric, shared by
                                   consecutive runs of one topology and load balancing
"""
from __future__ import annotations

import importlib.metadata
import itertools
import json
import math
import os
import platform
import sys
import re
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from controller import stats as controller_stats
from experiments import fidelity, metrics
from experiments.sampler import CPU_COLUMNS, DRAIN_COLUMNS, QUEUE_COLUMNS, SOCKET_COLUMNS
from experiments.spec import CONFIG_COLUMNS, Run, Spec, get_field, parse_spec, scheme_of
from hostapps import records
from common.files import atomic_open, write_text
from common.sysctl import read_sysctl
from emulation.machine import ALLOWED_TCP_CC, SOCKET_BUFFERS, transmit_buffer_bytes

MACHINE_SYSCTLS = [*SOCKET_BUFFERS, ALLOWED_TCP_CC, "net/ipv4/tcp_congestion_control"]

# Inputs written per host-app process, per run by the controller and the runner.
# The host apps' CSV contracts (hostapps/records.py), as lists for pandas.
ITERATION_COLUMNS = list(records.ITERATION_COLUMNS)
TENSOR_COLUMNS = list(records.TENSOR_COLUMNS)
# bytes_per_iteration is the model's size in bytes: the S of the lower bounds.
SUMMARY_FIELDS = ["final_accuracy", "iterations", "bytes_per_iteration", "param_count", "wall_time_s"]
PORT_COLUMNS = list(controller_stats.PORT_COLUMNS)  # the controller's port statistics
PORT_RATE_COLUMNS = ["switch", "port", "peer", "rate_mbps", "tier", "role"]
# OUT/queues.csv columns (after run_id): per switch port and class, over the run.
QUEUE_TOTAL_COLUMNS = ["switch", "port", "cs", "sent_pkts", "dropped_pkts"]

PROCESS_DIR = re.compile(r"(?P<host>.+)-(?P<role>worker|server)(?P<rank>\d+)")
# Port statistics silent for this many polling intervals: a gap (a controller restarting, say).
PORT_STATS_GAP_INTERVALS = 3
RUN_STATUSES = ("ok", "failed")
RECORD_COLUMNS = ["faults", "data_gaps"]


def runs_columns(axes: list[str]) -> list[str]:
    """runs.csv header: run_id, the axes (but those that are config columns), rep, config, metrics,
    then the faults the run survived and the data its metrics lack."""
    axis_columns = [axis for axis in axes if axis not in CONFIG_COLUMNS]
    config_columns = ["mode", "lb", "sched", "transport", "loss_bound", "workers", "iterations"]
    return ["run_id", *axis_columns, "rep", *config_columns, *metrics.METRIC_COLUMNS, *RECORD_COLUMNS]


# ------------------------------------------------------------------------------ layout, writers

def run_dir(out_dir: str | Path, run_id: str) -> Path:
    return Path(out_dir) / "runs" / run_id


def process_dir(out_dir: str | Path, run_id: str, host: str, role: str, rank: int) -> Path:
    """Where one host-app process writes iterations.csv, tensors.csv and summary.json."""
    return run_dir(out_dir, run_id) / f"{host}-{role}{rank}"


def start_output(out_dir: str | Path, spec: Spec, resume: bool) -> Path:
    """Create OUT (see output_folder) with spec.yaml and meta.json. Resuming needs the same resolved
    spec (the finished runs must stay comparable) and keeps the original meta.json."""
    out = Path(out_dir)
    output_folder(out)
    spec_path = out / "spec.yaml"
    document = spec.resolved_document()
    if resume and spec_path.exists():
        if yaml.safe_load(spec_path.read_text()) != document:
            raise ValueError(f"{spec_path}: differs from the spec given; resume needs the same spec")
    elif not resume and spec_path.exists():
        raise ValueError(f"{out}: holds results already; pass --resume or another --out")
    write_text(spec_path, yaml.safe_dump(document, sort_keys=False))
    if not (out / "meta.json").exists():
        write_text(out / "meta.json", json.dumps(environment(spec), indent=2) + "\n")
    return out


def output_folder(out: Path) -> None:
    """Create OUT and the folders above it that do not exist (mode 0o755 or tighter) and check OUT,
    them and the results root (the nearest folder above that existed); ValueError naming --out
    unless each is a folder, not a symbolic link, owned by us or root and, when we are root, not
    writable by other users (but a sticky results root such as /tmp, where no one else can rename
    or delete what we create). Otherwise another user could put a link where root then writes."""
    absolute = Path(os.path.abspath(out))
    missing = list(itertools.takewhile(lambda folder: not os.path.lexists(folder), [absolute, *absolute.parents]))
    root = missing[-1].parent if missing else absolute.parent
    _check_folder(out, root, sticky_allowed=True)
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o755)
        except FileExistsError:
            pass  # made meanwhile by someone: checked below like one found
        except OSError as error:
            raise ValueError(f"--out {out}: cannot create {folder}: {error.strerror}") from None
    for folder in [*reversed(missing[1:]), absolute]:
        _check_folder(out, folder, sticky_allowed=False)


def _check_folder(out: Path, folder: Path, sticky_allowed: bool) -> None:
    status = os.lstat(folder)
    mode, owner = status.st_mode, status.st_uid
    problem = None
    if stat.S_ISLNK(mode):
        problem = "is a symbolic link: results go into a real folder, not through a link"
    elif not stat.S_ISDIR(mode):
        problem = "is not a folder"
    elif owner not in (os.geteuid(), 0):
        problem = f"is owned by uid {owner}, neither us nor root: its owner could put links where we write"
    elif os.geteuid() == 0 and mode & 0o022 and not (sticky_allowed and mode & stat.S_ISVTX):
        problem = f"is writable by other users (mode {stat.S_IMODE(mode):#o}): they could put links where we write"
    if problem:
        raise ValueError(f"--out {out}: {folder} {problem}")


def _command_output(command: list[str]) -> str | None:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip().splitlines()[0] if result.stdout.strip() else None


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def environment(spec: Spec) -> dict[str, Any]:
    """meta.json: what produced the results; None where a version is not obtainable."""
    repo = Path(__file__).resolve().parent.parent
    return {
        "spec": spec.name,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git_revision": _command_output(["git", "-C", str(repo), "rev-parse", "HEAD"]),
        "git_dirty": bool(_command_output(["git", "-C", str(repo), "status", "--porcelain"])),
        "python": platform.python_version(),
        "numpy": _package_version("numpy"),
        "pandas": _package_version("pandas"),
        "ovs": _command_output(["ovs-vsctl", "--version"]),
        "mininet": _package_version("mininet"),
        "ryu": _package_version("ryu"),
        "kernel": platform.release(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "seed": spec.base.job.seed,
        # The machine-wide settings the emulation depends on (emulation/machine.py raises them
        # before the first fabric) and the buffer OVS transmits with; each host's TCP congestion
        # control is its run's topology.tcp_cc.
        "sysctls": {name.replace("/", "."): _sysctl(name) for name in MACHINE_SYSCTLS},
        "ovs_transmit_buffer_bytes": transmit_buffer_bytes(),
    }


def _sysctl(name: str) -> str | None:
    try:
        return read_sysctl(name)
    except OSError:
        return None


def write_csv(frame: pd.DataFrame, path: str | Path) -> None:
    """A CSV written whole or not at all."""
    with atomic_open(path, newline="") as file:
        frame.to_csv(file, index=False)


def write_run_record(out_dir: str | Path, run: Run, status: str, start_s: float, end_s: float,
                     error: str = "", faults: list[str] = (), bounds: dict[str, float] | None = None) -> Path:
    """runs/<run_id>/run.json: the run (see Run.to_dict), epoch start/end, status, error, the
    faults it survived (or not): e.g. a controller restarted, and the bounds its traffic puts on an
    iteration (experiments/traffic.py: link_bound_s, tail_comm_s)."""
    if status not in RUN_STATUSES:
        raise ValueError(f"status: {status!r} is not allowed (one of {', '.join(RUN_STATUSES)})")
    path = run_dir(out_dir, run.run_id) / "run.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {**run.to_dict(), "start_s": start_s, "end_s": end_s, "status": status, "error": error,
              "faults": list(faults), **(bounds or {})}
    write_text(path, json.dumps(record, indent=2) + "\n")
    return path


def read_run_record(out_dir: str | Path, run_id: str) -> dict[str, Any] | None:
    """The run's run.json; None when there is none or it cannot be read (the run is then not
    finished: --resume runs it again)."""
    path = run_dir(out_dir, run_id) / "run.json"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("status") in RUN_STATUSES else None


# What a finished run's folder holds besides run.json: the runner's and every host-app process's.
RUN_FILES = ("ports.csv", "port_rates.csv", "cpu.csv", "queues.csv", "drain.csv", "sockets.csv", "ovs.json")
PROCESS_FILES = ("iterations.csv", "tensors.csv", "summary.json")


def missing_records(out_dir: str | Path, run: Run) -> list[str]:
    """The files a finished run should have and has not (relative to its folder)."""
    path = run_dir(out_dir, run.run_id)
    config = run.config
    processes = [(host, "server", rank) for rank, host in enumerate(config.server_hosts)]
    processes += [(host, "worker", rank) for rank, host in enumerate(config.worker_hosts)]
    expected = list(RUN_FILES) + [f"{process_dir(out_dir, run.run_id, *process).name}/{name}"
                                  for process in processes for name in PROCESS_FILES]
    return [name for name in expected if not (path / name).is_file()]


def completed_run_ids(out_dir: str | Path, spec: Spec) -> set[str]:
    """Runs recorded with status ok and every record in place: what --resume skips."""
    done = set()
    for run in spec.runs:
        record = read_run_record(out_dir, run.run_id)
        if record and record["status"] == "ok" and not missing_records(out_dir, run):
            done.add(run.run_id)
    return done


# ------------------------------------------------------------------------------------ reading

# Columns added to the records after results were already made with them: older results read as
# empty there, so they still aggregate (each other missing column is an error).
LATER_COLUMNS = {"delivered_fraction_reduce", "delivered_fraction_gather", "mem_used_mb", "straggler_s"}


def _read_csv(path: Path, columns: list[str]) -> pd.DataFrame:
    """A contract CSV with exactly its declared columns (extra ones dropped); empty if absent."""
    if not path.exists():
        return pd.DataFrame(columns=columns)
    frame = pd.read_csv(path)
    frame = frame.assign(**{column: math.nan for column in LATER_COLUMNS & set(columns) - set(frame.columns)})
    missing = [column for column in columns if column not in frame.columns]
    if missing:
        raise ValueError(f"{path}: missing columns {', '.join(missing)} (expected {', '.join(columns)})")
    return frame[columns]


def _process_dirs(run_path: Path) -> list[tuple[Path, re.Match]]:
    matches = ((path, PROCESS_DIR.fullmatch(path.name)) for path in sorted(run_path.iterdir()))
    return [(path, match) for path, match in matches if match and path.is_dir()]


def _concat(frames: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    frames = [frame for frame in frames if len(frame)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def read_run(out_dir: str | Path, run_id: str) -> dict[str, pd.DataFrame]:
    """One run's raw records: iterations, tensors, summaries (one row per process, with
    host, role, rank), ports, port_rates, cpu."""
    path = run_dir(out_dir, run_id)
    processes = _process_dirs(path)
    summaries = []
    for process_path, match in processes:
        summary_path = process_path / "summary.json"
        if summary_path.exists():
            fields = json.loads(summary_path.read_text())
            summaries.append({"host": match["host"], "role": match["role"], "rank": int(match["rank"]),
                              **{name: fields.get(name, math.nan) for name in SUMMARY_FIELDS},
                              "lag_ms_p99": fields.get("timing", {}).get("lag_ms_p99", math.nan)})
    ovs_path = path / "ovs.json"
    return {
        "iterations": _concat([_read_csv(p / "iterations.csv", ITERATION_COLUMNS) for p, _ in processes],
                              ITERATION_COLUMNS),
        "tensors": _concat([_read_csv(p / "tensors.csv", TENSOR_COLUMNS) for p, _ in processes],
                           TENSOR_COLUMNS),
        "summaries": pd.DataFrame(summaries, columns=["host", "role", "rank", *SUMMARY_FIELDS, "lag_ms_p99"]),
        "ports": _read_csv(path / "ports.csv", PORT_COLUMNS),
        "port_rates": _read_csv(path / "port_rates.csv", PORT_RATE_COLUMNS),
        "cpu": _read_csv(path / "cpu.csv", CPU_COLUMNS),
        "queues": _read_csv(path / "queues.csv", QUEUE_COLUMNS),
        "drains": _read_csv(path / "drain.csv", DRAIN_COLUMNS),
        "sockets": _read_csv(path / "sockets.csv", SOCKET_COLUMNS),
        "ovs": json.loads(ovs_path.read_text()) if ovs_path.exists() else {},
    }


# -------------------------------------------------------------------------------- aggregation

def port_stats_gap_s(ports: pd.DataFrame, start_s: float, end_s: float) -> float:
    """The longest stretch of the run that some switch port's statistics do not cover: between
    two samples, or before the first and after the last (a dead controller stops them)."""
    if ports.empty:
        return end_s - start_s
    gaps = []
    for _, samples in ports.groupby(["switch", "port"]):
        times = samples["time_s"].sort_values()
        gaps += [times.diff().max() if len(times) > 1 else 0.0, times.iloc[0] - start_s, end_s - times.iloc[-1]]
    return float(max(gaps))


def _run_row(out: Path, run: Run, record: dict[str, Any], records: dict[str, pd.DataFrame],
             links: pd.DataFrame) -> dict[str, Any]:
    """One runs.csv row. A metric whose data is incomplete (a process's records missing, port
    statistics with a gap) is left empty, and data_gaps says what is missing."""
    config = run.config
    row = {"run_id": run.run_id, **run.axes, "rep": run.rep,
           **{column: get_field(config, dotted) for column, dotted in CONFIG_COLUMNS.items()},
           "workers": len(config.worker_hosts), "faults": "; ".join(record.get("faults", [])),
           "data_gaps": ""}
    if record["status"] != "ok":
        return row  # a failed run's partial records would give misleading metrics
    missing = missing_records(out, run)
    if missing:
        row["data_gaps"] = f"records missing: {', '.join(missing)}"
        return row
    interval_s = config.controller.stats_interval_s
    gap = port_stats_gap_s(records["ports"], record["start_s"], record["end_s"])
    if gap > PORT_STATS_GAP_INTERVALS * interval_s:
        row["data_gaps"] = f"port statistics missing for {gap:.1f} s: no uplink imbalance"
    else:
        row["uplink_imbalance"] = metrics.uplink_imbalance(links)
    iterations = records["iterations"]
    row.update(metrics.run_metrics(
        iterations, records["tensors"], records["summaries"],
        mode=config.job.mode, workers=len(config.worker_hosts), servers=len(config.server_hosts),
        batch=config.job.batch, host_bw_mbps=config.topology.host_bw,
        target_accuracy=config.job.target_accuracy, mtu=config.topology.mtu,
        transport=config.job.transport, link_bound_s=record.get("link_bound_s", math.nan),
        tail_comm_s=record.get("tail_comm_s", math.nan)))
    models = [process_dir(out, run.run_id, host, "worker", rank) / "model.npz"
              for rank, host in enumerate(config.worker_hosts)]
    if all(path.is_file() for path in models):
        row["replica_divergence"] = metrics.replica_divergence([dict(np.load(path)) for path in models])
    start_s, end_s = metrics.training_window_s(iterations)
    row.update(fidelity.judge(records["cpu"], records["queues"], records["drains"], records["sockets"],
                              records["ovs"], records["port_rates"],
                              list(records["summaries"]["lag_ms_p99"].dropna()), start_s, end_s))
    return row


def _with_run_id(frame: pd.DataFrame, run_id: str) -> pd.DataFrame:
    return frame.assign(run_id=run_id)[["run_id", *frame.columns]]


def aggregate(out_dir: str | Path, say=lambda line: print(line, file=sys.stderr)) -> pd.DataFrame:
    """Write OUT/runs.csv, iterations.csv, tensors.csv, links.csv and queues.csv from the runs
    recorded so far (those with a readable run.json), in spec order; return the runs table. A run
    whose records cannot be read is listed without metrics, its data_gaps saying why, and `say`
    reports it: one broken run never stops the aggregation."""
    out = Path(out_dir)
    spec = parse_spec(yaml.safe_load((out / "spec.yaml").read_text()))
    axes = [axis.name for axis in spec.axes]
    rows, iterations, tensors, links, queues = [], [], [], [], []
    for run in spec.runs:
        record = read_run_record(out, run.run_id)
        if record is None:
            continue
        try:
            records = read_run(out, run.run_id)
            run_links = metrics.link_utilization(records["ports"], records["port_rates"], records["queues"],
                                                 records["sockets"])
            row = _run_row(out, run, record, records, run_links)
            queue_totals = fidelity.run_deltas(records["queues"], ["switch", "port", "cs"],
                                               ["sent_pkts", "dropped_pkts"])
        except (OSError, ValueError, KeyError, TypeError, pd.errors.ParserError) as error:
            say(f"aggregate: {run.run_id}: its records cannot be read, left without metrics ({error})")
            rows.append(_run_row(out, run, {**record, "status": "failed"}, {}, pd.DataFrame())
                        | {"data_gaps": f"records unreadable: {error}"})
            continue
        rows.append(row)
        iterations.append(_with_run_id(records["iterations"], run.run_id))
        tensors.append(_with_run_id(records["tensors"], run.run_id))
        links.append(_with_run_id(run_links, run.run_id))
        queues.append(_with_run_id(queue_totals[QUEUE_TOTAL_COLUMNS], run.run_id))
    runs = pd.DataFrame(rows, columns=runs_columns(axes))
    baseline_axis, baseline_label = spec.baseline or (None, None)
    runs["speedup_vs_baseline"] = metrics.speedup_vs_baseline(runs, axes, baseline_axis, baseline_label)
    write_csv(runs, out / "runs.csv")
    for name, frames, columns in (("iterations", iterations, ITERATION_COLUMNS),
                                  ("tensors", tensors, TENSOR_COLUMNS),
                                  ("links", links, metrics.LINK_COLUMNS),
                                  ("queues", queues, QUEUE_TOTAL_COLUMNS)):
        write_csv(_concat(frames, ["run_id", *columns]), out / f"{name}.csv")
    return runs


def read_tables(out_dir: str | Path) -> dict[str, pd.DataFrame]:
    """The aggregated CSVs (runs, iterations, tensors, links), each with the mode and the
    scheme (the run_id without rep and mode) of its run: what plots and summaries group by."""
    out = Path(out_dir)
    runs = pd.read_csv(out / "runs.csv", dtype={"fidelity_ok": "boolean"})
    runs["scheme"] = runs["run_id"].map(scheme_of)
    labels = runs[["run_id", "mode", "scheme"]]
    tables = {"runs": runs}
    for name in ("iterations", "tensors", "links", "queues"):
        tables[name] = pd.read_csv(out / f"{name}.csv").merge(labels, on="run_id")
    return tables

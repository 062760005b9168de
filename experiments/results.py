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
    OUT/runs/<run_id>/servers/<server>/ the same five for each other server of a cluster (its sampler)
    OUT/runs/<run_id>/<host>-<role><rank>/iterations.csv, tensors.csv, summary.json  host apps
        (and model.npz, trace.json; stdout.log, stderr.log: the process's output)
    OUT/runs/<run_id>/flow<i>-<src>-<dst>.log     iperf3 output of background flows
    OUT/fabrics/<first run_id>/    controller log and port statistics of a fabric, shared by
                                   consecutive runs of one topology and load balancing
"""
from __future__ import annotations

import errno
import importlib.metadata
import io
import itertools
import json
import math
import os
import platform
import sys
import stat
import subprocess
import time
import zipfile
import zlib
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import yaml

from controller import stats as controller_stats
from experiments import fidelity, metrics, multijob
from experiments.sampler import CPU_COLUMNS, DRAIN_COLUMNS, QUEUE_COLUMNS, SERVERS_DIR, SOCKET_COLUMNS
from experiments.columns import CONFIG_COLUMNS, JOB_COLUMNS, runs_columns
from experiments.effects import EFFECT_COLUMNS, EFFECT_NUMERIC, effects
from experiments.spec import Run, RunConfig, Spec, alone_runs, get_field, parse_spec, scheme_of
from hostapps import records
from common.files import atomic_open, write_text
from common.sysctl import read_sysctl
from emulation.machine import ALLOWED_TCP_CC, SOCKET_BUFFERS, transmit_buffer_bytes
from topologies.cluster import LOCAL

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

# Port statistics silent for this many polling intervals: a gap (a controller restarting, say).
PORT_STATS_GAP_INTERVALS = 3
RUN_STATUSES = ("ok", "failed")

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
    if resume and os.path.lexists(spec_path):
        if read_spec_document(out) != document:
            raise ValueError(f"{spec_path}: differs from the spec given; resume needs the same spec")
    elif not resume and os.path.lexists(spec_path):
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
                     error: str = "", faults: list[str] = (), bounds: dict[str, float] | None = None,
                     placement: dict | None = None, jobs: list[dict] | None = None) -> Path:
    """runs/<run_id>/run.json: the run (see Run.to_dict), epoch start/end, status, error, the
    faults it survived (or not): e.g. a controller restarted, the bounds its traffic puts on an
    iteration (experiments/traffic.py: comm_bound_s, link_bound_s, tail_comm_s), and where per-flow
    ECMP placed its flows (emulation/placement.py: uplinks, max_flows_per_uplink); for a run of several
    jobs, each one's name, id, tag, arrival and start (Unix seconds) and bounds."""
    if status not in RUN_STATUSES:
        raise ValueError(f"status: {status!r} is not allowed (one of {', '.join(RUN_STATUSES)})")
    path = run_dir(out_dir, run.run_id) / "run.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {**run.to_dict(), "start_s": start_s, "end_s": end_s, "status": status, "error": error,
              "faults": list(faults), **(bounds or {}), **({"placement": placement} if placement else {}),
              **({"jobs": jobs} if jobs else {})}
    write_text(path, json.dumps(record, indent=2) + "\n")
    return path


class Damaged(ValueError):
    """A record that is not what its contract says (wrong JSON type, a field of another type, a CSV
    cut short or with other columns, a link, a FIFO...): str() is one line, `path: what`."""

    def __init__(self, path: str | Path, what: object):
        super().__init__(f"{path}: {one_line(what)}")


def one_line(what: object, limit: int = 300) -> str:
    """A message as one line (a pandas error spans several, a cell may hold anything)."""
    text = " ".join(str(what).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _read_bytes(path: Path) -> bytes | None:
    """A record file's bytes, None when there is none. A symbolic link is not followed and only a
    regular file is read: someone else's folder must not make root read what a link points to,
    nor block on a FIFO or read a device without end."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise Damaged(path, "a symbolic link, not followed" if error.errno == errno.ELOOP else error.strerror) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Damaged(path, "not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as file:
            return file.read()
    except OSError as error:
        raise Damaged(path, error.strerror) from None
    finally:
        os.close(fd)


def real_folder(path: Path) -> Path:
    """path, unless it is a symbolic link (Damaged): the folders of records are not followed either."""
    if path.is_symlink():
        raise Damaged(path, "a symbolic link, not followed")
    return path


JSON_TYPES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def read_spec_document(out: Path) -> Any:
    """OUT/spec.yaml's document; Damaged when there is none, or it is not YAML."""
    path = out / "spec.yaml"
    data = _read_bytes(path)
    if data is None:
        raise Damaged(path, "missing")
    try:
        return yaml.safe_load(data)
    except (yaml.YAMLError, ValueError, RecursionError) as error:
        raise Damaged(path, f"not YAML ({error})") from None


def read_json_object(path: Path) -> dict[str, Any] | None:
    """A JSON record (an object), None when there is none; Damaged when it is anything else."""
    data = _read_bytes(path)
    if data is None:
        return None
    if not data:
        raise Damaged(path, "empty")
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise Damaged(path, f"not JSON ({error})") from None
    if not isinstance(value, dict):
        raise Damaged(path, f"a JSON {JSON_TYPES.get(type(value), 'value')}, not an object")
    return value


def _number(path: Path, record: dict, name: str, default: float = math.nan, within: str = "") -> float:
    """record[name] as a number; default when absent or null; Damaged when anything else (`within`:
    the field that holds record, for the message)."""
    value = record.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Damaged(path, f"{within}{name}: {_shown(value)} is not a number")
    if isinstance(value, int) and not -2**63 <= value < 2**64:
        raise Damaged(path, f"{within}{name}: {_shown(value)} is out of range")  # no column can hold it
    return value


def _object(path: Path, record: dict, name: str) -> dict:
    """record[name] as a JSON object; {} when absent or null; Damaged when anything else."""
    value = record.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Damaged(path, f"{name}: {_shown(value)} is not an object")
    return value


def checked_run_record(out_dir: str | Path, run_id: str) -> dict[str, Any] | None:
    """The run's run.json (see write_run_record), None when there is none; Damaged when it is not
    a record of a finished run: a status, its start and end, faults a list of strings, error a
    string, the bounds numbers (null faults, error and bounds read as none)."""
    path = real_folder(real_folder(Path(out_dir) / "runs") / run_id) / "run.json"
    record = read_json_object(path)
    if record is None:
        return None
    if record.get("status") not in RUN_STATUSES:
        raise Damaged(path, f"status: {_shown(record.get('status'))} is not one of {', '.join(RUN_STATUSES)}")
    for name in ("start_s", "end_s"):
        if not math.isfinite(_number(path, record, name)):
            raise Damaged(path, f"{name}: missing" if record.get(name) is None else f"{name}: not finite")
    faults = [] if record.get("faults") is None else record["faults"]
    if not isinstance(faults, list) or not all(isinstance(fault, str) for fault in faults):
        raise Damaged(path, f"faults: {_shown(faults)} is not a list of strings")
    error = "" if record.get("error") is None else record["error"]
    if not isinstance(error, str):
        raise Damaged(path, f"error: {_shown(error)} is not a string")
    bounds = {name: _number(path, record, name) for name in ("comm_bound_s", "link_bound_s", "tail_comm_s")
              if name in record}
    return {**record, "faults": faults, "error": error, **bounds}


def read_run_record(out_dir: str | Path, run_id: str) -> dict[str, Any] | None:
    """The run's run.json; None when there is none or it is damaged (see checked_run_record): the run is
    then not finished, and --resume runs it again."""
    try:
        return checked_run_record(out_dir, run_id)
    except Damaged:
        return None


# What a finished run's folder holds besides run.json: the runner's and every host-app process's.
RUN_FILES = ("ports.csv", "port_rates.csv", "cpu.csv", "queues.csv", "drain.csv", "sockets.csv", "ovs.json")
PROCESS_FILES = ("iterations.csv", "tensors.csv", "summary.json")


def _processes(run: Run) -> list[tuple[str, str, int]]:
    """The run's host-app processes (host, role, rank): each job's servers, then its workers."""
    processes = []
    for job_run in run.job_runs:
        config = job_run.config
        processes += [(host, "server", rank) for rank, host in enumerate(config.server_hosts)]
        processes += [(host, "worker", rank) for rank, host in enumerate(config.worker_hosts)]
    return processes


def _regular_file(folder: Path, name: str) -> bool:
    """folder/name (name relative, maybe with folders) is a regular file reached through no link."""
    path = folder
    for part in Path(name).parts:
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            return False
        if stat.S_ISLNK(mode):
            return False
    return stat.S_ISREG(mode)


def missing_records(out_dir: str | Path, run: Run) -> list[str]:
    """The files a finished run should have and has not (relative to its folder); a link or a
    FIFO in place of one is not the file."""
    path = run_dir(out_dir, run.run_id)
    expected = list(RUN_FILES) + [f"{process_dir(out_dir, run.run_id, *process).name}/{name}"
                                  for process in _processes(run) for name in PROCESS_FILES]
    return [name for name in expected if not _regular_file(path, name)]


def completed_run_ids(out_dir: str | Path, spec: Spec) -> set[str]:
    """Runs recorded with status ok and every record in place and readable: what --resume skips."""
    done = set()
    for run in spec.runs:
        record = read_run_record(out_dir, run.run_id)
        if not record or record["status"] != "ok" or missing_records(out_dir, run):
            continue
        try:
            read_run(out_dir, run)
        except Damaged:
            continue
        done.add(run.run_id)
    return done


# ------------------------------------------------------------------------------------ reading

# Columns added to the records after results were already made with them: older results read as
# empty there, so they still aggregate (each other missing column is an error).
LATER_COLUMNS = {"delivered_fraction_reduce", "delivered_fraction_gather", "mem_used_mb", "straggler_s",
                 "steal_util"}
# The contracts' columns of text; every other column holds numbers (an empty cell is NaN). A
# tensor's layer is text: a bucket of a fused or partitioned all-reduce names its layers, "2+1+0".
TEXT_COLUMNS = {"run_id", "job", "role", "tensor", "layer", "direction", "peer", "switch", "tier"}
# The columns that say what a row is about: never empty.
KEY_COLUMNS = {"run_id", "time_s", "switch", "port", "cs", "role", "rank", "iteration"}


def _parse_csv(path: Path, columns: list[str], numeric: list[str] | None = None, **options) -> pd.DataFrame | None:
    """A CSV table with at least `columns` (LATER_COLUMNS added empty), numbers in `numeric` (by
    default the columns but TEXT_COLUMNS); None when there is none; Damaged when it is not that
    table. options go to pandas.read_csv."""
    data = _read_bytes(path)
    if data is None:
        return None
    if not data:
        raise Damaged(path, "empty")
    if not data.endswith(b"\n"):
        raise Damaged(path, "cut short (its last line does not end)")  # every writer ends its lines
    if "layer" in columns:  # numbers and buckets' "2+1+0" in one column: read as text from the start
        options = {"dtype": {"layer": str}, **options}
    try:
        frame = pd.read_csv(io.BytesIO(data), **options)
    except (ValueError, TypeError, RecursionError) as error:  # pandas' ParserError, EmptyDataError, bad UTF-8
        raise Damaged(path, f"not a CSV table ({error})") from None
    frame = frame.assign(**{column: math.nan for column in LATER_COLUMNS & set(columns) - set(frame.columns)})
    missing = [column for column in columns if column not in frame.columns]
    if missing:
        raise Damaged(path, f"missing columns {', '.join(missing)} (expected {', '.join(columns)})")
    for column in (numeric if numeric is not None else [c for c in columns if c not in TEXT_COLUMNS]):
        if not pd.api.types.is_numeric_dtype(frame[column]) and len(frame):
            numbers = pd.to_numeric(frame[column], errors="coerce")
            wrong = numbers.isna() & frame[column].notna()
            if wrong.any():
                row = int(wrong.to_numpy().argmax())
                raise Damaged(path, f"{column}: {_shown(frame[column].iloc[row])} on line {row + 2} is not a number")
            frame[column] = numbers
    for column in KEY_COLUMNS.intersection(columns):
        if frame[column].isna().any():
            raise Damaged(path, f"{column}: empty on line {int(frame[column].isna().to_numpy().argmax()) + 2}")
    return frame


def _read_csv(path: Path, columns: list[str]) -> pd.DataFrame:
    """A contract CSV with exactly its declared columns (extra ones dropped); empty if absent."""
    frame = _parse_csv(path, columns)
    return pd.DataFrame(columns=columns) if frame is None else frame[columns]


def _concat(frames: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    frames = [frame for frame in frames if len(frame)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def _summary_row(path: Path, host: str, role: str, rank: int) -> dict[str, Any] | None:
    """A process's summary.json as a row of the summaries table (null fields read as absent)."""
    fields = read_json_object(path)
    if fields is None:
        return None
    return {"host": host, "role": role, "rank": rank, **{name: _number(path, fields, name) for name in SUMMARY_FIELDS},
            "lag_ms_p99": _number(path, _object(path, fields, "timing"), "lag_ms_p99", within="timing: ")}


def _ovs_record(path: Path) -> dict[str, Any]:
    """The sampler's ovs.json with the counters the fidelity guard adds (absent ones 0)."""
    record = read_json_object(path)
    if record is None:
        return {}
    by_port = _object(path, record, "tx_errors_by_port")
    return {"tx_errors_by_port": {port: _number(path, by_port, port, 0, "tx_errors_by_port: ") for port in by_port},
            "tx_errors_suppressed": _number(path, record, "tx_errors_suppressed", 0),
            "datapath_drops": _number(path, record, "datapath_drops", 0)}


def _read_model(path: Path) -> dict[str, np.ndarray] | None:
    """A worker's final parameters (model.npz), None when there is none."""
    data = _read_bytes(path)
    if data is None:
        return None
    try:
        archive = np.load(io.BytesIO(data))  # no pickles: allow_pickle is off
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise ValueError("one array, not an archive of them")
        with archive:
            return dict(archive)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as error:
        raise Damaged(path, f"not a NumPy archive ({error})") from None


def read_run(out_dir: str | Path, run: Run) -> dict[str, Any]:
    """One run's raw records: iterations, tensors, summaries (one row per process, with host, role,
    rank), ports, port_rates, cpu, queues, drains, sockets, ovs, and the workers' final models
    (None unless every worker has one). Only the run's own processes are read; Damaged names the
    first record that is not what its contract says."""
    path = real_folder(real_folder(Path(out_dir) / "runs") / run.run_id)
    processes = sorted((real_folder(process_dir(out_dir, run.run_id, host, role, rank)), host, role, rank)
                       for host, role, rank in _processes(run))  # in the order of their folders' names
    summaries = [_summary_row(folder / "summary.json", host, role, rank) for folder, host, role, rank in processes]
    # the first job's workers in rank order: the first is the reference
    models = [_read_model(process_dir(out_dir, run.run_id, host, role, rank) / "model.npz")
              for host, role, rank in _processes(run.job_runs[0]) if role == "worker"]
    return {
        "iterations": _concat([_read_csv(p / "iterations.csv", ITERATION_COLUMNS) for p, *_ in processes],
                              ITERATION_COLUMNS),
        "tensors": _concat([_read_csv(p / "tensors.csv", TENSOR_COLUMNS) for p, *_ in processes],
                           TENSOR_COLUMNS),
        "summaries": pd.DataFrame([row for row in summaries if row],
                                  columns=["host", "role", "rank", *SUMMARY_FIELDS, "lag_ms_p99"]),
        "ports": _read_csv(path / "ports.csv", PORT_COLUMNS),
        "port_rates": _read_csv(path / "port_rates.csv", PORT_RATE_COLUMNS),
        "cpu": _read_csv(path / "cpu.csv", CPU_COLUMNS),
        "queues": _read_csv(path / "queues.csv", QUEUE_COLUMNS),
        "drains": _read_csv(path / "drain.csv", DRAIN_COLUMNS),
        "sockets": _read_csv(path / "sockets.csv", SOCKET_COLUMNS),
        "ovs": _ovs_record(path / "ovs.json"),
        "models": models if models and all(model is not None for model in models) else None,
        "servers": {server: _server_samples(path / SERVERS_DIR / server) for server in run.config.cluster.servers[1:]},
    }


def _server_samples(folder: Path) -> dict[str, Any] | None:
    """Another server's sampler records (runs/<run>/servers/<server>/), None when it left none."""
    if not real_folder(folder).is_dir():
        return None
    return {"cpu": _read_csv(folder / "cpu.csv", CPU_COLUMNS),
            "queues": _read_csv(folder / "queues.csv", QUEUE_COLUMNS),
            "drains": _read_csv(folder / "drain.csv", DRAIN_COLUMNS),
            "sockets": _read_csv(folder / "sockets.csv", SOCKET_COLUMNS), "ovs": _ovs_record(folder / "ovs.json")}


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
           "data_gaps": "", "max_flows_per_uplink": _max_flows_per_uplink(record),
           "placement": placement_text(record.get("placement"))}
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
        tail_comm_s=record.get("tail_comm_s", math.nan), comm_bound_s=record.get("comm_bound_s", math.nan)))
    if records["models"] is not None:
        row["replica_divergence"] = metrics.replica_divergence(records["models"])
    row.update(_verdict(config, records))
    return row


def _verdict(config: RunConfig, records: dict[str, Any]) -> dict[str, object]:
    """The fidelity guard's columns of a run from its records (experiments/fidelity.py)."""
    start_s, end_s = metrics.training_window_s(records["iterations"])
    here = {key: records[key] for key in ("cpu", "queues", "drains", "sockets", "ovs")}
    transports = {job.transport for job in config.jobs or [config.job]}
    return fidelity.judge_servers({LOCAL: here, **records.get("servers", {})}, records["port_rates"],
                                  list(records["summaries"]["lag_ms_p99"].dropna()), start_s, end_s,
                                  fidelity.app_lag_limit_ms(transports))


def stolen_failure(out_dir: str | Path, run: Run, earlier: Sequence[str] = ()) -> str:
    """Why a finished run failed the guard while the hypervisor gave other guests fidelity.STEAL_NOTE_MIN or
    more of the CPUs on average: its times measure the machine's neighbours, and running it again may
    measure the network. "" when it passed, stole less, failed otherwise, survived faults (another
    attempt would not meet them; `earlier`, the runner's notes of this run's earlier attempts, which
    head its faults, are not such), or its records cannot be judged."""
    try:
        record = checked_run_record(out_dir, run.run_id)
        if (not record or record["status"] != "ok" or record["faults"][len(earlier):]
                or missing_records(out_dir, run)):
            return ""
        verdict = _verdict(run.config, read_run(out_dir, run.job_runs[0]))
    except (Damaged, OSError, ValueError, KeyError):
        return ""
    steal = float(verdict["cpu_steal_mean"])
    if verdict["fidelity_ok"] is False and steal >= fidelity.STEAL_NOTE_MIN:
        return f"{verdict['fidelity_reason']}; the hypervisor stole {steal:.0%} of the CPUs on average"
    return ""


def job_record_of(record: dict[str, Any], name: str) -> dict[str, Any]:
    """A run's record as one of its jobs sees it: the run's, with that job's bounds and arrival
    (run.json's `jobs`); the run's own for a run of one job."""
    for job in record.get("jobs") or []:
        if isinstance(job, dict) and job.get("name") == name:
            numbers = {key: value for key, value in job.items() if key in (
                "comm_bound_s", "link_bound_s", "tail_comm_s", "arrival_s")
                and isinstance(value, (int, float)) and not isinstance(value, bool)}
            return {**record, **numbers}
    return record


def placement_text(placement: Any) -> str:
    """Where per-flow ECMP put the run's flows, in one canonical line: `first switch>uplink: flows`
    per uplink, sorted ("" when not measured). Two runs with the same text sent the same 5-tuples
    the same way: a scheme compared with another on the same placement is paired with it
    (experiments/effects.py)."""
    uplinks = placement.get("uplinks") if isinstance(placement, dict) else None
    if not isinstance(uplinks, dict):
        return ""
    return "; ".join(f"{switch}>{uplink}: {', '.join(sorted(map(str, flows)))}"
                     for switch, by_uplink in sorted(uplinks.items()) if isinstance(by_uplink, dict)
                     for uplink, flows in sorted(by_uplink.items()) if isinstance(flows, list))


def _max_flows_per_uplink(record: dict[str, Any]) -> float:
    """The most flows the run's placement put on one uplink (NaN: not measured, or a record of
    another shape)."""
    placement = record.get("placement")
    value = placement.get("max_flows_per_uplink") if isinstance(placement, dict) else None
    return float(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else math.nan


def _with_run_id(frame: pd.DataFrame, run_id: str) -> pd.DataFrame:
    return frame.assign(run_id=run_id)[["run_id", *frame.columns]]


def aggregate(out_dir: str | Path, say=lambda line: print(line, file=sys.stderr)) -> pd.DataFrame:
    """Write OUT/runs.csv, iterations.csv, tensors.csv, links.csv and queues.csv from the runs
    recorded so far (those with a run.json), in spec order; return the runs table. One damaged run
    never stops the aggregation, and `say` reports it in one line: a run whose run.json is damaged
    is not counted (--resume runs it again); one whose other records are damaged, or give no
    metrics, is listed without metrics, its data_gaps saying why."""
    out = Path(out_dir)
    spec = parse_spec(read_spec_document(out))
    axes = [axis.name for axis in spec.axes]
    rows, iterations, tensors, links, queues, uplinks = [], [], [], [], [], []
    for run in spec.runs:
        try:
            record = checked_run_record(out, run.run_id)
        except Damaged as error:
            say(f"aggregate: {run.run_id}: {error}; not counted as a run (--resume runs it again)")
            continue
        if record is None:
            continue
        for number, (name, job_run) in enumerate(zip(run.job_names, run.job_runs)):
            job_record = job_record_of(record, name)
            try:
                records = read_run(out, job_run)
            except Damaged as error:
                say(f"aggregate: {run.run_id}: its records cannot be read, left without metrics ({error})")
                rows.append(_run_row(out, job_run, {**job_record, "status": "failed"}, {}, pd.DataFrame())
                            | {"job": name, "data_gaps": f"records unreadable: {error}"})
                continue
            try:
                run_links = metrics.link_utilization(records["ports"], records["port_rates"], records["queues"],
                                                     records["sockets"])
                row = _run_row(out, job_run, job_record, records, run_links) | {"job": name}
                if job_record["status"] == "ok" and not row["data_gaps"]:
                    row.update(multijob.job_row(records["iterations"], job_record.get("arrival_s")))
                queue_totals = fidelity.run_deltas(records["queues"], ["switch", "port", "cs"],
                                                   ["sent_pkts", "dropped_pkts"])
            except (ValueError, TypeError, KeyError, IndexError, ArithmeticError) as error:
                # Records of the right shape with values no run writes (an empty key, say).
                why = one_line(f"{type(error).__name__}: {error}")
                say(f"aggregate: {run.run_id}: its records give no metrics, left without metrics ({why})")
                rows.append(_run_row(out, job_run, {**job_record, "status": "failed"}, {}, pd.DataFrame())
                            | {"job": name, "data_gaps": f"metrics failed: {why}"})
                continue
            rows.append(row)
            job_iterations = records["iterations"].assign(job=name) if name else records["iterations"]
            iterations.append(_with_run_id(job_iterations, run.run_id))
            tensors.append(_with_run_id(records["tensors"], run.run_id))
            if run.config.jobs:  # which job's bytes went on which uplink (the port counters cannot say)
                uplinks.append(_with_run_id(multijob.job_uplink_bytes(records["tensors"], record.get("placement"),
                                                                      name), run.run_id))
            if number == 0:  # the fabric's records are the run's, whichever job they were read with
                links.append(_with_run_id(run_links, run.run_id))
                queues.append(_with_run_id(queue_totals[QUEUE_TOTAL_COLUMNS], run.run_id))
    runs = pd.DataFrame(rows, columns=runs_columns(axes))
    baseline_axis, baseline_label = spec.baseline or (None, None)
    # a job of several against the same job in the baseline's run
    runs["speedup_vs_baseline"] = metrics.speedup_vs_baseline(runs, [*axes, "job"], baseline_axis, baseline_label)
    runs = multijob.with_alone(runs, alone_runs(spec))
    write_csv(runs, out / "runs.csv")
    if any(run.config.jobs for run in spec.runs):
        write_csv(multijob.runs_table(runs, spec), out / "multijob.csv")
        write_csv(_concat(uplinks, ["run_id", *multijob.JOB_UPLINK_COLUMNS]), out / "job_uplinks.csv")
    write_csv(multijob.effects_by_job(runs, spec, effects), out / "effects.csv")
    for name, frames, columns in (("iterations", iterations, ITERATION_COLUMNS),
                                  ("tensors", tensors, TENSOR_COLUMNS),
                                  ("links", links, metrics.LINK_COLUMNS),
                                  ("queues", queues, QUEUE_TOTAL_COLUMNS)):
        write_csv(_concat(frames, ["run_id", *columns]), out / f"{name}.csv")
    return runs


# runs.csv's columns of numbers (the others are text, or the axes' labels).
RUNS_NUMERIC = ["workers", *(column for column in metrics.METRIC_COLUMNS
                             if column not in ("fidelity_ok", "fidelity_reason", "placement")), *JOB_COLUMNS]


def read_tables(out_dir: str | Path, say=lambda line: print(line, file=sys.stderr)) -> dict[str, pd.DataFrame]:
    """The aggregated CSVs (runs, iterations, tensors, links, queues, each with the mode and the
    scheme (the run_id without rep and mode) of its run: what plots and summaries group by; and
    effects, the schemes' effects with their intervals).
    A damaged runs.csv is Damaged (one line naming it); another damaged table reads as empty, and
    `say` reports it."""
    out = Path(out_dir)
    runs = _parse_csv(out / "runs.csv", runs_columns([]), RUNS_NUMERIC, dtype={"fidelity_ok": "boolean"})
    if runs is None:
        raise Damaged(out / "runs.csv", "missing: aggregate the results first")
    runs["scheme"] = runs["run_id"].map(scheme_of)
    labels = runs[["run_id", "mode", "scheme"]]
    tables = {"runs": runs}
    for name, columns in (("iterations", ITERATION_COLUMNS), ("tensors", TENSOR_COLUMNS),
                          ("links", metrics.LINK_COLUMNS), ("queues", QUEUE_TOTAL_COLUMNS)):
        try:
            table = _parse_csv(out / f"{name}.csv", ["run_id", *columns])
        except Damaged as error:
            say(f"{error}; left out")
            table = None
        table = pd.DataFrame(columns=["run_id", *columns]) if table is None else table
        tables[name] = table.merge(labels, on="run_id")
    try:
        found = _parse_csv(out / "effects.csv", EFFECT_COLUMNS, EFFECT_NUMERIC)
    except Damaged as error:
        say(f"{error}; left out")
        found = None
    tables["effects"] = pd.DataFrame(columns=EFFECT_COLUMNS) if found is None else found
    try:  # a run of several jobs: which job's bytes on which uplink
        found = _parse_csv(out / "job_uplinks.csv", ["run_id", *multijob.JOB_UPLINK_COLUMNS], ["time_s", "bytes"])
    except Damaged as error:
        say(f"{error}; left out")
        found = None
    found = pd.DataFrame(columns=["run_id", *multijob.JOB_UPLINK_COLUMNS]) if found is None else found
    tables["job_uplinks"] = found.merge(labels.drop_duplicates("run_id"), on="run_id")
    return tables

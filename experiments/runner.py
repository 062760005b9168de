"""The experiment runner: every run of a spec on the emulated fabric, then the tidy CSVs, plots and
summary of the results directory (experiments/results.py describes its layout).

One fabric (Mininet network plus controller) serves consecutive runs with the same topology, load
balancing and statistics interval: building and checking one takes several seconds, a run often
less. The controller appends port statistics to the fabric's own CSV (OUT/fabrics/<first run>/
ports.csv) for its whole life; a run's ports.csv is the slice of it from the last poll before the
run started to the first poll after it ended.

A run does what its plan says (experiments/runplan.py, computed from the spec alone): background
flows and faults on a schedule from the job's start (experiments/disturbances.py), parameter-server
shards first, then the workers, all in their hosts with their stdout/stderr in their process
directories; the CPU of the machine sampled meanwhile. It fails when a process exits non-zero, the
job outlives RUN_TIMEOUT_S, a disturbance cannot be applied, the controller logs an exception or
anything else raises in it: its run.json says why, and the next run goes on (a fabric that fails
fails its runs not yet recorded, and the next fabric goes on). Ctrl-C or SIGTERM stops everything
the runner started and keeps the finished runs for --resume; a resumed fabric's earlier record is
kept beside the new one.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd
from mininet.log import setLogLevel

from experiments import multijob, plots, summary
from experiments.disturbances import Schedule, disturbances_of
from experiments.live import LiveError, LiveView
from experiments.progress import Progress
from experiments.results import (PORT_COLUMNS, PORT_RATE_COLUMNS, Damaged, aggregate, completed_run_ids,
                                 process_dir, read_run, read_run_record, read_spec_document, run_dir,
                                 start_output, stolen_failure, write_csv, write_run_record)
from common.files import write_text
from common.schema import one_line
from experiments.sampler import SAMPLED_FILES, FabricSampler, RemoteSamplers
from experiments.runplan import (OPENFLOW_PORT, REST_PORT, RunPlan, data_flows, fabric_key, fabric_params, host_ips,
                                job_tag, plan_jobs)
from experiments.spec import Run, Spec, SpecError, alone_runs, parse_spec
from hostapps.config import process_arguments
from emulation import cluster, placement
from emulation.preflight import check_servers
from topologies.cluster import LOCAL, ClusterError, crossing_links
from common.paths import REPO
from emulation.fabric import Fabric, FabricError, kill_group
from emulation.machine import MachineError, machine_used_mb, prepare, process_rss_mb, vswitchd_pid

RUN_TIMEOUT_S = 600.0   # a job still running after this is killed and its run failed
POLL_S = 0.2
CONTROLLER_CHECK_S = 1.0  # how often the runner checks that the controller is alive
ITERATION_LINE = re.compile(r"^iteration \d+/\d+ (\d+\.\d+)$", re.M)  # the rank-0 worker's stdout
# Several jobs start their first iterations together this long after they are launched (each then
# at its start and offset): every host app has imported and connected by then (~1 s on 2 cores).
JOBS_STARTUP_S = 4.0


@dataclass
class JobProcess:
    name: str  # <host>-<role><rank>, its process directory's name
    host: str
    popen: subprocess.Popen
    stdout: Path
    stderr: Path
    tag: int = 0
    job: str = ""  # its job's name in a run of several


def run_experiment(spec: Spec, out_dir: Path, resume: bool, live_port: int | None = None) -> int:
    """Run the spec's runs not yet finished in out_dir; return how many runs failed. live_port:
    serve the live view (experiments/live.py) on that port of 127.0.0.1 meanwhile."""
    if os.geteuid() != 0:
        sys.exit("run: the runner needs root (Mininet, Open vSwitch): run it with sudo")
    live = None
    if live_port is not None:
        try:
            live = LiveView(spec.name, [run.run_id for run in spec.runs], live_port)
        except LiveError as error:
            sys.exit(f"run: {error}")
    with live or contextlib.nullcontext():
        return _run_experiment(spec, out_dir, resume, live)


def _run_experiment(spec: Spec, out_dir: Path, resume: bool, live: LiveView | None) -> int:
    try:
        for servers, mtu in cluster_mtus(spec.runs).items():
            check_servers(list(servers), mtu)  # before this machine is touched
        for tcp_cc in sorted({run.topology.tcp_cc for run in spec.runs}):
            prepare(tcp_cc)  # before meta.json records the machine's settings
    except (MachineError, ClusterError) as error:
        sys.exit(f"run: {error}")
    try:
        out = start_output(out_dir, spec, resume)
    except ValueError as error:
        sys.exit(f"run: {error}")
    setLogLevel("warning")  # Mininet's pingall and start-up chatter would break the progress bars
    finished = completed_run_ids(out, spec) if resume else set()
    signal.signal(signal.SIGTERM, _interrupt)
    print(f"{spec.name}: {len(spec.runs)} runs into {out}", file=sys.stderr)
    if live is not None:
        print(f"live view: {live.url}", file=sys.stderr)
    try:
        with Progress(len(spec.runs), live=live) as progress:
            for run_id in finished:
                progress.end_run("skipped", run_id)
            pending = [run for run in spec.runs if run.run_id not in finished]
            for _, group in itertools.groupby(pending, fabric_key):
                runs = list(group)
                while runs:  # a fabric that broke under a run: the runs after it get a new one
                    runs = run_on_fabric(out, runs, progress, spec.header.stolen_retries)
    except KeyboardInterrupt:
        sys.exit(f"run: interrupted; the finished runs are kept, continue with --resume --out {out}")
    aggregate(out)
    plots.plot_all(out)
    print(summary.write_summary(out))
    records = [read_run_record(out, run.run_id) for run in spec.runs]
    return sum(1 for record in records if record and record["status"] == "failed")


def cluster_mtus(runs: list[Run]) -> dict[tuple[str, ...], int]:
    """Each list of servers the runs use, with the largest MTU its underlay must carry in VXLAN."""
    mtus: dict[tuple[str, ...], int] = {}
    for run in runs:
        if run.config.cluster.servers:
            servers = tuple(run.config.cluster.servers)
            mtus[servers] = max(mtus.get(servers, 0), run.topology.mtu)
    return dict(sorted(mtus.items()))


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds like Ctrl-C: the fabric and the runs' processes stop


def run_on_fabric(out: Path, runs: list[Run], progress: Progress, stolen_retries: int = 0) -> list[Run]:
    """Runs sharing one fabric. A run that fails fails alone, its record saying why. When the fabric
    breaks under a run (Fabric.check, a controller that cannot be restarted), that run fails and the
    runs after it are returned, for a new fabric; when it cannot be built, they all fail.

    A run the guard failed while the hypervisor gave other guests a share of the CPUs worth naming
    (results.stolen_failure) measured the machine's neighbours: it runs again, up to `stolen_retries`
    times (the spec's), each earlier attempt set aside. On the 2-core VM the host apps' timer lag
    follows the steal, which comes in episodes of minutes (docs/results.md)."""
    first = runs[0]
    workdir = fabric_dir(out, first)
    stats_csv = workdir / "ports.csv"
    recorded: list[str] = []
    fab, where = None, {}
    try:
        with Fabric(first.topology.kind, fabric_params(first.topology), lb=first.controller.lb,
                    ofp_port=OPENFLOW_PORT, rest_port=REST_PORT,
                    workdir=workdir, stats_csv=stats_csv, stats_interval=first.controller.stats_interval_s,
                    servers=first.config.cluster.servers or None,
                    placement=first.config.cluster.placement) as fab:
            for line in fab.cleaned:
                print(f"run: removed a stale fabric's leftover: {line}", file=sys.stderr)
            where = fabric_placement(fab)  # while its nodes exist
            fab.wait_reachable()
            rates = port_rates(fab)
            progress.fabric_up(fab, rates)
            for run in runs:
                try:
                    plans = plan_jobs(run)
                    earlier: list[str] = []
                    while True:
                        progress.start_run(run.run_id, run.job.iterations, plans[0].lower_bound_s)
                        status = run_once(fab, out, plans, rates, stats_csv, progress, run, earlier)
                        retry = status == "ok" and len(earlier) < stolen_retries
                        why = stolen_failure(out, run, earlier) if retry else ""
                        if not why:
                            break
                        kept = set_aside(run_dir(out, run.run_id), "stolen")
                        earlier.append(f"ran again: an earlier attempt, kept as runs/{kept.name}, failed the guard "
                                       f"({why})")
                        print(f"run {run.run_id}: {earlier[-1]}", file=sys.stderr)
                except (FabricError, OSError):
                    recorded.append(run.run_id)  # failed with its reason; the fabric is given up
                    progress.end_run("failed", run.run_id)
                    raise
                except Exception as error:  # this run alone: recorded failed, the next one goes on
                    now = time.time()
                    write_run_record(out, run, "failed", now, now, error=f"{type(error).__name__}: {error}")
                    status = "failed"
                recorded.append(run.run_id)
                progress.end_run(status, run.run_id)
    except Exception as error:
        left = [run for run in runs if run.run_id not in recorded]
        if recorded:  # it broke under a run: the runs after it get a new fabric
            if left:
                print(f"run: the fabric broke under {recorded[-1]} ({one_line(str(error))}); a new one for the "
                      f"{len(left)} runs left", file=sys.stderr)
            return left
        now = time.time()
        for run in left:
            run_dir(out, run.run_id).mkdir(parents=True, exist_ok=True)
            write_run_record(out, run, "failed", now, now, error=f"fabric: {error}")
            progress.end_run("failed", run.run_id)
    finally:
        progress.fabric_down()
        if fab is not None:  # it started: its record (also when interrupted), with how long it took to stop
            record = {**where, **fabric_memory([run_dir(out, run_id) for run_id in recorded]),
                      **{key: round(value, 3) for key, value in fab.timings.items()}}
            write_text(workdir / "fabric.json", json.dumps(record, indent=2) + "\n")
    return []


def fabric_dir(out: Path, first: Run) -> Path:
    """fabrics/<first run_id>, for a fabric's controller log, port statistics and record. An earlier
    attempt's there (an interrupted experiment, resumed) is kept beside it as <first run_id>.attempt<N>."""
    workdir = out / "fabrics" / first.run_id
    if workdir.exists():
        set_aside(workdir, "attempt")
    return workdir


def fabric_placement(fab: Fabric) -> dict:
    """The fabric's size and where its nodes run (for fabrics/<first run>/fabric.json)."""
    layout = fab.topo.layout
    where = {node.name: cluster.server_of(node) for node in fab.net.hosts + fab.net.switches}
    return {"hosts": len(layout.hosts), "switches": len(layout.switches), "links": len(layout.links),
            "servers": {server: sorted(name for name in where if where[name] == server)
                        for server in dict.fromkeys(where.values())},
            "clock_offsets": {server: {"offset_s": offset, "error_s": error}
                              for server, (offset, error) in clock_offsets(fab).items()},
            "crossing_links": len(crossing_links(layout, where)),
            "placement": fab.placement if fab.servers else None}  # None: Mininet's own classes, no cluster


_clock_offsets: dict[str, dict[str, tuple[float, float]]] = {}  # fabric id -> server -> (offset, error)


def clock_offsets(fab: Fabric) -> dict[str, tuple[float, float]]:
    """Each server's clock against this machine's, measured once per fabric (through one of its nodes)."""
    if fab.id not in _clock_offsets:
        first = {}
        for node in fab.net.hosts + fab.net.switches:  # a server may hold switches alone
            first.setdefault(cluster.server_of(node), node)
        _clock_offsets[fab.id] = {server: cluster.clock_offset(host) for server, host in first.items()}
    return _clock_offsets[fab.id]


def fabric_memory(run_dirs: list[Path]) -> dict:
    """The memory of ovs-vswitchd and of the machine now, and the machine's peak during the
    fabric's runs (their cpu.csv)."""
    pid = vswitchd_pid()
    samples = [path / "cpu.csv" for path in run_dirs]
    peaks = [pd.read_csv(csv)["mem_used_mb"].max() for csv in samples if csv.exists() and csv.stat().st_size]
    peaks = [peak for peak in peaks if pd.notna(peak)]  # an interrupted run may have no sample yet
    return {"vswitchd_rss_mb": process_rss_mb(pid) if pid else None, "machine_used_mb": machine_used_mb(),
            "machine_peak_mb": float(max(peaks)) if peaks else None}


def switch_ports(fab: Fabric) -> dict[str, tuple[str, int]]:
    """Every switch port's interface name -> (switch, OpenFlow port number)."""
    return {intf.name: (switch.name, switch.ports[intf]) for switch in fab.net.switches
            for intf in switch.intfList() if intf.name != "lo"}


def ports_by_server(fab: Fabric) -> dict[str, dict[str, tuple[str, int]]]:
    """switch_ports by the server their switch runs on (this machine's first): each server's
    sampler watches its own."""
    server = {switch.name: cluster.server_of(switch) for switch in fab.net.switches}
    by_server: dict[str, dict[str, tuple[str, int]]] = {LOCAL: {}}
    for name, (switch, port) in switch_ports(fab).items():
        by_server.setdefault(server[switch], {})[name] = (switch, port)
    return by_server


def fetch_samples(fab: Fabric, samplers: RemoteSamplers) -> list[str]:
    """Each other server's samples copied here and put on this machine's clock; what failed."""
    failed = list(samplers.errors)
    for server in samplers.processes:
        switch = next(switch for switch in fab.net.switches if cluster.server_of(switch) == server)
        folder = samplers.folder(server)
        copied = cluster.fetch(switch, str(folder))
        if copied:
            failed.append(copied)
        elif folder.is_dir():
            cluster.to_local_clock(folder, clock_offsets(fab)[server][0], SAMPLED_FILES)
    return failed


def port_rates(fab: Fabric) -> pd.DataFrame:
    """port_rates.csv rows: every switch port with its peer, configured rate, tier and the switch's
    role, from the fabric's layout and its links' rates."""
    layout, rows = fab.topo.layout, []
    for link in fab.net.links:
        for here, there in ((link.intf1, link.intf2), (link.intf2, link.intf1)):
            node = layout.node(here.node.name)
            if node.is_switch:
                tier = "fabric" if layout.node(there.node.name).is_switch else "host"
                rows.append([node.name, here.node.ports[here], there.node.name, here.bw, tier, node.role])
    return pd.DataFrame(rows, columns=PORT_RATE_COLUMNS)


class ControllerWatch:
    """Watches the fabric during a run: its network (Fabric.check: FabricError once it is torn down,
    a line when it recovered from an Open vSwitch restart) and its controller, a dead or silent one
    restarted on the same fabric with the run's job registered again (FabricError when that fails).
    Every event goes into `faults`, for the run's record."""

    def __init__(self, fab: Fabric, start_s: float) -> None:
        self.fab, self.start_s = fab, start_s
        self.jobs: list[dict] = []  # what the runner registered, to register again
        self.faults: list[str] = []
        self._next_check = 0.0

    def check(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if now < self._next_check:
            return
        self._next_check = now + CONTROLLER_CHECK_S
        try:
            recovered = self.fab.check()
        except FabricError as error:
            self.faults.append(f"{time.time() - self.start_s:.1f} s: {error}")
            raise FabricError(self.faults[-1]) from None
        if recovered:
            self.faults.append(f"{time.time() - self.start_s:.1f} s: {recovered}")
        why = self.fab.controller_down()
        if not why:
            return
        at = time.time() - self.start_s
        began = time.monotonic()
        try:
            self.fab.restart_controller(self.jobs)
        except (FabricError, OSError) as error:
            self.faults.append(f"{at:.1f} s: {why}; restarting it failed: {error}")
            raise FabricError(self.faults[-1]) from None
        self.faults.append(f"{at:.1f} s: {why}; restarted, tables restored in "
                           f"{time.monotonic() - began:.1f} s")


def set_aside(path: Path, kind: str) -> Path:
    """Move a folder out of the way of its next attempt, kept beside it as <name>.<kind><N> (the first N
    free); return where it went."""
    number = 1
    while path.with_name(f"{path.name}.{kind}{number}").exists():
        number += 1
    return path.rename(path.with_name(f"{path.name}.{kind}{number}"))


def run_once(fab: Fabric, out: Path, plans: list[RunPlan], rates: pd.DataFrame, stats_csv: Path,
             progress: Progress, run: Run | None = None, earlier: Sequence[str] = ()) -> str:
    """One run on a ready fabric, its jobs' plans (plan_jobs: one, or one per job of several; `run`
    the run itself, default the first plan's): its records in runs/<run_id>/; returns its status. A
    controller that dies is restarted (the run goes on, its record says so); FabricError when it
    cannot be. Whatever else stops a job fails this run alone, with the records it has. `earlier`:
    what became of this run's earlier attempts, recorded first among its faults.

    Several jobs: each registered (under timeshift with its iteration as its alone run measured it,
    `measured_documents`), then each launched with a tag of its own and told when to start its first
    iteration, together after JOBS_STARTUP_S, each at its start_s and the offset the controller's
    sharing policy gave it, and the pace it keeps to after that (0: none)."""
    run = run or plans[0].run
    several = len(plans) > 1
    plans = measured_documents(out, run, plans)
    path = run_dir(out, run.run_id)
    if path.exists():
        if path.is_symlink():  # never followed: a link in a results folder is not ours to empty
            path.unlink()
        else:
            shutil.rmtree(path)  # an interrupted or failed earlier attempt
    path.mkdir(parents=True)
    known_problems = len(fab.controller_problems())
    schedule = Schedule([])
    processes: list[JobProcess] = []
    start_s = time.time()
    watch = ControllerWatch(fab, start_s)
    watch.faults.extend(earlier)
    base = secrets.randbits(27)  # in every host-app frame: a stray datagram of another run or job is not ours
    error = ""
    placed: dict = {}
    remote_samplers: RemoteSamplers | None = None
    jobs: list[dict] = []
    try:
        try:
            placed = measured_placement(fab, plans)
            schedule = Schedule(disturbances_of(fab, run.config, path))
            ports = ports_by_server(fab)
            local_ports = ports.pop(LOCAL)
            with FabricSampler(path, local_ports) as sampler, \
                    RemoteSamplers(path, ports, sys.executable, str(REPO)) as remote_samplers:
                progress.sampling(sampler)
                registered = [register_job(fab, plan, watch.jobs) for plan in plans]
                shared = shared_jobs(fab) if several and watch.jobs else {}
                if any(job.get("paths") for job in shared.values()):
                    placed = multijob.pinned_placement(placed, pinned_flows(plans), list(shared.values()))
                jobs_start = time.time() + JOBS_STARTUP_S if several else 0.0
                for plan, layer_dscp in zip(plans, registered):
                    decided = shared.get(plan.job_id, {})
                    if decided:
                        layer_dscp = {layer["index"]: layer["dscp"] for layer in decided["layers"]}
                    offset_s = decided.get("start_offset_ms", 0.0) / 1000
                    start_at = jobs_start + plan.start_s + offset_s if several else 0.0
                    pace_s = (decided.get("pace_ms") or 0.0) / 1000 if several else 0.0
                    tag = job_tag(base, plan.number)
                    processes += launch_job(fab, out, plan, layer_dscp, tag, start_at, pace_s)
                    measured = {key: plan.document[key]
                                for key in ("period_ms", "period_p99_ms", "comm_ms", "comm_start_ms")
                                if plan.document and "period_ms" in plan.document}
                    jobs.append({"name": plan.name, "job_id": plan.job_id, "tag": tag,
                                 "arrival_s": jobs_start + plan.start_s, "start_at_s": start_at,
                                 "start_offset_s": offset_s, "pace_s": pace_s, "band": decided.get("band"),
                                 "intensity": decided.get("intensity"), **({"measured": measured} if measured else {}),
                                 **({"paths": decided["paths"]} if decided.get("paths") else {}),
                                 **plan.bounds})
                schedule.start()
                error = wait_job(processes, progress, watch.check)
        except (FabricError, OSError):
            raise
        except Exception as failure:
            error = f"{type(failure).__name__}: {failure}"
        finally:
            schedule.stop()
            for process in processes:
                kill_group(process.popen)
                cluster.kill_remote(fab.host(process.host), rf"--tag {process.tag}( |$)")
        watch.check(now=math.inf)  # the run's end: is the controller still there?
        for document in watch.jobs:
            unregister_job(fab, document["job"])
    except (FabricError, OSError) as failure:
        write_run_record(out, run, "failed", start_s, time.time(), error=f"fabric: {failure}",
                         faults=watch.faults, jobs=jobs if several else None)
        raise
    end_s = time.time()
    problems = fab.controller_problems()[known_problems:]
    fetched = [cluster.fetch(fab.host(process.host), str(process.stdout.parent)) for process in processes]
    if remote_samplers is not None:  # not the run's failure: the guard says which server has no samples
        for line in fetch_samples(fab, remote_samplers):
            print(f"run {run.run_id}: {line}", file=sys.stderr)
    for process in processes:  # every record on this machine's clock
        server = cluster.server_of(fab.host(process.host))
        if server != LOCAL:
            cluster.to_local_clock(process.stdout.parent, clock_offsets(fab)[server][0])
    error = "; ".join(filter(None, [error, *fetched, *schedule.errors,
                                    *(f"controller: {line}" for line in problems[:1])]))
    write_csv(rates, path / "port_rates.csv")
    write_port_slice(stats_csv, path / "ports.csv", start_s, end_s, run.controller.stats_interval_s)
    status = "failed" if error else "ok"
    write_run_record(out, run, status, start_s, end_s, error=error, faults=watch.faults,
                     bounds=None if several else plans[0].bounds, placement=placed, jobs=jobs if several else None)
    return status


def measured_documents(out: Path, run: Run, plans: list[RunPlan]) -> list[RunPlan]:
    """Under timeshift, each job's document with its iteration as its run alone in this repetition
    measured it (multijob.measured_timing: period, communication and when it starts), what CASSINI
    places rather than a plan; a job whose alone run is missing, failed or unreadable keeps the
    planned one (the controller models it from the layer table)."""
    if run.controller.sharing != "timeshift" or len(plans) < 2:
        return plans
    try:
        spec = parse_spec(read_spec_document(out))
    except (SpecError, Damaged, OSError):
        return plans
    alone, by_id = alone_runs(spec), {each.run_id: each for each in spec.runs}
    measured = []
    for plan in plans:
        reference = by_id.get(alone.get((run.run_id, plan.name), ""))
        timing = None
        if reference is not None and plan.document is not None and (
                read_run_record(out, reference.run_id) or {}).get("status") == "ok":
            try:
                records = read_run(out, reference)
                timing = multijob.measured_timing(records["iterations"], records["tensors"])
            except (Damaged, OSError, KeyError, ValueError):
                timing = None
        measured.append(dataclasses.replace(plan, document={**plan.document, **timing}) if timing else plan)
    return measured


def shared_jobs(fab: Fabric) -> dict[str, dict]:
    """The registered jobs as the controller shares the fabric among them (GET /jobs): each one's
    DSCP per layer in its band, and its start offset."""
    return {job["job"]: job for job in fab.rest("/jobs", "GET")}


def pinned_flows(plans: list[RunPlan]) -> list[tuple[str, str, str]]:
    """Every job's flows as the placement names them, with their ends' addresses."""
    return [(f"{plan.name} {flow.what}" if plan.name else flow.what, ip[flow.src], ip[flow.dst])
            for plan in plans for ip in [host_ips(plan.run)] for flow in data_flows(plan.run)]


_placements: dict[tuple, dict] = {}  # (fabric id, flows) -> placement: one fabric places a 5-tuple alike


def measured_placement(fab: Fabric, plans: list[RunPlan]) -> dict:
    """Where per-flow ECMP puts the run's flows (emulation/placement.py; every job's, and the
    background's once), probed before the jobs start, once per fabric for the same flows (every TCP
    scheme of a repetition has the same); {} on a cluster (the probes read this machine's switches
    only) or with no flow to place."""
    # a job's flows named after it ("vgg worker0->worker1"): the jobs' own names repeat
    flows = tuple(dict.fromkeys(flow._replace(what=f"{plan.name} {flow.what}") if plan.name else flow
                                for plan in plans for flow in data_flows(plan.run)))
    if not flows or fab.servers:
        return {}
    key = (fab.id, flows)
    if key not in _placements:
        _placements[key] = placement.summary(placement.measure(fab, flows))
    return _placements[key]


def register_job(fab: Fabric, plan: RunPlan, registered: list[dict]) -> dict[int, int]:
    """Register the job's layer table and flows with the controller, whose scheduling policy
    turns them into DSCP classes; returns layer -> DSCP for the host apps (none for fifo).
    A fifo job is registered too when it marks droppable datagrams: the LE -> CS1 rule is the job's.

    With TCP the controller rewrites the DSCP of the job's connections at their ingress switch;
    a connection carries every layer, so it gets its most urgent layer's class. With mlt the
    senders mark each message with its layer's class from the map returned here (a rewrite
    would erase that), and the controller only maps their lower-effort datagrams to CS1.
    The job document is appended to `registered` (to register it again after a restart)."""
    if plan.document is None:
        return {}
    job = fab.rest("/jobs", "POST", plan.document)
    registered.append(plan.document)
    return {layer["index"]: layer["dscp"] for layer in job["layers"]}


def unregister_job(fab: Fabric, job_id: str) -> None:
    """DELETE the run's job; one already gone (a REST client removed it) is no failure of the run."""
    try:
        fab.rest(f"/jobs/{job_id}", "DELETE")
    except urllib.error.HTTPError as error:
        if error.code != 404:
            raise


def launch_job(fab: Fabric, out: Path, plan: RunPlan, layer_dscp: dict[int, int],
               tag: int, start_at: float = 0.0, pace_s: float = 0.0) -> list[JobProcess]:
    """The job's host apps, in the plan's order: parameter-server shards first so the workers find
    them listening; start_at: when its workers start their first iteration (0: once connected);
    pace_s: iteration i no earlier than start_at + i x pace_s (0: free)."""
    # mlt senders mark each tensor's datagrams with its class themselves (TCP's are marked by the controller)
    dscp = layer_dscp if plan.run.job.transport == "mlt" else {}
    processes = []
    for role, rank, host, config in plan.processes:
        directory = process_dir(out, plan.run.run_id, host, role, rank)
        directory.mkdir(parents=True)
        cluster.make_dir(fab.host(host), str(directory))
        stdout, stderr = directory / "stdout.log", directory / "stderr.log"
        with open(stdout, "w") as out_file, open(stderr, "w") as err_file:
            cfg = dataclasses.replace(config, out=str(directory), tag=tag, layer_dscp=dscp, start_at=start_at,
                                      pace=pace_s)
            argv = [sys.executable, "-m", "hostapps", role, *process_arguments(cfg)]
            popen = fab.popen(host, argv, cwd=REPO, stdout=out_file, stderr=err_file)
        processes.append(JobProcess(directory.name, host, popen, stdout, stderr, tag, plan.name))
    return processes


def wait_job(processes: list[JobProcess], progress: Progress, watch: Callable[[], None]) -> str:
    """Wait for the job; '' when every process exited 0, else what went wrong first. The rank-0
    worker's stdout (one line per finished iteration) drives the progress display (the first job's;
    with several jobs, each job's for the live view); `watch` is called at every poll (the
    controller watch)."""
    firsts: dict[str, JobProcess] = {}
    for process in processes:
        if process.name.endswith("-worker0"):
            firsts.setdefault(process.job, process)
    hosts = {job: list(dict.fromkeys(process.host for process in processes if process.job == job)) for job in firsts}
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while True:
        watch()
        ends = {job: [float(end) for end in ITERATION_LINE.findall(rank0.stdout.read_text())]
                for job, rank0 in firsts.items()}
        first = next(iter(ends.values()))
        progress.iteration(len(first), first)
        if len(firsts) > 1:
            progress.job_iterations({job: {"hosts": hosts[job], "ends": job_ends} for job, job_ends in ends.items()})
        codes = [process.popen.poll() for process in processes]
        failed = [(process, code) for process, code in zip(processes, codes) if code]
        if failed:
            # A process killed by a signal is the cause; its peers then fail on the lost connection.
            process, code = min(failed, key=lambda failure: failure[1] > 0)
            if code < 0:
                return f"{process.name} was killed by {signal.Signals(-code).name}"
            lines = process.stderr.read_text().strip().splitlines()
            return f"{process.name} exited with status {code}: {lines[-1] if lines else 'no output'}"
        if all(code == 0 for code in codes):
            return ""
        if time.monotonic() > deadline:
            running = [process.name for process, code in zip(processes, codes) if code is None]
            return f"timeout: {', '.join(running)} still running after {RUN_TIMEOUT_S:.0f} s"
        time.sleep(POLL_S)


def write_port_slice(stats_csv: Path, path: Path, start_s: float, end_s: float,
                     interval_s: float) -> None:
    """The run's rows of the fabric's port statistics: from the last poll before start_s to the
    first after end_s (waiting up to two intervals for that poll)."""
    deadline = time.monotonic() + 2 * interval_s
    while True:
        ports = pd.read_csv(stats_csv) if stats_csv.exists() else pd.DataFrame(columns=PORT_COLUMNS)
        ports = ports.dropna()  # a row the controller is writing right now
        if (ports["time_s"] >= end_s).any() or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    before = ports.loc[ports["time_s"] < start_s, "time_s"]
    after = ports.loc[ports["time_s"] >= end_s, "time_s"]
    first = before.max() if len(before) else start_s
    last = after.min() if len(after) else end_s
    write_csv(ports[(ports["time_s"] >= first) & (ports["time_s"] <= last)][PORT_COLUMNS], path)

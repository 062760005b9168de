"""What each run of a spec will do, worked out from the spec alone: its host-app processes (role,
rank, host and config), the model's layer table, the job document the controller is given, the
bounds its traffic puts on an iteration, and the fabric it runs on (consecutive runs with one
fabric key share one fabric). No network, no Mininet, no pandas.

`dry_run` plans every run and checks what only a plan can tell: that the host apps take their
configs and build the model (as many shards as it has tensors, PS slices the message step field can
number), that the controller takes the job document, that the job's processes fit this machine's
memory, that the live view's port is not the controller's. `validate`, `plan` and `run` call it
before any network exists: whatever validates, runs (a failure at run time fails that run alone).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

from common.schema import SchemaError
from controller.scheduling import describe_job, parse_job
from controller.sharing import SHARING_POLICIES
from experiments import traffic
from experiments.source_ports import run_source_ports
from experiments.spec import FLOW_PORTS, Job, Run, Spec, SpecError, Topology, layout_of, not_allowed
from experiments.spec.checks import worker_leaves
from hostapps.allreduce import ALLREDUCES
from hostapps.assembly import peers_to_connect
from hostapps.config import ConfigError, Model, ProcessConfig, Training, build_model, config_from_args, \
    layer_times_s, process_arguments
from hostapps.mlt import payload_for_mtu
from topologies.cluster import LOCAL, placement

WORKER_PORT = 7000
SERVER_PORT = 7100
IPERF_PORT = 5201  # background flow i's iperf3 servers listen on IPERF_PORT + FLOW_PORTS*i + source index
PEER_TIMEOUT_S = 30.0   # host apps fail when a peer stays silent this long
JOB_TAG_BITS = 4        # a run's jobs (at most 16) are numbered in the low bits of their tag
# The controller the runner starts with each fabric listens on 127.0.0.1 (OpenFlow, REST).
OPENFLOW_PORT = 6653
REST_PORT = 8080
# A host app's private memory at start (numpy and the digits; measured), before its model's buffers.
PROCESS_BASE_BYTES = 21 * 2**20
MEMINFO = Path("/proc/meminfo")
# Host-app flags that are set from other spec fields than job.<flag>.
FLAG_FIELDS = {"link_mbps": "topology.host_bw", "mtu_payload": "topology.mtu", "leaves": "job.collective"}


class Process(NamedTuple):
    """One host-app process of a run: its config lacks only what the run decides as it starts
    (its records' directory, the job number in its frames, the controller's DSCP per layer)."""
    role: str
    rank: int
    host: str
    config: ProcessConfig


@dataclass(frozen=True)
class RunPlan:
    """One job's plan: a run of one job, or one job of a run of several (its `run` is the job's run as
    if alone, Run.job_runs, under the run's id and index)."""
    run: Run
    job_id: str                      # the job's id at the controller
    processes: list[Process]         # parameter-server shards first, then the workers, by rank
    layers: list[dict]               # the layer table (layer_table)
    document: dict[str, Any] | None  # the job document registered with the controller; None: not registered
    lower_bound_s: float             # experiments/traffic.py's analytical bound on an iteration's communication
    bounds: dict[str, float]         # experiments/traffic.py's: comm_bound_s, link_bound_s, tail_comm_s
    name: str = ""                   # the job's name in a run of several ("" in a run of one job)
    number: int = 0                  # its index among the run's jobs: the low bits of its frames' tag
    start_s: float = 0.0             # when its first iteration starts after the run's jobs start

    @property
    def layer_sizes(self) -> list[int]:
        """The job's layer bytes, front layer first."""
        return [layer["bytes"] for layer in self.layers]


def fabric_key(run: Run) -> tuple:
    """Runs with equal keys can share a fabric."""
    servers = run.config.cluster
    return (run.topology, run.controller.lb, run.controller.stats_interval_s, tuple(servers.servers),
            servers.placement)


def fabric_params(topology: Topology) -> dict:
    """The Topo's parameters (topologies/leafspine.py) for the spec's topology."""
    common = {"mtu": topology.mtu, "tcp_cc": topology.tcp_cc}
    if topology.kind == "file":
        return {"path": topology.file, "host_bw": topology.host_bw, "fabric_bw": topology.fabric_bw, **common}
    if topology.kind == "fattree":
        return {"k": topology.k, "bw": topology.host_bw, **common}
    return {"spines": topology.spines, "leaves": topology.leaves, "hosts_per_leaf": topology.hosts_per_leaf,
            "host_bw": topology.host_bw, "fabric_bw": topology.fabric_bw, **common}


def host_ips(run: Run) -> dict[str, str]:
    """Each host's address, as the fabric's layout gives it to every build of the fabric."""
    return {node.name: node.ip for node in layout_of(run.topology).hosts}


def process_config(run: Run, role: str, rank: int, ip: dict[str, str], **process: Any) -> ProcessConfig:
    """One process of the run's job: the spec's training knobs as they are, the peers' addresses and
    the fabric's facts (link rate for pacing and profile timing, datagram payload at the MTU, whether
    mlt sprays: a source port per datagram under lb spray, else one, a flow per peer as TCP's, and
    for an all-reduce that follows the fabric, the tree or the hierarchical one, each worker's leaf)."""
    config = run.config
    training = {field.name: getattr(run.job, field.name) for field in dataclasses.fields(Training)}
    ports, _ = run_source_ports(config)
    index = rank if role == "server" else len(config.server_hosts) + rank
    if config.controller.lb != "spray":
        process.setdefault("sport_range", 1)
    if run.job.mode == "allreduce" and ALLREDUCES[run.job.collective].follows_leaves:
        process.setdefault("leaves", worker_leaves(config))
    return ProcessConfig(**training, role=role, rank=rank, source_port=ports[index],
                         workers=[(ip[host], WORKER_PORT) for host in config.worker_hosts],
                         servers=[(ip[host], SERVER_PORT) for host in config.server_hosts],
                         timeout=PEER_TIMEOUT_S, link_mbps=config.topology.host_bw,
                         mtu_payload=payload_for_mtu(config.topology.mtu), **process)


def processes(run: Run) -> list[Process]:
    """The job's host apps, parameter-server shards first so the workers find them listening."""
    config, ip = run.config, host_ips(run)
    roles = [("server", rank, host) for rank, host in enumerate(config.server_hosts)]
    roles += [("worker", rank, host) for rank, host in enumerate(config.worker_hosts)]
    return [Process(role, rank, host, process_config(run, role, rank, ip)) for role, rank, host in roles]


class DataFlow(NamedTuple):
    """A 5-tuple that carries a run's bulk bytes, from the host `src` to `dst`: its per-flow ECMP
    placement is what a seed decides (experiments/source_ports.py)."""
    what: str    # e.g. "worker0->worker1", "flow0 h4->h7"
    src: str     # host names
    dst: str
    proto: str   # tcp or udp
    sport: int
    dport: int


def data_flows(run: Run) -> list[DataFlow]:
    """The run's flows that per-flow ECMP places: each TCP connection of the job both ways (a
    process dials its j-th peer from its source port + j), mlt's datagrams to each peer from the
    process's one source port (under lb ecmp or single; a sprayed datagram takes a port of its
    own), and each TCP background flow from its client's port to its iperf3 server. Flows left to
    ephemeral ports (source port 0) are not placed by the seed and are left out."""
    ip = host_ips(run)
    host_of = {address: host for host, address in ip.items()}
    flows = []
    for process in processes(run):
        cfg = process.config
        name = f"{process.role}{process.rank}"
        dial, accept = peers_to_connect(cfg)
        if cfg.transport == "tcp" and cfg.source_port:
            for j, (peer, (peer_ip, port)) in enumerate(dial.items()):
                other = f"{peer.role}{peer.rank}"
                flows.append(DataFlow(f"{name}->{other}", process.host, host_of[peer_ip], "tcp",
                                      cfg.source_port + j, port))
                flows.append(DataFlow(f"{other}->{name}", host_of[peer_ip], process.host, "tcp", port,
                                      cfg.source_port + j))
        elif cfg.transport == "mlt" and cfg.sport_range == 1 and cfg.source_port:
            for peer, (peer_ip, port) in {**dial, **accept}.items():
                flows.append(DataFlow(f"{name}->{peer.role}{peer.rank}", process.host, host_of[peer_ip], "udp",
                                      cfg.source_port, port))
    _, clients = run_source_ports(run.config)
    client_ports = iter(clients)
    for index, flow in enumerate(run.config.background):
        for source_index, source in enumerate([flow.src] if isinstance(flow.src, str) else flow.src):
            client_port = next(client_ports)
            if flow.proto == "tcp" and client_port:
                flows.append(DataFlow(f"flow{index} {source}->{flow.dst}", source, flow.dst, "tcp", client_port,
                                      IPERF_PORT + FLOW_PORTS * index + source_index))
    return flows


def layer_table(run: Run) -> list[dict]:
    """The job's layers as the host apps build the model: index, name, bytes, and a worker's
    forward and backward compute in milliseconds (what the tictac policy times its classes by).
    ConfigError when the host apps would refuse the model."""
    config = process_config(run, "worker", 0, host_ips(run))
    table = _layer_table(config.model, config.backward, config.link_mbps, config.mode, len(config.servers),
                         config.ps_slice_bytes, config.batch // config.world)
    return [dict(layer) for layer in table]


@lru_cache(maxsize=64)
def _layer_table(model: Model, backward: str, link_mbps: float, mode: str, servers: int, ps_slice_bytes: int,
                 rows: int) -> tuple[dict, ...]:
    """layer_table by what it depends on (not the seed: it sets the values, not the sizes or times)."""
    config = ProcessConfig(model=model, backward=backward, link_mbps=link_mbps, mode=mode, role="worker",
                           rank=0, workers=[("127.0.0.1", WORKER_PORT)],
                           servers=[("127.0.0.1", SERVER_PORT + shard) for shard in range(servers)],
                           ps_slice_bytes=ps_slice_bytes)
    built = build_model(config)
    forward_s, backward_s = layer_times_s(built, rows)
    return tuple({"index": i, "name": layer.name, "bytes": int(layer.size) * 4,
                  "fwd_ms": forward_s[i] * 1000, "bwd_ms": backward_s[i] * 1000}
                 for i, layer in enumerate(built.layers))


def registers_job(run: Run) -> bool:
    """Whether the runner registers the job with the controller: for a class policy, for the LE -> CS1
    rule of a fifo job that marks droppable datagrams, or for a sharing policy other than fair (its
    classes and start offsets are the controller's)."""
    return run.controller.sched != "fifo" or run.job.drop_marking or run.controller.sharing != "fair"


def job_document(run: Run, job_id: str, ip: dict[str, str], layers: list[dict] | None = None) -> dict:
    """The job as `POST /jobs` takes it (controller/scheduling.py): its policy, hosts, layer table
    and, with TCP, its connections each way between every two of its processes; its sharing policy
    and the time one iteration's traffic needs on its busiest link (experiments/traffic.py), what
    the intensity and time-shift policies rank and place it by; under a policy that chooses paths,
    the bytes an iteration sends from host to host (traffic.host_traffic), what they are chosen by."""
    config = run.config
    proto = "udp" if run.job.transport == "mlt" else "tcp"
    ports = {host: WORKER_PORT for host in config.worker_hosts}
    ports.update({host: SERVER_PORT for host in config.server_hosts})
    flows = []
    for src in ports if proto == "tcp" else ():
        for dst, port in ports.items():
            if src != dst:  # to the peer's listening port, and the answers from it
                flows.append({"src": ip[src], "dst": ip[dst], "proto": proto, "dport": port})
                flows.append({"src": ip[dst], "dst": ip[src], "proto": proto, "sport": port})
    layers = layer_table(run) if layers is None else layers
    sizes = [layer["bytes"] for layer in layers]
    comm_ms = traffic.link_bound_s(run, sizes) * 1000
    document = {"job": job_id, "policy": run.controller.sched, "hosts": [ip[h] for h in ports],
                "layers": layers, "flows": flows, "sharing": run.controller.sharing, "comm_ms": round(comm_ms, 3)}
    if SHARING_POLICIES[run.controller.sharing].chooses_paths:  # what its paths are chosen by
        document["traffic"] = [{"src": ip[src], "dst": ip[dst], "bytes": round(sent)}
                               for (src, dst), sent in sorted(traffic.host_traffic(run, sizes).items())]
    return document


def traffic_bounds(run: Run, sizes: list[int]) -> dict[str, float]:
    """The bounds the job's traffic puts on an iteration, for its run.json (experiments/traffic.py)."""
    return {"comm_bound_s": traffic.comm_bound_s(run, sizes), "link_bound_s": traffic.link_bound_s(run, sizes),
            "tail_comm_s": traffic.tail_comm_s(run, sizes)}


def job_tag(base: int, number: int) -> int:
    """The tag in the frames of job `number` of a run whose jobs draw `base` (31 bits in all): the
    jobs of a run never share one, so the host apps of one never take another's datagrams."""
    return (base << JOB_TAG_BITS | number) & 0x7FFF_FFFF


def plan_jobs(run: Run) -> list[RunPlan]:
    """Every job's plan of a run: one for a run of one job, else one per job, each planned as if it
    were alone (Run.job_runs) under its id `run<index>.<name>`, its number and its start; a
    SpecError names the job's field as `jobs.<index>.<field>`."""
    if not run.config.jobs:
        return [plan_run(run)]
    plans = []
    for number, (name, job_run) in enumerate(zip(run.job_names, run.job_runs)):
        try:
            plan = plan_run(job_run, f"run{run.index}.{name}")
        except SpecError as error:
            if error.path != "job" and not error.path.startswith("job."):
                raise
            raise SpecError(f"jobs.{number}{error.path[3:]}", error.problem) from None
        plans.append(dataclasses.replace(plan, name=name, number=number, start_s=run.config.jobs[number].start_s))
    return plans


def plan_run(run: Run, job_id: str | None = None) -> RunPlan:
    """What the run of one job will do; a SpecError naming the field when the host apps or the
    controller would refuse it. job_id: the job's id at the controller (run<index>)."""
    try:
        planned = processes(run)
        for process in planned:
            process.config.validate()
        for role in ("server", "worker"):  # the command line each host app reads back, one of each role
            first = next((process for process in planned if process.role == role), None)
            if first is not None:
                config_from_args([role, *process_arguments(first.config)])
        layers = layer_table(run)
    except ConfigError as error:
        flag = error.path.lstrip("-").replace("-", "_")
        known = {field.name for field in dataclasses.fields(Job)}
        field = FLAG_FIELDS.get(flag, f"job.{flag}" if flag in known else "job")
        raise SpecError(field, f"{error.problem} (the host apps would refuse {error.path or 'the job'})") from None
    job_id = job_id or f"run{run.index}"
    document = job_document(run, job_id, host_ips(run), layers) if registers_job(run) else None
    if document is not None:
        try:
            describe_job(parse_job(document))  # what the controller does with POST /jobs
        except SchemaError as error:
            field = {"layers": "job.model", "flows": "job.workers", "hosts": "job.workers"}.get(
                error.path.split(".")[0], "job")
            raise SpecError(field, f"the controller refuses the job: {error.path}: {error.problem}") from None
    sizes = [layer["bytes"] for layer in layers]
    bounds = traffic_bounds(run, sizes)
    plan = RunPlan(run, job_id, planned, layers, document, bounds["comm_bound_s"], bounds)
    check_memory(plan)
    return plan


def machine_memory_bytes() -> int | None:
    """This machine's memory (MemTotal); None when it cannot be read."""
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_needed_bytes(plan: RunPlan) -> int:
    """Least memory the job's processes on the busiest server take: each holds its base, and every
    worker the model's parameters and gradients (8 bytes a parameter), each shard its share of them."""
    config = plan.run.config
    model_bytes = 2 * sum(plan.layer_sizes)
    where = placement(layout_of(config.topology), config.cluster.servers or [LOCAL], config.cluster.placement)
    needed: dict[str, int] = {}
    for process in plan.processes:
        share = model_bytes if process.role == "worker" else model_bytes // len(config.server_hosts)
        needed[where[process.host]] = needed.get(where[process.host], 0) + PROCESS_BASE_BYTES + share
    return max(needed.values())


def check_memory(plan: RunPlan) -> None:
    available = machine_memory_bytes()
    needed = memory_needed_bytes(plan)
    if available is not None and needed > available:
        job = plan.run.job
        model = {name: value for name, value in dataclasses.asdict(job.model).items() if value is not None}
        raise not_allowed("job.model", model,
                          f"its {len(plan.processes)} host-app processes need at least {needed / 2**30:.1f} GiB "
                          f"(every worker holds the model's parameters and gradients, 8 bytes a parameter, "
                          f"{2 * sum(plan.layer_sizes) / 2**30:.2f} GiB here), more than this machine's "
                          f"{available / 2**30:.1f} GiB")


def check_live_port(port: int | None, field: str = "live") -> None:
    """The live view's port: not one the controller listens on (it would not start, nor would any fabric)."""
    if port is None:
        return
    if not 1024 <= port <= 65535 or port in (OPENFLOW_PORT, REST_PORT):
        raise not_allowed(field, port, f"a port 1024..65535 of 127.0.0.1 other than the controller's "
                          f"OpenFlow {OPENFLOW_PORT} and REST {REST_PORT}")


def dry_run(spec: Spec) -> list[RunPlan]:
    """Every run's plans (each job's, plan_jobs), as the runner will compute them; a SpecError (one
    line naming the field, and the run when the spec has a matrix) for anything the runner would
    fail on before its first fabric."""
    check_live_port(spec.header.live)
    plans = []
    for run in spec.runs:
        try:
            plans.extend(plan_jobs(run))
        except SpecError as error:
            if not spec.axes:
                raise
            point = ",".join(f"{axis}={label}" for axis, label in run.axes.items())
            raise SpecError(error.path, f"{error.problem} (in run {point})") from None
    return plans

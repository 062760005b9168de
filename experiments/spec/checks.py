"""The rules that span fields of one run's config, checked on what the schema built."""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from experiments.spec.errors import SpecError, not_allowed
from experiments.spec.schema import Fault, RunConfig
from experiments.spec.topology import check_topology, layout_of, shortest_paths_from, topology_links
from common.schema import show
from controller.sharing import MAX_JOBS, SHARING_POLICIES
from hostapps.allreduce import allreduce_names
from hostapps.config import check_training
from hostapps.traces import TraceError, read_trace
from topologies.cluster import ClusterError, placement
from topologies.layout import LEAF_ROLES


def check_config(config: RunConfig, runs: bool = True) -> None:
    """The rules that span fields: the fabric fits, hosts exist, placements fit, faults name real links,
    no knob is set that changes nothing. runs=False: the base of a spec whose matrix completes it,
    checked but for knobs that change nothing (the matrix may set what makes them count)."""
    if config.jobs:
        check_jobs(config, runs)
    else:
        check_one_job(config, runs)
    if runs:
        check_paths(config)


def check_paths(config: RunConfig) -> None:
    """A sharing policy that chooses the jobs' paths needs a choice: two hosts of one job joined by more
    than one shortest path."""
    sharing = config.controller.sharing
    if not SHARING_POLICIES[sharing].chooses_paths:
        return
    layout = layout_of(config.topology)
    for view in config.job_configs if config.jobs else [config]:
        hosts = view.worker_hosts + view.server_hosts
        if any(shortest_paths_from(layout, a)[1].get(b, 0) > 1 for a, b in itertools.combinations(hosts, 2)):
            return
    others = [name for name, policy in SHARING_POLICIES.items() if not policy.chooses_paths]
    raise not_allowed("controller.sharing", sharing, f"{', '.join(others[:-1])} or {others[-1]} here: no job has two "
                      "hosts on switches joined by more than one shortest path, so there is no path to choose and it "
                      "would change nothing")


def check_jobs(config: RunConfig, runs: bool) -> None:
    """Several jobs: each names its hosts, no host is two jobs', names differ, and each job passes
    every rule of a job alone, named as `jobs.<index>.<field>`."""
    if len(config.jobs) > MAX_JOBS:
        raise SpecError("jobs", f"{len(config.jobs)} jobs are not allowed (at most {MAX_JOBS}: the controller "
                        f"holds {MAX_JOBS} jobs)")
    owner: dict[str, int] = {}
    names: dict[str, int] = {}
    for index, entry in enumerate(config.jobs):
        path = f"jobs.{index}"
        if entry.name in names:
            raise not_allowed(f"{path}.name", entry.name, f"a name apart from jobs.{names[entry.name]}'s")
        names[entry.name] = index
        fields = ["workers"] + (["servers"] if entry.mode == "ps" else [])
        for name in fields:
            value = getattr(entry, name)
            if not isinstance(value, list):
                raise not_allowed(f"{path}.{name}", value, "a list of distinct host names: each of several jobs "
                                  "names its own hosts")
            for at, host in enumerate(value):
                if host in owner:
                    raise SpecError(f"{path}.{name}.{at}", f"{host} is also jobs.{owner[host]}'s (each host runs one "
                                    "job's process)")
                owner[host] = index
    for index, view in enumerate(config.job_configs):
        try:
            check_one_job(view, runs)
        except SpecError as error:
            if error.path != "job" and not error.path.startswith("job."):
                raise
            raise SpecError(f"jobs.{index}{error.path[3:]}", error.problem.replace("job.", f"jobs.{index}.")) from None


def check_one_job(config: RunConfig, runs: bool = True) -> None:
    """check_config of a run of one job (or of one job of several, as if alone)."""
    check_topology(config.topology)
    hosts = config.hosts
    job = config.job
    for name in ("workers", "servers"):
        value = getattr(job, name)
        if isinstance(value, list):
            for index, host in enumerate(value):
                if host not in hosts:
                    raise not_allowed(f"job.{name}.{index}", host, f"a host of h1..h{len(hosts)}")
        elif isinstance(value, int) and value > len(hosts):
            raise not_allowed(f"job.{name}", value, f"at most the {len(hosts)} hosts of the topology")
    servers = config.server_hosts
    if job.mode == "ps" and len(servers) >= len(hosts):
        raise not_allowed("job.servers", job.servers, f"fewer than the {len(hosts)} hosts, workers need one")
    shared = sorted(set(servers) & set(job.workers if isinstance(job.workers, list) else []))
    if shared:
        raise not_allowed("job.workers", job.workers, f"hosts apart from the servers {', '.join(servers)}")
    if isinstance(job.workers, int) and job.workers + len(servers) > len(hosts):
        raise not_allowed("job.workers", job.workers, f"at most {len(hosts) - len(servers)}: "
                          f"{len(hosts)} hosts, {len(servers)} of them servers")
    workers = len(config.worker_hosts)
    if job.batch % workers:
        raise not_allowed("job.batch", job.batch, f"a multiple of the {workers} workers, the global batch "
                          "splits evenly over them")
    if job.iterations < 3:
        raise not_allowed("job.iterations", job.iterations, "at least 3: the first iteration is start-up, the "
                          "last drains the final round, the metrics need one between")
    check_training(job, lambda name: f"job.{name}", SpecError, runs)
    if job.model.trace is not None:
        try:
            read_trace(job.model.trace)
        except TraceError as error:
            raise SpecError("job.model.trace", f"{show(job.model.trace)} {error}") from None
    if runs and config.controller.lb == "spray" and job.transport != "mlt":
        raise not_allowed("controller.lb", "spray", f"ecmp or single with job.transport {job.transport}: a TCP "
                          "connection keeps its 5-tuple, so spraying places it as ecmp does and would change "
                          "nothing; spray with job.transport mlt")
    if runs and job.mode == "allreduce" and job.collective == "hierarchical" and \
            len(set(worker_leaves(config))) == workers > 1:
        others = [name for name in allreduce_names() if name != "hierarchical"]
        raise not_allowed("job.collective", job.collective, f"{', '.join(others[:-1])} or {others[-1]} here: each "
                          f"of the {workers} workers is alone on its leaf, so its cross-leaf ring is the flat ring "
                          "and it would change nothing")
    if job.spray != "adaptive" and config.controller.lb != "spray":
        raise not_allowed("job.spray", job.spray, "adaptive unless controller.lb spray: on a per-flow fabric mlt "
                          "sends each peer's datagrams from one source port, there is nothing to spray")
    topology = config.topology
    if config.cluster.servers:
        try:
            placement(layout_of(topology), config.cluster.servers, config.cluster.placement)
        except ClusterError as error:
            path, _, problem = str(error).partition(": ")
            raise SpecError(path, problem) from None
    if topology.kind == "fattree" and topology.fabric_bw != topology.host_bw:
        raise not_allowed("topology.fabric_bw", topology.fabric_bw,
                          f"the host_bw {topology.host_bw:g}: all links of a fat-tree have one rate")
    for index, flow in enumerate(config.background):
        sources = [flow.src] if isinstance(flow.src, str) else flow.src
        ends = [("src", flow.src)] if isinstance(flow.src, str) else [
            (f"src.{i}", host) for i, host in enumerate(flow.src)]
        for end, name in ends + [("dst", flow.dst)]:
            if name not in hosts:
                raise not_allowed(f"background.{index}.{end}", name, f"a host of h1..h{len(hosts)}")
        if flow.dst in sources:
            raise not_allowed(f"background.{index}.dst", flow.dst, "a host other than the sources")
    links = topology_links(config.topology) if config.faults else set()
    held: dict[tuple[str, frozenset[str]], list[tuple[int, Fault]]] = {}  # faults by kind and link
    for index, fault in enumerate(config.faults):
        path = f"faults.{index}"
        link = frozenset(fault.link.split("-", 1))
        if link not in links or fault.link.count("-") != 1:
            example = "-".join(sorted(next(iter(sorted(links, key=sorted)))))
            raise not_allowed(f"{path}.link", fault.link, f"a link of the topology written a-b, e.g. {example}")
        for other, earlier in held.get((fault.kind, link), []):
            end = earlier.at_s + earlier.duration_s
            if fault.at_s < end and earlier.at_s < fault.at_s + fault.duration_s:
                raise not_allowed(f"{path}.at_s", fault.at_s, f"a time outside {earlier.at_s:g}..{end:g} s, when "
                                  f"faults.{other} holds the same link with a {fault.kind} fault: a link has one loss "
                                  "rule, one rate and one carrier, the end of one fault would end the other's")
        held.setdefault((fault.kind, link), []).append((index, fault))
        for name, kind in (("loss_percent", "loss"), ("rate_mbps", "rate")):
            given = getattr(fault, name) is not None
            if given and fault.kind != kind:
                raise not_allowed(f"{path}.{name}", getattr(fault, name), f"only with kind {kind}")
            if not given and fault.kind == kind:
                allowed = next(f for f in dataclasses.fields(Fault) if f.name == name).metadata["allowed"]
                raise SpecError(f"{path}.{name}", f"missing ({allowed})")


def worker_leaves(config: RunConfig) -> list[int]:
    """The number of the leaf (or edge) switch each worker's host hangs off, by rank (the host apps' --leaves)."""
    leaf_of = {}
    for link in layout_of(config.topology).links:
        for host, switch in ((link.a, link.b), (link.b, link.a)):
            if not host.is_switch and switch.role in LEAF_ROLES:
                leaf_of[host.name] = switch.number
    return [leaf_of[host] for host in config.worker_hosts]


def get_field(config: Any, dotted: str) -> Any:
    """config.a.b for dotted key 'a.b'."""
    for part in dotted.split("."):
        config = getattr(config, part)
    return config



def mechanisms(config: RunConfig) -> dict[str, Any]:
    """The mechanisms a run switches on, each an independent axis of the testbed: the transport,
    load balancing, the scheduling policy, the loss bound, drop marking, the send order with its
    own units, slicing (a parameter server's P3 slices) and the all-reduce's algorithm."""
    job = config.job
    order = job.order
    units = {"caramel": job.partition_bytes, "bytescheduler": (job.partition_bytes, job.credit_bytes)}
    return {
        "transport": job.transport,
        "load balancing": (config.controller.lb, job.spray),
        "scheduling": config.controller.sched,
        "loss bound": job.loss_bound,
        "drop marking": job.drop_marking,
        "send order": (order, units.get(order, job.fusion if job.mode == "allreduce" else None)),
        "slicing": job.ps_slice_bytes,
        "collective": job.collective,
    }


def changed_mechanisms(before: RunConfig, after: RunConfig) -> list[str]:
    """The mechanisms that differ between two runs' configs."""
    one, other = mechanisms(before), mechanisms(after)
    return [name for name in one if one[name] != other[name]]

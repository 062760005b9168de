"""Experiment specs: the declared schema, validation, `--set` overrides and matrix expansion.

A spec is YAML. Its schema is the dataclasses below, on the schema engine the whole testbed shares
(common/schema.py): each field's type annotation says what YAML value it takes and `knob` adds the
default and what is allowed. The job's knobs are the host apps' own (`Training`,
hostapps/config.py), and choices are read from the registries that define them (load balancing
modes, the controller's class policies, send orders, model profiles). `load_spec`
checks everything (types, ranges, unknown keys, host names, links, placements of every run
of the matrix) before any network state exists, and fails with one line naming the field:

    spec error: topology.spines: 5000 is not allowed (at most 4095 spine switches, the DPIDs of one tier)

Whatever validates can run: sizes fit the address plan, OVS, Linux and this machine, rates fit tc,
times are finite. Validation itself stays bounded: a spec file is small UTF-8 text, nested and
expanded (YAML aliases) within limits, and its matrix is capped before it is expanded.

Matrix: each axis is a name with values; scalar values set one dotted field, mapping values
are labelled sets of dotted-field overrides. The runs are the cartesian product of the axes
times the repetitions, each with a stable run_id such as `scheme=spray,mode=ps,rep=1`.

Node names and links come from the fabric's layout (topologies/layout.py): hosts h1..hN leaf by
leaf; leaf-spine switches leaf1.., spine1..; fat-tree switches edge1.., agg1.., core1.. pod by pod.
A link is written `a-b` in either order.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Literal

import yaml

from controller.routing import LB_MODES
from controller.scheduling import CLASS_POLICIES
from experiments.metrics import METRIC_COLUMNS
from common import schema
from hostapps.config import U32, Training, check_training
from common.schema import SchemaError, knob, one_line, section, show
from topologies.cluster import LOCAL, PLACERS, ClusterError, placement
from topologies.layout import MAX_PER_TIER, Layout, fat_tree, leaf_spine
from topologies.tcp import DEFAULT_TCP_CC, available_tcp_cc
from common.frames import DEFAULT_MTU, MAX_MTU, MIN_MTU

# runs.csv columns that echo a config field. An axis may share one of these names only when
# it is the scalar axis over that very field (the column then shows the axis value).
CONFIG_COLUMNS = {
    "mode": "job.mode", "lb": "controller.lb", "sched": "controller.sched",
    "transport": "job.transport", "loss_bound": "job.loss_bound", "iterations": "job.iterations",
}
RESERVED_COLUMNS = {"run_id", "rep", "workers", "faults", "data_gaps", *METRIC_COLUMNS}
LABEL_PATTERN = re.compile(r"[A-Za-z0-9_.+-]+")
AXIS_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SERVER_PATTERN = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252})")  # a DNS name or an IPv4 address

# What one spec may ask for. Reading: a small text file whose values, YAML aliases expanded, are
# few and shallow (the shipped specs: under 3 KB, 200 values, 8 levels). PyYAML's pure-Python
# parser, needed to bound the nesting while composing, reads about 300 KB/s.
MAX_SPEC_BYTES = 256 * 1024
MAX_VALUES = 10_000
MAX_DEPTH = 32
TOO_MANY_VALUES = f"has more than {MAX_VALUES} values with its aliases expanded"
# Runs: repetitions x matrix points, each validated; the matrix is sized before it is expanded.
MAX_REPETITIONS = 100
MAX_AXES = 6
MAX_RUNS = 1000
# Fabric sizes. Limits of the fabric's conventions: a tier of switches has MAX_PER_TIER DPIDs
# (topologies/layout.py); a switch's port numbers stay well inside OpenFlow's 0xff00 (this
# one is not a constant of topologies/); Mininet names port n of a switch `<switch>-eth<n>`, and
# Linux interface names have at most IFNAMSIZ - 1 characters.
MAX_SWITCH_PORTS = 1024
IFNAME_CHARS = 15
# Limits of this machine (2 cores, 24 GB): every host may run a host app, ~21 MB of private memory at
# start (numpy and the digits; measured) plus its model's and transport's buffers; one ovs-vswitchd thread
# forwards every packet of every switch, and a 4x8x4 leaf-spine (12 switches) already takes
# ~7 s to build and start (docs/platform.md).
MACHINE_HOSTS = 128
MACHINE_SWITCHES = 64
# Link rates: topologies/shaping.py gives each of the 8 priority classes a floor of 1% of the
# link, and tc's smallest rate is 8 kbit/s; tc reads `{rate:g}mbit`, plain decimals up to 999999.
MIN_RATE_MBIT = 0.8
MAX_RATE_MBIT = 100_000
LINK_RATE = (f"a rate in Mbit/s {MIN_RATE_MBIT:g}..{MAX_RATE_MBIT}, so that each class's floor, 1% of it, "
             "reaches tc's 8 kbit/s")
# Times after the job starts: finite, and at most iperf3's longest test (a run stops at 600 s).
MAX_SECONDS = 86_400
AT_SECONDS = f"seconds after the job starts, 0..{MAX_SECONDS}"
DURATION_SECONDS = f"seconds, > 0 and at most {MAX_SECONDS}"
# Background flows: flow i's iperf3 servers listen on 5201 + FLOW_PORTS*i + source index
# (experiments/disturbances.py), below the job's ports 7000 and 7100 (experiments/runner.py).
FLOW_PORTS = 10
MAX_FLOWS = 100
# Seeds grow by one per repetition, up to 2**32 - 1 (hostapps.config.U32).


class SpecError(SchemaError):
    """A spec problem, as one line: `spec error: <dotted path>: <what is wrong>`."""

    def __init__(self, path: str, problem: str):
        super().__init__(path, problem)
        self.args = (one_line(f"spec error: {path}: {problem}"),)


def not_allowed(path: str, value: Any, allowed: str) -> SpecError:
    return SpecError(path, f"{show(value)} is not allowed ({allowed})")


def build(cls: type, raw: Any, path: str = "", also_known: tuple[str, ...] = (), base: Any = None) -> Any:
    """schema.build, its errors as SpecErrors."""
    try:
        return schema.build(cls, raw, path, also_known, base)
    except SpecError:
        raise
    except SchemaError as error:
        raise SpecError(error.path, error.problem) from None


def _unique_names(value: Any) -> bool:
    return isinstance(value, list) and len(value) > 0 and len(set(value)) == len(value)


def _count_or_hosts(value: Any) -> bool:
    return value >= 1 if isinstance(value, int) else _unique_names(value)


# ---------------------------------------------------------------------------------------- schema

@dataclass(frozen=True)
class Topology:
    kind: Literal["leafspine", "fattree"] = knob("leafspine")
    spines: int = knob(2, "an integer >= 1", lambda n: n >= 1)
    leaves: int = knob(2, "an integer >= 1", lambda n: n >= 1)
    hosts_per_leaf: int = knob(2, "an integer >= 1", lambda n: n >= 1)
    k: int = knob(4, "an even integer >= 2 (fattree only)", lambda n: n >= 2 and n % 2 == 0)
    host_bw: float = knob(100.0, LINK_RATE, lambda x: MIN_RATE_MBIT <= x <= MAX_RATE_MBIT)
    fabric_bw: float = knob(100.0, LINK_RATE, lambda x: MIN_RATE_MBIT <= x <= MAX_RATE_MBIT)
    mtu: int = knob(DEFAULT_MTU, f"an integer {MIN_MTU}..{MAX_MTU} (bytes, every interface of the fabric)",
                          lambda n: MIN_MTU <= n <= MAX_MTU)
    tcp_cc: str = knob(DEFAULT_TCP_CC, "a TCP congestion control this kernel offers ("
                             + ", ".join(available_tcp_cc()) + "), set in every host",
                             lambda name: name in available_tcp_cc())


@dataclass(frozen=True)
class Controller:
    lb: str = knob("ecmp", choices=lambda: LB_MODES)
    sched: str = knob("fifo", choices=lambda: list(CLASS_POLICIES))
    stats_interval_s: float = knob(
        1.0, "a period in seconds, 0.1..60: a run waits up to two periods for its last port statistics",
        lambda x: 0.1 <= x <= 60)


@dataclass(frozen=True)
class Cluster:
    """The machines the fabric runs on (topologies/cluster.py, docs/cluster.md); none listed: this one."""
    servers: list[str] = knob(
        [], f"[] for this machine alone, or distinct server names, the first {LOCAL} (it runs the controller "
        "and keeps the results)",
        lambda v: v == [] or (_unique_names(v) and v[0] == LOCAL
                              and all(isinstance(name, str) and SERVER_PATTERN.fullmatch(name) for name in v)))
    placement: str = knob("switchbin", choices=lambda: list(PLACERS))


@dataclass(frozen=True, kw_only=True)
class Job(Training):
    """The training job: the host apps' knobs, where it runs, and the accuracy it aims for."""
    workers: Literal["all"] | int | list[str] = knob(
        "all", "'all' hosts but the servers, a count >= 1 or a list of distinct host names",
        lambda v: v == "all" or _count_or_hosts(v))
    servers: int | list[str] = knob(1, "a count >= 1 or a list of distinct host names (ps only)", _count_or_hosts)
    target_accuracy: float = knob(0.9, "a fraction in (0, 1]", lambda x: 0 < x <= 1)


@dataclass(frozen=True)
class Flow:
    """An iperf3 background flow; several sources make an incast into dst."""
    src: str | list[str] = knob(
        allowed=f"a host name or a list of at most {FLOW_PORTS} distinct host names (incast)",
        check=lambda v: isinstance(v, str) or (_unique_names(v) and len(v) <= FLOW_PORTS))
    dst: str = knob(allowed="a host name")
    proto: Literal["tcp", "udp"] = knob("tcp")
    rate_mbps: float = knob(
        0.0, f"0: as fast as it goes, or a rate in Mbit/s 0.001..{MAX_RATE_MBIT}; iperf3 counts whole bits per second",
        lambda x: x == 0 or 0.001 <= x <= MAX_RATE_MBIT)
    start_s: float = knob(0.0, AT_SECONDS, lambda x: 0 <= x <= MAX_SECONDS)
    duration_s: float = knob(10.0, DURATION_SECONDS, lambda x: 0 < x <= MAX_SECONDS)


@dataclass(frozen=True)
class Fault:
    """A link fault: down, random loss (nftables) or a rate cut, for duration_s from at_s."""
    kind: Literal["link_down", "loss", "rate"] = knob()
    link: str = knob(allowed="a link of the topology written a-b, e.g. h1-leaf1")
    at_s: float = knob(allowed=AT_SECONDS, check=lambda x: 0 <= x <= MAX_SECONDS)
    duration_s: float = knob(allowed=DURATION_SECONDS, check=lambda x: 0 < x <= MAX_SECONDS)
    loss_percent: float | None = knob(
        None, "a percentage 0.01..100, nftables drops in 1/10000ths; only with kind loss",
        lambda x: x is None or 0.01 <= x <= 100)
    rate_mbps: float | None = knob(None, f"only with kind rate: {LINK_RATE}",
                                         lambda x: x is None or MIN_RATE_MBIT <= x <= MAX_RATE_MBIT)


@dataclass(frozen=True)
class RunConfig:
    """Everything one run needs: the fabric, the controller, the job and the disturbances."""
    topology: Topology = section(Topology)
    controller: Controller = section(Controller)
    cluster: Cluster = section(Cluster)
    job: Job = section(Job)
    background: list[Flow] = knob(
        [], f"a list of at most {MAX_FLOWS} flows: their iperf3 ports stay below the job's",
        lambda flows: len(flows) <= MAX_FLOWS)
    faults: list[Fault] = knob([], "a list of faults")

    @property
    def hosts(self) -> list[str]:
        return host_names(self.topology)

    @property
    def server_hosts(self) -> list[str]:
        """Parameter-server shards' hosts (none in allreduce): a count takes the last hosts."""
        servers = self.job.servers
        if self.job.mode != "ps":
            return []
        return list(servers) if isinstance(servers, list) else self.hosts[-servers:]

    @property
    def worker_hosts(self) -> list[str]:
        """Workers' hosts in rank order: a count takes the first hosts that are not servers."""
        workers = self.job.workers
        if isinstance(workers, list):
            return list(workers)
        free = [host for host in self.hosts if host not in self.server_hosts]
        return free if workers == "all" else free[:workers]


@dataclass(frozen=True)
class Header:
    """The top-level fields that are about the experiment rather than each run."""
    name: str = knob("experiment", "a name of letters, digits and _.+-",
                           lambda v: LABEL_PATTERN.fullmatch(v) is not None)
    description: str = knob("", "text")
    repetitions: int = knob(1, f"an integer 1..{MAX_REPETITIONS}", lambda n: 1 <= n <= MAX_REPETITIONS)
    matrix: dict = knob({}, "a mapping of axis names to axes")
    live: int | None = knob(None, "a port 1024..65535 of 127.0.0.1 for the live view of the running experiment "
                            "(experiments/live.py), or null", lambda port: port is None or 1024 <= port <= 65535)


_HEADER_KEYS = tuple(f.name for f in dataclasses.fields(Header))
_CONFIG_KEYS = tuple(f.name for f in dataclasses.fields(RunConfig))


# ------------------------------------------------------------------------- topology node names

def layout_of(topology: Topology) -> Layout:
    """The fabric's nodes and links (topologies/layout.py), once check_topology passed."""
    if topology.kind == "fattree":
        return fat_tree(topology.k)
    return leaf_spine(topology.spines, topology.leaves, topology.hosts_per_leaf)


def host_names(topology: Topology) -> list[str]:
    return [node.name for node in layout_of(topology).hosts]


def _host_count(topology: Topology) -> int:
    """Counted, not listed: check_topology caps sizes before anything is built."""
    if topology.kind == "fattree":
        return topology.k ** 3 // 4
    return topology.leaves * topology.hosts_per_leaf


def topology_links(topology: Topology) -> set[frozenset[str]]:
    """Every link of the fabric as the unordered pair of its end nodes' names."""
    return {link.names for link in layout_of(topology).links}


def _tiers(topology: Topology) -> list[tuple[str, int, int, str, str]]:
    """Each tier of switches: (name prefix, switches, ports of each, the field sizing the tier,
    the ports' count in fields, the first of which is blamed for too many)."""
    if topology.kind == "fattree":
        k, half = topology.k, topology.k // 2
        return [("edge", k * half, k, "k", "k"), ("agg", k * half, k, "k", "k"), ("core", half * half, k, "k", "k")]
    return [("leaf", topology.leaves, topology.hosts_per_leaf + topology.spines, "leaves", "hosts_per_leaf + spines"),
            ("spine", topology.spines, topology.leaves, "spines", "leaves")]


def check_topology(topology: Topology) -> None:
    """The fabric's size within its DPID plan, OpenFlow port numbers, Linux interface names and
    this machine; checked before anything counts or names its nodes."""
    def refuse(name: str, allowed: str) -> SpecError:
        return not_allowed(f"topology.{name}", getattr(topology, name), allowed)

    tiers = _tiers(topology)
    for prefix, count, _, sized_by, _ in tiers:
        if count > MAX_PER_TIER:
            makes = "" if count == getattr(topology, sized_by) else f"; this makes {count}"
            raise refuse(sized_by, f"at most {MAX_PER_TIER} {prefix} switches, the DPIDs of one tier{makes}")
    for prefix, _, ports, _, ports_by in tiers:
        if ports > MAX_SWITCH_PORTS:
            raise refuse(ports_by.split(" ")[0], f"at most {MAX_SWITCH_PORTS} ports per switch, well inside "
                         f"OpenFlow's 0xff00; each {prefix} would have {ports}: {ports_by}")
    for prefix, count, ports, sized_by, _ in tiers:
        longest = f"{prefix}{count}-eth{ports}"
        if len(longest) > IFNAME_CHARS:
            raise refuse(sized_by, f"Linux interface names have at most {IFNAME_CHARS} characters; {longest} "
                         f"has {len(longest)}")
    hosts, switches = _host_count(topology), sum(tier[1] for tier in tiers)
    if hosts > MACHINE_HOSTS or switches > MACHINE_SWITCHES:
        if topology.kind == "fattree":
            blamed = "k"
        elif hosts > MACHINE_HOSTS:
            blamed = "hosts_per_leaf" if topology.hosts_per_leaf >= topology.leaves else "leaves"
        else:
            blamed = "spines" if topology.spines >= topology.leaves else "leaves"
        raise refuse(blamed, f"one machine runs at most {MACHINE_HOSTS} hosts and {MACHINE_SWITCHES} switches; "
                     f"this makes {hosts} hosts and {switches} switches")


# ------------------------------------------------------------------------- cross-field checks

def check_config(config: RunConfig) -> None:
    """The rules that span fields: the fabric fits, hosts exist, placements fit, faults name real links."""
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
    check_training(job, lambda name: f"job.{name}", SpecError)
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
    for index, fault in enumerate(config.faults):
        path = f"faults.{index}"
        if frozenset(fault.link.split("-", 1)) not in links or fault.link.count("-") != 1:
            example = "-".join(sorted(next(iter(sorted(links, key=sorted)))))
            raise not_allowed(f"{path}.link", fault.link, f"a link of the topology written a-b, e.g. {example}")
        for name, kind in (("loss_percent", "loss"), ("rate_mbps", "rate")):
            given = getattr(fault, name) is not None
            if given and fault.kind != kind:
                raise not_allowed(f"{path}.{name}", getattr(fault, name), f"only with kind {kind}")
            if not given and fault.kind == kind:
                allowed = next(f for f in dataclasses.fields(Fault) if f.name == name).metadata["allowed"]
                raise SpecError(f"{path}.{name}", f"missing ({allowed})")


def get_field(config: Any, dotted: str) -> Any:
    """config.a.b for dotted key 'a.b'."""
    for part in dotted.split("."):
        config = getattr(config, part)
    return config


# -------------------------------------------------------------------------------------- reading

class YamlLimitError(yaml.YAMLError):
    """Valid YAML that no spec may be: nested too deeply, too large with its aliases expanded, or
    containing itself."""


def _shape_problem(root: Any, parts: Callable[[Any], Iterable[tuple[str, Any]]]) -> tuple[str, str] | None:
    """(dotted path, problem) where root, with its shared parts (YAML aliases) expanded, is nested
    deeper than MAX_DEPTH levels, has more than MAX_VALUES values or contains itself; else None.

    parts(x) gives x's labelled parts. Linear in the distinct parts: each is measured once, so
    an alias bomb costs what its text does."""
    measured: dict[int, tuple[int, int]] = {}  # id -> (values, levels) of a part measured
    open_ids = {id(root)}
    stack = [[root, [], iter(parts(root)), 1, 1]]  # part, path, parts left, values, levels so far
    while stack:
        entry = stack[-1]
        step = next(entry[2], None)
        if step is None:
            stack.pop()
            open_ids.discard(id(entry[0]))
            measured[id(entry[0])] = (entry[3], entry[4])
            if stack:
                parent = stack[-1]
                parent[3] += entry[3]
                parent[4] = max(parent[4], entry[4] + 1)
                if parent[3] > MAX_VALUES:
                    return ".".join(parent[1]), TOO_MANY_VALUES
            continue
        label, child = step
        path = entry[1] + [label]
        if id(child) in open_ids:
            return ".".join(path), "contains itself (a recursive alias)"
        if id(child) in measured:
            values, levels = measured[id(child)]
            if len(path) + levels > MAX_DEPTH:
                return ".".join(path), f"is nested deeper than {MAX_DEPTH} levels"
            entry[3] += values
            entry[4] = max(entry[4], levels + 1)
            if entry[3] > MAX_VALUES:
                return ".".join(entry[1]), TOO_MANY_VALUES
        elif len(path) >= MAX_DEPTH:
            return ".".join(path), f"is nested deeper than {MAX_DEPTH} levels"
        else:
            open_ids.add(id(child))
            stack.append([child, path, iter(parts(child)), 1, 1])
    return None


def _value_parts(value: Any) -> Iterable[tuple[str, Any]]:
    """The keys and items of a loaded YAML value."""
    if isinstance(value, dict):
        for key, item in value.items():
            label = key if isinstance(key, str) else show(key)
            yield from ((label, key), (label, item))
    elif isinstance(value, (list, tuple, set, frozenset)):
        yield from ((str(index), item) for index, item in enumerate(value))


def _node_parts(node: yaml.Node) -> Iterable[tuple[str, yaml.Node]]:
    """The keys and items of a composed YAML node."""
    if isinstance(node, yaml.MappingNode):
        for key, item in node.value:
            label = key.value if isinstance(key, yaml.ScalarNode) else "?"
            yield from ((label, key), (label, item))
    elif isinstance(node, yaml.SequenceNode):
        yield from ((str(index), item) for index, item in enumerate(node.value))


class _SpecLoader(yaml.SafeLoader):
    """yaml.SafeLoader within the spec limits, failing early: nesting bounded while scanning (the
    scanner looks ahead across every open bracket, in quadratic time) and composing (before
    Python's recursion limit), values counted while composing, the composed document measured
    with its aliases expanded before any value is constructed (PyYAML copies merged keys while
    constructing: merges of merges grow exponentially), and values its constructors cannot
    build reported as YAML errors."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._values = 0

    @staticmethod
    def _too_deep(mark: yaml.Mark) -> YamlLimitError:
        return YamlLimitError(f"the document is nested deeper than {MAX_DEPTH} levels at line {mark.line + 1}, "
                              f"column {mark.column + 1}")

    def fetch_flow_collection_start(self, token_class: type) -> None:
        if self.flow_level >= MAX_DEPTH:
            raise self._too_deep(self.get_mark())
        super().fetch_flow_collection_start(token_class)

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self._depth >= MAX_DEPTH:
            raise self._too_deep(self.peek_event().start_mark)
        self._values += 1
        if self._values > MAX_VALUES:
            raise YamlLimitError(f"the document {TOO_MANY_VALUES}")
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> yaml.Node:
        node = super().compose_document()
        problem = _shape_problem(node, _node_parts)
        if problem:
            raise YamlLimitError(f"{problem[0] or 'the document'} {problem[1]}")
        return node

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except ValueError as error:  # e.g. the date 2020-13-45, an integer of over 4300 digits
            raise yaml.constructor.ConstructorError(None, None, str(error), node.start_mark) from None


def load_yaml(text: str) -> Any:
    """yaml.safe_load of text within the spec limits; every failure is a yaml.YAMLError."""
    loader = _SpecLoader(text)
    try:
        return loader.get_single_data()
    except RecursionError:  # the limits above keep PyYAML well inside Python's; should they not
        raise YamlLimitError("the document is nested too deeply") from None
    finally:
        loader.dispose()


# ----------------------------------------------------------------------------------- overrides

def set_dotted(document: dict, key: str, value: Any) -> None:
    """Set a dotted field of a raw spec document in place. A mapping value merges into a
    mapping field (its keys may be dotted too); any other value replaces the field."""
    parts = key.split(".")
    if not all(parts):
        raise not_allowed(key, value, "a dotted field name such as topology.spines")
    node = document
    for depth, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            path = ".".join(parts[:depth + 1])
            raise SpecError(path, f"{show(child)} has no fields, so {key} cannot be set")
        node = child
    last = parts[-1]
    if isinstance(value, dict) and isinstance(node.get(last), dict):
        for sub_key, sub_value in value.items():
            set_dotted(node[last], str(sub_key), sub_value)
    else:
        node[last] = copy.deepcopy(value)


def apply_sets(document: dict, assignments: list[str]) -> None:
    """Apply command-line `key=value` overrides (value parsed as YAML) to a raw document."""
    for assignment in assignments:
        key, separator, text = assignment.partition("=")
        if not separator or not key:
            raise SpecError(f"--set {assignment}", "expected key=value, e.g. topology.spines=4")
        try:
            value = load_yaml(text)
        except yaml.YAMLError as error:
            raise not_allowed(key, text, f"a YAML value: {str(error).splitlines()[0]}") from None
        set_dotted(document, key.strip(), value)


# -------------------------------------------------------------------------------------- matrix

@dataclass(frozen=True)
class Axis:
    """One matrix axis: labelled override sets (dotted field -> value), in spec order."""
    name: str
    values: dict[str, dict[str, Any]]
    baseline: str | None = None


def _unknown(path: str, key: Any, known: list[str]) -> tuple[str, str]:
    error = schema.unknown_key(path, key, known)
    return error.path, error.problem


def _parse_axis(name: Any, raw: Any) -> Axis:
    path = f"matrix.{name}"
    if not isinstance(name, str) or not AXIS_NAME_PATTERN.fullmatch(name):
        raise not_allowed("matrix", name, "axis names of letters, digits and _, not starting with a digit")
    known = ["field", "values", "baseline"]
    if not isinstance(raw, dict):
        raise not_allowed(path, raw, "a mapping with values and optionally field and baseline")
    for key in raw:
        if key not in known:
            raise SpecError(*_unknown(path, key, known))
    raw_values = raw.get("values")
    if isinstance(raw_values, list) and raw_values:
        field_name = raw.get("field")
        if not isinstance(field_name, str):
            raise not_allowed(f"{path}.field", field_name, "the dotted field the scalar values set")
        values = {}
        for index, value in enumerate(raw_values):
            if isinstance(value, (dict, list)) or value is None:
                raise not_allowed(f"{path}.values.{index}", value, f"a scalar for {field_name}")
            values[value if isinstance(value, str) else show(value)] = {field_name: value}
        if len(values) < len(raw_values):
            raise not_allowed(f"{path}.values", raw_values, "distinct values")
    elif isinstance(raw_values, dict) and raw_values:
        if "field" in raw:
            raise not_allowed(f"{path}.field", raw["field"], "only with a list of scalar values")
        values = {}
        for label, overrides in raw_values.items():
            if overrides is not None and not isinstance(overrides, dict):
                raise not_allowed(f"{path}.values.{label}", overrides,
                                  "a mapping of dotted fields to values, e.g. {controller.lb: spray}")
            values[str(label)] = overrides or {}
    else:
        raise not_allowed(f"{path}.values", raw_values,
                          "a non-empty list of scalars (with field) or mapping of labels to overrides")
    for label, overrides in values.items():
        if not LABEL_PATTERN.fullmatch(label):
            raise not_allowed(f"{path}.values", label, "labels of letters, digits and _.+-")
        for key in overrides:
            if str(key).split(".")[0] in _HEADER_KEYS:
                raise not_allowed(f"{path}.values.{label}", key, "fields of " + ", ".join(_CONFIG_KEYS))
    baseline = raw.get("baseline")
    if baseline is not None and str(baseline) not in values:
        raise not_allowed(f"{path}.baseline", baseline, f"one of {', '.join(values)}")
    if name in RESERVED_COLUMNS or (name in CONFIG_COLUMNS and raw.get("field") != CONFIG_COLUMNS[name]):
        raise not_allowed("matrix", name, "an axis name that is not a runs.csv column, unless it "
                          f"is the scalar axis over that column's field ({CONFIG_COLUMNS.get(name, '-')})")
    return Axis(name, values, None if baseline is None else str(baseline))


# ---------------------------------------------------------------------------------- spec, runs

@dataclass(frozen=True)
class Run:
    """One run of the experiment: a point of the matrix and a repetition."""
    run_id: str          # e.g. "scheme=spray,mode=ps,rep=1": axis=label parts, then rep
    index: int           # 0-based position in the run order
    rep: int             # 1-based repetition
    axes: dict[str, str]  # axis name -> value label, in axis order
    config: RunConfig    # fully resolved: base spec + --set + this point's overrides

    @property
    def topology(self) -> Topology:
        return self.config.topology

    @property
    def controller(self) -> Controller:
        return self.config.controller

    @property
    def job(self) -> Job:
        return self.config.job

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: run_id, index, rep, axes, config, and the resolved host placement."""
        return {
            "run_id": self.run_id, "index": self.index, "rep": self.rep, "axes": dict(self.axes),
            "config": dataclasses.asdict(self.config),
            "worker_hosts": self.config.worker_hosts, "server_hosts": self.config.server_hosts,
        }


@dataclass(frozen=True)
class Spec:
    header: Header
    base: RunConfig      # the spec without the matrix (after --set)
    axes: list[Axis]
    runs: list[Run]

    @property
    def name(self) -> str:
        return self.header.name

    @property
    def baseline(self) -> tuple[str, str] | None:
        """(axis name, label) that speedups are measured against, if an axis marks one."""
        return next(((axis.name, axis.baseline) for axis in self.axes if axis.baseline), None)

    def resolved_document(self) -> dict[str, Any]:
        """The spec with every default filled in; parse_spec of it gives the same runs."""
        return {
            "name": self.header.name, "description": self.header.description,
            **dataclasses.asdict(self.base),
            "repetitions": self.header.repetitions, "matrix": copy.deepcopy(self.header.matrix),
        }


def run_id(axes: dict[str, str], rep: int) -> str:
    return ",".join([f"{axis}={label}" for axis, label in axes.items()] + [f"rep={rep}"])


def scheme_of(run_id: str) -> str:
    """A run_id without its rep and mode parts: the configuration compared within a mode."""
    parts = [part for part in run_id.split(",") if part.split("=")[0] not in ("rep", "mode")]
    return ",".join(parts) or "base"


def _resolve(document: dict, base: RunConfig | None = None, sections: set[str] = frozenset()) -> RunConfig:
    """The checked RunConfig of a document; with base, only its sections named in `sections` are
    built (the others are base's, built from the same values)."""
    config_document = {key: value for key, value in document.items()
                       if key not in _HEADER_KEYS and (base is None or key in sections)}
    config = build(RunConfig, config_document, also_known=_HEADER_KEYS, base=base)
    check_config(config)
    return config



def parse_spec(document: Any, sets: list[str] = ()) -> Spec:
    """Validate a raw spec document (plus --set overrides) and expand its runs."""
    if not isinstance(document, dict):
        raise not_allowed("spec", document, "a YAML mapping with topology, controller, job, ...")
    problem = _shape_problem(document, _value_parts)
    if problem:
        raise SpecError(problem[0] or "spec", problem[1])
    document = copy.deepcopy(document)
    apply_sets(document, list(sets))
    header = build(Header, {key: document[key] for key in _HEADER_KEYS if key in document})
    if len(header.matrix) > MAX_AXES:
        raise not_allowed("matrix", list(header.matrix), f"at most {MAX_AXES} axes")
    base = _resolve(document)
    axes = [_parse_axis(name, raw) for name, raw in header.matrix.items()]
    if sum(axis.baseline is not None for axis in axes) > 1:
        raise not_allowed("matrix", [axis.name for axis in axes if axis.baseline], "a baseline on one axis at most")
    point_count = math.prod(len(axis.values) for axis in axes)
    if point_count > MAX_RUNS:
        raise SpecError("matrix", f"{point_count} points is not allowed (at most {MAX_RUNS} runs in all)")
    if point_count * header.repetitions > MAX_RUNS:
        raise not_allowed("repetitions", header.repetitions, f"at most {MAX_RUNS // point_count} with the "
                          f"matrix's {point_count} points: at most {MAX_RUNS} runs in all")
    points = itertools.product(*[list(axis.values) for axis in axes])
    resolved = []
    for labels in points:
        point = dict(zip([axis.name for axis in axes], labels))
        overrides = [(str(key), value) for axis in axes for key, value in axis.values[point[axis.name]].items()]
        # Only the sections a point overrides are copied and validated again: a big background
        # list is checked once, not once per point.
        sections = {key.split(".")[0] for key, _ in overrides}
        point_document = {key: copy.deepcopy(value) if key in sections else value for key, value in document.items()}
        for key, value in overrides:
            set_dotted(point_document, key, value)
        try:
            resolved.append((point, _resolve(point_document, base, sections)))
        except SpecError as error:
            point_name = ",".join(f"{axis}={label}" for axis, label in point.items())
            raise SpecError(error.path, f"{error.problem} (in run {point_name})") from None
    # Repetitions outermost: each scheme is measured once before any is measured again,
    # so slow drift of the host affects every scheme alike. Seeds differ per repetition
    # and are equal across schemes, making repetitions paired comparisons.
    runs = []
    for point, config in resolved:
        if config.job.seed + header.repetitions - 1 > U32:
            raise not_allowed("job.seed", config.job.seed, f"at most {U32 + 1 - header.repetitions} with "
                              f"{header.repetitions} repetitions: seeds grow by one per repetition up to "
                              "2**32 - 1")
    for rep in range(1, header.repetitions + 1):
        for point, config in resolved:
            job = dataclasses.replace(config.job, seed=config.job.seed + rep - 1)
            runs.append(Run(run_id(point, rep), len(runs), rep, point, dataclasses.replace(config, job=job)))
    return Spec(header, base, axes, runs)


def load_spec(path: str | Path, sets: list[str] = ()) -> Spec:
    """Read, validate and expand a YAML spec file."""
    where = str(path)
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_SPEC_BYTES + 1)
    except OSError as error:
        raise SpecError(where, f"cannot be read ({error.strerror or error})") from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(where, f"is more than {MAX_SPEC_BYTES // 1024} KiB, too large for a spec")
    nul = data.find(b"\0")
    if nul >= 0:
        raise SpecError(where, f"is not a text file (a NUL byte at offset {nul})")
    try:
        text = data.decode()
    except UnicodeDecodeError as error:
        raise SpecError(where, f"is not UTF-8 text (byte {data[error.start]:#04x} at offset {error.start})") from None
    try:
        document = load_yaml(text)
    except YamlLimitError as error:
        raise SpecError(where, f"is not allowed ({error})") from None
    except yaml.YAMLError as error:
        raise SpecError(where, f"is not valid YAML ({' '.join(str(error).split())})") from None
    return parse_spec(document, sets)

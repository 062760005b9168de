"""Gradient-aware flow scheduling: which DSCP each layer's gradient traffic of a training job
carries, decided from the job's layer table by a named policy.

Plain data in (a `RegisteredJob`: its hosts, layer table and the L4 flows each layer uses), plain data out
(a DSCP per layer, and the `FlowClass` rewrites the controller installs at the ingress switches).
The fabric serves the DSCP class selectors by strict priority (topologies/shaping.py):

    CS7 (56)         network control (non-IP frames land here too); never used for gradients
    CS6..CS2 (48..16) gradients, most urgent first: the five classes a policy fills
    CS0 (0)          unmarked background (and every layer under `fifo`)
    CS1 (8)          droppable: datagrams a sender marked LE (DSCP 1) are moved here; the class
                     is served last and has a short queue, so under congestion they drop first

A policy orders the layers by urgency (`ClassPolicy.ranks`); `layer_dscps` groups that order into
the five gradient classes. Adding a policy: subclass `ClassPolicy`, set `name`, write `ranks`,
decorate with `@register`.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, ClassVar, Sequence

from controller.priority import (MAX_FLOWS, MAX_MARKS, FlowClass, check_fields, parse_int,
                                 parse_ipv4, parse_list, parse_port, parse_proto,
                                 port_range_blocks, shown)

GRADIENT_DSCPS = (48, 40, 32, 24, 16)  # CS6..CS2, most urgent first
DEFAULT_DSCP = 0                       # CS0
LOWER_EFFORT_DSCP = 1                  # LE (RFC 8622): what senders mark droppable datagrams with
DROPPABLE_DSCP = 8                     # CS1: the short-queued class the controller moves LE to

JOB_FIELDS = ("job", "policy", "hosts", "layers", "flows")
LAYER_FIELDS = ("index", "name", "bytes", "fwd_ms", "bwd_ms")
FLOW_FIELDS = ("layer", "layers", "src", "dst", "proto", "sport", "dport", "dport_range")
# Layers in one job: real models have hundreds of parameter tensors; ranking the most allowed
# takes a few milliseconds.
MAX_LAYERS = 4096
MAX_HOSTS = 1024  # hosts in one job (each gets one mark, for its lower-effort datagrams)


@dataclass(frozen=True)
class Layer:
    """One entry of a job's layer table; `index` is the layer's position in the forward pass."""
    index: int
    name: str
    bytes: int
    fwd_ms: float | None = None
    bwd_ms: float | None = None


@dataclass(frozen=True)
class JobFlow:
    """An L4 flow of the job and the layers whose gradients it carries. The destination is one
    port (`dport_lo == dport_hi`), a port range, or any port (both None)."""
    layers: tuple[int, ...]
    src: str
    dst: str
    proto: str
    sport: int | None = None
    dport_lo: int | None = None
    dport_hi: int | None = None


@dataclass(frozen=True)
class RegisteredJob:
    job: str
    policy: str
    hosts: tuple[str, ...]
    layers: tuple[Layer, ...]
    flows: tuple[JobFlow, ...]


# -- policies -------------------------------------------------------------------------------------
class ClassPolicy:
    """Orders a job's layers by how urgently their gradients are needed."""
    name: ClassVar[str]

    def ranks(self, layers: Sequence[Layer]) -> dict[int, int] | None:
        """Layer index -> rank, 0 the most urgent; equal ranks share a class. None: no classes,
        every layer goes unprioritized (CS0)."""
        raise NotImplementedError


CLASS_POLICIES: dict[str, type[ClassPolicy]] = {}


def register(cls: type[ClassPolicy]) -> type[ClassPolicy]:
    CLASS_POLICIES[cls.name] = cls
    return cls


def ranks_by(layers: Sequence[Layer], key: Callable[[Layer], object]) -> dict[int, int]:
    """Rank layers by `key` ascending; layers with equal keys share a rank."""
    ordered = sorted(layers, key=key)
    return {layer.index: rank for rank, (_, group) in enumerate(itertools.groupby(ordered, key))
            for layer in group}


@register
class Fifo(ClassPolicy):
    """No priorities: the network's FIFO (the baseline)."""
    name = "fifo"

    def ranks(self, layers: Sequence[Layer]) -> None:
        return None


@register
class LayerOrder(ClassPolicy):
    """Front layers first (P3, ByteScheduler): the order of the next forward pass."""
    name = "layer"

    def ranks(self, layers: Sequence[Layer]) -> dict[int, int]:
        return ranks_by(layers, lambda layer: layer.index)


@register
class TicTac(ClassPolicy):
    """TicTac's TIC order: a parameter is as urgent as the moment the forward pass needs it.
    When every layer has `fwd_ms`, class k holds the layers needed (after the forward time of
    the layers before them) in the k-th fifth of the forward pass: the classes split its time,
    not its layer count, so a slow front layer keeps the top class to itself while many quick
    layers needed at about the same moment share one. Without timing, or with no forward time
    at all, the forward order (on a chain of layers, TIC's count of ops before the consumer)."""
    name = "tictac"

    def ranks(self, layers: Sequence[Layer]) -> dict[int, int]:
        forward_ms = [layer.fwd_ms for layer in layers]
        if None in forward_ms or not sum(forward_ms):
            return ranks_by(layers, lambda layer: layer.index)
        chain = sorted(layers, key=lambda layer: layer.index)
        needed_at = itertools.accumulate((layer.fwd_ms for layer in chain[:-1]), initial=0.0)
        classes, total = len(GRADIENT_DSCPS), sum(forward_ms)
        # zero-time layers at the end are needed at `total` itself: they join the last fifth
        return {layer.index: min(classes - 1, int(classes * at / total))
                for layer, at in zip(chain, needed_at)}


@register
class SmallestFirst(ClassPolicy):
    """Small tensors first (shortest job first): many small layers finish before a large one
    holds the link; ties in the forward order."""
    name = "size"

    def ranks(self, layers: Sequence[Layer]) -> dict[int, int]:
        return ranks_by(layers, lambda layer: (layer.bytes, layer.index))


def rank_to_class(rank: int, ranks: int, classes: int = len(GRADIENT_DSCPS)) -> int:
    """Group `ranks` ranks into `classes` classes in order: one rank per class while they fit,
    else near-equal groups with the finer ones at the front (the most urgent stay apart)."""
    if ranks <= classes:
        return rank
    size, larger = divmod(ranks, classes)  # the last `larger` classes hold one rank more
    front = (classes - larger) * size
    return rank // size if rank < front else classes - larger + (rank - front) // (size + 1)


def layer_dscps(policy: str, layers: Sequence[Layer]) -> dict[int, int]:
    """Layer index -> DSCP under `policy`."""
    ranks = CLASS_POLICIES[policy]().ranks(layers)
    if ranks is None:
        return {layer.index: DEFAULT_DSCP for layer in layers}
    count = max(ranks.values()) + 1
    return {index: GRADIENT_DSCPS[rank_to_class(rank, count)] for index, rank in ranks.items()}


# -- from a job to flow rewrites ----------------------------------------------------------------
def job_flow_classes(job: RegisteredJob) -> list[FlowClass]:
    """The DSCP rewrites that enforce the job's policy: each flow carries the class of the most
    urgent layer it carries (one connection cannot be in two classes); a port range becomes one
    masked match per aligned block. Then, for every host, LE-marked datagrams go to CS1."""
    dscps = layer_dscps(job.policy, job.layers)
    classes = []
    for flow in job.flows:
        dscp = max(dscps[index] for index in flow.layers)  # DSCPs grow with urgency
        blocks = [(None, None)] if flow.dport_lo is None else \
            port_range_blocks(flow.dport_lo, flow.dport_hi)
        for dport, mask in blocks:
            classes.append(FlowClass(flow.src, flow.dst, dscp, flow.proto, flow.sport, dport,
                                     None if mask in (None, 0xFFFF) else mask))
    classes += [FlowClass(host, None, DROPPABLE_DSCP, in_dscp=LOWER_EFFORT_DSCP)
                for host in job.hosts]
    return classes


# -- parsing the REST job document ----------------------------------------------------------------
def _parse_ms(name: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e9:
        raise ValueError(f"{name}: {shown(value)} is not allowed (milliseconds >= 0)")
    return float(value)


def parse_layer(data: object, at: str) -> Layer:
    check_fields(data, at, LAYER_FIELDS)
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{at}.name: {shown(name)} is not allowed (a non-empty string)")
    return Layer(parse_int(f"{at}.index", data.get("index"), 0, 1_000_000), name,
                 parse_int(f"{at}.bytes", data.get("bytes"), 0, 1 << 40),
                 _parse_ms(f"{at}.fwd_ms", data.get("fwd_ms")),
                 _parse_ms(f"{at}.bwd_ms", data.get("bwd_ms")))


def parse_flow(data: object, at: str, hosts: frozenset[str], indices: frozenset[int]) -> JobFlow:
    check_fields(data, at, FLOW_FIELDS)
    if "layer" in data and "layers" in data:
        raise ValueError(f"{at}.layers: give layer or layers, not both")
    if "layer" in data:
        layers = [parse_int(f"{at}.layer", data["layer"], 0, 1_000_000)]
    elif "layers" in data:
        layers = [parse_int(f"{at}.layers", i, 0, 1_000_000)
                  for i in parse_list(f"{at}.layers", data["layers"], MAX_LAYERS)]
    else:
        layers = sorted(indices)  # a connection carrying every layer
    unknown = [i for i in layers if i not in indices]
    if unknown:
        field = "layer" if "layer" in data else "layers"
        raise ValueError(f"{at}.{field}: layer {unknown[0]} is not in the layer table")
    src, dst = data.get("src"), data.get("dst")
    for end, address in (("src", src), ("dst", dst)):
        if not (isinstance(address, str) and address in hosts):  # the hosts are valid addresses
            parse_ipv4(f"{at}.{end}", address)
            raise ValueError(f"{at}.{end}: {address} is not one of the job's hosts")
    proto = parse_proto(f"{at}.proto", data.get("proto"))
    sport = None if data.get("sport") is None else parse_port(f"{at}.sport", data["sport"])
    if data.get("dport") is not None and data.get("dport_range") is not None:
        raise ValueError(f"{at}.dport_range: give dport or dport_range, not both")
    if data.get("dport") is not None:
        lo = hi = parse_port(f"{at}.dport", data["dport"])
    elif data.get("dport_range") is not None:
        bounds = data["dport_range"]
        if not isinstance(bounds, list) or len(bounds) != 2:
            raise ValueError(f"{at}.dport_range: {shown(bounds)} is not allowed ([lo, hi])")
        lo, hi = (parse_port(f"{at}.dport_range", port) for port in bounds)
        if lo > hi:
            raise ValueError(f"{at}.dport_range: {shown(bounds)} is not allowed (lo <= hi)")
    else:
        lo = hi = None
    return JobFlow(tuple(layers), src, dst, proto, sport, lo, hi)


def job_mark_count(job: RegisteredJob) -> int:
    """How many marks `job_flow_classes` makes of the job, without making them."""
    return len(job.hosts) + sum(1 if flow.dport_lo is None else
                                len(port_range_blocks(flow.dport_lo, flow.dport_hi))
                                for flow in job.flows)


def parse_job(data: object) -> RegisteredJob:
    """The job document of `POST /jobs`; every error names the field (e.g. `flows[2].dport`)."""
    check_fields(data, "", JOB_FIELDS, "job")
    job = data.get("job")
    if not isinstance(job, str) or not job or "/" in job:
        raise ValueError(f"job: {shown(job)} is not allowed (a non-empty name without '/')")
    policy = data.get("policy")
    if not isinstance(policy, str) or policy not in CLASS_POLICIES:
        raise ValueError(f"policy: {shown(policy)} is not allowed "
                         f"(one of {', '.join(sorted(CLASS_POLICIES))})")
    hosts = tuple(parse_ipv4(f"hosts[{i}]", h)
                  for i, h in enumerate(parse_list("hosts", data.get("hosts"), MAX_HOSTS)))
    layers = tuple(parse_layer(layer, f"layers[{i}]")
                   for i, layer in enumerate(parse_list("layers", data.get("layers"), MAX_LAYERS)))
    indices: set[int] = set()
    for layer in layers:
        if layer.index in indices:
            raise ValueError(f"layers: index {layer.index} appears twice")
        indices.add(layer.index)
    known_hosts, known_indices = frozenset(hosts), frozenset(indices)
    # No flows: the senders mark each message with its layer's class themselves.
    flows = tuple(parse_flow(flow, f"flows[{i}]", known_hosts, known_indices) for i, flow in
                  enumerate(parse_list("flows", data.get("flows", []), MAX_FLOWS,
                                       may_be_empty=True)))
    parsed = RegisteredJob(job, policy, hosts, layers, flows)
    marks = job_mark_count(parsed)
    if marks > MAX_MARKS:
        raise ValueError(f"flows: the job needs {marks} marks (one per host, one per flow or per "
                         f"aligned block of its port range), more than the {MAX_MARKS} allowed")
    return parsed


def describe_job(job: RegisteredJob) -> dict:
    """The job as `GET /jobs` shows it: its policy's DSCP per layer and the rewrites."""
    dscps = layer_dscps(job.policy, job.layers)
    return {"job": job.job, "policy": job.policy, "hosts": list(job.hosts),
            "layers": [{"index": layer.index, "name": layer.name, "dscp": dscps[layer.index]}
                       for layer in job.layers],
            "classes": [f.to_dict() for f in job_flow_classes(job)]}

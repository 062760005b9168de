"""Gradient-aware flow scheduling: which DSCP each layer's gradient traffic of a training job
carries, decided from the job's layer table by a named policy.

Plain data in (a `RegisteredJob`: its hosts, layer table and the L4 flows each layer uses), plain data out
(a DSCP per layer, and the `FlowClass` rewrites the controller installs at the ingress switches).
The fabric serves the DSCP classes by strict priority (the class plan: common/classes.py): a
policy fills the five gradient classes CS6..CS2; datagrams a sender marked lower-effort are moved
to the droppable class CS1.

A policy orders the layers by urgency (`ClassPolicy.ranks`); `layer_dscps` groups that order into
the five gradient classes. Adding a policy: subclass `ClassPolicy`, set `name`, write `ranks`,
decorate with `@register`.
"""
from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from typing import Callable, ClassVar, Iterable, Sequence

from controller.priority import (IPV4, MAX_FLOWS, MAX_MARKS, MAX_PORT, PORT, PROTOCOLS, FlowClass, is_ipv4, is_port,
                                 port_range_blocks, too_many)
from common import schema
from common.classes import DROPPABLE_DSCP, GRADIENT_DSCPS, LOWER_EFFORT_DSCP, UNMARKED_DSCP
from common.schema import SchemaError, knob
from controller.sharing import SHARING_POLICIES, Sharing, share

# Layers in one job: real models have hundreds of parameter tensors; ranking the most allowed
# takes a few milliseconds.
MAX_LAYERS = 4096
MAX_HOSTS = 1024  # hosts in one job (each gets one mark, for its lower-effort datagrams)
MAX_INDEX = 1_000_000
MAX_LAYER_BYTES = 1 << 40
MAX_MS = 1e9
INDEX = f"a layer index, an integer 0..{MAX_INDEX}"
MILLISECONDS = "milliseconds, 0 <= ms < 1e9"


# A job's id: what the runner sends (run0, run1, ...) and what a URL path and a log line carry
# as they are; DELETE /jobs/<id> matches it exactly.
JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
JOB_ID_ALLOWED = "1 to 64 of A-Z a-z 0-9 . _ -, the first a letter or digit"


def is_job_id(text: str) -> bool:
    return JOB_ID.fullmatch(text) is not None


def is_index(index: int) -> bool:
    return 0 <= index <= MAX_INDEX


def is_ms(ms: float | None) -> bool:
    return ms is None or 0 <= ms < MAX_MS


@dataclass(frozen=True)
class Layer:
    """One entry of a job's layer table; `index` is the layer's position in the forward pass.
    Declared on the schema engine: the job document's layers are built as these."""
    index: int = knob(allowed=INDEX, check=is_index)
    name: str = knob(allowed="a non-empty string", check=bool)
    bytes: int = knob(allowed=f"an integer 0..{MAX_LAYER_BYTES}", check=lambda n: 0 <= n <= MAX_LAYER_BYTES)
    fwd_ms: float | None = knob(None, MILLISECONDS, is_ms)
    bwd_ms: float | None = knob(None, MILLISECONDS, is_ms)


@dataclass(frozen=True, kw_only=True)
class FlowEntry:
    """A flow of the job document: the layers whose gradients it carries (`layer`, `layers`, or
    neither: every layer), its ends (two of the job's hosts), and its destination port (`dport`,
    `dport_range` [lo, hi], or neither: any); `parse_job` makes a JobFlow of it."""
    layer: int | None = knob(None, INDEX, lambda index: index is None or is_index(index))
    layers: list[int] | None = knob(None, f"a non-empty list of layer indices, integers 0..{MAX_INDEX}",
                                    lambda indices: indices is None or len(indices) > 0, each=is_index)
    src: str = knob(allowed=IPV4, check=is_ipv4)
    dst: str = knob(allowed=IPV4, check=is_ipv4)
    proto: str = knob(choices=lambda: list(PROTOCOLS))
    sport: int | None = knob(None, PORT, is_port)
    dport: int | None = knob(None, PORT, is_port)
    dport_range: list[int] | None = knob(None, f"[lo, hi]: ports 1..{MAX_PORT}, lo <= hi",
                                         lambda ports: ports is None or (len(ports) == 2 and ports[0] <= ports[1]),
                                         each=is_port)


@dataclass(frozen=True, kw_only=True)
class HostTraffic:
    """What one iteration of the job sends from one of its hosts to another: what `intensity-paths`
    loads the fabric's links with when it chooses the job's paths (controller/paths.py)."""
    src: str = knob(allowed=IPV4, check=is_ipv4)
    dst: str = knob(allowed=IPV4, check=is_ipv4)
    bytes: int = knob(allowed=f"an integer 0..{MAX_LAYER_BYTES}", check=lambda n: 0 <= n <= MAX_LAYER_BYTES)


@dataclass(frozen=True)
class JobDocument:
    """The job document of `POST /jobs`, declared on the schema engine (common/schema.py);
    `parse_job` builds it and makes a RegisteredJob of it. The policy is one of the registry's."""
    job: str = knob(allowed=JOB_ID_ALLOWED, check=is_job_id)
    policy: str = knob(choices=lambda: list(CLASS_POLICIES))
    hosts: list[str] = knob(allowed='a non-empty list of IPv4 addresses such as "10.0.0.1"', check=bool,
                            each=is_ipv4)
    layers: list[Layer] = knob(allowed="a non-empty list of layers", check=bool)
    # No flows: the senders mark each message with its layer's class themselves.
    flows: list[FlowEntry] = knob([], "a list of flows")
    # Sharing the fabric with other jobs (controller/sharing.py): the policy, one for every job
    # registered, and what it needs beyond the layer table.
    sharing: str = knob("fair", choices=lambda: list(SHARING_POLICIES))
    comm_ms: float | None = knob(None, f"{MILLISECONDS}: the time one iteration's traffic needs on the job's "
                                 "busiest link (none: the sharing policy estimates it from the layers' bytes)",
                                 is_ms)
    # The job's iteration as measured (its run alone): the time-shift policy places these, not the
    # ones modelled from the layer table.
    period_ms: float | None = knob(None, f"{MILLISECONDS}: the job's measured iteration period (none: "
                                   "modelled from the layer table and comm_ms)", is_ms)
    period_p99_ms: float | None = knob(None, f"{MILLISECONDS}: the 99th percentile of its measured iteration "
                                       "periods (none: the time-shift pace keeps a fixed margin)", is_ms)
    comm_start_ms: float | None = knob(None, f"{MILLISECONDS}: when its communication starts after its "
                                       "iteration starts, measured (none: after the forward pass)", is_ms)
    # What an iteration sends from host to host; none: each host's model bytes spread evenly over the
    # job's other hosts (controller/paths.py).
    traffic: list[HostTraffic] = knob([], "a list of {src, dst, bytes}: an iteration's bytes from host to host")


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
    """A job as the controller holds it: `parse_job` makes one of a JobDocument."""
    job: str
    policy: str
    hosts: tuple[str, ...]
    layers: tuple[Layer, ...]
    flows: tuple[JobFlow, ...]
    sharing: str = "fair"
    comm_ms: float | None = None
    period_ms: float | None = None
    comm_start_ms: float | None = None
    period_p99_ms: float | None = None
    traffic: tuple[tuple[str, str, int], ...] = ()  # (src, dst, bytes of an iteration)


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


def layer_dscps(policy: str, layers: Sequence[Layer], band: Sequence[int] | None = None) -> dict[int, int]:
    """Layer index -> DSCP under `policy`, its ranking compressed into `band`: the classes the
    inter-job sharing leaves the job (controller/sharing.py); None or all five, the job's own.
    In a band of its own, a job with no classes of its own (fifo) takes the band's first."""
    classes = GRADIENT_DSCPS if band is None else tuple(band)
    ranks = CLASS_POLICIES[policy]().ranks(layers)
    if ranks is None:
        dscp = UNMARKED_DSCP if classes == GRADIENT_DSCPS else classes[0]
        return {layer.index: dscp for layer in layers}
    count = max(ranks.values()) + 1
    return {index: classes[rank_to_class(rank, count, len(classes))] for index, rank in ranks.items()}


# -- from a job to flow rewrites ----------------------------------------------------------------
def job_flow_classes(job: RegisteredJob, band: Sequence[int] | None = None) -> list[FlowClass]:
    """The DSCP rewrites that enforce the job's policy: each flow carries the class of the most
    urgent layer it carries (one connection cannot be in two classes); a port range becomes one
    masked match per aligned block. Then, for every host, LE-marked datagrams go to CS1."""
    dscps = layer_dscps(job.policy, job.layers, band)
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


def sharing_of(jobs: Sequence[RegisteredJob]) -> Sharing:
    """What the jobs' sharing policy decides for them together (every job names the same one)."""
    return share(jobs[0].sharing if jobs else "fair", jobs)


def jobs_flow_classes(jobs: Sequence[RegisteredJob]) -> dict[str, list[FlowClass]]:
    """Job id -> its rewrites, each job in its band of the classes under their sharing policy."""
    shared = sharing_of(jobs)
    return {job.job: job_flow_classes(job, shared.bands[job.job]) for job in jobs}


# -- the REST job document ----------------------------------------------------------------------
def job_mark_count(job: RegisteredJob) -> int:
    """How many marks `job_flow_classes` makes of the job, without making them."""
    return len(job.hosts) + sum(1 if flow.dport_lo is None else
                                len(port_range_blocks(flow.dport_lo, flow.dport_hi))
                                for flow in job.flows)


def job_flow(flow: FlowEntry, at: str, hosts: frozenset[str], indices: frozenset[int]) -> JobFlow:
    """The flow entry at path `at` as a JobFlow, checked against the job's hosts and layers."""
    if flow.layer is not None and flow.layers is not None:
        raise SchemaError(f"{at}.layers", "give layer or layers, not both")
    if flow.layer is not None:
        layers, named = [flow.layer], "layer"
    elif flow.layers is not None:
        too_many(f"{at}.layers", flow.layers, MAX_LAYERS)
        layers, named = flow.layers, "layers"
    else:
        layers, named = sorted(indices), "layers"  # a connection carrying every layer
    unknown = [index for index in layers if index not in indices]
    if unknown:
        raise SchemaError(f"{at}.{named}", f"layer {unknown[0]} is not in the layer table")
    for end, address in (("src", flow.src), ("dst", flow.dst)):
        if address not in hosts:
            raise SchemaError(f"{at}.{end}", f"{address} is not one of the job's hosts")
    if flow.dport is not None and flow.dport_range is not None:
        raise SchemaError(f"{at}.dport_range", "give dport or dport_range, not both")
    lo, hi = (flow.dport, flow.dport) if flow.dport_range is None else flow.dport_range
    return JobFlow(tuple(layers), flow.src, flow.dst, flow.proto, flow.sport, lo, hi)


def host_traffic(entries: list[HostTraffic], hosts: frozenset[str]) -> tuple[tuple[str, str, int], ...]:
    """The document's traffic as (src, dst, bytes), checked: two different hosts of the job, each
    pair once."""
    too_many("traffic", entries, MAX_FLOWS)
    pairs: set[tuple[str, str]] = set()
    for at, entry in enumerate(entries):
        for end, address in (("src", entry.src), ("dst", entry.dst)):
            if address not in hosts:
                raise SchemaError(f"traffic.{at}.{end}", f"{address} is not one of the job's hosts")
        if entry.src == entry.dst:
            raise SchemaError(f"traffic.{at}.dst", f"{entry.dst} is the src too (traffic goes between two hosts)")
        if (entry.src, entry.dst) in pairs:
            raise SchemaError(f"traffic.{at}", f"{entry.src} -> {entry.dst} is given twice")
        pairs.add((entry.src, entry.dst))
    return tuple((entry.src, entry.dst, entry.bytes) for entry in entries)


def parse_job(data: object, pace: Callable[[Iterable], Iterable] = iter) -> RegisteredJob:
    """The job document of `POST /jobs`: `JobDocument` built by the schema engine (types, ranges,
    unknown keys), then the rules across fields; every error is one line naming the field (e.g.
    `flows.2.dport`). pace: how long lists are gone through (see schema.build)."""
    document = schema.build(JobDocument, data, pace=pace)
    too_many("hosts", document.hosts, MAX_HOSTS)
    too_many("layers", document.layers, MAX_LAYERS)
    too_many("flows", document.flows, MAX_FLOWS)
    indices: set[int] = set()
    for at, layer in enumerate(document.layers):
        if layer.index in indices:
            raise SchemaError(f"layers.{at}.index", f"{layer.index} is the index of an earlier layer")
        indices.add(layer.index)
    hosts, known = frozenset(document.hosts), frozenset(indices)
    flows = tuple(job_flow(flow, f"flows.{at}", hosts, known) for at, flow in pace(enumerate(document.flows)))
    job = RegisteredJob(document.job, document.policy, tuple(document.hosts), tuple(document.layers), flows,
                        document.sharing, document.comm_ms, document.period_ms, document.comm_start_ms,
                        document.period_p99_ms, host_traffic(document.traffic, hosts))
    marks = job_mark_count(job)
    if marks > MAX_MARKS:
        raise SchemaError("flows", f"the job needs {marks} marks (one per host, one per flow or per aligned "
                                   f"block of its port range), more than the {MAX_MARKS} allowed")
    return job


def describe_job(job: RegisteredJob, shared: Sharing | None = None) -> dict:
    """The job as `GET /jobs` shows it: its policy's DSCP per layer and the rewrites, in its band
    of the classes and with its start offset as `shared` (the sharing of every registered job,
    controller/sharing.py) decides; None: the job alone."""
    shared = shared or sharing_of([job])
    band = shared.bands[job.job]
    dscps = layer_dscps(job.policy, job.layers, band)
    return {"job": job.job, "policy": job.policy, "hosts": list(job.hosts),
            "layers": [{"index": layer.index, "name": layer.name, "dscp": dscps[layer.index]}
                       for layer in job.layers],
            "classes": [f.to_dict() for f in job_flow_classes(job, band)],
            "sharing": job.sharing, "band": list(band), "start_offset_ms": round(shared.offsets_ms[job.job], 3),
            "pace_ms": round(shared.paces_ms.get(job.job, 0.0), 3),
            "intensity": None if math.isinf(shared.intensity[job.job]) else round(shared.intensity[job.job], 6)}

"""Layer profiles read from PyTorch profiler traces (`job.model: {trace: PATH}`, the host apps'
`--model-trace`): the same `Profile` the hand-written ones are (hostapps/profiles.py), so send orders,
Caramel, the bounds and the controller's job document take it unchanged, scaled by `model.scale`.

A trace is the Chrome-trace JSON `torch.profiler` writes (Kineto's: `export_chrome_trace`, or
`tensorboard_trace_handler`'s `*.pt.trace.json[.gz]`) over at least one training step, recorded with
`record_shapes=True`. Only JSON is read: torch is not needed. Both Kineto layouts are read: PyTorch
1.8-1.9's (ops in category `Operator`, backward nodes under their own names) and later ones' (category
`cpu_op`, each node inside `autograd::engine::evaluate_function: <node>`).

What each training step (a `ProfilerStep#N` span; none: the whole trace is one step) gives:

* Gradients: backprop accumulates each parameter's gradient in a `torch::autograd::AccumulateGrad`
  node, whose input's recorded shape (`Input Dims`) and type are the parameter's.
* Layers: the autograd engine runs a parameter's AccumulateGrad right after the node that produced
  its gradient (AccumulateGrad comes first in the engine's ready queue), a view node between them
  (`TBackward0` of a Linear's `weight.t()`) only passing it on. The gradients one node produces are one
  profile layer, one tensor, as the hand-written profiles' modules are: a convolution's weight and
  bias, a norm's scale and shift, a Linear's weight and bias.
* Order: a layer is ready when its last gradient is accumulated. The profile lists the layers in the
  reverse of that order, front layer first, so that the emulated backprop (last layer first) readies
  them in the traced order. A Kineto trace has no dataflow between ops, so the profile is the chain of
  its layers (no `graph`).
* Times: a layer's backward time is the compute from the previous layer being ready to itself being
  ready (parameter-free ops in between, a ReLU's or a pooling's backward, delay it); its forward time
  runs from its forward op (the op that created its node: the node's `Sequence number`) to the next
  layer's, the last one's to the start of backprop (the loss). Compute is the busy time of the GPU
  kernels launched in that span when the trace has kernels (communication kernels, `nccl*`, not
  counted), else the CPU's wall time.

With several steps, the steps whose gradients match the most common list count, each layer's times
their median. The profile's forward and backward times are the sums, each layer weighted by its own.
"""
from __future__ import annotations

import bisect
import functools
import gzip
import json
import math
import re
import statistics
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from common.paths import REPO
from hostapps.profiles import Profile, ProfileLayer

# Every host app of the job reads the trace as it starts; parsing takes about ten times the JSON's size
# in memory. trim.py (tests/fixtures/traces) keeps a few steps of a larger one.
MAX_TRACE_BYTES = 64 * 2**20
TRIM_HINT = "keep one or a few steps with tests/fixtures/traces/trim.py"
# The controller's job document takes at most 4096 layers (controller/scheduling.py, MAX_LAYERS).
MAX_LAYERS = 4096
EVALUATE = "autograd::engine::evaluate_function: "
ACCUMULATE = "torch::autograd::AccumulateGrad"
NODE = re.compile(r"[A-Za-z0-9_]+Backward\d*")  # a backward node's own event in PyTorch 1.8-1.9 traces
STEP = re.compile(r"ProfilerStep#\d+")
CPU_CATEGORIES = {"cpu_op", "Operator", "user_annotation"}
RUNTIME_CATEGORIES = {"cuda_runtime", "Runtime", "cuda_driver"}
KERNEL_CATEGORIES = {"kernel", "Kernel"}
COMMUNICATION = re.compile(r"nccl|rccl", re.IGNORECASE)
# Nodes that only pass a parameter's gradient on (a view of it was used), whatever their suffix digit.
VIEW_NODES = {"TBackward", "TransposeBackward", "PermuteBackward", "ViewBackward", "UnsafeViewBackward",
              "ReshapeAliasBackward", "ExpandBackward", "SqueezeBackward", "UnsqueezeBackward", "AsStridedBackward",
              "AliasBackward", "SliceBackward", "SelectBackward", "UnbindBackward", "SplitBackward"}
ELEMENT_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "half": 2, "bfloat16": 2,
                 "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "signed char": 1, "unsigned char": 1, "bool": 1,
                 "short": 2, "int": 4, "long int": 8, "long": 8}


class TraceError(ValueError):
    """A trace that gives no profile; the message says why in one line, starting with a verb ('has no...')."""


@dataclass(frozen=True, slots=True)
class _Op:
    """A complete (ph X) CPU-side event: an op, a node of backprop or an annotation."""
    name: str
    thread: tuple
    start: float  # microseconds
    end: float
    args: dict


@dataclass(frozen=True)
class TraceLayer:
    """A layer as the trace gives it: the parameters its backward node's gradients hold, their bytes in
    the trace's types, and its forward and backward compute in seconds."""
    name: str
    params: int
    bytes: int
    forward_s: float
    backward_s: float


@dataclass(frozen=True)
class Trace:
    """What a trace says of a training step: its layers front first, from `steps` matching steps."""
    layers: tuple[TraceLayer, ...]
    steps: int
    device: str  # the GPU's name, or "CPU" when the trace has no kernels

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def bytes(self) -> int:
        return sum(layer.bytes for layer in self.layers)


def trace_path(text: str) -> Path:
    """Where a trace named in a spec or on a command line is: relative paths from the repository root,
    where the runner and the host apps run."""
    path = Path(text).expanduser()
    return path if path.is_absolute() else REPO / path


def trace_profile(text: str) -> Profile:
    """The profile of the trace at `text` (see the module's docstring); TraceError says why there is none."""
    trace = read_trace(text)
    layers = [ProfileLayer(layer.name, layer.params, layer.forward_s, layer.backward_s) for layer in trace.layers]
    forward = sum(layer.forward_s for layer in trace.layers)
    backward = sum(layer.backward_s for layer in trace.layers)
    name = Path(text).name.removesuffix(".gz").removesuffix(".json")
    steps = f"{trace.steps} step" + ("s, median" if trace.steps > 1 else "")
    return Profile(name, layers, forward, backward, f"{Path(text).name}: {trace.device}, {steps}")


def read_trace(text: str) -> Trace:
    """What the trace at `text` says of a training step; TraceError says why it says nothing."""
    path = trace_path(text)
    try:
        status = path.stat()
    except OSError as error:
        raise TraceError(f"cannot be read ({error.strerror})") from None
    return _read_trace(str(path), status.st_mtime_ns, status.st_size)


@functools.lru_cache(maxsize=8)
def _read_trace(path: str, mtime_ns: int, size: int) -> Trace:
    """Cached by the file's path, modification time and size: a spec's runs and checks read it once."""
    return parse_trace(_load(Path(path)))


def _load(path: Path) -> object:
    try:
        with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as stream:
            data = stream.read(MAX_TRACE_BYTES + 1)
    except (OSError, EOFError, zlib.error) as error:
        raise TraceError(f"cannot be read ({getattr(error, 'strerror', None) or error})") from None
    if len(data) > MAX_TRACE_BYTES:
        raise TraceError(f"is larger than {MAX_TRACE_BYTES // 2**20} MiB of JSON, which every host app would parse: "
                         f"{TRIM_HINT}")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as error:
        raise TraceError(f"is not JSON ({error})") from None


def _events(doc: object) -> list:
    if isinstance(doc, dict) and "nodes" in doc and "traceEvents" not in doc:
        raise TraceError("is a PyTorch execution trace (ops and tensors, no times): give the profiler's Chrome "
                         "trace (Kineto) of the same steps")
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise TraceError("is not a Chrome trace (a JSON object with a traceEvents list, or a list of events)")
    return events


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _ops(events: list) -> tuple[list[_Op], dict, list]:
    """The CPU-side complete events sorted by start, the runtime calls by correlation (their thread
    and start), and the kernels (correlation, microseconds, name)."""
    ops, launches, kernels = [], {}, []
    for index, event in enumerate(events):
        if not isinstance(event, dict) or event.get("ph") != "X":
            continue
        category, args = event.get("cat"), event.get("args")
        args = args if isinstance(args, dict) else {}
        if category not in CPU_CATEGORIES | RUNTIME_CATEGORIES | KERNEL_CATEGORIES:
            continue
        start, duration = event.get("ts"), event.get("dur")
        if not (_number(start) and _number(duration) and duration >= 0):
            raise TraceError(f"has a malformed event: traceEvents.{index} ({str(event.get('name'))[:40]!r}) has no "
                             "numeric ts and dur >= 0")
        thread = (str(event.get("pid")), str(event.get("tid")))
        if category in KERNEL_CATEGORIES:
            kernels.append((args.get("correlation"), duration, str(event.get("name", ""))))
        elif category in RUNTIME_CATEGORIES:
            if args.get("correlation") is not None:
                launches[args["correlation"]] = (thread, start)
        else:
            ops.append(_Op(str(event.get("name", "")), thread, start, start + duration, args))
    ops.sort(key=lambda op: (op.start, -op.end))
    return ops, launches, kernels


class _Compute:
    """Busy time in a span of a thread: its launched kernels' when the trace has kernels, else wall time."""

    def __init__(self, launches: dict, kernels: list) -> None:
        self.gpu = bool(kernels)
        starts: dict[tuple, list[tuple[float, float]]] = {}
        for correlation, duration, name in kernels:
            if correlation in launches and not COMMUNICATION.search(name):
                thread, start = launches[correlation]
                starts.setdefault(thread, []).append((start, duration))
        self.launched = {}
        for thread, pairs in starts.items():
            pairs.sort()
            sums = [0.0]
            for _, duration in pairs:
                sums.append(sums[-1] + duration)
            self.launched[thread] = ([start for start, _ in pairs], sums)

    def seconds(self, thread: tuple, begin: float, end: float) -> float:
        """Compute of [begin, end) on the thread, in seconds."""
        if not self.gpu:
            return max(0.0, end - begin) / 1e6
        starts, sums = self.launched.get(thread, ([], [0.0]))
        return (sums[bisect.bisect_left(starts, end)] - sums[bisect.bisect_left(starts, begin)]) / 1e6


def _node_name(op: _Op, wrapped: bool) -> str | None:
    """The backward node an event is, or None."""
    if wrapped:
        return op.name[len(EVALUATE):] if op.name.startswith(EVALUATE) else None
    return op.name if op.name == ACCUMULATE or NODE.fullmatch(op.name) else None


def _gradient(op: _Op) -> tuple[int, int] | None:
    """(elements, bytes) of an AccumulateGrad's gradient; None for an undefined one (type '')."""
    dims, types = op.args.get("Input Dims"), op.args.get("Input type")
    if not isinstance(dims, list) or not dims:
        raise TraceError("has no gradient sizes (no Input Dims on its AccumulateGrad ops): record it with "
                         "torch.profiler.profile(record_shapes=True)")
    shape = dims[0]
    kind = types[0] if isinstance(types, list) and types else "float"
    if kind == "":
        return None
    if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                              for n in shape):
        raise TraceError(f"has a malformed gradient shape {str(shape)[:40]} on an AccumulateGrad op")
    elements = math.prod(shape)
    return elements, elements * ELEMENT_BYTES.get(kind, 4)


def _outermost(ops: list[_Op]) -> dict[int, _Op]:
    """For each op (by id), the outermost aten:: op enclosing it on its thread (itself if none)."""
    outer, stacks = {}, {}
    for op in ops:
        stack = stacks.setdefault(op.thread, [])
        while stack and stack[-1].end <= op.start:
            stack.pop()
        enclosing = next((other for other in stack if other.name.startswith("aten::")), None)
        outer[id(op)] = enclosing or op
        stack.append(op)
    return outer


@dataclass
class _Group:
    """A layer of one step: the node that produced its gradients, their sizes, when the last was ready."""
    owner: _Op | None
    params: int = 0
    bytes: int = 0
    ready: float = 0.0


def _step(ops: list[_Op], wrapped: bool, compute: _Compute) -> tuple[tuple, list[TraceLayer]] | str:
    """One step's layers front first, with their gradients' sizes (the step's signature); or why not."""
    nodes = [(op, name) for op in ops if (name := _node_name(op, wrapped)) is not None]
    accumulating = Counter(op.thread for op, name in nodes if name == ACCUMULATE)
    if not accumulating:
        return "no backward pass"
    thread = accumulating.most_common(1)[0][0]
    nodes = [(op, name) for op, name in nodes if op.thread == thread]
    backward_start = nodes[0][0].start
    inner = [op for op in ops if op.name == ACCUMULATE and op.thread == thread]
    inner_starts = [op.start for op in inner]
    groups: dict[int, _Group] = {}
    owner: _Op | None = None
    for op, name in nodes:
        if name != ACCUMULATE:
            if re.sub(r"\d+$", "", name) not in VIEW_NODES:
                owner = op
            continue
        at = bisect.bisect_left(inner_starts, op.start)
        if at == len(inner) or inner[at].start > op.end:
            return "an AccumulateGrad node without its op"
        gradient = _gradient(inner[at])
        if gradient is None:
            continue
        group = groups.setdefault(id(owner) if owner else id(op), _Group(owner))
        group.params += gradient[0]
        group.bytes += gradient[1]
        group.ready = max(group.ready, op.end)
    if not groups:
        return "no backward pass"
    ready = sorted(groups.values(), key=lambda group: group.ready)
    backward, previous = [], backward_start
    for group in ready:
        backward.append(compute.seconds(thread, previous, group.ready))
        previous = group.ready
    forward_ops = [op for op in ops if op.args.get("Sequence number") is not None and _node_name(op, wrapped) is None
                   and (op.thread != thread or op.end <= backward_start)]
    created: dict[object, _Op] = {}
    for op in forward_ops:  # ops that do not create a node record the next number: the creator starts last
        created[op.args["Sequence number"]] = op
    outermost = _outermost([op for op in ops if op.thread != thread or op.end <= backward_start])
    anchors = []
    for group in ready:
        number = group.owner.args.get("Sequence number") if group.owner else None
        if number not in created:
            return "a backward node whose forward op is not in the step"
        anchors.append(outermost[id(created[number])])
    order = sorted(range(len(ready)), key=lambda i: anchors[i].start)
    forward = [0.0] * len(ready)
    for position, i in enumerate(order):
        end = anchors[order[position + 1]].start if position + 1 < len(order) else backward_start
        forward[i] = compute.seconds(anchors[i].thread, anchors[i].start, end)
    counts: Counter = Counter()
    names = [""] * len(ready)
    for i in order:
        base = anchors[i].name.removeprefix("aten::")
        names[i] = f"{base}.{counts[base]}"
        counts[base] += 1
    layers = [TraceLayer(names[i], ready[i].params, ready[i].bytes, forward[i], backward[i])
              for i in reversed(range(len(ready)))]
    return tuple((layer.params, layer.bytes) for layer in layers), layers


def parse_trace(doc: object) -> Trace:
    """The training step a parsed trace document records (see the module's docstring)."""
    events = _events(doc)
    ops, launches, kernels = _ops(events)
    compute = _Compute(launches, kernels)
    wrapped = any(op.name.startswith(EVALUATE) for op in ops)
    spans = [op for op in ops if STEP.fullmatch(op.name)]
    if spans:
        starts = [op.start for op in ops]
        steps = [ops[bisect.bisect_left(starts, span.start):bisect.bisect_left(starts, span.end)] for span in spans]
    else:
        steps = [ops]
    read = [_step(step, wrapped, compute) for step in steps]
    complete = [result for result in read if not isinstance(result, str)]
    if not complete:
        why = "no backward pass" if all(result == "no backward pass" for result in read) else read[-1]
        hint = {"no backward pass": " (no torch::autograd::AccumulateGrad op: profile training steps, loss.backward() "
                                    "inside the profiler)"}.get(why, "")
        raise TraceError(f"has {why}{hint}" if why.startswith("no ") else f"has {why} (profile whole steps)")
    signature = Counter(signature for signature, _ in complete).most_common(1)[0][0]
    matching = [layers for found, layers in complete if found == signature]
    first = matching[0]
    if len(first) > MAX_LAYERS:
        raise TraceError(f"has {len(first)} layers, more than the {MAX_LAYERS} a job document takes")
    layers = tuple(TraceLayer(layer.name, layer.params, layer.bytes,
                              statistics.median(step[i].forward_s for step in matching),
                              statistics.median(step[i].backward_s for step in matching))
                   for i, layer in enumerate(first))
    if sum(layer.params for layer in layers) == 0:
        raise TraceError("has only empty gradients")
    if sum(layer.backward_s for layer in layers) <= 0 or sum(layer.forward_s for layer in layers) <= 0:
        raise TraceError("has no measured compute in its forward or backward pass")
    return Trace(layers, len(matching), _device(doc) if compute.gpu else "CPU")


def _device(doc: object) -> str:
    properties = doc.get("deviceProperties") if isinstance(doc, dict) else None
    first = properties[0] if isinstance(properties, list) and properties else None
    return str(first["name"]) if isinstance(first, dict) and first.get("name") else "GPU"

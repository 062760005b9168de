"""Caramel for all-reduce (Hashemi, Abdu Jyothi, Godfrey, Campbell, "Caramel: Accelerating Decentralized
Distributed Deep Learning with Computation Scheduling", arXiv 2004.14020, 2020), part by part, and the
time model its parts are planned with.

Caramel's two halves, as its abstract puts them: (a) computation DAG scheduling that expands each
parameter's feasible window of transfer (its transfer boundaries), and (b) smoothing the network
load by adaptive batching and pipelining of the transfers.  Here each part is a job knob of its own
(hostapps/config.py): `backward` (reverse, dataflow or caramel: the computation schedule),
`caramel_batching` and `caramel_pipelining` (with send order `caramel`), and the cost model's
per-step overhead `caramel_step_ms`.

The time model (one iteration of wait-free backprop, from the start of backprop):
- Backprop runs the ops in the schedule's backward order, each for its layers' emulated time; an
  op's tensors have their gradients once it has run.  Its transfer boundaries: a tensor's transfer
  may start when its gradient exists (`start`) and must end when the next forward pass, run
  without a stall, reaches the op that reads it (`end` = the backward time + that op's start in the
  forward order).
- The network all-reduces units (runs of gradients in the order they become ready: every rank must
  take the same units in the same order) one after the other, each as soon as its last gradient
  exists and the previous unit is done, in `Ring.seconds(bytes)`.
- The next forward pass starts when backprop ends and runs each op once its tensors are in.  The
  iteration ends with it: T = backward + forward + stalls = backward + forward + max(0, lateness),
  the lateness being the largest (arrival - end) over the tensors.  So the boundaries are the
  deadlines, and every plan below minimizes that lateness.

The parts:
- Computation schedule (`caramel_schedule`): backprop by Lawler's rule for one machine with
  precedence and due dates (optimal for the largest lateness of gradients against due dates: each
  op's due date is its tensors' end boundary less their own transfer), the forward pass by
  earliest predicted arrival (a dataflow executor's choice made ahead of time); alternated a few
  rounds, and of all the schedules seen, the one the model gives the shortest iteration, the
  listing order included, so it never plans worse than the default.  `dataflow_schedule` is an
  arbitrary valid order of both passes (TensorFlow's executor runs any ready op), drawn from the
  job's seed so that every rank runs the same; `listing_schedule` (profiles) the default.
- Adaptive batching (`adaptive_batches`): the partition of the gradient sequence into units that
  minimizes the lateness under the cost model (bisection on the lateness, each step an exact dynamic
  program over the partitions for the earliest finish that meets every deadline), the earliest
  finish breaking ties: a larger per-transfer overhead makes fewer, larger units.
- Pipelining: a unit's ring all-reduce cut into segments of about `partition_bytes` that run as a
  wavefront (collectives.pipelined_ring_allreduce), so one segment's step latency overlaps the
  others' bytes.

Where this follows the paper and where it departs (only its abstract and introduction could be read
for this testbed): the boundaries, the schedule that widens them and the batching chosen from a
per-transfer overhead and the windows are its ideas; the algorithms (Lawler's rule, the earliest
arrival forward order, the dynamic program) and the cost model are ours.  Caramel measures its cost
model; here it is modelled from the link rate and `caramel_step_ms`, the same on every rank (ranks
that planned different units would deadlock the ring).  Caramel runs in TensorFlow, whose collective
all-reduce ends an iteration when every update is applied; our workers are wait-free (the next
forward pass waits only for the tensors it reads), so a tensor's window ends in the next forward
pass, not at the end of the iteration.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

import numpy as np

from hostapps.allreduce import make_allreduce
from hostapps.collectives import make_buckets
from hostapps.profiles import Op, ProfileModel, Schedule, gradient_order, listing_schedule, readers

if TYPE_CHECKING:
    from hostapps.model import FlatModel


class Knobs(Protocol):
    """What Caramel reads of a process's config (hostapps/config.py Knobs): the job's
    knobs below it in the import graph, so that the config may build its models with Caramel."""
    backward: str
    batch: int
    caramel_batching: str
    caramel_pipelining: str
    caramel_step_ms: float
    link_mbps: float
    mode: str
    mtu_payload: int
    partition_bytes: int
    seed: int

    @property
    def order(self) -> str: ...

    @property
    def world(self) -> int: ...

# Rounds of Caramel's schedule search: each plans backprop for the current forward order, then the
# forward pass for that backprop; the best schedule seen is kept.
SCHEDULE_ROUNDS = 4
# The lateness the adaptive batching settles for: within this of the best the model allows.
LATENESS_TOLERANCE_S = 1e-5
SCHEDULES = ("reverse", "dataflow", "caramel")
BATCHINGS = ("adaptive", "doubling", "none")
# Send order caramel's pipelining: a unit's ring all-reduce as a wavefront of segments, or whole.
PIPELININGS = ("segments", "none")


# -- the cost of one ring all-reduce -------------------------------------------------------------------
@dataclass(frozen=True)
class Ring:
    """The modelled cost of a ring all-reduce of one unit over `world` ranks: 2(world-1) message steps, each
    moving 1/world of it at `bytes_per_s` after `step_s` of latency (sending, forwarding, waking the
    receiver).  Pipelined (`segment_bytes` > 0), the unit is cut as collectives.segment_bounds cuts it and
    its segments run as a wavefront: in a tick every active segment sends one chunk, and a chunk's
    latency is hidden behind the other active segments' bytes."""
    world: int
    bytes_per_s: float
    step_s: float
    segment_bytes: int = 0
    grid: int = 1  # elements per datagram: segment_bounds' grain

    def seconds(self, nbytes: float) -> float:
        return float(self.seconds_of(np.array([nbytes], dtype=float))[0])

    def seconds_of(self, nbytes: np.ndarray) -> np.ndarray:
        """seconds() of each entry of an array of unit sizes in bytes."""
        nbytes = np.asarray(nbytes, dtype=float)
        if self.world == 1:
            return np.zeros_like(nbytes)
        steps = 2 * (self.world - 1)
        segments = (segment_counts(nbytes, self.segment_bytes, self.world, self.grid).astype(float)
                    if self.segment_bytes else np.ones_like(nbytes))
        chunk_s = nbytes / segments / self.world / self.bytes_per_s
        # Active segments per tick rise 1..m-1, stay at m = min(segments, steps), fall m-1..1; a tick takes
        # one chunk plus the larger of the step latency and the other active segments' chunks.
        m = np.minimum(segments, steps)
        ticks = steps + segments - 1
        plateau = ticks - 2 * (m - 1)
        # sum over a = 1..m-1 of max(step_s, (a - 1) chunk_s): the first q terms are step_s.
        hidden = np.floor(np.divide(self.step_s, chunk_s, out=np.full_like(chunk_s, np.inf), where=chunk_s > 0))
        q = np.minimum(m - 1, hidden + 1)
        ramp = q * self.step_s + chunk_s * ((m - 2) * (m - 1) / 2 - (q - 1) * q / 2)
        return ticks * chunk_s + 2 * ramp + plateau * np.maximum(self.step_s, (m - 1) * chunk_s)


def segment_counts(nbytes: np.ndarray, segment_bytes: int, world: int, grid: int) -> np.ndarray:
    """How many segments collectives.segment_bounds cuts units of these sizes (bytes) into, for all of them
    at once: segments of about segment_bytes in whole world x grid blocks, the step field's limit on
    their number, a last segment under half a step folded into the one before."""
    size = np.maximum(1, np.asarray(nbytes, dtype=np.int64) // 4)
    block = world * grid
    step = block * np.maximum(max(1, round(max(1, segment_bytes // 4) / block)),
                              -(-size // (block * make_allreduce("ring", world).max_segments())))
    count = -(-size // step)
    last = size - (count - 1) * step
    return count - ((count > 1) & (last < step // 2))


# -- transfer boundaries and the iteration they make -----------------------------------------------------
@dataclass(frozen=True)
class Job:
    """What Caramel plans with: the forward DAG, each op's forward and backward seconds, each tensor's bytes."""
    graph: tuple[Op, ...]
    forward_s: tuple[float, ...]   # per op
    backward_s: tuple[float, ...]  # per op
    nbytes: tuple[int, ...]        # per tensor (layer)

    @property
    def op_of(self) -> dict[int, int]:
        """Tensor -> the op that reads it."""
        return {param: i for i, op in enumerate(self.graph) for param in op.params}


@dataclass(frozen=True)
class Boundaries:
    """Each tensor's transfer window in one iteration, in seconds from the start of backprop: from when its
    gradient exists (`start`) to when the next forward pass, unstalled, needs it (`end`)."""
    start: dict[int, float]
    end: dict[int, float]
    backward_s: float
    forward_s: float

    def window(self, layer: int) -> float:
        return self.end[layer] - self.start[layer]


def transfer_boundaries(job: Job, schedule: Schedule) -> Boundaries:
    op_of, start, began, clock = job.op_of, {}, {}, 0.0
    for op in schedule.backward:
        clock += job.backward_s[op]
        for param in job.graph[op].params:
            start[param] = clock
    backward_s, clock = clock, 0.0
    for op in schedule.forward:
        began[op] = clock
        clock += job.forward_s[op]
    end = {param: backward_s + began[op_of[param]] for param in start}
    return Boundaries(start, end, backward_s, clock)


@dataclass(frozen=True)
class Prediction:
    """One iteration as the time model runs it."""
    iteration_s: float
    compute_s: float     # backward + forward
    lateness_s: float    # the largest (arrival - end) over the tensors; the stall is max(0, lateness)
    network_s: float     # time the network spends on the units
    arrival: dict[int, float]  # tensor -> when its unit's all-reduce ends


def predict(job: Job, schedule: Schedule, units: Sequence[Sequence[int]], ring: Ring) -> Prediction:
    """The time model's iteration: units all-reduced one after the other in the order their last gradients
    are readied (a send queue's first in, first out), each once that gradient exists, then the next
    forward pass, each op waiting for its tensors."""
    bounds = transfer_boundaries(job, schedule)
    place = {p: k for k, p in enumerate(gradient_order(job.graph, schedule))}
    units = sorted(units, key=lambda unit: max(place[p] for p in unit))
    costs = ring.seconds_of(np.array([sum(job.nbytes[p] for p in unit) for unit in units], dtype=float))
    free, arrival = 0.0, {}
    for unit, cost in zip(units, costs):
        free = max(free, max(bounds.start[p] for p in unit)) + float(cost)
        arrival.update(dict.fromkeys(unit, free))
    clock = bounds.backward_s
    for op in schedule.forward:
        clock = max([clock, *(arrival[p] for p in job.graph[op].params)]) + job.forward_s[op]
    lateness = max(arrival[p] - bounds.end[p] for p in arrival) if arrival else -math.inf
    compute = bounds.backward_s + bounds.forward_s
    return Prediction(clock, compute, lateness, float(costs.sum()), arrival)


# What plans a schedule's all-reduce units: per_tensor, adaptive batches with a given ring...
Planner = Callable[["Job", Schedule], list[tuple[int, ...]]]


def per_tensor(job: Job, schedule: Schedule) -> list[tuple[int, ...]]:
    """One unit per tensor, in the order backprop readies them (what `ready` sends with fusion none)."""
    return [(layer,) for layer in gradient_order(job.graph, schedule)]


# -- computation schedules -------------------------------------------------------------------------------
def dataflow_schedule(graph: Sequence[Op], seed: int) -> Schedule:
    """An arbitrary valid order of both passes, as a dataflow executor runs whichever op is ready: each
    next op drawn at random among the ready ones, from `seed` (the same on every rank)."""
    rng = random.Random(seed)
    read_by = readers(graph)
    forward = _list_schedule(_inputs(graph), read_by, lambda ready: rng.choice(ready))
    backward = _list_schedule(read_by, _inputs(graph), lambda ready: rng.choice(ready))
    return Schedule(tuple(forward), tuple(backward))


def _inputs(graph: Sequence[Op]) -> list[list[int]]:
    """Op -> the ops it reads, each once."""
    return [sorted(set(op.inputs)) for op in graph]


def _list_schedule(needs: list[list[int]], unblocks: list[list[int]], choose) -> list[int]:
    """A topological order: each op once every op in needs[op] has run, `choose` picking among the ready
    ops (given in ascending order)."""
    missing = [len(n) for n in needs]
    ready, order = [i for i, count in enumerate(missing) if count == 0], []
    while ready:
        op = choose(sorted(ready))
        ready.remove(op)
        order.append(op)
        for other in unblocks[op]:
            missing[other] -= 1
            if missing[other] == 0:
                ready.append(other)
    return order


def lawler_backward(job: Job, due: dict[int, float]) -> tuple[int, ...]:
    """The backprop order that minimizes the largest lateness of the ops' completions against `due` (op ->
    due date; ops without one never late), by Lawler's rule for one machine with precedence: from the
    last place back, among the ops whose inputs (which backprop must run after them) are all placed,
    place last the one with the latest due date (ties: the earliest listed, as the reverse order does)."""
    placed = _list_schedule(_inputs(job.graph), readers(job.graph),
                            lambda ready: max(ready, key=lambda i: (due.get(i, math.inf), -i)))
    return tuple(reversed(placed))


def earliest_arrival_forward(job: Job, arrival: dict[int, float]) -> tuple[int, ...]:
    """The forward order that runs, among the ops whose inputs have run, the one whose tensors are predicted
    in first (parameter-free ops at once; ties: listing order)."""
    release = [max((arrival[p] for p in op.params), default=-math.inf) for op in job.graph]
    return tuple(_list_schedule(_inputs(job.graph), readers(job.graph),
                                lambda ready: min(ready, key=lambda i: (release[i], i))))


def caramel_schedule(job: Job, ring: Ring, units: Planner | None = None) -> Schedule:
    """The computation schedule that widens the transfer windows (see the module docstring), judged by the
    time model with the units `units` plans for a schedule (default: one per tensor); among schedules the
    model gives the same iteration, the one with the least total lateness (the sum of every tensor's)."""
    units = units or per_tensor
    single = ring.seconds_of(np.array(job.nbytes, dtype=float))

    def judged(schedule: Schedule) -> tuple[float, float, Prediction]:
        prediction = predict(job, schedule, units(job, schedule), ring)
        end = transfer_boundaries(job, schedule).end
        total = sum(max(0.0, prediction.arrival[p] - end[p]) for p in prediction.arrival)
        return prediction.iteration_s, total, prediction

    best = schedule = listing_schedule(job.graph)
    best_s, best_total, prediction = judged(best)
    for _ in range(SCHEDULE_ROUNDS):
        bounds = transfer_boundaries(job, schedule)
        due = {i: min(bounds.end[p] - single[p] for p in op.params) for i, op in enumerate(job.graph) if op.params}
        schedule = Schedule(schedule.forward, lawler_backward(job, due))
        schedule = Schedule(earliest_arrival_forward(job, judged(schedule)[2].arrival), schedule.backward)
        seconds, total, _ = judged(schedule)
        if seconds < best_s - 1e-9 or (seconds <= best_s + 1e-9 and total < best_total - 1e-9):
            best, best_s, best_total = schedule, seconds, total
    return best


# -- batching --------------------------------------------------------------------------------------------
def adaptive_batches(job: Job, schedule: Schedule, ring: Ring) -> list[tuple[int, ...]]:
    """The units (runs of the gradient sequence) that minimize the time model's lateness, see the module
    docstring."""
    order = gradient_order(job.graph, schedule)
    if not order:
        return []
    bounds = transfer_boundaries(job, schedule)
    n = len(order)
    ready = np.array([bounds.start[p] for p in order])
    end = np.array([bounds.end[p] for p in order])
    total = np.concatenate([[0.0], np.cumsum([job.nbytes[p] for p in order], dtype=float)])
    # cost[k][j]: all-reduce of order[j:k+1] (row k holds the units ending at k).
    cost = [ring.seconds_of(total[k + 1] - total[:k + 1]) for k in range(n)]
    # deadline[k][j]: the earliest end among order[j:k+1].
    deadline = [np.minimum.accumulate(end[k::-1])[::-1] for k in range(n)]

    def plan(lateness: float) -> tuple[np.ndarray, list[int]] | None:
        """The earliest finish of each prefix with every tensor in by its end + lateness, and the start of
        the last unit of each prefix; None if none meets it."""
        finish, first = np.full(n + 1, np.inf), [0] * (n + 1)
        finish[0] = 0.0
        for k in range(n):
            done = np.maximum(finish[:k + 1], ready[k]) + cost[k]
            done[done > deadline[k] + lateness] = np.inf
            j = int(np.argmin(done))
            finish[k + 1], first[k + 1] = done[j], j
        return (finish, first) if math.isfinite(finish[n]) else None

    single = predict(job, schedule, [(p,) for p in order], ring).lateness_s
    whole = predict(job, schedule, [tuple(order)], ring).lateness_s
    lo = float(np.max(ready + np.array([cost[k][k] for k in range(n)]) - end)) - LATENESS_TOLERANCE_S
    hi = min(single, whole) + LATENESS_TOLERANCE_S
    while hi - lo > LATENESS_TOLERANCE_S:
        middle = (lo + hi) / 2
        if plan(middle) is None:
            lo = middle
        else:
            hi = middle
    found = plan(hi)
    assert found is not None, "the bisection keeps a feasible lateness"
    _, first = found
    units, k = [], n
    while k > 0:
        units.append(tuple(order[first[k]:k]))
        k = first[k]
    return units[::-1]


def doubling_batches(job: Job, schedule: Schedule, first_bytes: int) -> list[tuple[int, ...]]:
    """Buckets that double from `first_bytes` along the gradient sequence (collectives.make_buckets)."""
    order = gradient_order(job.graph, schedule)
    # make_buckets walks its sizes from the last: give it the sequence reversed.
    buckets = make_buckets([job.nbytes[p] for p in reversed(order)], first_bytes, growth=2)
    return [tuple(order[len(order) - 1 - i] for i in bucket) for bucket in buckets]


# -- a job's plan, from its knobs ------------------------------------------------------------------------
def job_of(model: FlatModel, rows: int) -> Job:
    """A model as Caramel plans it: a profile's DAG and emulated times, or the numpy network's chain and its
    times estimated from FLOPs on `rows` samples."""
    if isinstance(model, ProfileModel):
        forward_s, backward_s = model.op_times_s()
        graph = model.graph
    else:
        forward_s, backward_s = model.estimated_times_s(rows)
        graph = tuple(Op(layer.name, (k - 1,) if k else (), (k,)) for k, layer in enumerate(model.layers))
    return Job(tuple(graph), tuple(forward_s), tuple(backward_s),
               tuple(int(layer.size) * 4 for layer in model.layers))


def pipelines(cfg: Knobs) -> bool:
    """Whether the job's all-reduce units go as wavefronts of segments: send order caramel, caramel_pipelining
    segments."""
    return cfg.order == "caramel" and cfg.caramel_pipelining == "segments"


def ring_of(cfg: Knobs, pipelined: bool) -> Ring:
    """The cost model of the job's ring: its link rate, `caramel_step_ms`, and caramel's segments if pipelined."""
    return Ring(cfg.world, cfg.link_mbps * 1e6 / 8, cfg.caramel_step_ms / 1000,
                cfg.partition_bytes if pipelined else 0, cfg.mtu_payload // 4)


def computation_schedule(job: Job, cfg: Knobs) -> Schedule:
    """The schedule of the job knob `backward`: reverse (listing), dataflow (from the seed) or caramel,
    planned for the units the job will send (adaptive batches with send order caramel and caramel_batching
    adaptive, else one per tensor)."""
    if cfg.backward == "dataflow":
        return dataflow_schedule(job.graph, cfg.seed)
    if cfg.backward == "caramel":
        if cfg.mode == "allreduce" and cfg.order == "caramel" and cfg.caramel_batching == "adaptive":
            ring = ring_of(cfg, pipelines(cfg))
            return caramel_schedule(job, ring, lambda job, schedule: adaptive_batches(job, schedule, ring))
        return caramel_schedule(job, ring_of(cfg, pipelined=False))
    return listing_schedule(job.graph)


def caramel_units(job: Job, schedule: Schedule, cfg: Knobs) -> list[tuple[int, ...]]:
    """Send order caramel's all-reduce units, by `caramel_batching`: adaptive, doubling from
    partition_bytes, or none (one per tensor); in the order backprop readies their gradients."""
    if cfg.caramel_batching == "adaptive":
        return adaptive_batches(job, schedule, ring_of(cfg, pipelines(cfg)))
    if cfg.caramel_batching == "doubling":
        return doubling_batches(job, schedule, cfg.partition_bytes)
    return per_tensor(job, schedule)


def caramel_pieces(model: FlatModel, cfg: Knobs) -> list[tuple[int, ...]]:
    """The layers of each of send order caramel's all-reduce units for this model and job (the model built
    by config.build_model, which runs it in its schedule and lays caramel's units out contiguously)."""
    job = job_of(model, cfg.batch // cfg.world)
    schedule = model.schedule if isinstance(model, ProfileModel) else listing_schedule(job.graph)
    return caramel_units(job, schedule, cfg)

"""Send orders: which ready tensor a worker pushes, or a server returns, next.

A send order is a small class registered by name (`SEND_ORDERS`: the registry the spec's and the
command line's choices are read from); the send loop (hostapps/sendloop.py) asks it to pick among
the units that are ready. The default sends in ready order; `best` names the strongest order of
each mode.

* PS mode: `priority` (front layers first, as P3), `tic` and `tac` (TicTac,
  on the model's forward DAG: a profile's graph, else the chain of its layers)
  order worker gradient pushes and the server's parameter returns; `random`
  is TicTac's baseline, no enforced order.
* Allreduce mode: every rank must take the same units in the same order or the
  ring deadlocks.  `ready` and `caramel` pick in ready order, identical on
  every rank since backprop produces gradients in the same order on every
  rank (the schedule of the knob `backward` is computed alike everywhere).
  `bytescheduler` picks by priority, so its SendLoop first agrees with the
  other ranks on how many units are ready everywhere (`agree`), and picks
  only among those.
"""
import math
import random
from dataclasses import dataclass
from typing import Callable, Sequence

from hostapps.model import FlatModel
from hostapps.profiles import Op, ProfileModel, chain_graph


@dataclass(frozen=True)
class Unit:
    """One communicated tensor of one iteration: a layer, a fused bucket of layers, or a partition of a layer.
    A PS slice (--ps-slice-bytes) is part `part` of `parts` near-equal slices of its tensor."""
    iteration: int
    tensor: int
    layers: tuple[int, ...]
    nbytes: int
    part: int = 0
    parts: int = 1


@dataclass(frozen=True)
class TimeOracle:
    """Per-layer seconds TAC plans with (TicTac's time oracle): forward compute and transfer of each layer,
    and the forward DAG of the model's ops (empty: the chain of its layers)."""
    forward_s: Sequence[float]
    transfer_s: Sequence[float]
    graph: Sequence[Op] = ()

    def forward_graph(self) -> Sequence[Op]:
        return self.graph or chain_graph(len(self.forward_s))


def time_oracle(model: FlatModel, link_mbps: float) -> TimeOracle:
    """Forward times of a profile's emulated compute (the MLP's real compute is negligible: 0) and its graph,
    and transfer times at the emulated link rate."""
    profile = isinstance(model, ProfileModel)
    forward_s = model.forward_s if profile else [0.0] * len(model.layers)
    return TimeOracle(forward_s, [layer.size * 4 * 8 / (link_mbps * 1e6) for layer in model.layers],
                      model.profile.graph if profile else ())


# -- TicTac on a forward DAG (Hashemi et al., "TicTac", MLSys'19, section 4) ---------------------------
def op_compute_s(graph: Sequence[Op], forward_s: Sequence[float]) -> list[float]:
    """Each op's compute: the forward time of the layers it reads (a parameter-free op takes none)."""
    return [sum(forward_s[param] for param in op.params) for op in graph]


def transfer_dependencies(graph: Sequence[Op]) -> list[frozenset[int]]:
    """Each op's communication dependency (TicTac's op.dep): the parameter transfers that must complete
    before it runs, its own and those of every op it reads from."""
    dependencies: list[frozenset[int]] = []
    for op in graph:
        dependencies.append(frozenset(op.params).union(*(dependencies[i] for i in op.inputs)))
    return dependencies


def tic_priorities(graph: Sequence[Op]) -> dict[int, int]:
    """TIC, from the DAG alone: a transfer's priority (lower first) is the number of transfers of the
    earliest op that needs it, i.e. of the op needing it with the fewest dependencies.  On a chain,
    layer k gets k + 1: front layers first."""
    priority: dict[int, int] = {}
    for dependency in transfer_dependencies(graph):
        for param in dependency:
            priority[param] = min(priority.get(param, len(dependency)), len(dependency))
    return priority


def tac_order(graph: Sequence[Op], forward_s: Sequence[float], transfer_s: Sequence[float]) -> list[int]:
    """TAC, timed by the oracle: the order of the parameter transfers, picked one at a time among the
    outstanding transfers of the op that needs the least communication to run (the least op.M), by
    TicTac's comparator of two transfers A and B: A first if min(P_A, M_B) > min(P_B, M_A), i.e. sending
    A first overlaps more of B's transfer with compute that A alone unblocks; equal, the lower
    M+ first.  Over the ops still waiting for transfers, an outstanding transfer r has
      M   its transfer time (an op's M: the sum over the outstanding transfers it needs),
      P   the compute of the ops whose only outstanding transfer is r,
      M+  the least M of an op that needs r and other outstanding transfers.
    On a chain the order is front layers first."""
    dependencies = transfer_dependencies(graph)
    compute = op_compute_s(graph, forward_s)
    outstanding = set().union(*dependencies)
    order = []
    while outstanding:
        waiting = [(dependency & outstanding, seconds) for dependency, seconds in zip(dependencies, compute)
                   if dependency & outstanding]
        communication = [sum(transfer_s[r] for r in needs) for needs, _ in waiting]
        unblocked = dict.fromkeys(outstanding, 0.0)         # P
        impending = dict.fromkeys(outstanding, math.inf)    # M+
        for (needs, seconds), op_m in zip(waiting, communication):
            if len(needs) == 1:
                unblocked[next(iter(needs))] += seconds
            else:
                for r in needs:
                    impending[r] = min(impending[r], op_m)
        least = min(communication)
        candidates = sorted(set().union(*(needs for (needs, _), op_m in zip(waiting, communication)
                                          if op_m == least)))

        def first(a: int, b: int) -> bool:
            """Does A go before B (TicTac's comparator)?"""
            overlap_a, overlap_b = min(unblocked[a], transfer_s[b]), min(unblocked[b], transfer_s[a])
            return overlap_a > overlap_b or (overlap_a == overlap_b and impending[a] < impending[b])

        best = candidates[0]
        for r in candidates[1:]:
            if first(r, best):
                best = r
        order.append(best)
        outstanding.remove(best)
    return order


def needed_at(graph: Sequence[Op], forward_s: Sequence[float], order: Sequence[int]) -> dict[int, float]:
    """Parameter -> when the forward pass needs it, the transfers arriving at once in `order` and each op
    running as soon as its transfers are in (on a chain in layer order: layer k at the forward time of
    layers 0..k-1)."""
    dependencies = transfer_dependencies(graph)
    compute = op_compute_s(graph, forward_s)
    arrived: set[int] = set()
    waiting = list(range(len(graph)))
    elapsed, needed = 0.0, {}
    for param in order:
        needed[param] = elapsed
        arrived.add(param)
        elapsed += sum(compute[op] for op in waiting if dependencies[op] <= arrived)
        waiting = [op for op in waiting if not dependencies[op] <= arrived]
    return needed


class SendOrder:
    """Picks the index of the next unit to send among those ready (in arrival order), or None to wait."""
    name = ""
    modes: tuple[str, ...] = ("allreduce", "ps")

    def __init__(self, oracle: TimeOracle):
        self.oracle = oracle

    def pick(self, ready: Sequence[Unit], now: float) -> int | None:
        raise NotImplementedError

    def became_ready(self, unit: Unit, now: float) -> None:
        """Called when `unit` is put in the queue."""


SEND_ORDERS: dict[str, type[SendOrder]] = {}
# `best`: the strongest order of each mode (TicTac TAC at a PS, Caramel for all-reduce).
BEST = "best"
BEST_SEND_ORDER = {"ps": "tac", "allreduce": "caramel"}


def register_send_order(name: str) -> Callable[[type[SendOrder]], type[SendOrder]]:
    def register(cls: type[SendOrder]) -> type[SendOrder]:
        cls.name = name
        SEND_ORDERS[name] = cls
        return cls
    return register


def send_order_names() -> list[str]:
    """What a job's send_order may be: `best` or a registered order."""
    return [BEST, *SEND_ORDERS]


def resolve(name: str, mode: str) -> str:
    """A send order's registered name, `best` resolved for the mode."""
    return BEST_SEND_ORDER[mode] if name == BEST else name


@register_send_order("ready")
class ReadyOrder(SendOrder):
    """First ready, first sent: the order backprop produces gradients."""

    def pick(self, ready: Sequence[Unit], now: float) -> int | None:
        return 0


@register_send_order("random")
class ArbitraryOrder(SendOrder):
    """Any ready unit, drawn at random: TensorFlow's PS without TicTac, which enforces no order among the
    transfers that are ready (TicTac's own baseline).  Seeded: a run is repeatable."""
    modes = ("ps",)

    def __init__(self, oracle: TimeOracle):
        super().__init__(oracle)
        self._rng = random.Random(0)

    def pick(self, ready: Sequence[Unit], now: float) -> int | None:
        return self._rng.randrange(len(ready))


def front_most(ready: Sequence[Unit], position: Sequence[int] | None = None) -> int:
    """Index of the unit the next forward pass needs first: oldest iteration, then earliest layer (by
    `position`, a rank per layer; default the layer order), then lowest slice."""
    rank = position.__getitem__ if position is not None else (lambda layer: layer)
    return min(range(len(ready)), key=lambda i: (ready[i].iteration, min(map(rank, ready[i].layers)),
                                                 ready[i].tensor, ready[i].part))


def positions(order: Sequence[int]) -> list[int]:
    """Layer -> its place in `order`, a permutation of the layers."""
    position = [0] * len(order)
    for place, layer in enumerate(order):
        position[layer] = place
    return position


@register_send_order("priority")
class FrontLayersFirst(SendOrder):
    """Front layers first, as P3 (Jayarajan et al., SysML'19): layer 0's gradient is needed first next iteration."""
    modes = ("ps",)

    def pick(self, ready: Sequence[Unit], now: float) -> int | None:
        return front_most(ready)


@register_send_order("tic")
class Tic(SendOrder):
    """TIC, Timing-Independent Communication scheduling (Hashemi et al., "TicTac", MLSys'19).

    A transfer's priority is the number of transfers the first op that
    consumes it depends on (`tic_priorities`), from the forward DAG alone.  In
    a chain model op k needs the parameters of layers 0..k, so the order is
    front layers first; in ResNet-50 a stage's downsample conv ranks with the
    block's first conv, beside which it runs.  For pushes and for the server's
    returns alike; equal priorities go in layer order.
    """
    modes = ("ps",)

    def __init__(self, oracle: TimeOracle):
        super().__init__(oracle)
        priority = tic_priorities(oracle.forward_graph())
        self._position = positions(sorted(priority, key=lambda layer: (priority[layer], layer)))

    def pick(self, ready: Sequence[Unit], now: float) -> int | None:
        return front_most(ready, self._position)


@register_send_order("tac")
class Tac(SendOrder):
    """TAC, Timing-Aware Communication scheduling (Hashemi et al., "TicTac", MLSys'19).

    The plan is TicTac's TAC order of the transfers on the forward DAG
    (`tac_order`, timed by the TimeOracle); "front" below means earlier in it.
    On a chain it is front layers first, which with every transfer ready
    minimises the forward pass's stall (layer k arrives at the earliest moment
    all of 0..k can).  Timing matters when the front-most pending tensor e is
    not ready yet: sending the front-most ready tensor j may occupy the link
    when e arrives.  Greedy rule, with ready times predicted from the previous
    iteration (measured offsets from its first ready unit):

    1. e ready, no prediction yet, or e's predicted ready time has passed: send j.
    2. if the forward compute between the moments the plan needs e and j
       (`needed_at`; on a chain sum forward_s[e:j]) cannot hide j's transfer
       plus the pending ones in front of j, deferring j would stall the
       forward pass: send j.
    3. otherwise send the front-most ready tensor that finishes before e is
       predicted ready, or wait (None) until e or another unit becomes ready.

    PS slices: the plan stays per layer.  A layer's ready time is its first
    slice's (from then on it can be sent) and rule 2 weighs whole layers, so
    slicing does not change which layer goes first; rule 3 times the unit
    itself (its 1/parts share of the layer's transfer), so a slice may fill a
    gap that its whole layer would overrun.
    """
    modes = ("ps",)

    def __init__(self, oracle: TimeOracle):
        super().__init__(oracle)
        graph = oracle.forward_graph()
        order = tac_order(graph, oracle.forward_s, oracle.transfer_s)
        self._position = positions(order)
        self._needed_at = needed_at(graph, oracle.forward_s, order)
        self._first_ready: dict[int, float] = {}     # iteration -> time its first unit became ready
        self._offsets: dict[int, dict[int, float]] = {}  # iteration -> tensor -> ready offset

    def became_ready(self, unit: Unit, now: float) -> None:
        start = self._first_ready.setdefault(unit.iteration, now)
        self._offsets.setdefault(unit.iteration, {}).setdefault(unit.tensor, now - start)
        for old in [it for it in self._offsets if it < unit.iteration - 1]:
            del self._offsets[old], self._first_ready[old]

    def pick(self, ready: Sequence[Unit], now: float) -> int | None:
        position = self._position
        j_index = front_most(ready, position)
        it, j = ready[j_index].iteration, ready[j_index].tensor
        predicted = self._offsets.get(it - 1)
        if predicted is None:
            return j_index
        start = self._first_ready[it]
        pending = sorted((t for t in predicted if t not in self._offsets[it]),  # not ready yet
                         key=position.__getitem__)
        if not pending or position[pending[0]] > position[j]:
            return j_index
        e = pending[0]
        e_ready = start + predicted[e]
        if e_ready <= now:
            return j_index
        transfer = self.oracle.transfer_s
        in_front = sum(transfer[i] for i in pending[1:] if position[i] < position[j]) + transfer[j]
        if in_front > self._needed_at[j] - self._needed_at[e]:
            return j_index
        fitting = [i for i, u in enumerate(ready)
                   if u.iteration == it and now + transfer[u.tensor] / u.parts <= e_ready]
        return min(fitting, key=lambda i: (position[ready[i].tensor], ready[i].part)) if fitting else None


@register_send_order("caramel")
class Caramel(ReadyOrder):
    """Caramel for all-reduce (Hashemi, Abdu Jyothi, Godfrey, Campbell, "Caramel: Accelerating Decentralized
    Distributed Deep Learning with Computation Scheduling", arXiv 2004.14020, 2020): its units are batches
    of gradients planned by hostapps/caramel.py (`caramel_batching`: adaptive from the time model's
    per-step overhead and the tensors' transfer windows, doubling from --partition-bytes, or none), each
    all-reduced as a pipeline of --partition-bytes segments (`caramel_pipelining`).  They go in ready
    order, the same on every rank; its computation schedule is the knob `backward`.
    """
    modes = ("allreduce",)


@register_send_order("bytescheduler")
class ByteScheduler(SendOrder):
    """ByteScheduler (Peng et al., SOSP'19) for allreduce: tensors cut into --partition-bytes partitions,
    front layers first, at most --credit-bytes of partitions in flight (all-reduced as one pipelined
    batch), so a front layer that becomes ready preempts the rest of a large back layer."""
    modes = ("allreduce",)

    def pick(self, ready: Sequence[Unit], now: float) -> int | None:
        return front_most(ready)


def make_send_order(name: str, oracle: TimeOracle) -> SendOrder:
    return SEND_ORDERS[name](oracle)

"""Send orders: which ready tensor a worker pushes, or a server returns, next.

A send order is a small class registered by name (`SEND_ORDERS`: the registry the spec's and the
command line's choices are read from); the send loop (hostapps/sendloop.py) asks it to pick among
the units that are ready. The default sends in ready order; `best` names the strongest order of
each mode.

* PS mode: `priority` (front layers first, as P3), `tic` and `tac` (TicTac)
  order worker gradient pushes and the server's parameter returns; `random`
  is TicTac's baseline, no enforced order.
* Allreduce mode: every rank must take the same units in the same order or the
  ring deadlocks.  `ready` and `caramel` pick in ready order, identical on
  every rank since backprop produces gradients in a fixed order.
  `bytescheduler` picks by priority, so its SendLoop first agrees with the
  other ranks on how many units are ready everywhere (`agree`), and picks
  only among those.
"""
import random
from dataclasses import dataclass
from typing import Callable, Sequence

from hostapps.model import FlatModel
from hostapps.profiles import ProfileModel


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
    """Per-layer seconds TAC plans with (TicTac's time oracle): forward compute and transfer of each layer."""
    forward_s: Sequence[float]
    transfer_s: Sequence[float]


def time_oracle(model: FlatModel, link_mbps: float) -> TimeOracle:
    """Forward times of a profile's emulated compute (the MLP's real compute is negligible: 0) and
    transfer times at the emulated link rate."""
    forward_s = model.forward_s if isinstance(model, ProfileModel) else [0.0] * len(model.layers)
    return TimeOracle(forward_s, [layer.size * 4 * 8 / (link_mbps * 1e6) for layer in model.layers])


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


def front_most(ready: Sequence[Unit]) -> int:
    """Index of the unit the next forward pass needs first: oldest iteration, then lowest layer, then
    lowest slice."""
    return min(range(len(ready)), key=lambda i: (ready[i].iteration, min(ready[i].layers), ready[i].tensor,
                                                 ready[i].part))


@register_send_order("priority")
class FrontLayersFirst(SendOrder):
    """Front layers first, as P3 (Jayarajan et al., SysML'19): layer 0's gradient is needed first next iteration."""
    modes = ("ps",)

    def pick(self, ready: Sequence[Unit], now: float) -> int | None:
        return front_most(ready)


@register_send_order("tic")
class Tic(FrontLayersFirst):
    """TIC, Timing-Independent Communication scheduling (Hashemi et al., "TicTac", MLSys'19).

    A transfer's priority is the number of transfers the forward pass needs
    before the first op that consumes it.  In a chain model op k needs the
    parameters of layers 0..k, so the priority of layer k is k: the order is
    front layers first, for pushes and for the server's returns alike.
    """


@register_send_order("tac")
class Tac(SendOrder):
    """TAC, Timing-Aware Communication scheduling (Hashemi et al., "TicTac", MLSys'19), for chain models.

    With every transfer ready, front layers first minimises the forward pass's
    stall in a chain (layer k arrives at the earliest moment all of 0..k can).
    Timing matters when the earliest-needed tensor e is not ready yet: sending
    the front-most ready tensor j (TIC) may occupy the link when e arrives.
    Greedy rule, with ready times predicted from the previous iteration
    (measured offsets from its first ready unit) and the TimeOracle:

    1. e ready, no prediction yet, or e's predicted ready time has passed: send j.
    2. if the forward compute from op e to op j cannot hide j's transfer plus the
       pending ones between (sum transfer_s[e<i<j pending] + transfer_s[j] >
       sum forward_s[e:j]), deferring j would stall the forward pass: send j.
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
        self._first_ready: dict[int, float] = {}     # iteration -> time its first unit became ready
        self._offsets: dict[int, dict[int, float]] = {}  # iteration -> tensor -> ready offset

    def became_ready(self, unit: Unit, now: float) -> None:
        start = self._first_ready.setdefault(unit.iteration, now)
        self._offsets.setdefault(unit.iteration, {}).setdefault(unit.tensor, now - start)
        for old in [it for it in self._offsets if it < unit.iteration - 1]:
            del self._offsets[old], self._first_ready[old]

    def pick(self, ready: Sequence[Unit], now: float) -> int | None:
        j_index = front_most(ready)
        it, j = ready[j_index].iteration, ready[j_index].tensor
        predicted = self._offsets.get(it - 1)
        if predicted is None:
            return j_index
        start = self._first_ready[it]
        pending = sorted(t for t in predicted if t not in self._offsets[it])  # not ready yet
        if not pending or pending[0] > j:
            return j_index
        e = pending[0]
        e_ready = start + predicted[e]
        if e_ready <= now:
            return j_index
        transfer, forward = self.oracle.transfer_s, self.oracle.forward_s
        if sum(transfer[i] for i in pending[1:] if i < j) + transfer[j] > sum(forward[e:j]):
            return j_index
        fitting = [i for i, u in enumerate(ready)
                   if u.iteration == it and now + transfer[u.tensor] / u.parts <= e_ready]
        return min(fitting, key=lambda i: (ready[i].tensor, ready[i].part)) if fitting else None


@register_send_order("caramel")
class Caramel(ReadyOrder):
    """Caramel-style overlap (Wang et al., "Caramel: Accelerating Decentralized Distributed Deep Learning
    with Model-Aware Scheduling", 2020) for allreduce.

    Buckets grow as backprop proceeds: the first closes at --partition-bytes,
    each next one at twice the previous, so the first all-reduce starts as
    soon as the last layers' gradients exist; each bucket's ring all-reduce is
    cut into --partition-bytes segments whose steps are pipelined.  Buckets go
    in ready order, the same on every rank.
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

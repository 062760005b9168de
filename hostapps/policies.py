"""Send-order policies: which ready tensor a worker pushes, or a server returns, next.

A policy is a small class registered by name; `PolicyQueue` asks it to pick
among the units that are ready.  The default sends in ready order.

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
import threading
import time
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


class Policy:
    """Picks the index of the next unit to send among those ready (in arrival order), or None to wait."""
    name = ""
    modes: tuple[str, ...] = ("allreduce", "ps")

    def __init__(self, oracle: TimeOracle):
        self.oracle = oracle

    def pick(self, ready: Sequence[Unit], now: float) -> int | None:
        raise NotImplementedError

    def became_ready(self, unit: Unit, now: float) -> None:
        """Called when `unit` is put in the queue."""


POLICIES: dict[str, type[Policy]] = {}


def register_policy(name: str) -> Callable[[type[Policy]], type[Policy]]:
    def register(cls: type[Policy]) -> type[Policy]:
        cls.name = name
        POLICIES[name] = cls
        return cls
    return register


@register_policy("ready")
class ReadyOrder(Policy):
    """First ready, first sent: the order backprop produces gradients."""

    def pick(self, ready: Sequence[Unit], now: float) -> int | None:
        return 0


@register_policy("random")
class ArbitraryOrder(Policy):
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


@register_policy("priority")
class FrontLayersFirst(Policy):
    """Front layers first, as P3 (Jayarajan et al., SysML'19): layer 0's gradient is needed first next iteration."""
    modes = ("ps",)

    def pick(self, ready: Sequence[Unit], now: float) -> int | None:
        return front_most(ready)


@register_policy("tic")
class Tic(FrontLayersFirst):
    """TIC, Timing-Independent Communication scheduling (Hashemi et al., "TicTac", MLSys'19).

    A transfer's priority is the number of transfers the forward pass needs
    before the first op that consumes it.  In a chain model op k needs the
    parameters of layers 0..k, so the priority of layer k is k: the order is
    front layers first, for pushes and for the server's returns alike.
    """


@register_policy("tac")
class Tac(Policy):
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


@register_policy("caramel")
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


@register_policy("bytescheduler")
class ByteScheduler(Policy):
    """ByteScheduler (Peng et al., SOSP'19) for allreduce: tensors cut into --partition-bytes partitions,
    front layers first, at most --credit-bytes of partitions in flight (all-reduced as one pipelined
    batch), so a front layer that becomes ready preempts the rest of a large back layer."""
    modes = ("allreduce",)

    def pick(self, ready: Sequence[Unit], now: float) -> int | None:
        return front_most(ready)


def make_policy(name: str, oracle: TimeOracle) -> Policy:
    return POLICIES[name](oracle)


class QueueClosed(Exception):
    """The queue was closed and is empty."""


# How long a queue whose policy chose to wait sleeps before asking again (a put wakes it sooner).
WAIT_POLL_S = 0.0005


class PolicyQueue:
    """Thread-safe queue whose take() returns the units the policy picks."""

    def __init__(self, policy: Policy):
        self._policy = policy
        self._ready: list[tuple[int, Unit]] = []  # (arrival number, unit)
        self._arrivals = 0
        self._cond = threading.Condition()
        self._closed = False
        self._taken = 0
        self._done = 0

    def put(self, unit: Unit) -> None:
        with self._cond:
            self._ready.append((self._arrivals, unit))
            self._arrivals += 1
            self._policy.became_ready(unit, time.monotonic())
            self._cond.notify_all()

    def _wait_for_units(self) -> None:
        """Block until a unit is ready (the producer is our own compute thread) or the queue closes."""
        while not self._ready:
            if self._closed:
                raise QueueClosed()
            self._cond.wait()

    def next_arrival(self) -> tuple[Unit, int]:
        """Block until a unit is ready; return the earliest-arrived one and how many units ever arrived."""
        with self._cond:
            self._wait_for_units()
            return self._ready[0][1], self._arrivals

    def take(self, visible: int | None = None, credit_bytes: int = 0) -> list[Unit]:
        """The unit the policy picks among the first `visible` arrivals (all if None), then more picks while
        the batch stays within credit_bytes."""
        with self._cond:
            batch: list[Unit] = []
            while True:
                if batch and not self._ready:
                    return batch
                self._wait_for_units()
                candidates = [unit for arrival, unit in self._ready if visible is None or arrival < visible]
                choice = self._policy.pick(candidates, time.monotonic()) if candidates else None
                if choice is None or (batch and sum(u.nbytes for u in batch) + candidates[choice].nbytes > credit_bytes):
                    if batch:
                        return batch
                    self._cond.wait(WAIT_POLL_S)
                    continue
                unit = candidates[choice]
                self._ready = [(arrival, u) for arrival, u in self._ready if u is not unit]
                self._taken += 1
                batch.append(unit)

    def task_done(self, count: int = 1) -> None:
        with self._cond:
            self._done += count
            self._cond.notify_all()

    def join(self, timeout: float) -> bool:
        """Wait until every unit put so far was taken and marked done; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._ready or self._done < self._taken:
                if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                    return False
            return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


# (earliest-arrived ready unit, units arrived so far) -> how many arrivals every rank has: a collective.
Agree = Callable[[Unit, int], int]


class SendLoop:
    """A daemon thread that takes batches of units from a PolicyQueue and hands each batch to `communicate`.

    With `agree`, each batch is picked only among the arrivals every rank has
    (allreduce with a reordering policy).  An exception stops the loop and is
    kept in `error` for the owner to raise.
    """

    def __init__(self, name: str, policy: Policy, communicate: Callable[[list[Unit]], None],
                 on_error: Callable[[], None], agree: Agree | None = None, credit_bytes: int = 0):
        self.queue = PolicyQueue(policy)
        self.error: BaseException | None = None
        self._communicate, self._on_error = communicate, on_error
        self._agree, self._credit_bytes = agree, credit_bytes
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                visible = self._agree(*self.queue.next_arrival()) if self._agree else None
                units = self.queue.take(visible, self._credit_bytes)
                self._communicate(units)
                self.queue.task_done(len(units))
        except QueueClosed:
            return
        except BaseException as e:  # reported by the owner, which fails the whole process
            self.error = e
            self._on_error()

    def stop(self) -> None:
        self.queue.close()
        self._thread.join()

"""Send-order policies: which ready tensor a worker pushes, or a server returns, next.

A policy is a small class registered by name; `PolicyQueue` asks it to pick
among the units that are ready.  The default sends in ready order.  TicTac
(TIC/TAC) and priority policies plug in with @register_policy.  In allreduce
mode every rank must reach the same order, so a policy there must depend only
on what every rank sees identically (ready order and layer indices do).
"""
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence


@dataclass(frozen=True)
class Unit:
    """One communicated tensor of one iteration: a layer, or a fused bucket of layers."""
    iteration: int
    tensor: int
    layers: tuple[int, ...]
    nbytes: int


class Policy:
    """Picks the index of the next unit to send among those ready (in arrival order)."""
    name = ""

    def pick(self, ready: Sequence[Unit]) -> int:
        raise NotImplementedError


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

    def pick(self, ready: Sequence[Unit]) -> int:
        return 0


def make_policy(name: str) -> Policy:
    return POLICIES[name]()


class QueueClosed(Exception):
    """The queue was closed and is empty."""


class PolicyQueue:
    """Thread-safe queue whose get() returns the unit the policy picks."""

    def __init__(self, policy: Policy):
        self._policy = policy
        self._ready: list[Unit] = []
        self._cond = threading.Condition()
        self._closed = False
        self._taken = 0
        self._done = 0

    def put(self, unit: Unit) -> None:
        with self._cond:
            self._ready.append(unit)
            self._cond.notify_all()

    def get(self) -> Unit:
        """Block until a unit is ready (the producer is our own compute thread) or the queue closes."""
        with self._cond:
            while not self._ready:
                if self._closed:
                    raise QueueClosed()
                self._cond.wait()
            self._taken += 1
            return self._ready.pop(self._policy.pick(self._ready))

    def task_done(self) -> None:
        with self._cond:
            self._done += 1
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


class SendLoop:
    """A daemon thread that takes units from a PolicyQueue and hands each to `communicate`.

    An exception stops the loop and is kept in `error` for the owner to raise.
    """

    def __init__(self, name: str, policy: Policy, communicate: Callable[[Unit], None],
                 on_error: Callable[[], None]):
        self.queue = PolicyQueue(policy)
        self.error: BaseException | None = None
        self._communicate, self._on_error = communicate, on_error
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                unit = self.queue.get()
                self._communicate(unit)
                self.queue.task_done()
        except QueueClosed:
            return
        except BaseException as e:  # reported by the owner, which fails the whole process
            self.error = e
            self._on_error()

    def stop(self) -> None:
        self.queue.close()
        self._thread.join()

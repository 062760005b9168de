"""The send loop: a thread per queue of ready units that takes them in the order a send order picks
(hostapps/send_orders.py) and communicates them, batched within a credit of bytes, optionally only
among the units every rank has (an all-reduce with a reordering send order).
"""
import threading
import time
from typing import Callable

from hostapps.send_orders import SendOrder, Unit


class QueueClosed(Exception):
    """The queue was closed and is empty."""


# How long a queue whose send order chose to wait sleeps before asking again (a put wakes it sooner).
WAIT_POLL_S = 0.0005


class SendQueue:
    """Thread-safe queue whose take() returns the units the send order picks."""

    def __init__(self, order: SendOrder):
        self._order = order
        self._ready: list[tuple[int, Unit]] = []  # (arrival number, unit)
        self._arrivals = 0
        self._cond = threading.Condition()
        self._closed = False
        self._taken = 0
        self._done = 0

    def put(self, *units: Unit) -> None:
        """Make units ready, all at once: the send order picks among all of them."""
        with self._cond:
            for unit in units:
                self._ready.append((self._arrivals, unit))
                self._arrivals += 1
                self._order.became_ready(unit, time.monotonic())
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
        """The unit the send order picks among the first `visible` arrivals (all if None), then more picks while
        the batch stays within credit_bytes."""
        with self._cond:
            batch: list[Unit] = []
            while True:
                if batch and not self._ready:
                    return batch
                self._wait_for_units()
                candidates = [unit for arrival, unit in self._ready if visible is None or arrival < visible]
                choice = self._order.pick(candidates, time.monotonic()) if candidates else None
                if choice is None or (batch and sum(u.nbytes for u in batch) + candidates[choice].nbytes
                                      > credit_bytes):
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
    """A daemon thread that takes batches of units from a SendQueue and hands each batch to `communicate`.

    With `agree`, each batch is picked only among the arrivals every rank has
    (allreduce with a reordering send order).  An exception stops the loop and is
    kept in `error` for the owner to raise.
    """

    def __init__(self, name: str, order: SendOrder, communicate: Callable[[list[Unit]], None],
                 on_error: Callable[[], None], agree: Agree | None = None, credit_bytes: int = 0):
        self.queue = SendQueue(order)
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

"""What each process writes into --out: iterations.csv, tensors.csv, trace.json, summary.json.

Byte counts are tensor payload bytes (frame headers, codec.HEADER.size bytes each, are not counted)
and are attributed to the iteration named in the message.  An iteration's delivered_fraction is
the share of the bytes it received that arrived (below 1 only with a loss-tolerant transport), and
delivered_fraction_reduce / _gather the same over its messages of each phase (collectives.PHASES:
reduce-scatter or PS push; all-gather, PS pull or agreement), empty when it received none of them.
The gather's is 1 whatever the loss: those messages are exact.
"""
import csv
import json
import os
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Callable, Iterator, NamedTuple

from hostapps.collectives import PHASES
from common.files import atomic_open
from hostapps.transport import Peer

# `job` is the job's tag (its number in every frame): the results read the column by that name.
ITERATION_COLUMNS = ("job", "role", "rank", "iteration", "start_s", "end_s", "compute_s", "wait_s",
                     "bytes_sent", "bytes_recv", "delivered_fraction",
                     *(f"delivered_fraction_{phase}" for phase in PHASES), "loss", "test_accuracy")
TENSOR_COLUMNS = ("job", "role", "rank", "iteration", "tensor", "layer", "bytes", "direction", "peer",
                  "start_s", "end_s", "delivered_fraction")

# The phase (collectives.PHASES) of a message, from its tensor id and step.
PhaseOf = Callable[[int, int], str]


class MessageRecord(NamedTuple):
    """One message a process sent or received, as the transport reported it."""
    iteration: int
    tensor: int
    step: int
    nbytes: int
    direction: str  # send or recv
    peer: str
    start_s: float
    end_s: float
    delivered_fraction: float


class Recorder:
    """Collects iteration rows, per-message tensor rows and trace spans of one process."""

    def __init__(self, tag: int, role: str, rank: int):
        self.tag, self.role, self.rank = tag, role, rank
        self.iterations: list[dict] = []
        self.messages: list[MessageRecord] = []
        self.spans: list[tuple[str, str, float, float, str]] = []
        self._lock = threading.Lock()

    def log_message(self, iteration: int, tensor: int, step: int, nbytes: int, direction: str,
                    peer: Peer, start_s: float, end_s: float, delivered_fraction: float) -> None:
        """The transport's TensorLog: called from sender and receiver threads."""
        with self._lock:
            self.messages.append(MessageRecord(iteration, tensor, step, nbytes, direction, str(peer),
                                               start_s, end_s, delivered_fraction))

    @contextmanager
    def span(self, name: str, category: str) -> Iterator[None]:
        start = time.time()
        try:
            yield
        finally:
            with self._lock:
                self.spans.append((name, category, start, time.time(), threading.current_thread().name))

    def add_iteration(self, iteration: int, start_s: float, end_s: float, wait_s: float,
                      loss: float | None, test_accuracy: float | None) -> None:
        self.iterations.append(dict(iteration=iteration, start_s=start_s, end_s=end_s,
                                    compute_s=max(0.0, end_s - start_s - wait_s), wait_s=wait_s,
                                    loss=loss, test_accuracy=test_accuracy))

    def bytes_by_iteration(self, phase_of: PhaseOf) -> dict[tuple, float]:
        """Per (iteration, "send" | "recv" | "delivered"): bytes sent, to receive, and received; and per
        (iteration, "recv" | "delivered", phase) the received ones of each phase."""
        total: dict[tuple, float] = defaultdict(int)
        for m in self.messages:
            total[(m.iteration, m.direction)] += m.nbytes
            if m.direction == "recv":
                phase = phase_of(m.tensor, m.step)
                total[(m.iteration, "delivered")] += m.nbytes * m.delivered_fraction
                total[(m.iteration, "recv", phase)] += m.nbytes
                total[(m.iteration, "delivered", phase)] += m.nbytes * m.delivered_fraction
        return total

    def write(self, out_dir: str, tensor_names: dict[int, tuple[str, str]], summary: dict,
              phase_of: PhaseOf) -> None:
        """tensor_names maps a tensor id to (tensor name, layer indices joined by '+'); phase_of gives each
        message's phase."""
        os.makedirs(out_dir, exist_ok=True)
        ident = dict(job=self.tag, role=self.role, rank=self.rank)
        nbytes = self.bytes_by_iteration(phase_of)
        with atomic_open(os.path.join(out_dir, "iterations.csv"), newline="") as f:
            writer = csv.DictWriter(f, ITERATION_COLUMNS)
            writer.writeheader()
            for row in self.iterations:
                received = nbytes[(row["iteration"], "recv")]
                delivered = nbytes[(row["iteration"], "delivered")] / received if received else 1.0
                writer.writerow({**ident, **row, "start_s": f'{row["start_s"]:.6f}', "end_s": f'{row["end_s"]:.6f}',
                                 "compute_s": f'{row["compute_s"]:.6f}', "wait_s": f'{row["wait_s"]:.6f}',
                                 "bytes_sent": nbytes[(row["iteration"], "send")], "bytes_recv": received,
                                 "delivered_fraction": f"{delivered:.4f}",
                                 **{f"delivered_fraction_{phase}": _fraction(nbytes, row["iteration"], phase)
                                    for phase in PHASES},
                                 "loss": "" if row["loss"] is None else f'{row["loss"]:.6f}',
                                 "test_accuracy": ("" if row["test_accuracy"] is None
                                                   else f"{row['test_accuracy']:.4f}")})
        with atomic_open(os.path.join(out_dir, "tensors.csv"), newline="") as f:
            writer = csv.writer(f)
            writer.writerow(TENSOR_COLUMNS)
            for iteration, tensor, _, size, direction, peer, start, end, fraction in self.messages:
                name, layer = tensor_names[tensor]
                writer.writerow([self.tag, self.role, self.rank, iteration, name, layer, size, direction, peer,
                                 f"{start:.6f}", f"{end:.6f}", f"{fraction:.4f}"])
        with atomic_open(os.path.join(out_dir, "trace.json")) as f:
            json.dump(self.chrome_trace(tensor_names), f)
        # Serialized before the file is opened: a value json cannot take fails without leaving half a
        # summary.json for the runner to trip over.
        text = json.dumps(summary, indent=2)
        with atomic_open(os.path.join(out_dir, "summary.json")) as f:
            f.write(text)

    def chrome_trace(self, tensor_names: dict[int, tuple[str, str]]) -> dict:
        """Chrome trace-event format (chrome://tracing, Perfetto): complete events in microseconds."""
        pid = f"{self.role}{self.rank}"
        events = [dict(name=name, cat=category, ph="X", ts=start * 1e6, dur=(end - start) * 1e6, pid=pid, tid=thread)
                  for name, category, start, end, thread in self.spans]
        events += [dict(name=f"{tensor_names[tensor][0]} {direction}", cat="comm", ph="X", ts=start * 1e6,
                        dur=(end - start) * 1e6, pid=pid, tid=f"{direction} {peer}",
                        args=dict(iteration=iteration, step=step, bytes=size, delivered_fraction=fraction))
                   for iteration, tensor, step, size, direction, peer, start, end, fraction in self.messages]
        return dict(traceEvents=events, displayTimeUnit="ms")


def _fraction(nbytes: dict[tuple, float], iteration: int, phase: str) -> str:
    """An iteration's delivered fraction over its received messages of one phase; empty without any."""
    received = nbytes[(iteration, "recv", phase)]
    return f"{nbytes[(iteration, 'delivered', phase)] / received:.4f}" if received else ""


def comm_busy_s(messages: list[MessageRecord], iteration: int) -> float:
    """Length of the union of an iteration's message spans: the time communication was active."""
    spans = sorted((m.start_s, m.end_s) for m in messages if m.iteration == iteration)
    busy, reach = 0.0, float("-inf")
    for start, end in spans:
        if end > reach:
            busy += end - max(start, reach)
            reach = end
    return busy

"""All-reduce algorithms as schedules, and the one executor that runs them.

An algorithm (a registered `AllReduce`) says what each rank sends and receives, round by round, to
reduce a segment of `size` floats to its mean: `rounds(rank, size)`, a list of `Round`s of the same
length on every rank. A round's sends go out first, then its receives are taken (a REDUCE message is
added in, a GATHER one copied), then the ranges the rank now holds the whole sum of are divided by the
world. The executor runs several segments as a wavefront (segment k one round behind segment k-1), so
a pipelined algorithm overlaps one segment's rounds with the next one's.

Deadlock-free for any schedule in which every message is received in a round no earlier than the one
it was sent in: in tick t a rank receives only what was sent in ticks before t, and the transports'
receiver threads drain every connection into a mailbox, so no send waits on a receive.

Loss (a transport with a loss bound) is tolerated only where the math allows: a REDUCE message is a
contribution to a sum on its way to the one rank that finishes that sum, so it is sent tolerate_loss
and may arrive short, its missing elements zero (the sum there lacks the contributions that message
carried and is still divided by the world: zero-fill, ring.Ring says why); a GATHER
message carries a finished mean and arrives whole. Every algorithm finishes each element of the mean
on exactly one rank and only copies it from there, so every rank ends bit-identical, loss or none.
"""
from __future__ import annotations

import queue
import threading
from typing import Callable, ClassVar, Iterator, NamedTuple, Sequence

import numpy as np

from hostapps.transport import MessageKey, Peer, Transport

# The two phases of a collective, as the records name them: REDUCE messages carry contributions to a sum and
# tolerate loss (an all-reduce's reduce phase, a PS push); GATHER messages carry what every replica must
# agree on and arrive whole (an all-reduce's gather phase, a PS pull, and the send orders' agreements).
REDUCE = "reduce"
GATHER = "gather"
PHASES = (REDUCE, GATHER)

# Values of the frame header's 16-bit step field (codec.HEADER).
STEP_VALUES = 1 << 16


def chunk_bounds(size: int, parts: int) -> list[tuple[int, int]]:
    """Split range(size) into `parts` contiguous chunks whose sizes differ by at most one."""
    base, extra = divmod(size, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


class Transfer(NamedTuple):
    """One message of a round, seen from one end: the other rank, the message's step within its segment
    (its key is (iteration, tensor, first step of the segment + step)), the elements [lo, hi) it carries,
    and whether it is a contribution to a sum (REDUCE: tolerates loss, added on arrival) or a finished
    mean (GATHER: exact, copied)."""
    peer: int
    step: int
    lo: int
    hi: int
    reduce: bool


class Round(NamedTuple):
    """What one rank does in one round: sends, then receives, then divides `scale` (element ranges whose
    whole sum it now holds) by the world."""
    sends: tuple[Transfer, ...] = ()
    recvs: tuple[Transfer, ...] = ()
    scale: tuple[tuple[int, int], ...] = ()


class Rounds:
    """A schedule being written: rounds of one rank, filled in any order."""

    def __init__(self, count: int):
        self.sends: list[list[Transfer]] = [[] for _ in range(count)]
        self.recvs: list[list[Transfer]] = [[] for _ in range(count)]
        self.scale: list[list[tuple[int, int]]] = [[] for _ in range(count)]

    def send(self, at: int, transfer: Transfer) -> None:
        self.sends[at].append(transfer)

    def recv(self, at: int, transfer: Transfer) -> None:
        self.recvs[at].append(transfer)

    def add(self, at: int, done: Round) -> None:
        """Round `at` also does what `done` does."""
        self.sends[at].extend(done.sends)
        self.recvs[at].extend(done.recvs)
        self.scale[at].extend(done.scale)

    def finish(self, at: int, lo: int, hi: int) -> None:
        """After round `at`'s receives the rank holds the whole sum of [lo, hi)."""
        self.scale[at].append((lo, hi))

    def done(self) -> list[Round]:
        return [Round(tuple(s), tuple(r), tuple(f)) for s, r, f in zip(self.sends, self.recvs, self.scale)]


class AllReduce:
    """An all-reduce algorithm for `world` ranks, the leaf switch of each in `leaves` (only an algorithm
    that follows the fabric reads them).

    A subclass sets `steps` (message steps of one segment, the first `reduce_steps` of them REDUCE),
    `parts` (the near-equal chunks it cuts a segment into: a pipeline's segments are whole numbers of
    datagrams in each) and writes `peers` and `schedule`. `pipelined`: it cuts every unit into segments of
    --partition-bytes itself (a tree or a chain only uses its links in parallel when several segments are
    under way); the others are cut only under the caramel send order.  `follows_leaves`: it reads `leaves`
    (the runner passes them to the algorithms that do)."""
    name: ClassVar[str] = ""
    pipelined: ClassVar[bool] = False
    follows_leaves: ClassVar[bool] = False

    def __init__(self, world: int, leaves: Sequence[int] = ()):
        self.world = world
        self.leaves = tuple(leaves)
        self.steps = 0
        self.reduce_steps = 0
        self.parts = 1
        self._rounds: dict[tuple[int, int], list[Round]] = {}

    def peers(self, rank: int) -> set[int]:
        """The ranks `rank` exchanges messages with."""
        raise NotImplementedError

    def schedule(self, rank: int, size: int) -> list[Round]:
        """`rank`'s rounds for a segment of `size` floats (every rank: as many)."""
        raise NotImplementedError

    def rounds(self, rank: int, size: int) -> list[Round]:
        """schedule(rank, size), written once per size."""
        key = (rank, size)
        if key not in self._rounds:
            self._rounds[key] = self.schedule(rank, size) if self.world > 1 else []
        return self._rounds[key]

    def phase(self, step: int) -> str:
        """REDUCE or GATHER: the phase of a message step (of any segment of a pipeline)."""
        return REDUCE if step % max(1, self.steps) < self.reduce_steps else GATHER

    def max_segments(self) -> int:
        """Segments one unit can have: their steps share the 16-bit step field of the frame header."""
        return STEP_VALUES // max(1, self.steps)

    def segments(self, size: int, segment_elements: int, grid: int, pipeline: bool = False) -> list[tuple[int, int]]:
        """The segments a unit of `size` floats is reduced in: of about `segment_elements` when the
        algorithm is pipelined (or `pipeline`: caramel's), else the unit whole."""
        if not (pipeline or self.pipelined):
            return [(0, size)]
        return segment_bounds(size, segment_elements, self.parts, grid, self.max_segments())

    def scratch_elements(self, rank: int, size: int) -> int:
        """The largest REDUCE message `rank` receives for a segment of `size` floats."""
        return max((t.hi - t.lo for r in self.rounds(rank, size) for t in r.recvs if t.reduce), default=0)


ALLREDUCES: dict[str, type[AllReduce]] = {}


def register_allreduce(name: str) -> Callable[[type[AllReduce]], type[AllReduce]]:
    def register(cls: type[AllReduce]) -> type[AllReduce]:
        cls.name = name
        ALLREDUCES[name] = cls
        return cls
    return register


def allreduce_names() -> list[str]:
    """What a job's collective may be."""
    return list(ALLREDUCES)


def make_allreduce(name: str, world: int, leaves: Sequence[int] = ()) -> AllReduce:
    return ALLREDUCES[name](world, leaves)


def segment_bounds(size: int, segment_elements: int, parts: int, grid: int, most: int) -> list[tuple[int, int]]:
    """Cut range(size), the elements of one all-reduce unit, into at most `most` pipeline segments of about
    `segment_elements` each (at least one): a whole number of parts x grid elements, so each of a segment's
    `parts` chunks fills whole datagrams of `grid` elements, save the last segment, which takes the remainder
    (one under half a segment is folded into the segment before it).  Segments of exactly segment_elements
    would end every chunk with a short datagram: more datagrams for the same bytes, each one a wake-up of
    the sender and the receiver."""
    block = parts * grid
    step = block * max(1, round(segment_elements / block), -(-size // (block * most)))
    bounds = [(lo, min(size, lo + step)) for lo in range(0, size, step)] or [(0, 0)]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] < step // 2:
        bounds[-2:] = [(bounds[-2][0], size)]
    return bounds


class Segment(NamedTuple):
    """One all-reduce of a pipeline: its messages are keyed (iteration, tensor, first_step + step)."""
    tensor: int
    first_step: int
    flat: np.ndarray


class PeerSenders:
    """A thread per peer that sends this rank's messages to it in the order they are given, while the caller
    goes on to its receives.

    A transport's send returns once the message's first pass has left, paced at the share of the receiver's
    link that the receiver advises: half of it while another rank sends to it too.  Sent one after the
    other from one thread, a round's messages to several peers (a tree's parent and children, the
    halving-doubling partners of a pipeline's segments) would each leave the rest of this host's link idle;
    a thread per peer lets the transport send them side by side (the link shared as its pacing allows), and
    a segment's receives wait for no send of another.  Each message is copied when given, so the caller may
    overwrite its range at once (a GATHER received into what was just sent)."""

    def __init__(self, transport: Transport):
        self.transport = transport
        self._queues: dict[Peer, queue.SimpleQueue] = {}
        self._threads: list[threading.Thread] = []
        self._done = threading.Condition()
        self._pending = 0
        self._error: BaseException | None = None

    def send(self, peer: Peer, key: MessageKey, array: np.ndarray, tolerate_loss: bool) -> None:
        self.check()
        if peer not in self._queues:
            self._queues[peer] = queue.SimpleQueue()
            thread = threading.Thread(target=self._send_loop, args=(peer, self._queues[peer]), daemon=True,
                                      name=f"allreduce-send-{peer}")
            thread.start()
            self._threads.append(thread)
        with self._done:
            self._pending += 1
        self._queues[peer].put((key, array.copy(), tolerate_loss))

    def _send_loop(self, peer: Peer, messages: queue.SimpleQueue) -> None:
        while (message := messages.get()) is not None:
            key, payload, tolerate_loss = message
            try:
                if self._error is None:
                    self.transport.send(peer, key, payload, tolerate_loss=tolerate_loss)
            except BaseException as error:  # the caller raises it (check, wait): a receive may be waiting
                with self._done:
                    self._error = self._error or error
            finally:
                with self._done:
                    self._pending -= 1
                    self._done.notify_all()

    def check(self) -> None:
        """Raise what a send failed with."""
        if self._error is not None:
            raise self._error

    def wait(self) -> None:
        """Until every message given has left (its first pass: as a transport's send returns)."""
        with self._done:
            while self._pending and self._error is None:
                self._done.wait()
        self.check()

    def close(self, join: bool = True) -> None:
        """Stop the threads once they sent what they were given (join: wait for that; after a failure the
        caller need not wait for sends that may only end at their timeout)."""
        for messages in self._queues.values():
            messages.put(None)
        if join:
            for thread in self._threads:
                thread.join()
        self._queues.clear()
        self._threads.clear()


SendFunction = Callable[[Peer, MessageKey, np.ndarray, bool], None]


def _segment_rounds(send: SendFunction, transport: Transport, algorithm: AllReduce, workers: Sequence[Peer],
                    rank: int, iteration: int, segment: Segment, scratch: np.ndarray) -> Iterator[None]:
    """Run one segment's rounds, yielding after each round's sends: the next resumption takes its receives."""
    flat, scale = segment.flat, np.float32(1.0 / algorithm.world)
    for done in algorithm.rounds(rank, flat.size):
        for t in done.sends:
            send(workers[t.peer], MessageKey(iteration, segment.tensor, segment.first_step + t.step),
                 flat[t.lo:t.hi], t.reduce)
        yield
        for t in done.recvs:
            key = MessageKey(iteration, segment.tensor, segment.first_step + t.step)
            if t.reduce:
                incoming = scratch[:t.hi - t.lo]
                transport.recv(workers[t.peer], key, out=incoming)
                flat[t.lo:t.hi] += incoming
            else:
                transport.recv(workers[t.peer], key, out=flat[t.lo:t.hi])
        for lo, hi in done.scale:
            flat[lo:hi] *= scale


def run_allreduce(transport: Transport, algorithm: AllReduce, rank: int, iteration: int,
                  segments: Sequence[Segment], scratch: np.ndarray | None = None,
                  senders: PeerSenders | None = None) -> None:
    """Replace every segment in place by its mean over the ranks, as a wavefront: segment k starts one round
    after segment k-1, so one segment's reduction and latency overlap the others' transfers (a pipeline).
    `scratch` holds the largest REDUCE message this rank receives (scratch_elements), or is made here.

    A rank that sends to more than one peer sends through `senders` (PeerSenders: a thread per peer; one is
    made for the call if none is given) and returns once all its messages have left; one that sends to a
    single peer (the ring's) sends from the calling thread, which has nothing else to do meanwhile."""
    if algorithm.world == 1:
        return
    if scratch is None:
        scratch = np.empty(max(algorithm.scratch_elements(rank, s.flat.size) for s in segments), np.float32)
    workers = [Peer("worker", r) for r in range(algorithm.world)]
    destinations = {t.peer for s in segments for r in algorithm.rounds(rank, s.flat.size) for t in r.sends}
    own = None
    if len(destinations) > 1 and senders is None:
        senders = own = PeerSenders(transport)
    if len(destinations) <= 1:
        senders = None

    def send(peer: Peer, key: MessageKey, array: np.ndarray, tolerate_loss: bool) -> None:
        if senders is None:
            transport.send(peer, key, array, tolerate_loss=tolerate_loss)
        else:
            senders.send(peer, key, array, tolerate_loss)
    try:
        waiting = [_segment_rounds(send, transport, algorithm, workers, rank, iteration, s, scratch) for s in segments]
        active: list[Iterator[None]] = []
        while waiting or active:
            if waiting:
                active.append(waiting.pop(0))
            active = [run for run in active if next(run, StopIteration) is not StopIteration]
            if senders is not None:
                senders.check()
        if senders is not None:
            senders.wait()
    except BaseException:
        if own is not None:
            own.close(join=False)
        raise
    if own is not None:
        own.close()

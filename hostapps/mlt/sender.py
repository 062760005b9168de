"""The sending end of mlt as a state machine: messages, feedback and clock ticks in, datagrams out.

No sockets, threads or clock of its own.  The transport submits each message, hands it its peers'
ACKs, NACKs and rate advice and a tick, all with the time, and asks it for datagrams to emit, each
with its DSCP and the time it may leave (its slot reserved at its peer's rate and on the host's
link, HostPacer): a message's first pass datagram by datagram (first_datagram), and the resends
and probes of every peer (next_datagram): of the peers with some waiting, the one whose rate lets
it leave first; a peer's pending passes take turns.

First passes share the host's link whole message by whole message, as a NIC's FIFO would, not
datagram by datagram (has_turn): the most important class first, then the oldest iteration, then
the peer already sent the most of it, then the message with the fewest bytes left (SRPT, as Homa's
sender), then the oldest; a message may go beside those ahead of it only while their peers' rates
leave some of the link free.  Interleaved evenly, a PS would finish every worker's pull at the same
moment, so no worker's next pushes could overlap the others' pulls (the overlap TCP's unfair sharing
gives).

A message is kept until its receiver ACKs it.  It either tolerates loss (a gradient on its way to
be reduced) or is exact (what every replica must agree on: all-gathered sums, pulled parameters,
agreements); its DATA datagrams tell the receiver how many of its bytes it must hold.  A NACK is
answered with just enough of the fragments it names to bring the message within its bound, 0 for
an exact one (unmarked ones first); a message that hears nothing for its RTO after a pass is probed,
which makes the receiver ACK or NACK it: its last fragment is re-sent where the peer NACKed a message in
the last LOSSY_PATH_S (the fragment is likely lost, and the probe repairs it), else its header goes
alone (wire.is_probe: the pass is over), since on a clean path most probes find the message whole and
its ACK on the way, and a header costs the receiver's link almost nothing where a fragment costs a
jumbo frame.  The RTO doubles up to MAX_RTO_S; one that hears nothing for the timeout fails its peer.
The RTO follows the peer's feedback delay (from the end of a pass to its ACK or NACK) as TCP's does
its round trip (RFC 6298: smoothed delay + 4 x its variation), between MIN_RTO_S and RTO_S: a lost
last fragment stalls its message for a few round trips, not for a fixed 100 ms.
Drop marking sends the least important fragments of a worker's first pass of a message that
tolerates loss as lower-effort (LOWER_EFFORT_DSCP).  docs/mlt.md has the protocol.
"""
import math
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import numpy as np

from hostapps import codec
from hostapps.mlt import wire
from hostapps.mlt.options import MltOptions, MltStats
from common.classes import LOWER_EFFORT_DSCP, service_rank
from hostapps.mlt.pacing import HostPacer
from hostapps.transport import MessageKey, Peer, describe_key

LOSSY_PATH_S = 0.5             # a peer that NACKed this recently: a probe re-sends the last fragment
RTO_S = 0.1                    # silence after a send pass before the sender probes, at most
MIN_RTO_S = 0.01               # ... and at least: the receiver's thread may sleep one 5 ms switch interval
MAX_RTO_S = 1.0                # after probes doubled it


def fragments_to_resend(missing: np.ndarray, marked: np.ndarray | None, total: int, fragment_bytes: int,
                        short_bytes: int) -> np.ndarray:
    """The NACKed fragments worth resending: just enough to bring the message within its loss bound
    (short_bytes more), the important ones first; all of them for an exact message or with loss bound 0.
    Resending the marked fragments a drop-marking sender let go would only feed the droppable queue again."""
    if short_bytes <= 0:
        return missing[:0]
    order = missing if marked is None else missing[np.argsort(marked[missing], kind="stable")]
    sizes = np.minimum(fragment_bytes, total - order * fragment_bytes)
    return order[:int(np.searchsorted(np.cumsum(sizes), short_bytes)) + 1]


def least_important_fragments(values: np.ndarray, fragment_bytes: int, chosen: int) -> np.ndarray | None:
    """Per fragment of a float32 gradient: True for the `chosen` with smallest max |value|."""
    if values.dtype != np.float32 or values.size == 0:
        return None
    per = fragment_bytes // 4
    count = wire.fragment_count(values.size, per)
    magnitude = np.zeros(count * per, dtype=np.float32)
    np.abs(values.reshape(-1), out=magnitude[:values.size])
    magnitude = magnitude.reshape(count, per).max(axis=1)
    marked = np.zeros(count, dtype=bool)
    if chosen:
        marked[np.argpartition(magnitude, chosen - 1)[:chosen]] = True
    return marked


@dataclass
class Outgoing:
    """A sent message kept until its receiver ACKs it."""
    peer: Peer
    key: MessageKey
    payload: np.ndarray             # uint8 copy: the caller may reuse its array
    marked: np.ndarray | None       # per fragment: send with LOWER_EFFORT_DSCP
    required: int                   # bytes the receiver must hold: the total, or less if it tolerates loss
    dscp: int
    fragments: int                  # in its first pass: all of them, at least one
    handed_out: int = 0             # of its first pass
    deadline: float = math.inf      # no feedback by then: the peer is gone
    probe_at: float = math.inf
    passed_at: float | None = None  # when its last pass left, until feedback: a feedback delay sample
    backoff: int = 0                # probes since the last feedback: the RTO doubles with each
    busy: bool = True               # a pass is being sent or waits
    rated: bool = False             # its loss was already fed to the rate control
    released: bool = False          # ACKed, or its peer closed or failed: nothing more to send
    view: memoryview = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.view = memoryview(self.payload)

    def length(self, index: int, fragment_bytes: int) -> int:
        return min(fragment_bytes, self.payload.size - index * fragment_bytes)


@dataclass
class Pass:
    """Fragments of a message to send again, in order: a NACK's resends, or a probe (its last fragment, or
    that fragment's header alone: wire.is_probe)."""
    message: Outgoing
    fragments: Sequence[int]
    header_only: bool = False
    position: int = 0

    def next_index(self) -> int:
        return int(self.fragments[self.position])

    def next_length(self, fragment_bytes: int) -> int:
        """Payload bytes of the next datagram: none for a header alone."""
        return 0 if self.header_only else self.message.length(self.next_index(), fragment_bytes)


class Emission(NamedTuple):
    """One DATA datagram: header (its send time stamped as it leaves) and payload, to send with `dscp`,
    not before `at`."""
    peer: Peer
    frame: codec.Frame
    header: bytearray
    payload: memoryview
    dscp: int
    lower_effort: bool    # a fragment the drop marking lets go (dscp is LOWER_EFFORT_DSCP)
    at: float
    message: Outgoing
    first: bool           # of the message's first pass, not a resend or a probe
    ends_pass: bool       # the last of its pass: report pass_sent once it left


class Failure(NamedTuple):
    """A peer that stopped acknowledging."""
    peer: Peer
    reason: str


class Sender:
    """Every outgoing message of this process, from submission to its ACK."""

    def __init__(self, me: Peer, tag: int, options: MltOptions, timeout: float, stats: MltStats):
        self.me, self.tag, self.timeout, self.stats = me, tag, timeout, stats
        self.fragment_bytes, self.loss_bound = options.mtu_payload, options.loss_bound
        self.drop_marking, self.layer_dscp = options.drop_marking, options.layer_dscp
        self.allreduce_precedence = options.allreduce_precedence
        self.pacer = HostPacer(options.link_mbps * 1e6 / 8)
        self.outgoing: dict[tuple[Peer, MessageKey], Outgoing] = {}
        self._passes: dict[Peer, deque[Pass]] = {}  # only peers with a pass waiting
        self._dscp: dict[Peer, int] = {}
        self._feedback_delay: dict[Peer, tuple[float, float]] = {}  # per peer: smoothed, variation
        self._last_nack: dict[Peer, float] = {}  # per peer: when it last NACKed a message
        self._first_passes: list[Outgoing] = []  # messages whose first pass is not all handed out, oldest first
        self._served: dict[Peer, tuple[int, int]] = {}  # per peer: its latest iteration, first-pass bytes of it
        self._unspent: dict[tuple[Peer, int], tuple[int, int]] = {}  # (peer, tensor): iteration, bytes (allowance)

    def add_peer(self, peer: Peer) -> None:
        self.pacer.add(peer)

    def set_dscp(self, peer: Peer, dscp: int) -> None:
        if not 0 <= dscp < 64:
            raise ValueError(f"DSCP {dscp} is not in 0..63")
        self._dscp[peer] = dscp

    def allowance(self, peer: Peer, key: MessageKey, total: int, tolerate_loss: bool) -> int:
        """The bytes of a message that may stay missing, in whole fragments (a lost datagram is a lost fragment):
        0 for an exact message.  The bound is counted over the message's tensor, all its messages to `peer` in
        the iteration (PS slices, ring chunks): each adds loss_bound x its bytes, and what whole fragments
        leave of that goes to the next, so that a tensor in slices of fewer than 1/loss_bound datagrams
        still spares its share (docs/mlt.md: the bound is counted over a tensor).  At least one fragment must arrive."""
        if not tolerate_loss or self.loss_bound == 0:
            return 0
        iteration, unspent = self._unspent.get((peer, key.tensor), (key.iteration, 0))
        budget = wire.allowed_missing_bytes(total, self.loss_bound) + (unspent if iteration == key.iteration else 0)
        fragments = min(budget // self.fragment_bytes, wire.fragment_count(total, self.fragment_bytes) - 1)
        allowed = fragments * self.fragment_bytes  # under total: at least one fragment must arrive
        self._unspent[(peer, key.tensor)] = (key.iteration, min(budget - allowed, self.fragment_bytes - 1))
        return allowed

    def lower_effort(self, values: np.ndarray, allowance: int) -> np.ndarray | None:
        """Per fragment of a message, whether its first pass sends it LE: with drop marking, as many of a worker's
        message (a gradient) as its allowance of missing bytes covers.  Reads no state that changes: callable
        outside the transport's lock."""
        if self.drop_marking and self.me.role == "worker":
            return least_important_fragments(values, self.fragment_bytes, allowance // self.fragment_bytes)
        return None

    def submit(self, peer: Peer, key: MessageKey, payload: np.ndarray, marked: np.ndarray | None,
               allowance: int = 0) -> Outgoing:
        """A message to send: kept until ACKed; its first pass is handed out by first_datagram.  It may arrive
        short by its allowance (Sender.allowance); with none it arrives whole."""
        message = Outgoing(peer, key, payload, marked, payload.size - allowance,
                           self.layer_dscp.get(key.tensor, self._dscp.get(peer, 0)),
                           max(1, wire.fragment_count(payload.size, self.fragment_bytes)))
        self.outgoing[(peer, key)] = message
        self._first_passes.append(message)
        return message

    def has_turn(self, message: Outgoing) -> bool:
        """Whether the message's first pass may go on now: the first passes ahead of it (_precedence) leave at
        least a floor's worth of the host's link free at their peers' rates (a peer slowed by its receiver's
        share or by loss leaves room for others).  One whose first pass is over waits for nothing: its caller
        must return, to submit what became ready meanwhile."""
        if message.released or message.handed_out == message.fragments:
            return True
        claimed, peers = 0.0, set()
        free = self.pacer.link.rate - self.pacer.rates[message.peer].floor
        for other in sorted(self._first_passes, key=self._precedence):  # stable: ties go oldest first
            if other is message:
                return True
            if other.peer not in peers:
                peers.add(other.peer)
                claimed += self.pacer.rates[other.peer].rate
                if claimed > free:
                    return False
        return True

    def _precedence(self, message: Outgoing) -> tuple[int, ...]:
        """Which first pass goes first: the most important class, the oldest iteration, then the peer this
        host has already sent the most of that iteration (one peer's whole share before the next's, so that
        peers finish at different times, as TCP's unfair sharing lets them), the fewest bytes left.

        With allreduce_precedence (an all-reduce's worker, whose messages to several peers are under way side
        by side: allreduce.PeerSenders), after the iteration a peer slowed below the link (its receiver
        shares its link) before one at the link's rate, then the lowest step: the slowed one leaves room for
        the next beside it, where at the link's rate first the slowed one would run alone afterwards, half
        the link idle (a rank with a message to a peer that another rank sends to as well, and one to a peer
        it alone sends to); then a pipeline's
        oldest segment, the one every rank waits for, where by the peer served most a tree's rank held one
        child's message 100 ms behind the others'.

        A parameter server's shard puts that peer before the class: a worker goes on only once it has every
        layer, the least important one included.  By class first, a back layer aggregated last (one worker's
        gradient for it went out late) would wait behind the next workers' front layers for every worker,
        and they would all restart together, late."""
        iteration, served = self._served.get(message.peer, (None, 0))
        rank, peer_first = service_rank(message.dscp), -served if iteration == message.key.iteration else 0
        left = message.fragments - message.handed_out
        if self.me.role == "server":
            return (message.key.iteration, peer_first, rank, left)
        if self.allreduce_precedence:
            return (rank, message.key.iteration, int(not self._slowed(message.peer)), message.key.step, left)
        return (rank, message.key.iteration, peer_first, left)

    def _slowed(self, peer: Peer) -> bool:
        """Whether the peer's rate leaves at least a floor's worth of the host's link free beside it, as has_turn
        counts.  Not measured against the ceiling: a receiver alone with us advises its link's share (LINK_SHARE),
        just below it, while a peer sent only one-datagram messages is never advised; against the ceiling the
        first would count as slowed and go first for as long as it kept sending, the second held behind it."""
        rate = self.pacer.rates[peer]
        return rate.rate <= self.pacer.link.rate - rate.floor

    def first_pass_over(self, message: Outgoing) -> None:
        """The message's first pass is all handed out, or will never be (released, or its caller failed)."""
        if message in self._first_passes:
            self._first_passes.remove(message)

    def first_datagram(self, message: Outgoing, now: float) -> Emission | None:
        """The next datagram of the message's first pass, in order, and when it may leave (its slot is
        reserved); None once all are handed out, or the message was released."""
        if message.released or message.handed_out == message.fragments:
            return None
        index = message.handed_out
        message.handed_out += 1
        if message.handed_out == message.fragments:
            self.first_pass_over(message)
        length = message.length(index, self.fragment_bytes)
        self._count_served(message.peer, message.key.iteration, length)
        at = self.pacer.reserve(message.peer, wire.wire_bytes(length), now)
        return self._emission(message, index, length, at, True, message.handed_out == message.fragments)

    def _count_served(self, peer: Peer, iteration: int, nbytes: int) -> None:
        """Add first-pass bytes sent to `peer` in `iteration`; a later iteration starts the count afresh."""
        latest, served = self._served.get(peer, (iteration, 0))
        if iteration > latest:
            self._served[peer] = (iteration, nbytes)
        elif iteration == latest:
            self._served[peer] = (iteration, served + nbytes)

    @property
    def ready(self) -> bool:
        """A resend or a probe waits."""
        return bool(self._passes)

    def next_datagram(self, now: float) -> Emission | None:
        """The resend or probe datagram to send next, of whichever peer, and when it may leave (its slot is
        reserved); None when none waits."""
        if not self._passes:
            return None
        heads = [(waiting, wire.wire_bytes(passes[0].next_length(self.fragment_bytes)))
                 for waiting, passes in self._passes.items()]
        peer, at = self.pacer.schedule(heads, now)
        passes = self._passes[peer]
        current = passes[0]
        index, length = current.next_index(), current.next_length(self.fragment_bytes)
        current.position += 1
        ends = current.position == len(current.fragments)
        if ends:
            passes.popleft()
        else:
            passes.rotate(-1)  # the peer's other passes take their turn
        if not passes:
            del self._passes[peer]
        return self._emission(current.message, index, length, at, False, ends)

    def _emission(self, message: Outgoing, index: int, length: int, at: float, first: bool, ends: bool) -> Emission:
        offset = index * self.fragment_bytes
        frame = wire.data_frame(self.me, self.tag, message.key, offset, length, message.payload.size)
        header = bytearray(codec.encode_datagram_header(frame, 0, self.fragment_bytes, message.required))
        lower = first and message.marked is not None and bool(message.marked[index])
        return Emission(message.peer, frame, header, message.view[offset:offset + length],
                        LOWER_EFFORT_DSCP if lower else message.dscp, lower, at, message, first, ends)

    def pass_sent(self, message: Outgoing, now: float) -> None:
        """A pass has left (or failed): arm the probe timer; the message may be served again."""
        message.busy = False
        message.passed_at = now
        message.probe_at = now + self.rto(message)
        message.deadline = min(message.deadline, now + self.timeout)  # only feedback extends it

    def advise(self, peer: Peer, bytes_per_s: float) -> bool:
        """The receiver's advice; True if it changed the peer's rate (a first pass may now have its turn)."""
        rate = self.pacer.rates[peer]
        before = rate.rate
        rate.advise(bytes_per_s)
        return rate.rate != before

    def on_feedback(self, peer: Peer, datagram: codec.Datagram, now: float) -> None:
        """An ACK or NACK from `peer`."""
        frame = datagram.frame
        key = MessageKey(frame.iteration, frame.tensor, frame.step)
        message = self.outgoing.get((peer, key))
        if message is None:  # mostly a duplicate feedback for a message already ACKed
            self.stats.late_feedback += 1
            return
        if frame.total != message.payload.size or (frame.kind == codec.KIND_NACK
                                                   and datagram.fragment_bytes != self.fragment_bytes):
            self.stats.mismatched += 1  # a bitmap on another grid would name fragments we do not have
            return
        message.deadline = now + self.timeout
        if message.passed_at is not None and not message.backoff:  # after a probe, whose answer is it? (Karn)
            self._sample_delay(peer, now - message.passed_at)
        message.passed_at, message.backoff = None, 0
        if not message.rated:
            message.rated = True
            self.pacer.rates[peer].on_feedback(1 - datagram.delivered / frame.total if frame.total else 0.0, now)
        if frame.kind == codec.KIND_ACK:
            self._release((peer, key))
            return
        self._last_nack[peer] = now
        if not message.busy:  # a NACK; one already being served is not served twice
            message.busy = True
            missing = wire.missing_fragments(datagram.payload, frame.total, self.fragment_bytes)
            resend = fragments_to_resend(missing, message.marked, frame.total, self.fragment_bytes,
                                         message.required - datagram.delivered)
            self.stats.fragments_retransmitted += len(resend)
            if len(resend):
                self._queue(Pass(message, resend))
            else:
                self.pass_sent(message, now)

    def tick(self, now: float) -> list[Failure]:
        """Timers: probe messages silent for their RTO; fail the peers of those silent for the timeout."""
        failures = []
        for message in self.outgoing.values():
            if now >= message.deadline:
                failures.append(Failure(message.peer, f"did not acknowledge {describe_key(message.key)} within "
                                                      f"{self.timeout:.1f} s"))
            elif now >= message.probe_at and not message.busy:
                message.busy = True
                message.backoff += 1
                self.stats.probes += 1
                lossy = now - self._last_nack.get(message.peer, -math.inf) < LOSSY_PATH_S
                self._queue(Pass(message, [message.fragments - 1], header_only=not lossy))
        return failures

    def rto(self, message: Outgoing) -> float:
        """How long a message may stay silent after a pass before it is probed."""
        if message.peer in self._feedback_delay:
            smoothed, variation = self._feedback_delay[message.peer]
            base = min(RTO_S, max(MIN_RTO_S, smoothed + 4 * variation))
        else:
            base = RTO_S
        return min(MAX_RTO_S, base * 2 ** message.backoff)

    def _sample_delay(self, peer: Peer, delay: float) -> None:
        """RFC 6298's estimator, on feedback delays."""
        if peer not in self._feedback_delay:
            self._feedback_delay[peer] = (delay, delay / 2)
            return
        smoothed, variation = self._feedback_delay[peer]
        self._feedback_delay[peer] = (0.875 * smoothed + 0.125 * delay,
                                      0.75 * variation + 0.25 * abs(smoothed - delay))

    def forget(self, peer: Peer) -> None:
        """Drop every message kept for `peer` (it closed or failed) and whatever they had left to send."""
        for ident in [ident for ident in self.outgoing if ident[0] == peer]:
            self._release(ident)
        self._passes.pop(peer, None)

    def _release(self, ident: tuple[Peer, MessageKey]) -> None:
        message = self.outgoing.pop(ident)
        message.released = True
        self.first_pass_over(message)
        if passes := self._passes.get(message.peer):  # what it had left to send
            kept = deque(item for item in passes if item.message is not message)
            if kept:
                self._passes[message.peer] = kept
            else:
                del self._passes[message.peer]

    def _queue(self, item: Pass) -> None:
        self._passes.setdefault(item.message.peer, deque()).append(item)

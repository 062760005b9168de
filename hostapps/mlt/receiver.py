"""The receiving end of mlt as a state machine: data and clock ticks in, replies and deliveries out.

No sockets, threads or clock of its own.  The transport hands it each DATA datagram of a peer it
trusts (our job, from that peer's host) and a tick every half quiet period, both with the time, and
does what the returned actions say: send a Reply (an ACK, a NACK, a RATE advice) from its home
socket, hand a Delivery (a message complete within its loss bound) to recv().  A message's bound is
the stricter of ours and its sender's: every DATA datagram says how many bytes must arrive, all of
them for an exact message (docs/mlt.md: exact messages).  Completion rule, NACKs and advice:
docs/mlt.md.

Memory stays bounded whatever arrives: a DATA frame may declare at most max_message_bytes, and one
peer's incomplete messages are capped in number (MAX_INCOMPLETE_MESSAGES) and bytes (INCOMPLETE_BYTES,
or two of the job's largest messages); a fragment beyond that is dropped like a lost one, and the
sender's probe brings it back once older messages completed.
"""
import math
from collections import Counter, OrderedDict
from typing import NamedTuple, Sequence

import numpy as np

from hostapps import codec
from hostapps.mlt import wire
from hostapps.mlt.options import MltOptions, MltStats
from hostapps.mlt.pacing import LINK_SHARE
from hostapps.transport import MessageKey, Peer

ACTIVE_WINDOW_S = 0.2          # a peer heard this recently shares our link: about an iteration, so a PS's
                               # workers start each push phase at their share, not at the whole link
ADVICE_INTERVAL_S = 0.01       # how often a receiver re-advises its active senders
COMPLETED_MEMORY = 4096        # completed messages remembered to re-ACK late duplicates
MAX_INCOMPLETE_MESSAGES = 1024
INCOMPLETE_BYTES = 64 << 20


def reassembly_bytes(total: int, fragment_bytes: int) -> int:
    """Memory of a Reassembly: its buffer and a flag per fragment."""
    return total + max(1, wire.fragment_count(total, fragment_bytes))


class Reassembly:
    """One incoming message: its buffer, which fragments arrived, and the completion rule.
    `required`: the bytes its sender says must arrive (the total for an exact message)."""

    def __init__(self, total: int, fragment_bytes: int, now: float, required: int = 0):
        self.total, self.fragment_bytes, self.required = total, fragment_bytes, required
        self.buffer = np.zeros(total, dtype=np.uint8)  # what never arrives reads as zero
        self._view = memoryview(self.buffer)
        self.received = np.zeros(max(1, wire.fragment_count(total, fragment_bytes)), dtype=bool)
        self.delivered = 0
        self.arrivals = 0
        self.first_arrival = self.last_arrival = now
        self.last_nack = -math.inf
        self.saw_last = False  # the last fragment arrived: the sender's first pass is over

    def add(self, offset: int, total: int, fragment_bytes: int, payload: memoryview, now: float) -> bool:
        """Place one fragment; False for a duplicate."""
        if total != self.total or fragment_bytes != self.fragment_bytes:
            raise codec.FrameError(f"fragment of a {total}-byte message in {fragment_bytes}-byte pieces, expected "
                                   f"{self.total} in {self.fragment_bytes}")
        index = offset // fragment_bytes
        if self.received[index]:
            return False
        self.received[index] = True
        self.saw_last |= index == len(self.received) - 1
        self._view[offset:offset + len(payload)] = payload
        self.delivered += len(payload)
        self.arrivals += 1
        self.last_arrival = now
        return True

    @property
    def delivered_fraction(self) -> float:
        return self.delivered / self.total if self.total else 1.0

    def within_bound(self, loss_bound: float) -> bool:
        return (self.delivered >= self.required
                and self.total - self.delivered <= wire.allowed_missing_bytes(self.total, loss_bound))

    def quiet_period(self, quiet_s: float) -> float:
        if self.arrivals < 2:
            return quiet_s
        return max(quiet_s, 4 * (self.last_arrival - self.first_arrival) / (self.arrivals - 1))

    def due(self, now: float, loss_bound: float, quiet_s: float) -> str | None:
        """'complete', 'nack' or None (keep waiting) for a message that is not yet whole."""
        quiet = self.quiet_period(quiet_s)
        if not self.saw_last or now - self.last_arrival < quiet:
            return None  # a lost last fragment: the sender's probe re-sends it
        if self.within_bound(loss_bound):
            return "complete"
        return "nack" if now - self.last_nack >= quiet else None

    def missing_bitmap(self) -> bytes:
        return wire.missing_bitmap(self.received)

    def copy_into(self, out: np.ndarray) -> None:
        """Write the message into out, missing bytes zero (only a message that tolerates loss has any)."""
        out.reshape(-1).view(np.uint8)[:] = self.buffer

    def arrived_elements(self, arrived: np.ndarray, itemsize: int) -> None:
        """Set arrived (one bool per `itemsize`-byte element) True where every byte of the element arrived."""
        if self.delivered == self.total:
            arrived[...] = True
            return
        received_bytes = np.repeat(self.received, self.fragment_bytes)[:self.total]
        arrived.reshape(-1)[:] = received_bytes.reshape(-1, itemsize).all(axis=1)


class Reply(NamedTuple):
    """A control datagram (ACK, NACK, RATE) for `peer`, to send from the home socket."""
    peer: Peer
    datagram: bytes


class Delivery(NamedTuple):
    """A message complete within its loss bound: recv() takes it."""
    peer: Peer
    key: MessageKey
    message: Reassembly


Action = Reply | Delivery


class Receiver:
    """Every incoming message of this process, from first fragment to delivery."""

    def __init__(self, me: Peer, job: int, options: MltOptions, timeout: float, stats: MltStats):
        self.me, self.job, self.timeout, self.stats = me, job, timeout, stats
        self.loss_bound, self.quiet_s = options.loss_bound, options.quiet_s
        self.link_mbps, self.max_message_bytes = options.link_mbps, options.max_message_bytes
        self.incoming: dict[tuple[Peer, MessageKey], Reassembly] = {}
        self._completed: OrderedDict[tuple[Peer, MessageKey], list[float]] = OrderedDict()  # [delivered, last ACK]
        self._last_data: dict[Peer, float] = {}  # when each peer's data last arrived
        self._held_messages: Counter[Peer] = Counter()  # each peer's incomplete messages
        self._held_bytes: Counter[Peer] = Counter()     # and their reassembly_bytes
        self._held_budget = max(INCOMPLETE_BYTES, 2 * self.max_message_bytes)
        self._next_advice = 0.0

    def on_data(self, peer: Peer, datagram: codec.Datagram, now: float) -> Sequence[Action]:
        """A DATA datagram from `peer`."""
        frame = datagram.frame
        self._last_data[peer] = now
        key = MessageKey(frame.iteration, frame.tensor, frame.step)
        ident = (peer, key)
        reassembly = self.incoming.get(ident)
        if reassembly is None:
            done = self._completed.get(ident)
            if done is not None:  # a late duplicate or a probe: our ACK may have been lost
                self.stats.duplicates += 1
                if now - done[1] < self.quiet_s:
                    return ()
                done[1] = now
                return [Reply(peer, wire.feedback(self.me, self.job, key, codec.KIND_ACK, frame.total,
                                                  datagram.fragment_bytes, int(done[0])))]
            if frame.total > self.max_message_bytes:
                self.stats.oversized += 1
                return ()
            footprint = reassembly_bytes(frame.total, datagram.fragment_bytes)
            if (self._held_messages[peer] >= MAX_INCOMPLETE_MESSAGES
                    or self._held_bytes[peer] + footprint > self._held_budget):
                self.stats.over_budget += 1
                return ()
            reassembly = self.incoming[ident] = Reassembly(frame.total, datagram.fragment_bytes, now,
                                                           datagram.delivered)
            self._held_messages[peer] += 1
            self._held_bytes[peer] += footprint
        try:
            added = reassembly.add(frame.offset, frame.total, datagram.fragment_bytes, datagram.payload, now)
        except codec.FrameError:
            self.stats.mismatched += 1
            return ()
        if not added:
            self.stats.duplicates += 1
        elif reassembly.delivered == reassembly.total:
            return self._complete(peer, key, reassembly, now)
        return ()

    def tick(self, now: float) -> list[Action]:
        """Timers: advise senders; complete or NACK quiet messages; forget stale ones."""
        actions: list[Action] = []
        if now >= self._next_advice:
            active = self._active_senders(now)
            for peer in active:
                actions.append(Reply(peer, wire.control(self.me, self.job, codec.KIND_RATE,
                                                        advised_kbps=self._fair_share_kbps(len(active)))))
            self._next_advice = now + ADVICE_INTERVAL_S
        for (peer, key), reassembly in list(self.incoming.items()):
            if now - reassembly.last_arrival > self.timeout:  # a stray fragment of a long-forgotten message
                self._release(peer, key)
                continue
            verdict = reassembly.due(now, self.loss_bound, self.quiet_s)
            if verdict == "complete":
                actions += self._complete(peer, key, reassembly, now)
            elif verdict == "nack":
                reassembly.last_nack = now
                self.stats.nacks_sent += 1
                self.stats.nack_max_delivered = max(self.stats.nack_max_delivered, reassembly.delivered_fraction)
                actions.append(self._feedback(peer, key, reassembly, codec.KIND_NACK, now))
        return actions

    def _active_senders(self, now: float) -> list[Peer]:
        """The peers whose data arrived within ACTIVE_WINDOW_S: they share our link."""
        return [peer for peer, last in self._last_data.items() if now - last <= ACTIVE_WINDOW_S]

    def _fair_share_kbps(self, senders: int) -> int:
        """Our link's share per active sender (at least one)."""
        return int(LINK_SHARE * self.link_mbps * 1000 / max(1, senders))

    def _feedback(self, peer: Peer, key: MessageKey, reassembly: Reassembly, kind: int, now: float) -> Reply:
        return Reply(peer, wire.feedback(
            self.me, self.job, key, kind, reassembly.total, reassembly.fragment_bytes, reassembly.delivered,
            self._fair_share_kbps(len(self._active_senders(now))),
            reassembly.missing_bitmap() if kind == codec.KIND_NACK else b""))

    def _release(self, peer: Peer, key: MessageKey) -> None:
        """Forget an incomplete message (it completed or went stale) and its share of the peer's budget."""
        reassembly = self.incoming.pop((peer, key))
        self._held_messages[peer] -= 1
        self._held_bytes[peer] -= reassembly_bytes(reassembly.total, reassembly.fragment_bytes)

    def _complete(self, peer: Peer, key: MessageKey, reassembly: Reassembly, now: float) -> list[Action]:
        self._release(peer, key)
        self._completed[(peer, key)] = [reassembly.delivered, now]
        if len(self._completed) > COMPLETED_MEMORY:
            self._completed.popitem(last=False)
        return [self._feedback(peer, key, reassembly, codec.KIND_ACK, now), Delivery(peer, key, reassembly)]

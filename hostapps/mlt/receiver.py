"""The receiving end of mlt as a state machine: data and clock ticks in, replies and deliveries out.

No sockets, threads or clock of its own.  The transport hands it each DATA datagram of a peer it
trusts (our job's tag, from that peer's host) and a tick every half quiet period, both with the time, and
does what the returned actions say: send a Reply (an ACK, a NACK, a RATE advice) from its home
socket, hand a Delivery (a message complete within its loss bound) to recv().  A message's bound is
the stricter of ours and its sender's: every DATA datagram says how many bytes must arrive, all of
them for an exact message (docs/mlt.md: exact messages).  Completion rule, NACKs and advice:
docs/mlt.md.

What a header may say is checked against what the receiver knows of its job, never trusted to size
anything: every message is cut into fragments of the job's payload (--mtu-payload, the same in every
process), so a DATA datagram in other pieces is off the grid; it may declare at most max_message_bytes
(the job's largest message); a message's size is fixed by its first datagram, and a later one of
another size is off its grid (both counted as mismatched and dropped).  Its required bytes are the most
any of its datagrams says, and at least one fragment of every message must arrive, so no datagram
completes a message that is not there.  Memory stays bounded whatever arrives: one peer's incomplete
messages are capped in number (MAX_INCOMPLETE_MESSAGES) and bytes (INCOMPLETE_BYTES, or two of the
job's largest messages); a fragment beyond that is dropped like a lost one, and the sender's probe
brings it back once older messages completed.

A completed message is remembered (Completed) while its sender may still send any of it: a sender keeps
a message until an ACK reaches it and gives up `timeout` after the last feedback it heard, so a message
is forgotten once none of its iteration's datagrams came for that long (and REMEMBER_MARGIN_S more, the
feedback's way back).  Until then a late duplicate or probe is re-ACKed; after, any datagram of a
forgotten iteration is stale: counted and dropped, never delivered again nor NACKed.
"""
import math
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np

from hostapps import codec
from hostapps.mlt import wire
from hostapps.mlt.options import MltOptions, MltStats
from common.classes import service_rank
from hostapps.mlt.pacing import FLOOR_SHARE, LINK_SHARE
from hostapps.transport import MessageKey, Peer

ADVICE_INTERVAL_S = 0.01       # how often a receiver re-advises the senders of messages in flight
LINGER_GAPS = 2                # a shard's pusher whose last message ended keeps its share this many of its gaps
MAX_LINGER_S = 0.05            # and at most this long (a sender at the floor share, 1/20 of the link, paces ~36 ms
                               # gaps at 40 Mbit/s)
CATCH_UP_S = 0.1               # a shard gives a pusher behind the others more of its link: weights (_catch_up_shares)
REMEMBER_MARGIN_S = 1.0        # a completed message is remembered this long beyond its sender's timeout
MAX_REMEMBERED = 1 << 16       # completed messages remembered per peer at most (about 10 MB), far beyond what
#                                one iteration of a job sends a peer: beyond, its least recently heard iterations
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
        self.saw_last = False  # the last fragment or a probe arrived: the sender's pass is over

    def add(self, offset: int, payload: memoryview, now: float) -> bool:
        """Place one fragment of this message's grid; False for a duplicate."""
        index = offset // self.fragment_bytes
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
                and self.total - self.delivered <= wire.most_missing_bytes(self.total, loss_bound, self.fragment_bytes))

    def quiet_period(self, quiet_s: float) -> float:
        if self.arrivals < 2:
            return quiet_s
        return max(quiet_s, 4 * (self.last_arrival - self.first_arrival) / (self.arrivals - 1))

    def due(self, now: float, loss_bound: float, quiet_s: float) -> str | None:
        """'complete', 'nack' or None (keep waiting) for a message that is not yet whole."""
        quiet = self.quiet_period(quiet_s)
        if not self.saw_last or now - self.last_arrival < quiet:
            return None  # a lost last fragment: the sender's probe will say its pass is over
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


@dataclass(slots=True)
class Done:
    """A completed message: what a late duplicate or probe of it is answered with."""
    total: int
    delivered: int
    last_ack: float


class Completed:
    """One peer's completed messages, by iteration, the least recently heard iteration first.  `horizon`: the
    highest iteration forgotten; a message of it or an older one that is not remembered is stale."""

    def __init__(self) -> None:
        self.iterations: OrderedDict[int, dict[tuple[int, int], Done]] = OrderedDict()
        self.heard: dict[int, float] = {}  # per iteration: when a datagram of one of its messages last came
        self.count = 0
        self.horizon = -1

    def find(self, key: MessageKey) -> Done | None:
        messages = self.iterations.get(key.iteration)
        return None if messages is None else messages.get((key.tensor, key.step))

    def hear(self, iteration: int, now: float) -> None:
        self.iterations.move_to_end(iteration)
        self.heard[iteration] = now

    def add(self, key: MessageKey, done: Done, now: float) -> None:
        messages = self.iterations.setdefault(key.iteration, {})
        self.count += (key.tensor, key.step) not in messages
        messages[(key.tensor, key.step)] = done
        self.hear(key.iteration, now)
        while self.count > MAX_REMEMBERED:
            self._forget_first()

    def forget(self, before: float) -> None:
        """Forget the iterations heard of last before `before`."""
        while self.iterations and self.heard[next(iter(self.iterations))] < before:
            self._forget_first()

    def _forget_first(self) -> None:
        iteration, messages = self.iterations.popitem(last=False)
        del self.heard[iteration]
        self.count -= len(messages)
        self.horizon = max(self.horizon, iteration)


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

    def __init__(self, me: Peer, tag: int, options: MltOptions, timeout: float, stats: MltStats):
        self.me, self.tag, self.timeout, self.stats = me, tag, timeout, stats
        self.fragment_bytes = options.mtu_payload  # every process of the job cuts its messages so
        self.loss_bound, self.quiet_s = options.loss_bound, options.quiet_s
        self.link_mbps, self.max_message_bytes = options.link_mbps, options.max_message_bytes
        self.layer_dscp = options.layer_dscp
        self.shard = me.role == "server"  # a parameter server's shard: its pushers' shares by progress, lingering
        self.incoming: dict[tuple[Peer, MessageKey], Reassembly] = {}
        self._completed: dict[Peer, Completed] = {}
        self._remember_s = timeout + REMEMBER_MARGIN_S  # every process of a job has the same timeout
        self._in_flight: dict[Peer, Counter[int]] = {}  # each peer's incomplete messages by service rank
        self._lingering: dict[Peer, tuple[float, int]] = {}  # peer whose last message ended: until, its rank
        self._progress: dict[Peer, tuple[int, int]] = {}  # a shard's pushers: latest iteration, bytes of it placed
        self._iteration_bytes = 0  # the most one pusher has sent this shard in an iteration
        self._advised: dict[Peer, int] = {}  # the share we last advised each peer
        self._shares: dict[Peer, int] | None = None  # _shares_kbps() until the in-flight classes change
        self._held_messages: Counter[Peer] = Counter()  # each peer's incomplete messages
        self._held_bytes: Counter[Peer] = Counter()     # and their reassembly_bytes
        self._held_budget = max(INCOMPLETE_BYTES, 2 * self.max_message_bytes)
        self._next_advice = 0.0

    def on_data(self, peer: Peer, datagram: codec.Datagram, now: float) -> Sequence[Action]:
        """A DATA datagram from `peer`."""
        frame = datagram.frame
        total = frame.total
        if total > self.max_message_bytes:
            self.stats.oversized += 1
            return ()
        if datagram.fragment_bytes != self.fragment_bytes:  # off the job's grid
            self.stats.mismatched += 1
            return ()
        key = MessageKey(frame.iteration, frame.tensor, frame.step)
        ident = (peer, key)
        probe = wire.is_probe(frame)
        reassembly = self.incoming.get(ident)
        advice: Sequence[Action] = ()
        if reassembly is None:
            if (completed := self._completed.get(peer)) is not None:
                if (done := completed.find(key)) is not None:
                    return self._late(peer, key, completed, done, datagram, now)
                if key.iteration <= completed.horizon:
                    self.stats.stale += 1
                    return ()
            footprint = reassembly_bytes(total, self.fragment_bytes)
            if (self._held_messages[peer] >= MAX_INCOMPLETE_MESSAGES
                    or self._held_bytes[peer] + footprint > self._held_budget):
                self.stats.over_budget += 1
                return ()
            reassembly = self.incoming[ident] = Reassembly(total, self.fragment_bytes, now)
            self._held_messages[peer] += 1
            self._held_bytes[peer] += footprint
            if self._count_in_flight(peer, key, reassembly, +1, now):
                advice = self._advice(now, changed_only=True)
        elif total != reassembly.total:  # off the grid its first datagram set
            self.stats.mismatched += 1
            return ()
        if datagram.delivered > reassembly.required:  # its sender says the same in every datagram: a forged one
            reassembly.required = datagram.delivered  # may only ask for more
        if probe:
            # The sender's pass is over and it heard nothing for its RTO: complete or NACK the message now
            # (every fragment, if none came), not a quiet period later.
            reassembly.saw_last = True
            verdict = "complete" if reassembly.within_bound(self.loss_bound) else "nack"
            return [*advice, *self._decide(peer, key, reassembly, verdict, now)]
        placed = self._place(peer, key, reassembly, datagram, now)
        return [*advice, *placed] if advice else placed

    def _late(self, peer: Peer, key: MessageKey, completed: Completed, done: Done, datagram: codec.Datagram,
              now: float) -> Sequence[Action]:
        """A datagram of a completed message, a late duplicate or a probe: our ACK may have been lost, so it is
        ACKed again, at most once per quiet period."""
        if datagram.frame.total != done.total:
            self.stats.mismatched += 1
            return ()
        completed.hear(key.iteration, now)
        if wire.is_probe(datagram.frame):
            self.stats.late_probes += 1
        else:
            self.stats.duplicates += 1
        if now - done.last_ack < self.quiet_s:
            return ()
        done.last_ack = now
        return [Reply(peer, wire.feedback(self.me, self.tag, key, codec.KIND_ACK, done.total, self.fragment_bytes,
                                          done.delivered))]

    def remembered(self) -> int:
        """How many completed messages are remembered, of every peer."""
        return sum(completed.count for completed in self._completed.values())

    def _place(self, peer: Peer, key: MessageKey, reassembly: Reassembly, datagram: codec.Datagram,
               now: float) -> Sequence[Action]:
        if not reassembly.add(datagram.frame.offset, datagram.payload, now):
            self.stats.duplicates += 1
            return ()
        if self.shard:
            self._count_progress(peer, key.iteration, len(datagram.payload))
        if reassembly.delivered == reassembly.total:
            return self._complete(peer, key, reassembly, now)
        return ()

    def tick(self, now: float) -> list[Action]:
        """Timers: advise senders; complete or NACK quiet messages; forget stale ones, and the completed ones
        whose senders gave up on them."""
        expired = [peer for peer, (until, _) in self._lingering.items() if until <= now]
        for peer in expired:
            del self._lingering[peer]
        if expired:
            self._shares = None
        actions: list[Action] = []
        if now >= self._next_advice:  # every sender advised: the expired lingers' changes with them
            if self.shard:
                self._shares = None  # the pushers' progress moved: re-weighed at each periodic advice
            actions = self._advice(now)
        elif expired:
            actions = self._advice(now, changed_only=True)
        for completed in self._completed.values():
            completed.forget(now - self._remember_s)
        for (peer, key), reassembly in list(self.incoming.items()):
            if now - reassembly.last_arrival > self.timeout:  # a stray fragment of a long-forgotten message
                actions += self._release(peer, key, now)
                continue
            actions += self._decide(peer, key, reassembly, reassembly.due(now, self.loss_bound, self.quiet_s), now)
        return actions

    def _decide(self, peer: Peer, key: MessageKey, reassembly: Reassembly, verdict: str | None,
                now: float) -> list[Action]:
        """Do what Reassembly.due decided: deliver and ACK the message, NACK what it misses, or nothing."""
        if verdict == "complete":
            return self._complete(peer, key, reassembly, now)
        if verdict == "nack":
            reassembly.last_nack = now
            self.stats.nacks_sent += 1
            self.stats.nack_max_delivered = max(self.stats.nack_max_delivered, reassembly.delivered_fraction)
            return [self._feedback(peer, key, reassembly, codec.KIND_NACK, now)]
        return []

    def _count_in_flight(self, peer: Peer, key: MessageKey, reassembly: Reassembly, change: int,
                         now: float) -> bool:
        """Count a message of `peer` in (+1) or out (-1) of flight; True if that changed the peer's share:
        its first message began or its most important class changed.  A one-datagram message is over as it
        begins: it never counts.

        At a parameter server's shard, when a pusher's last message ends it lingers: it keeps its share for
        LINGER_GAPS of its own datagram gaps (at least a quiet period), and tick re-advises the others once
        that is over.  A pusher sends slice after slice, each one paced gap behind the last, and re-advising
        the others a larger share at each slice's end overloads the link for that gap (five pushers side by
        side: four at a quarter and one still at its fifth, 1.2 times the link, at every boundary).  An
        all-reduce rank's senders pause between their messages while their own inputs arrive: held for
        them, a double tree's other child would send at half its rate for nothing."""
        if len(reassembly.received) == 1:
            return False
        ranks = self._in_flight.get(peer)
        if ranks is None:
            ranks = self._in_flight[peer] = Counter()
        lingering = self._lingering.pop(peer, None) if change > 0 else None
        before = min(ranks) if ranks else (lingering[1] if lingering else None)
        rank = service_rank(self.layer_dscp.get(key.tensor, 0))
        ranks[rank] += change
        if not ranks[rank]:
            del ranks[rank]
        if not ranks and change < 0 and self.shard:
            gap = (reassembly.last_arrival - reassembly.first_arrival) / max(1, reassembly.arrivals - 1)
            self._lingering[peer] = (now + min(MAX_LINGER_S, max(self.quiet_s, LINGER_GAPS * gap)), before)
            return False
        changed = (min(ranks) if ranks else None) != before
        if changed:
            self._shares = None
        return changed

    def _shares_kbps(self) -> dict[Peer, int]:
        """Each sender with a message in flight, and its share of our link: the senders of the most important
        class split it evenly, the others are held at the floor (the fabric's strict priority, which pacing
        alone would defeat: paced senders build no queue for it to order).

        A parameter server's shard splits it by its pushers' progress whatever the classes (_catch_up_shares): it
        aggregates a slice only once every worker's piece is in, so one worker's more important layer ahead of
        another's less important one completes no slice sooner, and by class each class change would re-advise
        every pusher, their rates out of step for a round trip each time."""
        if self._shares is None:  # asked for every ACK and NACK: computed once per change of the classes
            self._shares = self._compute_shares()
        return self._shares

    def _compute_shares(self) -> dict[Peer, int]:
        ranks = {peer: min(counts) for peer, counts in self._in_flight.items() if counts}
        ranks.update({peer: rank for peer, (_, rank) in self._lingering.items() if peer not in ranks})
        if not ranks:
            return {}
        link_kbps = self.link_mbps * 1000
        floor = int(FLOOR_SHARE * link_kbps)
        if self.shard:
            return self._catch_up_shares(list(ranks), link_kbps, floor)
        top = min(ranks.values())
        first = [peer for peer, rank in ranks.items() if rank == top]
        share = max(floor, int((LINK_SHARE * link_kbps - floor * (len(ranks) - len(first))) / len(first)))
        return {peer: share if rank == top else floor for peer, rank in ranks.items()}

    def _count_progress(self, peer: Peer, iteration: int, nbytes: int) -> None:
        latest, placed = self._progress.get(peer, (iteration, 0))
        if iteration > latest:
            self._iteration_bytes = max(self._iteration_bytes, placed)
            self._progress[peer] = (iteration, nbytes)
        elif iteration == latest:
            self._progress[peer] = (iteration, placed + nbytes)

    def _catch_up_shares(self, peers: list[Peer], link_kbps: float, floor: int) -> dict[Peer, int]:
        """A shard's shares: each pusher's weight is how far it is behind the one furthest ahead (bytes, an
        iteration counted as the most one pusher sent in one), plus what one sends at an even share in
        CATCH_UP_S; level pushers split the link evenly.  Every slice waits for its last piece, so the pusher
        behind gates them all: split evenly, one that started late finishes late, its slices' pulls pile
        up at the end of the iteration and go back one worker after another, so the last one pulled
        starts the next iteration later still, and the workers' spread grows from iteration to iteration."""
        position = {}
        for peer in peers:
            iteration, placed = self._progress.get(peer, (0, 0))
            position[peer] = iteration * self._iteration_bytes + placed
        lead = max(position.values())
        base = link_kbps * 1000 / 8 * CATCH_UP_S / len(peers)
        weights = {peer: base + lead - position[peer] for peer in peers}
        total = sum(weights.values())
        return {peer: max(floor, int(LINK_SHARE * link_kbps * weight / total)) for peer, weight in weights.items()}

    def _advice(self, now: float, changed_only: bool = False) -> list[Action]:
        """A RATE frame with its share to every sender with a message in flight (changed_only: to those whose
        share changed since we last advised them)."""
        shares = self._shares_kbps()
        if changed_only:
            shares = {peer: share for peer, share in shares.items() if self._advised.get(peer) != share}
        else:
            self._next_advice = now + ADVICE_INTERVAL_S
        self._advised.update(shares)
        return [Reply(peer, wire.control(self.me, self.tag, codec.KIND_RATE, advised_kbps=share))
                for peer, share in shares.items()]

    def _feedback(self, peer: Peer, key: MessageKey, reassembly: Reassembly, kind: int, now: float) -> Reply:
        return Reply(peer, wire.feedback(
            self.me, self.tag, key, kind, reassembly.total, reassembly.fragment_bytes, reassembly.delivered,
            self._shares_kbps().get(peer, 0),
            reassembly.missing_bitmap() if kind == codec.KIND_NACK else b""))

    def _release(self, peer: Peer, key: MessageKey, now: float) -> list[Action]:
        """Forget an incomplete message (it completed or went stale) and its share of the peer's budget;
        re-advise the senders if that changed the peer's share."""
        reassembly = self.incoming.pop((peer, key))
        self._held_messages[peer] -= 1
        self._held_bytes[peer] -= reassembly_bytes(reassembly.total, reassembly.fragment_bytes)
        if self._count_in_flight(peer, key, reassembly, -1, now):
            return self._advice(now, changed_only=True)
        return []

    def _complete(self, peer: Peer, key: MessageKey, reassembly: Reassembly, now: float) -> list[Action]:
        advice = self._release(peer, key, now)
        completed = self._completed.get(peer) or self._completed.setdefault(peer, Completed())
        completed.add(key, Done(reassembly.total, reassembly.delivered, now), now)
        return [self._feedback(peer, key, reassembly, codec.KIND_ACK, now), Delivery(peer, key, reassembly), *advice]

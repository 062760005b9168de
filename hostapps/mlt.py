"""Order-free, loss-tolerant UDP transport for tensor messages (`--transport mlt`).

Datagrams: every datagram is self-describing (codec header + DATAGRAM
extension: job, iteration, tensor, step, offset, length, total, sequence,
sender), so the receiver writes each payload straight into the message buffer
at its offset: arrival order does not matter and duplicates are ignored.  Data
leaves from a source port drawn per datagram from a pool of --sport-range
bound sockets, so a fabric that hashes the UDP 5-tuple (spray mode, OVS
dp_hash) spreads one message over every spine.  Each process has one home
socket at its --workers/--servers address; data and the control channel
(ACK/NACK, HELLO/BYE/ABORT) all arrive there.

Completion (receiver): a message is complete as soon as all its bytes arrived,
or once at least (1 - loss_bound) of them arrived, its last fragment arrived
(the sender sends in order, so its first pass is over) and nothing for it
arrived for a quiet period of max(--quiet-ms, 4 x its mean inter-arrival gap),
so a slowly paced sender, or one whose thread stalls (Python switches threads
every 5 ms), is neither cut short nor asked for what it has yet to send.  It is
then ACKed with the delivered byte count.  A quiet message below the bound is
NACKed with a bitmap of its missing fragments and its delivered count (again
after every further quiet period); the sender keeps every message until it is
ACKed and retransmits only NACKed fragments: just enough of them to bring the
message within its bound, unmarked ones first, at the message's class.
A sender that hears nothing for a while re-sends the message's last fragment,
which makes the receiver ACK or NACK it.  loss_bound 0 is fully reliable.

Lost bytes: gradients (messages from workers) are zero-filled, not rescaled:
the aggregators (ring all-reduce, PS shard) stay transport-agnostic, and a zero
is that worker skipping the update of those coordinates (the mean shrinks by
at most the loss bound).  Parameters (messages from a server, the PS pull)
keep the receiver's previous values: recv writes only delivered ranges.

Rate control (sender, per peer): datagrams are paced at a rate that starts at
--link-mbps and never exceeds it; all peers together are also paced at --link-mbps
(the host's own link).  The first feedback on each message carries
its loss (1 - delivered/total): a loss-free message adds 1/32 of the link rate,
a lossy one multiplies the rate by (1 - loss/2) (at most once per 50 ms),
never below 1/20 of the link rate.  Senders that share a link (incast at a
PS) thus back off when its queue drops and probe back up.  Per-message
feedback is too slow for incast, where n senders start a large message at
once: the receiver also advises every sender it heard from in the last
ACTIVE_WINDOW_S of its fair share of the receiving link (RATE frames every
ADVICE_INTERVAL_S, and in every ACK/NACK), and a sender never exceeds the
latest advice (receiver-driven pacing, as in NDP or Homa, without credits).

Drop marking (--drop-marking with loss_bound > 0): a worker sends the
floor(loss_bound x fragments) fragments of a gradient with the smallest
max |value| with DSCP 1 (LE, RFC 8622) from a separate socket pool; the rest go
with the DSCP chosen by set_dscp for that peer (default 0).

What a receiver trusts: a datagram counts only if its job id is ours, its header
names one of our peers and it comes from that peer's host (any source port: see
_on_datagram); a DATA frame may declare at most max_message_bytes (the job's
largest message, from the model), and one peer's incomplete messages are
capped in number and bytes, so memory stays bounded whatever arrives.  Frames
that do not fit (another fragment size or size for a known message, feedback
for a message no longer kept) and malformed ones are counted and dropped.  A
failure while handling one datagram is a bug: counted (internal_errors, in
summary.json) and reported once, but the threads go on.
"""
import errno
import itertools
import math
import queue
import random
import socket
import sys
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from hostapps import codec
from hostapps.timing import sleep_for
from hostapps.transport import (Address, Mailbox, MessageKey, Peer, TensorLog, Transport, TransportError,
                                describe_key, format_address)

LE_DSCP = 1                    # RFC 8622 lower-effort
RTO_S = 0.1                    # silence after a send pass before the sender probes
MAX_RTO_S = 1.0
HELLO_INTERVAL_S = 0.05
ACTIVE_WINDOW_S = 0.2          # a peer heard this recently shares our link: about an iteration, so a PS's
                               # workers start each push phase at their share, not at the whole link
ADVICE_INTERVAL_S = 0.01       # how often a receiver re-advises its active senders
LINK_SHARE = 0.97              # advised share of the receiving link: leave room for control and ARP
PACING_BURST_S = 0.002         # a sender may run this far ahead of its rate after idling
PACING_MIN_SLEEP_S = 0.001     # shorter delays are accumulated: sleep() is coarse
RECEIVE_BUFFER_BYTES = 8 << 20
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)  # Linux; Python does not export it
DECREASE_INTERVAL_S = 0.05     # about an RTT under load: one back-off per congestion episode
COMPLETED_MEMORY = 4096        # completed messages remembered to re-ACK late duplicates
FRAME_OVERHEAD = 42            # UDP + IPv4 + Ethernet headers: what the links' HTB shapers count
IP_UDP_HEADER_BYTES = 28
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20  # when the job's largest message is not given (the loopback bench's are 4 MB)
# One peer's incomplete messages (a forger from its host, or a backlog of lossy ones): at most this many, in at
# most INCOMPLETE_BYTES or two largest messages of memory (reassembly_bytes).  A fragment beyond that is dropped
# like a lost one: the sender's probe brings it back once older messages completed.
MAX_INCOMPLETE_MESSAGES = 1024
INCOMPLETE_BYTES = 64 << 20

# A test hook: called with each data frame about to be sent; True drops it.
DropFunction = Callable[[codec.Frame], bool]


@dataclass
class MltOptions:
    loss_bound: float = 0.0    # fraction of a message's bytes that may stay missing
    sport_range: int = 128     # source sockets per DSCP pool (fds: one pool per DSCP in use)
    mtu_payload: int = 1400    # payload bytes per datagram (a multiple of 4)
    quiet_s: float = 0.005
    link_mbps: float = 100.0
    drop_marking: bool = False
    # DSCP per tensor id (a layer, unless fused) from the controller's scheduling policy;
    # tensors not in it take the peer's DSCP (set_dscp)
    tensor_dscp: dict[int, int] = field(default_factory=dict)
    # the largest message any process of the job sends: a DATA frame declaring more is dropped, not allocated
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES


@dataclass
class MltStats:
    datagrams_sent: int = 0
    datagrams_dropped: int = 0       # by the drop hook
    datagrams_refused: int = 0       # by the local stack (a firewall drop, a full queue)
    datagrams_marked: int = 0        # sent with LE_DSCP
    fragments_retransmitted: int = 0
    probes: int = 0
    nacks_sent: int = 0
    nack_max_delivered: float = 0.0  # highest delivered fraction of a message that was NACKed
    duplicates: int = 0              # fragments that arrived again: retransmissions that were not needed
    malformed: int = 0               # not a datagram of our wire format
    foreign: int = 0                 # another job's, or not from the host of the peer its header names
    oversized: int = 0               # DATA declaring a message larger than max_message_bytes
    over_budget: int = 0             # DATA of a new message while its sender's incomplete ones are at their cap
    mismatched: int = 0              # another size or fragment grid than the message it names
    late_feedback: int = 0           # ACK/NACK of a message no longer kept (a duplicate, or a forgery)
    internal_errors: int = 0         # a bug: handling one datagram (or a retransmission) raised


def payload_for_mtu(mtu: int) -> int:
    """The largest payload (a multiple of 4: whole floats) whose datagram crosses a path of this MTU
    unfragmented."""
    return (mtu - IP_UDP_HEADER_BYTES - codec.DATAGRAM_HEADER_BYTES) // 4 * 4


def allowed_missing_bytes(total: int, loss_bound: float) -> int:
    return math.floor(loss_bound * total + 1e-9)  # so that 0.29 * 100 allows 29 bytes


def fragment_count(total: int, fragment_bytes: int) -> int:
    return -(-total // fragment_bytes)


def reassembly_bytes(total: int, fragment_bytes: int) -> int:
    """Memory of a Reassembly: its buffer and a flag per fragment."""
    return total + max(1, fragment_count(total, fragment_bytes))


class Reassembly:
    """One incoming message: its buffer, which fragments arrived, and the completion rule (no sockets)."""

    def __init__(self, total: int, fragment_bytes: int, now: float):
        self.total, self.fragment_bytes = total, fragment_bytes
        self.buffer = np.zeros(total, dtype=np.uint8)  # what never arrives reads as zero
        self._view = memoryview(self.buffer)
        self.received = np.zeros(max(1, fragment_count(total, fragment_bytes)), dtype=bool)
        self.delivered = 0
        self.arrivals = 0
        self.first_arrival = self.last_arrival = now
        self.last_nack = -math.inf
        self.saw_last = False  # the last fragment arrived: the sender's first pass is over
        self.start_wall = time.time()

    def add(self, offset: int, total: int, fragment_bytes: int, payload: memoryview, now: float) -> bool:
        """Place one fragment; False for a duplicate."""
        if total != self.total or fragment_bytes != self.fragment_bytes:
            raise codec.FrameError("fragment of a %d-byte message in %d-byte pieces, expected %d in %d" % (
                total, fragment_bytes, self.total, self.fragment_bytes))
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
        return self.total - self.delivered <= allowed_missing_bytes(self.total, loss_bound)

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
        return np.packbits(~self.received, bitorder="little").tobytes()

    def copy_into(self, out: np.ndarray, keep_unreceived: bool) -> None:
        """Write the message into out: missing bytes zero, or (keep_unreceived) left as they were."""
        target = out.reshape(-1).view(np.uint8)
        if keep_unreceived and self.delivered < self.total:
            mask = np.repeat(self.received, self.fragment_bytes)[:self.total]
            np.copyto(target, self.buffer, where=mask)
        else:
            target[:] = self.buffer


def missing_fragments(bitmap: bytes | memoryview, total: int, fragment_bytes: int) -> np.ndarray:
    """Fragment indices whose bit is set in a NACK bitmap."""
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
    return np.flatnonzero(bits[:fragment_count(total, fragment_bytes)])


def fragments_to_resend(missing: np.ndarray, marked: np.ndarray | None, total: int, fragment_bytes: int,
                        short_bytes: int) -> np.ndarray:
    """The NACKed fragments worth resending: just enough to bring the message within its loss bound
    (short_bytes more), the important ones first; all of them with loss bound 0.  Resending the marked
    fragments a drop-marking sender let go would only feed the droppable queue again."""
    if short_bytes <= 0:
        return missing[:0]
    order = missing if marked is None else missing[np.argsort(marked[missing], kind="stable")]
    sizes = np.minimum(fragment_bytes, total - order * fragment_bytes)
    return order[:int(np.searchsorted(np.cumsum(sizes), short_bytes)) + 1]


def least_important_fragments(values: np.ndarray, fragment_bytes: int, share: float) -> np.ndarray | None:
    """Per fragment of a float32 gradient: True for the floor(share x fragments) with smallest max |value|."""
    if values.dtype != np.float32 or values.size == 0:
        return None
    per = fragment_bytes // 4
    count = fragment_count(values.size, per)
    magnitude = np.zeros(count * per, dtype=np.float32)
    np.abs(values.reshape(-1), out=magnitude[:values.size])
    magnitude = magnitude.reshape(count, per).max(axis=1)
    marked = np.zeros(count, dtype=bool)
    chosen = math.floor(share * count + 1e-9)
    if chosen:
        marked[np.argpartition(magnitude, chosen - 1)[:chosen]] = True
    return marked


class RateControl:
    """Paced sending rate towards one peer: AIMD on the loss each message's first feedback reports."""

    def __init__(self, link_bytes_per_s: float):
        self.ceiling = link_bytes_per_s
        self.floor = link_bytes_per_s / 20
        self.increase = link_bytes_per_s / 32
        self.rate = link_bytes_per_s
        self.advised = link_bytes_per_s  # the receiver's latest fair-share advice
        self._virtual_time = 0.0
        self._last_decrease = -math.inf
        self._lock = threading.Lock()

    def on_feedback(self, lost_fraction: float) -> None:
        """Additive increase per loss-free message; at most one multiplicative decrease per
        DECREASE_INTERVAL_S, since the messages of one burst all report the same congestion."""
        with self._lock:
            now = time.monotonic()
            if lost_fraction <= 0:
                self.rate = min(self.ceiling, self.advised, self.rate + self.increase)
            elif now - self._last_decrease >= DECREASE_INTERVAL_S:
                self.rate = max(self.floor, self.rate * (1 - min(1.0, lost_fraction) / 2))
                self._last_decrease = now

    def advise(self, bytes_per_s: float) -> None:
        """The receiver's fair share for us caps the rate; when the share grows (a sender left), the
        rate grows by as much, keeping any back-off from loss elsewhere on the path."""
        with self._lock:
            advised = min(self.ceiling, max(self.floor, bytes_per_s))
            self.rate = min(advised, self.rate + max(0.0, advised - self.advised))
            self.advised = advised

    def reserve(self, nbytes: int, now: float) -> float:
        """Account nbytes about to be sent; return how long to wait first."""
        with self._lock:
            self._virtual_time = max(self._virtual_time, now - PACING_BURST_S) + nbytes / self.rate
            return self._virtual_time - now


@dataclass
class Outgoing:
    """A sent message kept until its receiver ACKs it."""
    peer: Peer
    key: MessageKey
    payload: np.ndarray             # uint8 copy: the caller may reuse its array
    marked: np.ndarray | None       # per fragment: send with LE_DSCP
    dscp: int
    deadline: float = math.inf      # no feedback by then: the peer is gone
    probe_at: float = math.inf
    rto: float = RTO_S
    busy: bool = True               # a send pass is running or queued
    rated: bool = False             # its loss was already fed to the rate control


def _dscp_socket_pool(host: str, count: int, dscp: int) -> list[socket.socket]:
    pool = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((host, 0))
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
        pool.append(sock)
    return pool


class MltTransport(Transport):
    """UDP datagrams sprayed over source ports, with ACK/NACK recovery up to a loss bound."""

    def __init__(self, me: Peer, listen: Address, job: int, timeout: float, log: TensorLog | None = None,
                 options: MltOptions | None = None, drop: DropFunction | None = None):
        self.me, self.listen_address, self.job, self.timeout = me, listen, job, timeout
        self.options = options or MltOptions()
        self.stats = MltStats()
        self._log, self._drop = log, drop
        self._quiet_s = self.options.quiet_s
        self._fragment_bytes = self.options.mtu_payload
        self._names: dict[Peer, str] = {}
        self._addresses: dict[Peer, Address] = {}
        self._hosts: dict[Peer, str] = {}  # each peer's IPv4 address: its datagrams must come from there
        self.mailbox = Mailbox(self._names)
        self._rates: dict[Peer, RateControl] = {}
        # All peers share this host's link: a PS answering n workers must not send n links' worth.  Just
        # under the link's rate, or the link's own queue grows with every pacing hiccup until it drops.
        self._nic = RateControl(LINK_SHARE * self.options.link_mbps * 1e6 / 8)
        self._dscp: dict[Peer, int] = {}
        self._pools: dict[int, list[socket.socket]] = {}
        self._pool_lock = threading.Lock()
        self._sequence = itertools.count()
        self._lock = threading.Condition()  # guards _outgoing, _gone, _heard, _byes
        self._outgoing: dict[tuple[Peer, MessageKey], Outgoing] = {}
        self._gone: dict[Peer, str] = {}
        self._heard: set[Peer] = set()
        self._byes: set[Peer] = set()
        self._incoming: dict[tuple[Peer, MessageKey], Reassembly] = {}  # receive thread only
        self._completed: OrderedDict[tuple[Peer, MessageKey], list[float]] = OrderedDict()  # [delivered, last ACK]
        self._last_data: dict[Peer, float] = {}  # receive thread only: when each peer's data last arrived
        self._held_messages: Counter[Peer] = Counter()  # receive thread only: each peer's incomplete messages
        self._held_bytes: Counter[Peer] = Counter()     # and their reassembly_bytes
        self._held_budget = max(INCOMPLETE_BYTES, 2 * self.options.max_message_bytes)
        self._bug_reported = False
        self._next_advice = 0.0
        self._retransmits: queue.Queue[tuple[Outgoing, Sequence[int]] | None] = queue.Queue()
        self._stopped = threading.Event()
        self._home = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:  # root (as in Mininet hosts) may exceed net.core.rmem_max, which caps SO_RCVBUF
            self._home.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RECEIVE_BUFFER_BYTES)
        except PermissionError:
            self._home.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
        try:
            self._home.bind(listen)
        except OSError as e:
            self._home.close()
            raise TransportError("%s cannot listen on %s: %s" % (me, format_address(listen), e.strerror or e))
        self._home.settimeout(max(0.001, self._quiet_s / 2))
        self._threads = [threading.Thread(target=self._receive_loop, daemon=True, name="mlt-recv-%s" % (me,)),
                         threading.Thread(target=self._retransmit_loop, daemon=True, name="mlt-rexmit-%s" % (me,))]
        for thread in self._threads:
            thread.start()

    # --- set-up and shutdown

    def connect(self, dial: dict[Peer, Address], accept: dict[Peer, Address]) -> None:
        """Exchange HELLOs with every peer (dial and accept are alike for UDP) within the timeout."""
        peers = {**dial, **accept}
        hosts = {}
        for peer, address in peers.items():
            self._names[peer] = "%s (%s)" % (peer, format_address(address))
            self._rates[peer] = RateControl(self.options.link_mbps * 1e6 / 8)
            try:
                hosts[peer] = socket.gethostbyname(address[0])
            except OSError as e:
                raise TransportError(f"{self._names[peer]}: cannot resolve its host: {e}")
        self._addresses.update(peers)
        self._hosts.update(hosts)  # last: the receive thread takes a peer's datagrams from now on
        deadline = time.monotonic() + self.timeout
        with self._lock:
            while missing := set(peers) - self._heard:
                if time.monotonic() >= deadline:
                    raise TransportError("%s never answered within %.1f s" % (
                        ", ".join(self._names[p] for p in sorted(missing)), self.timeout))
                for peer in missing:
                    self._control(peer, codec.KIND_HELLO)
                self._lock.wait(HELLO_INTERVAL_S)

    def set_dscp(self, peer: Peer, dscp: int) -> None:
        """DSCP of the (important) datagrams sent to `peer` from now on; for priority policies."""
        if not 0 <= dscp < 64:
            raise ValueError("DSCP %d is not in 0..63" % dscp)
        self._dscp[peer] = dscp

    def close(self) -> None:
        """Wait until every sent message is ACKed, then exchange BYEs (re-ACKing peers meanwhile)."""
        # Each message fails by itself within the timeout of its last feedback; twice that is a safety net.
        deadline = time.monotonic() + 2 * self.timeout
        with self._lock:
            while self._outgoing and not self._stopped.is_set() and time.monotonic() < deadline:
                self._lock.wait(0.05)
            unacknowledged = sorted({str(m.peer) for m in self._outgoing.values()})
            failure = next(iter(self._gone.items()), None)
        if failure or unacknowledged:
            self.abort()
            raise TransportError("%s %s" % (self._names[failure[0]], failure[1]) if failure else
                                 "%s: closing with messages to %s unacknowledged" % (self.me, ", ".join(unacknowledged)))
        deadline = time.monotonic() + self.timeout
        with self._lock:
            while (set(self._addresses) - self._byes) and time.monotonic() < deadline:
                for peer in set(self._addresses) - self._byes:
                    self._control(peer, codec.KIND_BYE)
                self._lock.wait(HELLO_INTERVAL_S)
        self._shutdown()

    def counters(self) -> dict[str, float]:
        return asdict(self.stats)

    def abort(self) -> None:
        if not self._stopped.is_set():
            for peer in self._addresses:
                self._control(peer, codec.KIND_ABORT)
        self._shutdown()
        for peer in self._addresses:  # a thread still waiting in recv must not sit out its timeout
            self.mailbox.peer_gone(peer, "cannot be heard: %s aborted" % (self.me,))

    def _shutdown(self) -> None:
        self._stopped.set()
        self._retransmits.put(None)
        with self._lock:
            self._lock.notify_all()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(self.timeout)
        for sock in [self._home, *itertools.chain(*self._pools.values())]:
            sock.close()

    # --- sending

    def send(self, peer: Peer, key: MessageKey, array: np.ndarray) -> None:
        self._check_peer(peer)
        if array.nbytes > self.options.max_message_bytes:  # the receiver would drop it: a bug in computing the cap
            raise TransportError(f"{describe_key(key)} for {self._names[peer]} has {array.nbytes} bytes, more than "
                                 f"the job's largest message ({self.options.max_message_bytes} bytes)")
        values = np.ascontiguousarray(array)
        payload = values.reshape(-1).view(np.uint8).copy()
        marked = None
        if self.options.drop_marking and self.options.loss_bound > 0 and self.me.role == "worker":
            marked = least_important_fragments(values, self._fragment_bytes, self.options.loss_bound)
        dscp = self.options.tensor_dscp.get(key.tensor, self._dscp.get(peer, 0))
        message = Outgoing(peer, key, payload, marked, dscp)
        with self._lock:
            self._outgoing[(peer, key)] = message
        start = time.time()
        self._send_pass(message, range(max(1, fragment_count(payload.size, self._fragment_bytes))))
        if self._log:
            self._log(key.iteration, key.tensor, key.step, payload.size, "send", peer, start, time.time(), 1.0)

    def _pool(self, dscp: int) -> list[socket.socket]:
        with self._pool_lock:
            if dscp not in self._pools:
                self._pools[dscp] = _dscp_socket_pool(self.listen_address[0], self.options.sport_range, dscp)
            return self._pools[dscp]

    def _send_pass(self, message: Outgoing, fragments: Sequence[int], first: bool = True) -> None:
        """Send the given fragments paced, each from a random source port; then arm the probe timer.
        Only the first pass marks fragments LE: a fragment resent was needed after all."""
        total, size = message.payload.size, self._fragment_bytes
        view = memoryview(message.payload)
        address = self._addresses[message.peer]
        rate = self._rates[message.peer]
        pools = {message.dscp: self._pool(message.dscp)}
        if message.marked is not None:
            pools[LE_DSCP] = self._pool(LE_DSCP)
        ports = random.choices(range(self.options.sport_range), k=len(fragments))
        key = message.key
        for index, port in zip(fragments, ports):
            offset = index * size
            length = min(size, total - offset)
            frame = codec.Frame(codec.KIND_DATA, self.me.role, self.me.rank, key.step, self.job, key.iteration,
                                key.tensor, offset, length, total)
            wire_bytes, now = length + codec.DATAGRAM_HEADER_BYTES + FRAME_OVERHEAD, time.monotonic()
            delay = max(rate.reserve(wire_bytes, now), self._nic.reserve(wire_bytes, now))
            if delay > PACING_MIN_SLEEP_S:
                sleep_for(delay)
            if self._stopped.is_set():
                raise TransportError("%s: transport closed while sending %s" % (self.me, describe_key(key)))
            if self._drop is not None and self._drop(frame):
                self.stats.datagrams_dropped += 1
                continue
            low = first and message.marked is not None and bool(message.marked[index])
            header = codec.encode_datagram_header(frame, next(self._sequence) & 0xFFFFFFFF, size)
            try:
                pools[LE_DSCP if low else message.dscp][port].sendmsg([header, view[offset:offset + length]], [],
                                                                       0, address)
            except OSError as e:
                # A firewall drop (EPERM: nft output hooks, as the runner's loss faults) or a full
                # device queue (ENOBUFS) is packet loss to recover from like any other.
                if e.errno not in (errno.EPERM, errno.ENOBUFS):
                    raise
                self.stats.datagrams_refused += 1
                continue
            self.stats.datagrams_sent += 1
            self.stats.datagrams_marked += low
        self._rearm(message)

    def _rearm(self, message: Outgoing) -> None:
        """A send pass ended (or failed): arm the probe timer; the message may be served again."""
        now = time.monotonic()
        with self._lock:
            message.busy = False
            message.probe_at = now + message.rto
            message.deadline = min(message.deadline, now + self.timeout)  # only feedback extends it

    def _retransmit_loop(self) -> None:
        while (item := self._retransmits.get()) is not None:
            message, fragments = item
            try:
                self._send_pass(message, fragments, first=False)
            except TransportError:
                return  # closed while sending
            except OSError as e:
                if not self._stopped.is_set():
                    self._fail_peer(message.peer, "could not be sent to (%s)" % e)
            except Exception as e:
                self._rearm(message)  # its probe timer serves it later
                self._internal_error("a retransmission", e)

    def _internal_error(self, what: str, error: Exception) -> None:
        """A bug met while handling one datagram or retransmission: count it, say so once, carry on."""
        self.stats.internal_errors += 1
        if not self._bug_reported:
            self._bug_reported = True
            # stderr: the runner counts a worker's progress in "iteration " on its stdout
            print(f"warning: {self.me}: mlt failed handling {what}: {error!r} (counted in internal_errors)",
                  file=sys.stderr, flush=True)

    def _check_peer(self, peer: Peer) -> None:
        with self._lock:
            if peer in self._gone:
                raise TransportError("%s %s" % (self._names[peer], self._gone[peer]))
        if self._stopped.is_set():
            raise TransportError("%s: transport is closed" % self.me)

    def _forget_outgoing(self, peer: Peer) -> None:
        """Drop every message kept for `peer` (with _lock held)."""
        for ident in [ident for ident in self._outgoing if ident[0] == peer]:
            del self._outgoing[ident]
        self._lock.notify_all()

    def _fail_peer(self, peer: Peer, reason: str) -> None:
        with self._lock:
            self._gone.setdefault(peer, reason)
            self._forget_outgoing(peer)
        self.mailbox.peer_gone(peer, reason)

    def _on_feedback(self, peer: Peer, datagram: codec.Datagram, now: float) -> None:
        frame = datagram.frame
        key = MessageKey(frame.iteration, frame.tensor, frame.step)
        with self._lock:
            message = self._outgoing.get((peer, key))
            if message is None:  # mostly a duplicate feedback for a message already ACKed
                self.stats.late_feedback += 1
                return
            if frame.total != message.payload.size or (frame.kind == codec.KIND_NACK
                                                       and datagram.fragment_bytes != self._fragment_bytes):
                self.stats.mismatched += 1  # a bitmap on another grid would name fragments we do not have
                return
            message.deadline = now + self.timeout
            message.rto = RTO_S
            first, message.rated = not message.rated, True
            if frame.kind == codec.KIND_ACK:
                del self._outgoing[(peer, key)]
                self._lock.notify_all()
            elif not message.busy:  # a NACK; one already being served is not served twice
                message.busy = True
                missing = missing_fragments(datagram.payload, frame.total, self._fragment_bytes)
                resend = fragments_to_resend(missing, message.marked, frame.total, self._fragment_bytes,
                                             frame.total - datagram.delivered - allowed_missing_bytes(
                                                 frame.total, self.options.loss_bound))
                self.stats.fragments_retransmitted += len(resend)
                self._retransmits.put((message, resend))
        if first:
            self._rates[peer].on_feedback(1 - datagram.delivered / frame.total if frame.total else 0.0)

    # --- receiving

    def recv(self, peer: Peer, key: MessageKey, out: np.ndarray) -> float:
        arrival: Reassembly = self.mailbox.take(peer, key, self.timeout)  # type: ignore[assignment]
        if arrival.total != out.nbytes:
            raise TransportError("%s from %s has %d bytes, expected %d" % (
                describe_key(key), self._names[peer], arrival.total, out.nbytes))
        arrival.copy_into(out, keep_unreceived=peer.role == "server")
        return arrival.delivered_fraction

    def wait_any(self, wanted: Iterable[tuple[Peer, MessageKey]]) -> tuple[Peer, MessageKey]:
        return self.mailbox.wait_any(wanted, self.timeout)

    def _control(self, peer: Peer, kind: int, step: int = 0, advised_kbps: int = 0) -> None:
        frame = codec.Frame(kind, self.me.role, self.me.rank, step, self.job, 0, 0, 0, 0, 0)
        self._send_control(peer, codec.encode_datagram_header(frame, 0, 0, 0, advised_kbps))

    def _send_control(self, peer: Peer, datagram: bytes) -> None:
        try:
            self._home.sendto(datagram, self._addresses[peer])
        except OSError:
            pass  # best effort: a lost control datagram is repeated by its timer

    def _active_senders(self, now: float) -> list[Peer]:
        """The peers whose data arrived within ACTIVE_WINDOW_S: they share our link."""
        return [peer for peer, last in self._last_data.items() if now - last <= ACTIVE_WINDOW_S]

    def _fair_share_kbps(self, senders: int) -> int:
        """Our link's share per active sender (at least one)."""
        return int(LINK_SHARE * self.options.link_mbps * 1000 / max(1, senders))

    def _advise_senders(self, now: float) -> None:
        """Tell every active sender its fair share of our link."""
        active = self._active_senders(now)
        for peer in active:
            self._control(peer, codec.KIND_RATE, advised_kbps=self._fair_share_kbps(len(active)))

    def _feedback(self, peer: Peer, key: MessageKey, reassembly: Reassembly, kind: int, now: float) -> None:
        bitmap = reassembly.missing_bitmap() if kind == codec.KIND_NACK else b""
        frame = codec.Frame(kind, self.me.role, self.me.rank, key.step, self.job, key.iteration, key.tensor,
                            0, len(bitmap), reassembly.total)
        self._send_control(peer, codec.encode_datagram_header(
            frame, 0, reassembly.fragment_bytes, reassembly.delivered,
            self._fair_share_kbps(len(self._active_senders(now)))) + bitmap)

    def _receive_loop(self) -> None:
        buffer = bytearray(65536)
        view = memoryview(buffer)
        next_tick = 0.0
        try:
            while not self._stopped.is_set():
                try:
                    n, (host, _) = self._home.recvfrom_into(buffer)
                except socket.timeout:
                    n = -1
                now = time.monotonic()
                if n >= 0:
                    self._on_bytes(view[:n], host, now)
                if now >= next_tick:
                    self._tick(now)
                    next_tick = now + self._quiet_s / 2
        except BaseException as e:  # a bug in the timers must fail the job, not look like a silent peer
            if not self._stopped.is_set():
                for peer in self._addresses:
                    self._fail_peer(peer, "is unreachable: %s receiver failed (%r)" % (self.me, e))

    def _on_bytes(self, data: memoryview, host: str, now: float) -> None:
        """One datagram from `host`; whatever it holds, the receive thread goes on."""
        try:
            try:
                datagram = codec.decode_datagram(data)
            except codec.FrameError:
                self.stats.malformed += 1
                return
            self._on_datagram(datagram, host, now)
        except Exception as e:  # a bug, decoding included
            self._internal_error("a datagram", e)

    def _on_datagram(self, datagram: codec.Datagram, host: str, now: float) -> None:
        frame = datagram.frame
        peer = Peer(frame.role, frame.rank)
        # Any source port of the peer's host: its data leaves from sport_range ephemeral ports per DSCP class in
        # use.  Binding those pools to port ranges known in advance would need a range reserved per process, and
        # on loopback (tests, bench), where every process shares one address, such ranges could take the ports
        # handed out to the peers.  Every other host is kept out here; other runs' processes on a peer's host
        # (the runner reuses hosts and ports) by the job id, unique per run.
        if frame.job != self.job or self._hosts.get(peer) != host:
            if self._hosts:  # before connect() it is a peer's early HELLO, which the peer repeats
                self.stats.foreign += 1
            return
        if datagram.advised_kbps:  # RATE frames, ACKs and NACKs carry the receiver's advice
            self._rates[peer].advise(datagram.advised_kbps * 125)
        if frame.kind == codec.KIND_DATA:
            self._on_data(peer, datagram, now)
        elif frame.kind in (codec.KIND_ACK, codec.KIND_NACK):
            self._on_feedback(peer, datagram, now)
        elif frame.kind == codec.KIND_HELLO:
            with self._lock:
                self._heard.add(peer)
                self._lock.notify_all()
            if frame.step == 0:
                self._control(peer, codec.KIND_HELLO, step=1)
        elif frame.kind == codec.KIND_BYE:
            with self._lock:
                self._byes.add(peer)
                # A peer closes only once it received every message it needs: whatever it has not
                # ACKed (an ACK lost just before it closed) is delivered, and nobody will ACK it now.
                self._forget_outgoing(peer)
            self.mailbox.peer_gone(peer, "closed the connection")
            if frame.step == 0:
                self._control(peer, codec.KIND_BYE, step=1)
        elif frame.kind == codec.KIND_ABORT:
            self._fail_peer(peer, "aborted")

    def _on_data(self, peer: Peer, datagram: codec.Datagram, now: float) -> None:
        frame = datagram.frame
        self._last_data[peer] = now
        key = MessageKey(frame.iteration, frame.tensor, frame.step)
        ident = (peer, key)
        reassembly = self._incoming.get(ident)
        if reassembly is None:
            done = self._completed.get(ident)
            if done is not None:  # a late duplicate or a probe: our ACK may have been lost
                self.stats.duplicates += 1
                if now - done[1] >= self._quiet_s:
                    done[1] = now
                    self._send_control(peer, codec.encode_datagram_header(frame._replace(
                        kind=codec.KIND_ACK, role=self.me.role, rank=self.me.rank, offset=0, length=0),
                        0, datagram.fragment_bytes, int(done[0])))
                return
            if frame.total > self.options.max_message_bytes:
                self.stats.oversized += 1
                return
            footprint = reassembly_bytes(frame.total, datagram.fragment_bytes)
            if (self._held_messages[peer] >= MAX_INCOMPLETE_MESSAGES
                    or self._held_bytes[peer] + footprint > self._held_budget):
                self.stats.over_budget += 1
                return
            reassembly = self._incoming[ident] = Reassembly(frame.total, datagram.fragment_bytes, now)
            self._held_messages[peer] += 1
            self._held_bytes[peer] += footprint
        try:
            added = reassembly.add(frame.offset, frame.total, datagram.fragment_bytes, datagram.payload, now)
        except codec.FrameError:
            self.stats.mismatched += 1
            return
        if not added:
            self.stats.duplicates += 1
        elif reassembly.delivered == reassembly.total:
            self._complete(peer, key, reassembly, now)

    def _release(self, peer: Peer, key: MessageKey) -> None:
        """Forget an incomplete message (it completed or went stale) and its share of the peer's budget."""
        reassembly = self._incoming.pop((peer, key))
        self._held_messages[peer] -= 1
        self._held_bytes[peer] -= reassembly_bytes(reassembly.total, reassembly.fragment_bytes)

    def _complete(self, peer: Peer, key: MessageKey, reassembly: Reassembly, now: float) -> None:
        self._release(peer, key)
        self._completed[(peer, key)] = [reassembly.delivered, now]
        if len(self._completed) > COMPLETED_MEMORY:
            self._completed.popitem(last=False)
        self._feedback(peer, key, reassembly, codec.KIND_ACK, now)
        if self._log:
            self._log(key.iteration, key.tensor, key.step, reassembly.total, "recv", peer, reassembly.start_wall,
                      time.time(), reassembly.delivered_fraction)
        self.mailbox.put(peer, key, reassembly)  # type: ignore[arg-type]  # recv() knows what it gets

    def _tick(self, now: float) -> None:
        """Timers: advise senders; complete or NACK quiet messages; probe or give up on unacknowledged ones."""
        if now >= self._next_advice:
            self._advise_senders(now)
            self._next_advice = now + ADVICE_INTERVAL_S
        for (peer, key), reassembly in list(self._incoming.items()):
            if now - reassembly.last_arrival > self.timeout:  # a stray fragment of a long-forgotten message
                self._release(peer, key)
                continue
            verdict = reassembly.due(now, self.options.loss_bound, self._quiet_s)
            if verdict == "complete":
                self._complete(peer, key, reassembly, now)
            elif verdict == "nack":
                reassembly.last_nack = now
                self.stats.nacks_sent += 1
                self.stats.nack_max_delivered = max(self.stats.nack_max_delivered, reassembly.delivered_fraction)
                self._feedback(peer, key, reassembly, codec.KIND_NACK, now)
        expired = []
        with self._lock:
            for message in self._outgoing.values():
                if now >= message.deadline:
                    expired.append(message)
                elif now >= message.probe_at and not message.busy:
                    message.busy = True
                    message.rto = min(MAX_RTO_S, 2 * message.rto)
                    self.stats.probes += 1
                    self._retransmits.put((message, [max(0, fragment_count(message.payload.size,
                                                                           self._fragment_bytes) - 1)]))
        for message in expired:
            self._fail_peer(message.peer, "did not acknowledge %s within %.1f s" % (
                describe_key(message.key), self.timeout))

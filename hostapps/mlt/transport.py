"""The mlt transport: sockets and threads around the sender and receiver state machines.

Each process has one home socket at its --workers/--servers address, where its peers' data and
control datagrams (ACK/NACK, RATE, PATHS, HELLO/BYE/ABORT) all arrive, and a pool of --sport-range
source sockets: every data datagram leaves from one drawn at random (away from the ports its receiver
reported congested: hostapps.mlt.paths), stamped with its send time, its DSCP set per datagram (IP_TOS
ancillary data), so a fabric that hashes the UDP 5-tuple sprays a message over every path.  A leaf's
split over its spines is a sample of that hash over the source ports: its two sides differ by about
sqrt(2 / (pi n)) of the bytes for n ports, 7% for 128, 2.5% for 1024 (the default).  On a
per-flow fabric (the runner gives --sport-range 1 unless the spec's lb is spray) the one source socket
binds --source-port: the datagrams to each peer are one flow, which ECMP places as it places a TCP flow.

- The receive loop (a thread) reads the home socket, drops what is not a trusted peer's (Peers),
  feeds data to the Receiver, feedback and advice to the Sender, and ticks both every half quiet
  period.
- send() submits a message to the Sender and sends its first pass from the calling thread, while
  the message has its turn on the host's link (Sender.has_turn; else it waits on _turn), each
  datagram once the slot the Sender reserved for it comes (hostapps.timing.sleep_for), and returns
  when the pass has left.  A send thread sends every peer's resends and probes the same way.  The
  Sender is the one place that paces and orders: the threads only wait and send.

First passes leave from their callers' threads, not from the send thread: one thread sending them all
would sleep less for pacing, but would have to wake each caller once its message is out, and would
leave the link idle whenever it waits for the GIL.

A failure while handling one datagram is a bug: counted (internal_errors, in summary.json) and
reported once, but the loops go on.
"""
import errno
import os
import resource
import socket
import sys
import threading
import time
from dataclasses import asdict
from typing import Callable, Iterable, Sequence

import numpy as np

from hostapps import codec
from hostapps.mlt import wire
from hostapps.mlt.options import MltOptions, MltStats
from hostapps.mlt.pacing import PACING_MIN_SLEEP_S
from hostapps.mlt.paths import PathChooser, PathMonitor
from hostapps.mlt.peers import Peers
from hostapps.mlt.receiver import Action, Delivery, Reassembly, Receiver, Reply
from hostapps.mlt.sender import Emission, Sender
from hostapps.timing import sleep_for
from hostapps.transport import (Address, Mailbox, MessageKey, Peer, TensorLog, Transport, TransportError,
                                describe_key, format_address, too_large)

HELLO_INTERVAL_S = 0.05
TURN_WAIT_S = 0.01  # a first pass waiting its turn looks again this often at the latest (a rate changed)
FILES_BESIDE_SOURCES = 256  # open files kept free beside the source sockets (other transports, logs, peers)
RECEIVE_BUFFER_BYTES = 8 << 20
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)  # Linux; Python does not export it

# A test hook: called with each data frame about to be sent; True drops it.
DropFunction = Callable[[codec.Frame], bool]


def _source_sockets(host: str, count: int, port: int = 0) -> list[socket.socket]:
    """`count` UDP sockets bound to ephemeral ports of `host`, the open-file limit raised for them; one
    socket bound to `port` if given (else, said on stderr, to an ephemeral port) when `count` is 1."""
    if count == 1 and port:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.bind((host, port))
            return [sock]
        except OSError as e:
            sock.close()
            print(f"warning: cannot send from {host}:{port} ({e.strerror or e}); sending from an ephemeral port",
                  file=sys.stderr, flush=True)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    open_now = len(os.listdir("/proc/self/fd"))
    wanted = open_now + count + FILES_BESIDE_SOURCES
    if soft < wanted and (hard == resource.RLIM_INFINITY or soft < hard):
        soft = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    pool = []
    for _ in range(max(1, min(count, soft - open_now - FILES_BESIDE_SOURCES))):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((host, 0))
        pool.append(sock)
    return pool


# Per DSCP, the ancillary data that sends a datagram with it (built once: sendmsg runs per datagram).
TOS_ANCILLARY = [[(socket.IPPROTO_IP, socket.IP_TOS, bytes([dscp << 2]))] for dscp in range(64)]


class MltTransport(Transport):
    """UDP datagrams sprayed over source ports, with ACK/NACK recovery up to a loss bound."""

    def __init__(self, me: Peer, listen: Address, tag: int, timeout: float, options: MltOptions,
                 log: TensorLog | None = None, drop: DropFunction | None = None):
        self.me, self.listen_address, self.tag, self.timeout = me, listen, tag, timeout
        self.options = options
        self._tick_s = options.quiet_s / 2  # the machines' timers run this often
        self._adaptive_spray = options.adaptive_spray
        self.stats = MltStats()
        self._log, self._drop = log, drop
        self._peers = Peers(tag)
        self.mailbox = Mailbox(self._peers.names)
        self._receiver = Receiver(me, tag, self.options, timeout, self.stats)  # the receive loop's alone
        self._sender = Sender(me, tag, self.options, timeout, self.stats)
        # _lock guards what several threads share: the Sender and the peers' life cycle.  The send thread
        # waits on _work (a resend or probe queued); connect() and close() on _progress (a HELLO, an ACK, a BYE);
        # send() on _turn (a first pass ended, or a rate changed) when its message must let others go first.
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._turn = threading.Condition(self._lock)
        self._progress = threading.Condition(self._lock)
        self._sources: list[socket.socket] = []
        self._paths: PathChooser | None = None  # which source port each datagram leaves from: with the pool
        self._monitor = PathMonitor(wire.wire_bytes(self.options.mtu_payload), self.options.link_mbps)  # receive loop's
        self._sources_lock = threading.Lock()
        self._bug_reported = False
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
            raise TransportError(f"{me} cannot listen on {format_address(listen)}: {e.strerror or e}")
        self._home.settimeout(max(0.001, self._tick_s))
        self._threads = [threading.Thread(target=self._receive_loop, daemon=True, name=f"mlt-recv-{me}"),
                         threading.Thread(target=self._send_loop, daemon=True, name=f"mlt-send-{me}")]
        for thread in self._threads:
            thread.start()

    # --- set-up and shutdown

    def connect(self, dial: dict[Peer, Address], accept: dict[Peer, Address]) -> None:
        """Exchange HELLOs with every peer (dial and accept are alike for UDP) within the timeout."""
        peers = {**dial, **accept}
        hosts = {}
        for peer, address in peers.items():
            self._peers.names[peer] = f"{peer} ({format_address(address)})"
            try:
                hosts[peer] = socket.gethostbyname(address[0])
            except OSError as e:
                raise TransportError(f"{self._peers.names[peer]}: cannot resolve its host: {e}")
        with self._lock:
            for peer in peers:
                self._sender.add_peer(peer)
        self._peers.addresses.update(peers)
        self._peers.hosts.update(hosts)  # last: the receive loop takes a peer's datagrams from now on
        deadline = time.monotonic() + self.timeout
        with self._lock:
            while missing := set(peers) - self._peers.heard:
                if failed := sorted(missing & self._peers.gone.keys()):
                    raise TransportError(f"{self._peers.names[failed[0]]} {self._peers.gone[failed[0]]}")
                if time.monotonic() >= deadline:
                    raise TransportError(f"{', '.join(self._peers.names[p] for p in sorted(missing))} never answered "
                                         f"within {self.timeout:.1f} s")
                for peer in missing:
                    self._control(peer, codec.KIND_HELLO)
                self._progress.wait(HELLO_INTERVAL_S)

    def set_dscp(self, peer: Peer, dscp: int) -> None:
        """DSCP of the (important) datagrams sent to `peer` from now on; for priority policies."""
        with self._lock:
            self._sender.set_dscp(peer, dscp)

    def close(self) -> None:
        """Wait until every sent message is ACKed, then exchange BYEs (re-ACKing peers meanwhile)."""
        # Each message fails by itself within the timeout of its last feedback; twice that is a safety net.
        deadline = time.monotonic() + 2 * self.timeout
        with self._lock:
            while self._sender.outgoing and not self._stopped.is_set() and time.monotonic() < deadline:
                self._progress.wait(0.05)
            unacknowledged = sorted({str(m.peer) for m in self._sender.outgoing.values()})
            failure = next(iter(self._peers.gone.items()), None)
        if failure or unacknowledged:
            self.abort()
            raise TransportError(f"{self._peers.names[failure[0]]} {failure[1]}" if failure else
                                 f"{self.me}: closing with messages to {', '.join(unacknowledged)} unacknowledged")
        deadline = time.monotonic() + self.timeout
        with self._lock:
            while (missing := set(self._peers.addresses) - self._peers.byes) and time.monotonic() < deadline:
                for peer in missing:
                    self._control(peer, codec.KIND_BYE)
                self._progress.wait(HELLO_INTERVAL_S)
        self._shutdown()

    def counters(self) -> dict[str, float]:
        self.stats.datagrams_queued = self._monitor.flagged  # the receive loop's monitor counts them
        return asdict(self.stats)

    def abort(self) -> None:
        if not self._stopped.is_set():
            for peer in self._peers.addresses:
                self._control(peer, codec.KIND_ABORT)
        self._shutdown()
        for peer in self._peers.addresses:  # a thread still waiting in recv must not sit out its timeout
            self.mailbox.peer_gone(peer, f"cannot be heard: {self.me} aborted")

    def _shutdown(self) -> None:
        self._stopped.set()
        with self._lock:
            self._work.notify_all()
            self._progress.notify_all()
            self._turn.notify_all()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(self.timeout)
        for sock in [self._home, *self._sources]:
            sock.close()

    def _fail_peer(self, peer: Peer, reason: str) -> None:
        with self._lock:
            self._peers.gone.setdefault(peer, reason)
            self._sender.forget(peer)
            self._progress.notify_all()
            self._turn.notify_all()
        self.mailbox.peer_gone(peer, reason)

    def _check_peer(self, peer: Peer) -> None:
        with self._lock:
            if peer in self._peers.gone:
                raise TransportError(f"{self._peers.names[peer]} {self._peers.gone[peer]}")
        if self._stopped.is_set():
            raise TransportError(f"{self.me}: transport is closed")

    def _internal_error(self, what: str, error: Exception) -> None:
        """A bug met while handling one datagram: count it, say so once, carry on."""
        self.stats.internal_errors += 1
        if not self._bug_reported:
            self._bug_reported = True
            # stderr: the runner counts a worker's progress in "iteration " on its stdout
            print(f"warning: {self.me}: mlt failed handling {what}: {error!r} (counted in internal_errors)",
                  file=sys.stderr, flush=True)

    # --- sending

    def send(self, peer: Peer, key: MessageKey, array: np.ndarray, tolerate_loss: bool = False) -> None:
        if peer not in self._peers.addresses:  # a caller's bug: fail the call, not the send thread that would meet it
            raise TransportError(f"{peer} is not a peer of {self.me}")
        self._check_peer(peer)
        if array.nbytes > self.options.max_message_bytes:
            raise too_large(key, self._peers.names[peer], array.nbytes, self.options.max_message_bytes)
        values = np.ascontiguousarray(array)
        payload = values.reshape(-1).view(np.uint8).copy()
        with self._lock:
            allowance = self._sender.allowance(peer, key, payload.size, tolerate_loss)
        marked = self._sender.lower_effort(values, allowance)
        start = time.time()
        with self._lock:
            message = self._sender.submit(peer, key, payload, marked, allowance)
            try:
                while True:
                    if self._stopped.is_set():
                        raise TransportError(f"{self.me}: transport closed while sending {describe_key(key)}")
                    if not self._sender.has_turn(message):
                        self._turn.wait(TURN_WAIT_S)
                        continue
                    if (emission := self._sender.first_datagram(message, now := time.monotonic())) is None:
                        break
                    self._send_one(emission, now)
            finally:
                self._sender.first_pass_over(message)
                self._turn.notify_all()
        self._check_peer(peer)  # released before its first pass was out: the peer failed (or closed: no error)
        if self._log:
            self._log(key.iteration, key.tensor, key.step, payload.size, "send", peer, start, time.time(), 1.0)

    def _send_loop(self) -> None:
        """The send thread: every peer's resends and probes, as the Sender orders them."""
        try:
            with self._lock:
                while not self._stopped.is_set():
                    now = time.monotonic()
                    if (emission := self._sender.next_datagram(now)) is None:
                        self._work.wait()
                    else:
                        self._send_one(emission, now)
        except BaseException as e:  # a bug here must fail the job, not look like a silent peer
            if not self._stopped.is_set():
                for peer in self._peers.addresses:
                    self._fail_peer(peer, f"is unreachable: {self.me} sender failed ({e!r})")

    def _send_one(self, emission: Emission, now: float) -> None:
        """With _lock held (released meanwhile): pace and send one datagram; report its pass when it ends it."""
        self._lock.release()
        try:
            self._pace_and_emit(emission, now)
        finally:
            self._lock.acquire()
        if emission.ends_pass:
            self._sender.pass_sent(emission.message, time.monotonic())

    def _pace_and_emit(self, emission: Emission, now: float) -> None:
        """Wait until the datagram may leave (its slot was reserved at `now`), then send it."""
        delay = emission.at - now
        if delay > PACING_MIN_SLEEP_S:
            sleep_for(delay)
        if self._stopped.is_set():
            return
        try:
            self._emit(emission)
        except OSError as e:
            if not self._stopped.is_set():
                self._fail_peer(emission.peer, f"could not be sent to ({e})")
        except Exception as e:
            self._internal_error("a retransmission" if not emission.first else "a datagram to send", e)

    def _emit(self, emission: Emission) -> None:
        """Send one data datagram, stamped with its send time, from a random source socket whose path its
        peer did not report congested, unless the drop hook takes it."""
        if self._drop is not None and self._drop(emission.frame):
            self.stats.datagrams_dropped += 1
            return
        try:
            sources = self._sources or self._source_pool()
            index = self._paths.pick(emission.peer, time.monotonic())
            # No Python call between reading the clock and sending: the GIL cannot pass to another thread
            # there, which would make the datagram look overtaken (hostapps.mlt.paths).  A lower-effort one
            # goes unstamped: its own queue lets the others overtake it on any path.
            if not emission.lower_effort:
                codec.SENT_US.pack_into(emission.header, codec.HEADER.size, time.time_ns() // 1000 & 0xFFFFFFFF or 1)
            sources[index].sendmsg([emission.header, emission.payload], TOS_ANCILLARY[emission.dscp], 0,
                                   self._peers.addresses[emission.peer])
        except OSError as e:
            # A firewall drop (EPERM: nft output hooks, as the runner's loss faults) or a full
            # device queue (ENOBUFS) is packet loss to recover from like any other.
            if e.errno not in (errno.EPERM, errno.ENOBUFS):
                raise
            self.stats.datagrams_refused += 1
            return
        self.stats.datagrams_sent += 1
        self.stats.datagrams_marked += emission.lower_effort

    def _source_pool(self) -> list[socket.socket]:
        """The source sockets, opened by the first datagram sent (later ones read self._sources)."""
        with self._sources_lock:
            if not self._sources:
                sources = _source_sockets(self.listen_address[0], self.options.sport_range,
                                           self.options.source_port)
                self._paths = PathChooser([sock.getsockname()[1] for sock in sources])
                self._sources = sources  # last: other threads read it without the lock
            return self._sources

    def _control(self, peer: Peer, kind: int, step: int = 0) -> None:
        self._send_control(peer, wire.control(self.me, self.tag, kind, step, fragment_bytes=self.options.mtu_payload))

    def _send_control(self, peer: Peer, datagram: bytes) -> None:
        try:
            self._home.sendto(datagram, self._peers.addresses[peer])
        except OSError:
            pass  # best effort: a lost control datagram is repeated by its timer

    # --- receiving

    def recv(self, peer: Peer, key: MessageKey, out: np.ndarray, arrived: np.ndarray | None = None) -> float:
        arrival: Reassembly = self.mailbox.take(peer, key, self.timeout)  # type: ignore[assignment]
        if arrival.total != out.nbytes:
            raise TransportError(f"{describe_key(key)} from {self._peers.names[peer]} has {arrival.total} bytes, "
                                 f"expected {out.nbytes}")
        arrival.copy_into(out)
        if arrived is not None:
            arrival.arrived_elements(arrived, out.itemsize)
        return arrival.delivered_fraction

    def wait_any(self, wanted: Iterable[tuple[Peer, MessageKey]]) -> tuple[Peer, MessageKey]:
        return self.mailbox.wait_any(wanted, self.timeout)

    def _receive_loop(self) -> None:
        buffer = bytearray(65536)
        view = memoryview(buffer)
        next_tick = 0.0
        try:
            while not self._stopped.is_set():
                try:
                    n, (host, port) = self._home.recvfrom_into(buffer)
                except socket.timeout:
                    n = -1
                now = time.monotonic()
                if n >= 0:
                    self._on_bytes(view[:n], host, port, now)
                if now >= next_tick:
                    self._tick(now)
                    next_tick = now + self._tick_s
        except BaseException as e:  # a bug in the timers must fail the job, not look like a silent peer
            if not self._stopped.is_set():
                for peer in self._peers.addresses:
                    self._fail_peer(peer, f"is unreachable: {self.me} receiver failed ({e!r})")

    def _on_bytes(self, data: memoryview, host: str, port: int, now: float) -> None:
        """One datagram from `host`:`port`; whatever it holds, the receive loop goes on."""
        try:
            try:
                datagram = codec.decode_datagram(data)
            except codec.FrameError:
                self.stats.malformed += 1
                return
            self._on_datagram(datagram, host, port, now)
        except Exception as e:  # a bug, decoding included
            self._internal_error("a datagram", e)

    def _on_datagram(self, datagram: codec.Datagram, host: str, port: int, now: float) -> None:
        frame = datagram.frame
        peer = self._peers.sender_of(frame, host)
        if peer is None:
            if self._peers.hosts:  # before connect() it is a peer's early HELLO, which the peer repeats
                self.stats.foreign += 1
            return
        if datagram.advised_kbps:  # RATE frames, ACKs and NACKs carry the receiver's advice
            with self._lock:
                if self._sender.advise(peer, datagram.advised_kbps * 125):
                    self._turn.notify_all()
        if frame.kind == codec.KIND_DATA:
            if datagram.sent_us and self._adaptive_spray:  # unstamped: lower-effort, queued apart
                self._monitor.observe(peer, port, datagram.sent_us, now, self.options.layer_dscp.get(frame.tensor, 0))
            self._on_data(peer, datagram, now)
        elif frame.kind in (codec.KIND_ACK, codec.KIND_NACK):
            with self._lock:
                self._sender.on_feedback(peer, datagram, now)
                self._wake_sender()
                self._progress.notify_all()
        elif frame.kind == codec.KIND_HELLO:
            if datagram.fragment_bytes != self.options.mtu_payload:  # its DATA would be off our grid
                if frame.step == 0:  # our answer tells it ours: it fails as clearly
                    self._control(peer, codec.KIND_HELLO, step=1)
                self._fail_peer(peer, f"cuts messages into {datagram.fragment_bytes}-byte fragments, {self.me} into "
                                      f"{self.options.mtu_payload}: every process of a job needs the same "
                                      "--mtu-payload")
                return
            with self._lock:
                self._peers.heard.add(peer)
                self._progress.notify_all()
            if frame.step == 0:
                self._control(peer, codec.KIND_HELLO, step=1)
        elif frame.kind == codec.KIND_BYE:
            with self._lock:
                self._peers.byes.add(peer)
                # A peer closes only once it received every message it needs: whatever it has not
                # ACKed (an ACK lost just before it closed) is delivered, and nobody will ACK it now.
                self._sender.forget(peer)
                self._progress.notify_all()
                self._turn.notify_all()
            self.mailbox.peer_gone(peer, "closed the connection")
            if frame.step == 0:
                self._control(peer, codec.KIND_BYE, step=1)
        elif frame.kind == codec.KIND_PATHS:
            self.stats.paths_reports += 1
            if self._paths is not None:  # else not about a datagram of ours
                self._paths.hear(peer, wire.path_report(datagram), now)
        elif frame.kind == codec.KIND_ABORT:
            self._fail_peer(peer, "aborted")


    def _on_data(self, peer: Peer, datagram: codec.Datagram, now: float) -> None:
        self._act(self._receiver.on_data(peer, datagram, now))

    def _tick(self, now: float) -> None:
        """The timers of both machines, and the path monitor's reports."""
        self._act(self._receiver.tick(now))
        for peer, report in self._monitor.report(now).items():
            self._send_control(peer, wire.paths(self.me, self.tag, report))
        with self._lock:
            failures = self._sender.tick(now)
            self._wake_sender()
        for failure in failures:
            self._fail_peer(failure.peer, failure.reason)

    def _wake_sender(self) -> None:
        """With _lock held: the send thread goes on when a resend or probe waits."""
        if self._sender.ready:
            self._work.notify()

    def _act(self, actions: Sequence[Action]) -> None:
        for action in actions:
            if isinstance(action, Reply):
                self._send_control(action.peer, action.datagram)
            else:
                self._deliver(action)

    def _deliver(self, delivery: Delivery) -> None:
        peer, key, message = delivery
        if self._log:  # from its first fragment to now (its ACK is out), in wall-clock time
            end = time.time()
            self._log(key.iteration, key.tensor, key.step, message.total, "recv", peer,
                      end - (time.monotonic() - message.first_arrival), end, message.delivered_fraction)
        self.mailbox.put(peer, key, message)  # type: ignore[arg-type]  # recv() knows what it gets

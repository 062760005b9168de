"""Transports move whole tensor messages between peers; collectives see only `Transport`.

`send(peer, key, array)` and `recv(peer, key, out)` name a message by
MessageKey (iteration, tensor, step).  `recv` fills `out` and returns the
fraction of its bytes that were delivered: always 1.0 for TCP, less for a
loss-tolerant datagram transport that zero-fills what is missing after its
loss bound, and then only for a message sent with tolerate_loss (a gradient
on its way to be reduced); every other message arrives whole.  Receiver
threads drain every connection into a shared Mailbox, so sends never deadlock
on a peer that is itself sending, and consumers can take messages in any
order (`wait_any`) without knowing the sender's order.
"""
import errno
import random
import selectors
import socket
import sys
import threading
import time
from abc import ABC, abstractmethod
from typing import Callable, Iterable, NamedTuple

import numpy as np

from hostapps import codec


class Peer(NamedTuple):
    role: str
    rank: int

    def __str__(self) -> str:
        return f"{self.role}{self.rank}"


class MessageKey(NamedTuple):
    iteration: int
    tensor: int
    step: int


Address = tuple[str, int]

# The largest message a transport takes when not told the job's (hostapps.assembly.largest_message_bytes):
# in tests.  A peer announcing more is refused, not allocated.
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20
HELLO_TIMEOUT_S = 5.0  # an accepted connection that has not said who it is by then is closed
MAX_HANDSHAKES = 64    # accepted connections whose HELLO is awaited at once; beyond, the oldest is closed

# Called for every message sent or received:
# (iteration, tensor, step, nbytes, direction, peer, start_s, end_s, delivered_fraction).
TensorLog = Callable[[int, int, int, int, str, Peer, float, float, float], None]


class TransportError(RuntimeError):
    """A peer failed, sent garbage or did not answer within the timeout."""


def free_loopback_addresses(n: int) -> list[Address]:
    """n distinct 127.0.0.1 ports, free for TCP and UDP a moment ago (for loopback tests and the bench).

    Drawn below Linux's ephemeral range (32768 and up): the datagram transport binds its many
    source sockets to ephemeral ports, which must not take a port handed out here."""
    found: list[Address] = []
    while len(found) < n:
        address = ("127.0.0.1", random.randrange(10000, 32768))
        if address in found:
            continue
        try:
            for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                with socket.socket(socket.AF_INET, kind) as sock:
                    sock.bind(address)
        except OSError:
            continue
        found.append(address)
    return found


def format_address(address: Address) -> str:
    host, port = address
    return f"{host}:{port}"


class Arrival(NamedTuple):
    payload: np.ndarray  # uint8
    delivered_fraction: float


class Mailbox:
    """Messages that arrived and were not yet taken, and the peers that went away."""

    def __init__(self, names: dict[Peer, str]):
        self._names = names
        self._cond = threading.Condition()
        self._messages: dict[tuple[Peer, MessageKey], Arrival] = {}
        self._gone: dict[Peer, str] = {}

    def put(self, peer: Peer, key: MessageKey, arrival: Arrival) -> None:
        with self._cond:
            self._messages[(peer, key)] = arrival
            self._cond.notify_all()

    def peer_gone(self, peer: Peer, reason: str) -> None:
        """Waiters for messages from `peer` that have not arrived fail with `reason`."""
        with self._cond:
            self._gone.setdefault(peer, reason)
            self._cond.notify_all()

    def _check(self, wanted: Iterable[tuple[Peer, MessageKey]], deadline: float,
               timeout: float) -> tuple[Peer, MessageKey] | None:
        for item in wanted:
            if item in self._messages:
                return item
        for peer, key in wanted:
            if peer in self._gone:
                raise TransportError(f"{self._names[peer]} {self._gone[peer]} before sending {describe_key(key)}")
        if time.monotonic() >= deadline:
            peer, key = next(iter(wanted))
            raise TransportError(f"timed out after {timeout:.1f} s waiting for {describe_key(key)} "
                                 f"from {self._names[peer]}")
        return None

    def wait_any(self, wanted: Iterable[tuple[Peer, MessageKey]], timeout: float) -> tuple[Peer, MessageKey]:
        wanted = list(wanted)
        deadline = time.monotonic() + timeout
        with self._cond:
            while (found := self._check(wanted, deadline, timeout)) is None:
                self._cond.wait(max(0.0, deadline - time.monotonic()))
            return found

    def take(self, peer: Peer, key: MessageKey, timeout: float) -> Arrival:
        self.wait_any([(peer, key)], timeout)
        with self._cond:
            return self._messages.pop((peer, key))


def describe_key(key: MessageKey) -> str:
    return f"tensor {key.tensor} step {key.step} of iteration {key.iteration}"


def too_large(key: MessageKey, peer: str, nbytes: int, largest: int) -> TransportError:
    """A message to send beyond the job's largest: its receiver would refuse it (a bug in computing the largest)."""
    return TransportError(f"{describe_key(key)} for {peer} has {nbytes} bytes, more than the job's largest message "
                          f"({largest} bytes)")


class Transport(ABC):
    """Moves tensor messages between this process and its peers."""

    @abstractmethod
    def send(self, peer: Peer, key: MessageKey, array: np.ndarray, tolerate_loss: bool = False) -> None:
        """Send a contiguous array as message `key`; returns once the bytes are handed off.  tolerate_loss: the
        receiver may take it short within the transport's loss bound (mlt counts it over the messages of the
        key's tensor: docs/mlt.md), its missing elements zero; only for values
        whose loss the math absorbs (a gradient contribution to a sum), never for what replicas must agree on."""

    @abstractmethod
    def recv(self, peer: Peer, key: MessageKey, out: np.ndarray, arrived: np.ndarray | None = None) -> float:
        """Fill `out` with message `key` from `peer`; return the delivered fraction.  `arrived`, a bool array
        of out's shape, is set True where the element arrived (False where it reads a zero-filled loss)."""

    @abstractmethod
    def wait_any(self, wanted: Iterable[tuple[Peer, MessageKey]]) -> tuple[Peer, MessageKey]:
        """Block until one of the wanted messages can be received; return which."""

    @abstractmethod
    def close(self) -> None:
        """Orderly shutdown after the last message; peers see an end of stream."""

    @abstractmethod
    def abort(self) -> None:
        """Drop every connection at once (on error), so that peers fail fast."""

    def counters(self) -> dict[str, float]:
        """The transport's own counters for the run summary (retransmissions, NACKs...); none by default."""
        return {}


def _recv_exact(sock: socket.socket, view: memoryview, idle_ok: bool, closing: threading.Event) -> bool:
    """Fill view from sock; False on a clean end of stream before the first byte."""
    got = 0
    while got < len(view):
        try:
            n = sock.recv_into(view[got:])
        except socket.timeout:
            if (idle_ok and got == 0) and not closing.is_set():
                continue  # an idle connection between messages is normal
            raise
        if n == 0:
            if got == 0 and idle_ok:
                return False
            raise TransportError("connection closed in the middle of a frame")
        got += n
    return True


def _send_parts(sock: socket.socket, header: bytes, payload: memoryview) -> None:
    """One gather syscall for header + payload in the common case, then finish any remainder."""
    sent = sock.sendmsg([header, payload]) if len(payload) else sock.send(header)
    if sent < len(header):
        sock.sendall(header[sent:])
        sent = len(header)
    if sent - len(header) < len(payload):
        sock.sendall(payload[sent - len(header):])


class _SourcePortBusy(Exception):
    """The chosen source port cannot dial the peer now."""


class _Handshake:
    """An accepted connection whose HELLO is still arriving."""

    def __init__(self, sock: socket.socket, source: Address, now: float):
        self.sock, self.source, self.since = sock, source, now
        self.header = bytearray(codec.HEADER.size)
        self.got = 0


class TcpTransport(Transport):
    """One persistent TCP connection per peer, framed with codec headers; every message arrives whole."""

    def __init__(self, me: Peer, listen: Address, tag: int, timeout: float,
                 log: TensorLog | None = None, source_port: int = 0,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES):
        self.me = me
        self.listen_address = listen
        self.source_port = source_port  # the first peer dialed from it, the next from source_port + 1...; 0: any
        self.tag = tag
        self.timeout = timeout
        self.max_message_bytes = max_message_bytes  # the job's largest message: a frame announcing more is refused
        self._log = log
        self._names: dict[Peer, str] = {}
        self.mailbox = Mailbox(self._names)
        self._socks: dict[Peer, socket.socket] = {}
        self._send_locks: dict[Peer, threading.Lock] = {}
        self._receivers: list[threading.Thread] = []
        self._closing = threading.Event()
        self._listener = socket.create_server(listen, reuse_port=False)
        self._listener.settimeout(0.2)

    def connect(self, dial: dict[Peer, Address], accept: dict[Peer, Address]) -> None:
        """Dial the peers in `dial` and wait for those in `accept`, all within the timeout."""
        for peer, address in {**dial, **accept}.items():
            self._names[peer] = f"{peer} ({format_address(address)})"
        deadline = time.monotonic() + self.timeout
        accepted: dict[Peer, socket.socket] = {}
        accept_error: list[str] = []
        acceptor = threading.Thread(target=self._accept, daemon=True,
                                    args=(set(accept), accepted, accept_error, deadline))
        acceptor.start()
        for index, (peer, address) in enumerate(dial.items()):
            source = self.source_port + index if self.source_port and self.source_port + index <= 65535 else 0
            self._attach(peer, self._dial(peer, address, deadline, source))
        acceptor.join()
        if accept_error:
            raise TransportError(accept_error[0])
        for peer, sock in accepted.items():
            self._attach(peer, sock)
        self._listener.close()

    def _dial(self, peer: Peer, address: Address, deadline: float, source_port: int = 0) -> socket.socket:
        """A connection to the peer, from source_port if given and free (else, said once on stderr, from an
        ephemeral port: the run then places that flow by chance)."""
        last_error = "no attempt"
        while time.monotonic() < deadline:
            try:
                sock = self._connect(address, source_port, deadline)
            except _SourcePortBusy as e:
                print(f"warning: {self.me}: cannot dial {self._names[peer]} from port {source_port} ({e}); "
                      "dialing from an ephemeral port", file=sys.stderr, flush=True)
                source_port = 0
                continue
            except OSError as e:  # the peer may not be listening yet
                last_error = e.strerror or str(e)
                time.sleep(0.05)
                continue
            sock.settimeout(self.timeout)
            hello = codec.Frame(codec.KIND_HELLO, self.me.role, self.me.rank, 0, self.tag, 0, 0, 0, 0, 0)
            sock.sendall(codec.encode_header(hello))
            return sock
        raise TransportError(f"could not connect to {self._names[peer]} within {self.timeout:.1f} s: {last_error}")

    def _connect(self, address: Address, source_port: int, deadline: float) -> socket.socket:
        if not source_port:
            return socket.create_connection(address, timeout=max(0.1, deadline - time.monotonic()))
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            # The previous run's connection from this port may linger in TIME_WAIT (the fabric's hosts let
            # a connect reuse it: emulation.fabric); SO_REUSEADDR lets the bind through meanwhile.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                sock.bind((self.listen_address[0], source_port))
            except OSError as e:
                raise _SourcePortBusy(e.strerror or str(e))
            try:
                sock.connect(address)
            except OSError as e:
                if e.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
                    raise _SourcePortBusy(e.strerror or str(e))
                raise
        except BaseException:
            sock.close()
            raise
        return sock

    def _accept(self, expected: set[Peer], accepted: dict[Peer, socket.socket],
                error: list[str], deadline: float) -> None:
        """Accept connections until every expected peer said HELLO on one.  Every connection's HELLO is read as
        it arrives, so a silent or slow one holds up none of the others; it is closed after HELLO_TIMEOUT_S, or
        when MAX_HANDSHAKES newer ones wait."""
        handshakes: dict[socket.socket, _Handshake] = {}
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            try:
                while expected - set(accepted):
                    now = time.monotonic()
                    if self._closing.is_set():  # abort() closed the listener
                        error.append(f"{self.me}: stopped while waiting for peers")
                        return
                    if now >= deadline:
                        names = ", ".join(self._names[p] for p in sorted(expected - set(accepted)))
                        error.append(f"{names} never connected within {self.timeout:.1f} s")
                        return
                    for late in [h for h in handshakes.values() if now - h.since > HELLO_TIMEOUT_S]:
                        self._refuse(handshakes.pop(late.sock), selector, f"no hello within {HELLO_TIMEOUT_S:g} s")
                    for ready, _ in selector.select(min(0.2, deadline - now)):
                        if ready.fileobj is self._listener:
                            if len(handshakes) >= MAX_HANDSHAKES:
                                self._refuse(handshakes.pop(next(iter(handshakes))), selector, "too many connections")
                            sock, source = self._listener.accept()
                            sock.setblocking(False)
                            handshakes[sock] = _Handshake(sock, source, time.monotonic())
                            selector.register(sock, selectors.EVENT_READ)
                            continue
                        handshake = handshakes[ready.fileobj]  # type: ignore[index]
                        try:
                            peer = self._hear_hello(handshake, expected, accepted)
                        except (OSError, codec.FrameError) as e:
                            # A stray or garbled connection is refused; the job waits for its real peers.
                            self._refuse(handshakes.pop(handshake.sock), selector, str(e))
                            continue
                        if peer is not None:
                            selector.unregister(handshake.sock)
                            del handshakes[handshake.sock]
                            handshake.sock.settimeout(self.timeout)
                            accepted[peer] = handshake.sock
            except OSError as e:  # the listener failed
                error.append(f"{self.me}: stopped while waiting for peers ({e.strerror or e})")
            finally:
                for handshake in handshakes.values():
                    handshake.sock.close()

    def _hear_hello(self, handshake: _Handshake, expected: set[Peer],
                    accepted: dict[Peer, socket.socket]) -> Peer | None:
        """Read what came of a connection's HELLO: its peer once whole, None while it is not."""
        try:
            n = handshake.sock.recv_into(memoryview(handshake.header)[handshake.got:])
        except BlockingIOError:
            return None
        if n == 0:
            raise codec.FrameError("closed before its hello")
        handshake.got += n
        if handshake.got < len(handshake.header):
            return None
        hello = codec.decode_header(handshake.header)
        peer = Peer(hello.role, hello.rank)
        if hello.kind != codec.KIND_HELLO or hello.tag != self.tag or peer not in expected:
            raise codec.FrameError(f"unexpected hello from {peer} with tag {hello.tag}")
        if peer in accepted:
            raise codec.FrameError(f"a second hello from {peer}")
        return peer

    def _refuse(self, handshake: _Handshake, selector: selectors.BaseSelector, reason: str) -> None:
        print(f"warning: {self.me}: rejected connection from {format_address(handshake.source)}: {reason}", flush=True)
        selector.unregister(handshake.sock)
        handshake.sock.close()

    def _attach(self, peer: Peer, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._socks[peer] = sock
        self._send_locks[peer] = threading.Lock()
        thread = threading.Thread(target=self._receive_loop, args=(peer, sock), daemon=True,
                                  name=f"recv-{peer}")
        self._receivers.append(thread)
        thread.start()

    def _receive_loop(self, peer: Peer, sock: socket.socket) -> None:
        header = bytearray(codec.HEADER.size)
        header_view = memoryview(header)
        try:
            while _recv_exact(sock, header_view, True, self._closing):
                frame = codec.decode_header(header)
                if frame.kind != codec.KIND_DATA or (frame.role, frame.rank) != peer or frame.tag != self.tag:
                    raise codec.FrameError(f"frame kind {frame.kind} from {frame.role}{frame.rank} tag {frame.tag} "
                                           f"on the connection of {peer}")
                if frame.offset != 0 or frame.length != frame.total:
                    raise codec.FrameError(f"TCP frames carry whole messages, got fragment "
                                           f"{frame.offset}+{frame.length} of {frame.total}")
                if frame.total > self.max_message_bytes:
                    raise codec.FrameError(f"a message of {frame.total} bytes, more than the job's largest "
                                           f"({self.max_message_bytes} bytes)")
                start = time.time()
                payload = np.empty(frame.total, dtype=np.uint8)
                _recv_exact(sock, memoryview(payload), False, self._closing)
                end = time.time()
                key = MessageKey(frame.iteration, frame.tensor, frame.step)
                if self._log:
                    self._log(key.iteration, key.tensor, key.step, frame.total, "recv", peer, start, end, 1.0)
                self.mailbox.put(peer, key, Arrival(payload, 1.0))
            self.mailbox.peer_gone(peer, "closed the connection")
        except codec.FrameError as e:
            self.mailbox.peer_gone(peer, f"sent a malformed frame ({e})")
            sock.close()
        except (OSError, TransportError) as e:
            reason = "timed out mid-message" if isinstance(e, socket.timeout) else f"failed ({e})"
            self.mailbox.peer_gone(peer, "closing" if self._closing.is_set() else reason)

    def send(self, peer: Peer, key: MessageKey, array: np.ndarray, tolerate_loss: bool = False) -> None:
        if array.nbytes > self.max_message_bytes:
            raise too_large(key, self._names[peer], array.nbytes, self.max_message_bytes)
        payload = memoryview(np.ascontiguousarray(array)).cast("B")
        header = codec.encode_header(codec.Frame(
            codec.KIND_DATA, self.me.role, self.me.rank, key.step, self.tag, key.iteration,
            key.tensor, 0, len(payload), len(payload)))
        start = time.time()
        try:
            with self._send_locks[peer]:
                _send_parts(self._socks[peer], header, payload)
        except OSError as e:
            why = "timed out" if isinstance(e, socket.timeout) else e
            raise TransportError(f"sending {describe_key(key)} to {self._names[peer]} failed: {why}")
        if self._log:
            self._log(key.iteration, key.tensor, key.step, len(payload), "send", peer, start, time.time(), 1.0)

    def recv(self, peer: Peer, key: MessageKey, out: np.ndarray, arrived: np.ndarray | None = None) -> float:
        arrival = self.mailbox.take(peer, key, self.timeout)
        if arrival.payload.size != out.nbytes:
            raise TransportError(f"{describe_key(key)} from {self._names[peer]} has {arrival.payload.size} bytes, "
                                 f"expected {out.nbytes}")
        np.copyto(out, arrival.payload.view(out.dtype).reshape(out.shape))
        if arrived is not None:
            arrived[...] = True
        return arrival.delivered_fraction

    def wait_any(self, wanted: Iterable[tuple[Peer, MessageKey]]) -> tuple[Peer, MessageKey]:
        return self.mailbox.wait_any(wanted, self.timeout)

    def close(self) -> None:
        self._closing.set()
        for sock in self._socks.values():
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        deadline = time.monotonic() + self.timeout
        for thread in self._receivers:
            thread.join(max(0.0, deadline - time.monotonic()))
        self.abort()

    def abort(self) -> None:
        self._closing.set()
        for sock in [self._listener, *self._socks.values()]:
            sock.close()

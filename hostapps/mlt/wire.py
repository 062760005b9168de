"""mlt's datagrams as codec frames, and the message grid both ends count in.

hostapps.codec packs and checks every header; this module only says which frame each mlt datagram
is (a fragment of a message, an ACK or NACK, a control frame) and how a message is cut: into
fragments of the sender's fragment size, the last one shorter.  docs/mlt.md describes the format.
"""
import math

import numpy as np

from hostapps import codec
from hostapps.mlt.paths import PathReport
from hostapps.transport import MessageKey, Peer

PORT = np.dtype(">u2")  # a PATHS frame's ports

IP_UDP_HEADER_BYTES = 28
FRAME_OVERHEAD = 42  # UDP + IPv4 + Ethernet headers: what the links' HTB shapers count


def payload_for_mtu(mtu: int) -> int:
    """The largest payload (a multiple of 4: whole floats) whose datagram crosses a path of this MTU
    unfragmented."""
    return (mtu - IP_UDP_HEADER_BYTES - codec.DATAGRAM_HEADER_BYTES) // 4 * 4


def fragment_count(total: int, fragment_bytes: int) -> int:
    return -(-total // fragment_bytes)


def allowed_missing_bytes(total: int, loss_bound: float) -> int:
    """A `total`-byte message's own share of a loss bound, in bytes."""
    return math.floor(loss_bound * total + 1e-9)  # so that 0.29 * 100 allows 29 bytes


def most_missing_bytes(total: int, loss_bound: float, fragment_bytes: int) -> int:
    """The most bytes a message may miss: its own share of the bound and, the bound being counted over
    its tensor (Sender.allowance), less than a fragment its tensor's earlier messages left unspent; but
    never its every fragment, as Sender.allowance never allows (one always arrives)."""
    if loss_bound <= 0:
        return 0
    return min(allowed_missing_bytes(total, loss_bound) + fragment_bytes - 1,
               (max(1, fragment_count(total, fragment_bytes)) - 1) * fragment_bytes)


def wire_bytes(payload_bytes: int) -> int:
    """What a data datagram with this payload costs on a link: what pacing counts."""
    return payload_bytes + codec.DATAGRAM_HEADER_BYTES + FRAME_OVERHEAD


def data_frame(me: Peer, tag: int, key: MessageKey, offset: int, length: int, total: int) -> codec.Frame:
    return codec.Frame(codec.KIND_DATA, me.role, me.rank, key.step, tag, key.iteration, key.tensor, offset, length,
                       total)


def is_probe(frame: codec.Frame) -> bool:
    """A DATA frame of a message with bytes that carries none: the sender's probe, once its pass is over
    and it heard nothing for its RTO (hostapps.mlt.sender)."""
    return frame.kind == codec.KIND_DATA and frame.length == 0 and frame.total > 0


def control(me: Peer, tag: int, kind: int, step: int = 0, advised_kbps: int = 0, fragment_bytes: int = 0) -> bytes:
    """A HELLO, BYE, ABORT or RATE datagram (step 1 answers a HELLO or a BYE); a HELLO says the fragment size
    its sender cuts messages into."""
    frame = codec.Frame(kind, me.role, me.rank, step, tag, 0, 0, 0, 0, 0)
    return codec.encode_datagram_header(frame, 0, fragment_bytes, 0, advised_kbps)


def feedback(me: Peer, tag: int, key: MessageKey, kind: int, total: int, fragment_bytes: int, delivered: int,
             advised_kbps: int = 0, bitmap: bytes = b"") -> bytes:
    """An ACK, or a NACK with the bitmap of the missing fragments, of message `key`."""
    frame = codec.Frame(kind, me.role, me.rank, key.step, tag, key.iteration, key.tensor, 0, len(bitmap), total)
    return codec.encode_datagram_header(frame, 0, fragment_bytes, delivered, advised_kbps) + bitmap


def paths(me: Peer, tag: int, report: PathReport) -> bytes:
    """A PATHS frame: the source ports of the peer's datagrams that queued, then those that went through;
    `step` says how many queued (hostapps.mlt.paths)."""
    payload = np.array([*report.congested, *report.clear], dtype=PORT).tobytes()
    frame = codec.Frame(codec.KIND_PATHS, me.role, me.rank, len(report.congested), tag, 0, 0, 0, len(payload),
                        len(payload))
    return codec.encode_datagram_header(frame, 0, 0) + payload


def path_report(datagram: codec.Datagram) -> PathReport:
    """What a PATHS frame says."""
    ports = np.frombuffer(datagram.payload, dtype=PORT).tolist()
    return PathReport(ports[:datagram.frame.step], ports[datagram.frame.step:])


def missing_bitmap(received: np.ndarray) -> bytes:
    """A NACK's bitmap: bit i set when fragment i has not arrived."""
    return np.packbits(~received, bitorder="little").tobytes()


def missing_fragments(bitmap: bytes | memoryview, total: int, fragment_bytes: int) -> np.ndarray:
    """Fragment indices whose bit is set in a NACK bitmap."""
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
    return np.flatnonzero(bits[:fragment_count(total, fragment_bytes)])

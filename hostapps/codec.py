"""Wire format of host-app messages: the one place that encodes and decodes frames.

A frame is a fixed header followed by `length` payload bytes.  The header is
self-describing so that a datagram transport can carry one fragment of a
message per packet and the receiver needs no other state to place it:
(tag, iteration, tensor, step) names the message, `offset`/`length` place the
fragment inside it and `total` is the message size.  The sender's role and
rank are in every header because a loss-tolerant transport sends from random
source ports.  TCP sends each message as a single fragment.

The datagram transport (hostapps.mlt) appends a DATAGRAM extension to every
header: the sender's clock when it sent the datagram (microseconds, modulo 2^32; the
receiver's path monitor compares one-way delays), the fragment size the sender cuts
messages into (NACK bitmaps count in it), the delivered byte count (in
feedback: the bytes the receiver holds; in DATA: the bytes it must hold before it
may complete the message, all of them for an exact one) and the receiver's
advised sending rate (its link's fair share per active sender, kbit/s; 0 for no
advice).  A NACK's payload is a bitmap with bit i set when fragment i is missing; a PATHS
frame's, 16-bit source ports of the sender's: the first `step` of them queued, the rest went through.
"""
import struct
from typing import NamedTuple

MAGIC = b"HA"
VERSION = 1

KIND_HELLO = 1  # first frame on a connection: who is dialing
KIND_DATA = 2   # a fragment of a tensor message
KIND_ACK = 3    # datagram receiver -> sender: message complete (within the loss bound)
KIND_NACK = 4   # datagram receiver -> sender: retransmit the fragments in the bitmap
KIND_BYE = 5    # datagram peer closes in order; step 1 answers a BYE
KIND_ABORT = 6  # datagram peer failed: fail fast
KIND_RATE = 7   # datagram receiver -> sender: advised sending rate (advised_kbps)
KIND_PATHS = 8  # datagram receiver -> sender: source ports that queued or went through (hostapps.mlt.paths)
KINDS = (KIND_HELLO, KIND_DATA, KIND_ACK, KIND_NACK, KIND_BYE, KIND_ABORT, KIND_RATE, KIND_PATHS)

ROLES = ("worker", "server")

# magic, version, kind, role, rank, step, tag, iteration, tensor, offset, length, total
HEADER = struct.Struct("!2sBBBHHIIIQIQ")

# sent_us, fragment_bytes, delivered, advised_kbps: appended to HEADER in every datagram.
DATAGRAM = struct.Struct("!IIQI")
SENT_US = struct.Struct("!I")  # DATAGRAM's first field, stamped as a datagram leaves (modulo 2^32 us)
DATAGRAM_HEADER_BYTES = HEADER.size + DATAGRAM.size
_HEADER_AND_DATAGRAM = struct.Struct(HEADER.format + DATAGRAM.format[1:])

# Bounds the decoder enforces so that a corrupt header cannot make us allocate or wait for garbage.
MAX_MESSAGE_BYTES = 1 << 32
MAX_FRAGMENT_BYTES = 1 << 32


class FrameError(ValueError):
    """A frame that does not follow the wire format."""


class Frame(NamedTuple):
    kind: int
    role: str
    rank: int
    step: int
    tag: int        # the job's: jobs sharing hosts never take each other's frames
    iteration: int
    tensor: int
    offset: int
    length: int
    total: int


def encode_header(frame: Frame) -> bytes:
    """Pack a frame header; the payload (frame.length bytes) is sent after it."""
    if not 0 <= frame.offset <= frame.total - frame.length:
        raise FrameError(f"fragment {frame.offset}+{frame.length} lies outside a {frame.total}-byte message")
    return HEADER.pack(MAGIC, VERSION, frame.kind, ROLES.index(frame.role), frame.rank,
                       frame.step, frame.tag, frame.iteration, frame.tensor,
                       frame.offset, frame.length, frame.total)


def decode_header(data: bytes | bytearray | memoryview) -> Frame:
    """Unpack and validate a header; raise FrameError on anything malformed."""
    if len(data) != HEADER.size:
        raise FrameError(f"header is {len(data)} bytes, expected {HEADER.size}")
    return _checked_frame(*HEADER.unpack(data))


def _checked_frame(magic: bytes, version: int, kind: int, role: int, rank: int, step: int, tag: int,
                   iteration: int, tensor: int, offset: int, length: int, total: int) -> Frame:
    if magic != MAGIC:
        raise FrameError(f"bad magic {bytes(magic)!r}")
    if version != VERSION:
        raise FrameError(f"unsupported version {version}")
    if kind not in KINDS:
        raise FrameError(f"unknown frame kind {kind}")
    if role >= len(ROLES):
        raise FrameError(f"unknown sender role {role}")
    if total > MAX_MESSAGE_BYTES or length > MAX_FRAGMENT_BYTES:
        raise FrameError(f"message of {max(total, length)} bytes exceeds the limit")
    if offset + length > total:
        raise FrameError(f"fragment {offset}+{length} lies outside a {total}-byte message")
    if kind == KIND_HELLO and total:
        raise FrameError("hello frame carries a payload")
    return Frame(kind, ROLES[role], rank, step, tag, iteration, tensor, offset, length, total)


class Datagram(NamedTuple):
    frame: Frame
    sent_us: int
    fragment_bytes: int
    delivered: int
    advised_kbps: int
    payload: memoryview


def nack_bitmap_bytes(total: int, fragment_bytes: int) -> int:
    return (-(-total // fragment_bytes) + 7) // 8


def encode_datagram_header(frame: Frame, sent_us: int, fragment_bytes: int, delivered: int = 0,
                           advised_kbps: int = 0) -> bytes:
    """Header + datagram extension; the payload (frame.length bytes) follows in the same datagram."""
    return encode_header(frame) + DATAGRAM.pack(sent_us, fragment_bytes, delivered, advised_kbps)


def decode_datagram(data: memoryview) -> Datagram:
    """Unpack and validate one whole datagram; raise FrameError on anything malformed."""
    if len(data) < DATAGRAM_HEADER_BYTES:
        raise FrameError(f"datagram of {len(data)} bytes is shorter than its header")
    *header, sent_us, fragment_bytes, delivered, advised_kbps = _HEADER_AND_DATAGRAM.unpack_from(data)
    frame = _checked_frame(*header)  # one unpack for both: this runs for every datagram received
    payload = data[DATAGRAM_HEADER_BYTES:]
    if len(payload) != frame.length:
        raise FrameError(f"datagram carries {len(payload)} payload bytes, header says {frame.length}")
    if delivered > frame.total:
        raise FrameError(f"{delivered} bytes delivered of a {frame.total}-byte message")
    if frame.kind in (KIND_DATA, KIND_NACK) and fragment_bytes == 0:
        raise FrameError("fragment size 0")
    if frame.kind == KIND_DATA and (frame.offset % fragment_bytes  # header alone: mlt's probe of a fragment
                                    or frame.length not in (0, min(fragment_bytes, frame.total - frame.offset))):
        raise FrameError(f"fragment {frame.offset}+{frame.length} is off the {fragment_bytes}-byte grid "
                         f"of a {frame.total}-byte message")
    if frame.kind == KIND_NACK and (frame.offset or frame.length != nack_bitmap_bytes(frame.total, fragment_bytes)):
        raise FrameError(f"NACK bitmap of {frame.length} bytes for {-(-frame.total // fragment_bytes)} fragments")
    if frame.kind == KIND_PATHS and (frame.offset or frame.length % 2 or 2 * frame.step > frame.length):
        raise FrameError(f"PATHS payload of {frame.length} bytes is not a list of 16-bit ports, {frame.step} "
                         f"of them congested")
    if frame.kind not in (KIND_DATA, KIND_NACK, KIND_PATHS) and frame.length:
        raise FrameError(f"control frame kind {frame.kind} carries a payload")
    return Datagram(frame, sent_us, fragment_bytes, delivered, advised_kbps, payload)

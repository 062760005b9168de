"""Wire format of host-app messages: the one place that encodes and decodes frames.

A frame is a fixed header followed by `length` payload bytes.  The header is
self-describing so that a datagram transport can carry one fragment of a
message per packet and the receiver needs no other state to place it:
(job, iteration, tensor, step) names the message, `offset`/`length` place the
fragment inside it and `total` is the message size.  The sender's role and
rank are in every header because a loss-tolerant transport sends from random
source ports.  TCP sends each message as a single fragment.
"""
import struct
from typing import NamedTuple

MAGIC = b"HA"
VERSION = 1

KIND_HELLO = 1  # first frame on a connection: who is dialing
KIND_DATA = 2   # a fragment of a tensor message
KINDS = (KIND_HELLO, KIND_DATA)

ROLES = ("worker", "server")

# magic, version, kind, role, rank, step, job, iteration, tensor, offset, length, total
HEADER = struct.Struct("!2sBBBHHIIIQIQ")

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
    job: int
    iteration: int
    tensor: int
    offset: int
    length: int
    total: int


def encode_header(frame: Frame) -> bytes:
    """Pack a frame header; the payload (frame.length bytes) is sent after it."""
    if not 0 <= frame.offset <= frame.total - frame.length:
        raise FrameError("fragment %d+%d lies outside a %d-byte message"
                         % (frame.offset, frame.length, frame.total))
    return HEADER.pack(MAGIC, VERSION, frame.kind, ROLES.index(frame.role), frame.rank,
                       frame.step, frame.job, frame.iteration, frame.tensor,
                       frame.offset, frame.length, frame.total)


def decode_header(data: bytes | bytearray | memoryview) -> Frame:
    """Unpack and validate a header; raise FrameError on anything malformed."""
    if len(data) != HEADER.size:
        raise FrameError("header is %d bytes, expected %d" % (len(data), HEADER.size))
    (magic, version, kind, role, rank, step, job, iteration, tensor,
     offset, length, total) = HEADER.unpack(data)
    if magic != MAGIC:
        raise FrameError("bad magic %r" % bytes(magic))
    if version != VERSION:
        raise FrameError("unsupported version %d" % version)
    if kind not in KINDS:
        raise FrameError("unknown frame kind %d" % kind)
    if role >= len(ROLES):
        raise FrameError("unknown sender role %d" % role)
    if total > MAX_MESSAGE_BYTES or length > MAX_FRAGMENT_BYTES:
        raise FrameError("message of %d bytes exceeds the limit" % max(total, length))
    if offset + length > total:
        raise FrameError("fragment %d+%d lies outside a %d-byte message" % (offset, length, total))
    if kind == KIND_HELLO and total:
        raise FrameError("hello frame carries a payload")
    return Frame(kind, ROLES[role], rank, step, job, iteration, tensor, offset, length, total)

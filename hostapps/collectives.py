"""Collectives over a Transport: ring all-reduce, fusion buckets and parameter-server shards."""
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from hostapps.transport import MessageKey, Peer, Transport

# Message steps of the parameter server: gradients go up, parameters come back.
PS_PUSH = 0
PS_PULL = 1

# The two phases of a collective, as the records name them: REDUCE messages carry contributions to a sum and
# tolerate loss (ring reduce-scatter, PS push); GATHER messages carry what every replica must agree on and
# arrive whole (ring all-gather, PS pull, and the send orders' agreements).
REDUCE = "reduce"
GATHER = "gather"
PHASES = (REDUCE, GATHER)

# Values of the frame header's 16-bit step field (codec.HEADER).
STEP_VALUES = 1 << 16
# Slices one PS tensor can have: a slice's step is 2 * slice + PS_PUSH or PS_PULL (ps_key).
MAX_PS_SLICES = STEP_VALUES // 2

# Fusion thresholds in bytes: Horovod's HOROVOD_FUSION_THRESHOLD default (64 MB)
# and PyTorch DDP's bucket_cap_mb default (25 MiB); "none" sends each layer alone.
FUSION_PRESETS = {"none": 0, "horovod": 64 * 1024 * 1024, "ddp": 25 * 1024 * 1024}


def chunk_bounds(size: int, parts: int) -> list[tuple[int, int]]:
    """Split range(size) into `parts` contiguous chunks whose sizes differ by at most one."""
    base, extra = divmod(size, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def _ring_steps(transport: Transport, left: Peer, right: Peer, rank: int, world: int, iteration: int,
                tensor: int, flat: np.ndarray, scratch: np.ndarray, first_step: int) -> Iterator[None]:
    """Ring all-reduce of `flat` to its mean, yielding after each send: the next resumption receives
    that step's chunk.  Messages are keyed (iteration, tensor, first_step + step); the reduce-scatter's
    tolerate loss, the all-gather's are exact (ring_allreduce)."""
    bounds = chunk_bounds(flat.size, world)
    for step in range(world - 1):
        send_lo, send_hi = bounds[(rank - step) % world]
        recv_lo, recv_hi = bounds[(rank - step - 1) % world]
        key = MessageKey(iteration, tensor, first_step + step)
        transport.send(right, key, flat[send_lo:send_hi], tolerate_loss=True)
        yield
        incoming = scratch[:recv_hi - recv_lo]
        transport.recv(left, key, out=incoming)
        flat[recv_lo:recv_hi] += incoming
    own_lo, own_hi = bounds[(rank + 1) % world]
    flat[own_lo:own_hi] *= np.float32(1.0 / world)
    for step in range(world - 1):
        send_lo, send_hi = bounds[(rank + 1 - step) % world]
        recv_lo, recv_hi = bounds[(rank - step) % world]
        key = MessageKey(iteration, tensor, first_step + world - 1 + step)
        transport.send(right, key, flat[send_lo:send_hi])
        yield
        transport.recv(left, key, out=flat[recv_lo:recv_hi])


def ring_allreduce(transport: Transport, left: Peer, right: Peer, rank: int, world: int,
                   iteration: int, tensor: int, flat: np.ndarray, scratch: np.ndarray) -> None:
    """Replace `flat` in place by its mean over the ring: reduce-scatter, then all-gather.

    Each of the 2(world-1) steps sends one of `world` chunks to the right
    neighbour and receives one from the left, so every rank sends and receives
    2(world-1)/world of the tensor.  `scratch` holds at least one chunk.

    Loss (a transport with a loss bound) is tolerated only where the math allows.
    The reduce-scatter's partial sums are sent tolerate_loss: one may arrive short
    (at least 1 - loss_bound of it), its missing elements zero.  The rule is
    zero-fill: such an element of the sum lacks the contributions that partial
    sum carried (up to world-1 of them) and is still divided by world, so the
    step shrinks there, as if those workers skipped it (MLT, NSDI'24, zero-fills
    lost gradient bytes too).  Averaging over the contributions that arrived
    would need each element's count to travel with the partial sum (a partial
    sum does not say how many contributions it holds): a second message per
    hop or a quarter more bytes, so not here (the parameter server, whose every
    push is one contribution, does average over arrivals).  The all-gather's
    messages are exact: the transport recovers every lost byte, so every rank
    ends with bit-identical values and replicas never diverge.  OptiReduce
    (NSDI'25) lets both rounds of its Transpose AllReduce go over a bounded-loss
    transport and spreads lost entries with a Hadamard transform; we bound loss
    in the reduce phase only and have no Hadamard transform.
    """
    if world > 1:
        for _ in _ring_steps(transport, left, right, rank, world, iteration, tensor, flat, scratch, 0):
            pass


def ring_step_count(world: int) -> int:
    return 2 * (world - 1)


def max_segments(world: int) -> int:
    """Segments one tensor's pipeline can have: their steps share the 16-bit step field of the frame header."""
    return STEP_VALUES // max(1, ring_step_count(world))


def segment_bounds(size: int, segment_elements: int, world: int, grid: int) -> list[tuple[int, int]]:
    """Cut range(size), the elements of one all-reduce unit, into pipeline segments of about
    `segment_elements` each (at least one): a whole number of world x grid elements, so each of a segment's
    ring chunks fills whole datagrams of `grid` elements, save the last segment, which takes the remainder
    (one under half a segment is folded into the segment before it).  Segments of exactly segment_elements
    would end every chunk with a short datagram: more datagrams for the same bytes, each one a wake-up of
    the sender and the receiver."""
    block = world * grid
    step = block * max(1, round(segment_elements / block), -(-size // (block * max_segments(world))))
    bounds = [(lo, min(size, lo + step)) for lo in range(0, size, step)] or [(0, 0)]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] < step // 2:
        bounds[-2:] = [(bounds[-2][0], size)]
    return bounds


@dataclass(frozen=True)
class Segment:
    """One ring all-reduce of a pipeline: its messages are keyed (iteration, tensor, first_step + step)."""
    tensor: int
    first_step: int
    flat: np.ndarray


def pipelined_ring_allreduce(transport: Transport, left: Peer, right: Peer, rank: int, world: int,
                             iteration: int, segments: Sequence[Segment], scratch: np.ndarray) -> None:
    """All-reduce every segment to its mean, as a wavefront: segment k starts one step after segment k-1,
    so one segment's reduction and latency overlap the others' transfers (Caramel's pipelining).

    Deadlock-free because every rank runs the same schedule: in each tick a rank
    receives only chunks its left neighbour sent in an earlier tick.  `scratch`
    holds at least one chunk of the largest segment.
    """
    if world == 1:
        return
    waiting = [_ring_steps(transport, left, right, rank, world, iteration, s.tensor, s.flat, scratch, s.first_step)
               for s in segments]
    active: list[Iterator[None]] = []
    while waiting or active:
        if waiting:
            active.append(waiting.pop(0))
        active = [ring for ring in active if next(ring, StopIteration) is not StopIteration]


def ring_phase(world: int, step: int) -> str:
    """REDUCE or GATHER: the half of a ring all-reduce (of any segment of a pipeline) a message step is in."""
    return REDUCE if step % ring_step_count(world) < world - 1 else GATHER


def ps_phase(step: int) -> str:
    """REDUCE for a PS push, GATHER for a pull (ps_key)."""
    return REDUCE if step % 2 == PS_PUSH else GATHER


def ring_min(transport: Transport, left: Peer, right: Peer, world: int, key: MessageKey, value: int) -> int:
    """Minimum of every rank's `value`: each rank passes on what it last heard, world-1 hops, keyed
    (key.iteration, key.tensor, key.step + hop); exact messages, as every rank must agree."""
    passing, lowest = np.array([value], dtype=np.int64), value
    for hop in range(world - 1):
        hop_key = MessageKey(key.iteration, key.tensor, key.step + hop)
        transport.send(right, hop_key, passing)
        passing = np.empty(1, dtype=np.int64)
        transport.recv(left, hop_key, out=passing)
        lowest = min(lowest, int(passing[0]))
    return lowest


def ring_neighbours(rank: int, world: int) -> tuple[Peer, Peer]:
    """(left, right) workers of `rank` on the ring."""
    return Peer("worker", (rank - 1) % world), Peer("worker", (rank + 1) % world)


def make_buckets(layer_bytes: Sequence[int], threshold: int, growth: int = 1) -> list[tuple[int, ...]]:
    """Group layers in backward order (last first) into buckets of at least `threshold` bytes.

    Like DDP's buckets, a bucket closes as soon as it reaches the threshold;
    threshold 0 gives one bucket per layer.  Each next bucket's threshold is
    `growth` times the previous one (Caramel: small early buckets start
    communication sooner).  Layers in a bucket are adjacent, so a bucket is one
    contiguous slice of the flat gradient buffer.
    """
    buckets, current, current_bytes = [], [], 0
    for layer in reversed(range(len(layer_bytes))):
        current.append(layer)
        current_bytes += layer_bytes[layer]
        if current_bytes >= threshold:
            buckets.append(tuple(current))
            current, current_bytes = [], 0
            threshold *= growth
    if current:
        buckets.append(tuple(current))
    return buckets


def split_bytes(nbytes: int, part_bytes: int) -> int:
    """How many parts of at most `part_bytes` a message of `nbytes` is cut into (at least one)."""
    return max(1, -(-nbytes // part_bytes))


def float_parts(where: slice, part_bytes: int) -> list[slice]:
    """`where`, a slice of a flat float32 buffer, cut into split_bytes(its bytes, part_bytes) contiguous
    slices whose sizes differ by at most one float (so none exceeds a part_bytes that is a multiple of 4);
    part_bytes 0 leaves it whole."""
    size = where.stop - where.start
    parts = split_bytes(size * 4, part_bytes) if part_bytes else 1
    return [slice(where.start + lo, where.start + hi) for lo, hi in chunk_bounds(size, parts)]


def ps_key(iteration: int, tensor: int, part: int, direction: int) -> MessageKey:
    """The message of slice `part` of a PS tensor going up (PS_PUSH) or down (PS_PULL).  The tensor id stays
    the layer's, so per-tensor maps (DSCP classes, names) apply to every slice; unsliced is step PS_PUSH/PS_PULL."""
    return MessageKey(iteration, tensor, 2 * part + direction)


def ps_request_key(iteration: int, layers: int) -> MessageKey:
    """An inference worker's request for iteration's parameters (what starts their return, as a TensorFlow
    worker's receive ops do): a PS push of the tensor after the model's `layers`."""
    return ps_key(iteration, layers, 0, PS_PUSH)


def assign_shards(sizes: Sequence[int], shards: int) -> list[int]:
    """Shard of each tensor, balancing bytes: largest tensor first onto the least-loaded shard."""
    load = [0] * shards
    owner = [0] * len(sizes)
    for tensor in sorted(range(len(sizes)), key=lambda t: (-sizes[t], t)):
        shard = min(range(shards), key=lambda s: (load[s], s))
        owner[tensor] = shard
        load[shard] += sizes[tensor]
    return owner

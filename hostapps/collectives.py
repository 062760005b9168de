"""Collectives over a Transport: fusion buckets, parameter-server shards and the ring agreement; the
all-reduce algorithms are hostapps/allreduce's."""
from typing import Sequence

import numpy as np

# The all-reduce's phases, chunking and ring (hostapps/allreduce), which the records, the runs table and
# the loopback benchmark read here.
from hostapps.allreduce import (GATHER, PHASES, REDUCE, STEP_VALUES, chunk_bounds, ring_allreduce,  # noqa: F401
                                ring_neighbours, ring_phase)
from hostapps.transport import MessageKey, Peer, Transport

# Message steps of the parameter server: gradients go up, parameters come back.
PS_PUSH = 0
PS_PULL = 1

# Slices one PS tensor can have: a slice's step is 2 * slice + PS_PUSH or PS_PULL (ps_key).
MAX_PS_SLICES = STEP_VALUES // 2

# Fusion thresholds in bytes: Horovod's HOROVOD_FUSION_THRESHOLD default (64 MB)
# and PyTorch DDP's bucket_cap_mb default (25 MiB); "none" sends each layer alone.
FUSION_PRESETS = {"none": 0, "horovod": 64 * 1024 * 1024, "ddp": 25 * 1024 * 1024}


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

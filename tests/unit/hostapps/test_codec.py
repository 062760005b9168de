"""Wire codec and the pure helpers of the collectives: property tests."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from hostapps import codec
from hostapps.collectives import assign_shards, chunk_bounds, make_buckets

u32 = st.integers(0, 2**32 - 1)


@st.composite
def frames(draw):
    total = draw(st.integers(0, codec.MAX_MESSAGE_BYTES))
    offset = draw(st.integers(0, total))
    length = draw(st.integers(0, min(total - offset, codec.MAX_FRAGMENT_BYTES)))
    return codec.Frame(codec.KIND_DATA, draw(st.sampled_from(codec.ROLES)), draw(st.integers(0, 65535)),
                       draw(st.integers(0, 65535)), draw(u32), draw(u32), draw(u32), offset, length, total)


@given(frames())
def test_header_round_trip(frame):
    data = codec.encode_header(frame)
    assert len(data) == codec.HEADER.size
    assert codec.decode_header(data) == frame


@given(frames(), st.integers(0, codec.HEADER.size - 1), st.integers(1, 255))
def test_corrupted_header_is_rejected_or_decodes_consistently(frame, position, flip):
    data = bytearray(codec.encode_header(frame))
    data[position] ^= flip
    try:
        decoded = codec.decode_header(data)
    except codec.FrameError:
        return
    # Whatever the decoder accepts must be a frame it would itself produce.
    assert codec.decode_header(codec.encode_header(decoded)) == decoded
    assert decoded.offset + decoded.length <= decoded.total <= codec.MAX_MESSAGE_BYTES


def _header(**changes):
    fields = dict(magic=codec.MAGIC, version=codec.VERSION, kind=codec.KIND_DATA, role=0, rank=0, step=0,
                  tag=0, iteration=0, tensor=0, offset=0, length=4, total=4)
    fields.update(changes)
    return codec.HEADER.pack(*fields.values())


@pytest.mark.parametrize("changes, message", [
    (dict(magic=b"XX"), "bad magic"),
    (dict(version=9), "unsupported version"),
    (dict(kind=max(codec.KINDS) + 1), "unknown frame kind"),
    (dict(role=5), "unknown sender role"),
    (dict(offset=2, length=4, total=4), "outside"),
    (dict(total=codec.MAX_MESSAGE_BYTES + 1, length=0), "exceeds"),
    (dict(kind=codec.KIND_HELLO), "hello frame carries a payload"),
])
def test_malformed_headers_are_rejected(changes, message):
    with pytest.raises(codec.FrameError, match=message):
        codec.decode_header(_header(**changes))


def test_truncated_header_is_rejected():
    with pytest.raises(codec.FrameError, match="header is"):
        codec.decode_header(_header()[:-1])


@given(st.integers(0, 10**6), st.integers(1, 64))
def test_chunks_cover_the_range_in_order(size, parts):
    bounds = chunk_bounds(size, parts)
    assert len(bounds) == parts
    assert bounds[0][0] == 0 and bounds[-1][1] == size
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    lengths = [hi - lo for lo, hi in bounds]
    assert max(lengths) - min(lengths) <= 1


@given(st.lists(st.integers(1, 10**6), min_size=1, max_size=40), st.integers(0, 4 * 10**6))
def test_buckets_hold_every_layer_once_in_backward_order(sizes, threshold):
    buckets = make_buckets(sizes, threshold)
    order = [layer for bucket in buckets for layer in bucket]
    assert order == list(reversed(range(len(sizes))))
    for bucket in buckets[:-1]:
        assert sum(sizes[layer] for layer in bucket) >= threshold
        # A bucket closes as soon as it reaches the threshold.
        assert len(bucket) == 1 or sum(sizes[layer] for layer in bucket[:-1]) < threshold


@given(st.lists(st.integers(1, 10**6), min_size=1, max_size=60), st.integers(1, 8))
def test_shards_are_balanced_within_the_largest_tensor(sizes, shards):
    owner = assign_shards(sizes, shards)
    load = np.bincount(owner, weights=sizes, minlength=shards)
    assert len(owner) == len(sizes) and set(owner) <= set(range(shards))
    if len(sizes) >= shards:
        assert min(load) > 0
    assert max(load) - min(load) <= max(sizes)


@pytest.mark.parametrize("offset, length, fine", [
    (200, 24, True),   # the last fragment of a 224-byte message in 100-byte fragments
    (200, 0, True),    # its header alone: mlt's probe
    (100, 0, True),
    (150, 0, False),   # off the grid
    (100, 50, False),  # a fragment cut short
])
def test_data_datagrams_are_whole_fragments_on_the_grid_or_a_header_alone(offset, length, fine):
    frame = codec.Frame(codec.KIND_DATA, "worker", 0, 0, 0, 0, 0, offset, length, 224)
    data = memoryview(codec.encode_datagram_header(frame, 0, 100) + bytes(length))
    if fine:
        assert codec.decode_datagram(data).frame == frame
    else:
        with pytest.raises(codec.FrameError, match="grid"):
            codec.decode_datagram(data)

"""Forged, absurd, late and reordered mlt datagrams against the receiving end in-process: the path a datagram
takes in MltTransport (codec.decode_datagram, Peers.sender_of, Receiver.on_data and its ticks), without
sockets, threads or a real clock.

Whatever arrives: no exception escapes, the memory held is bounded by the job's limits (its largest
message, its fragment size, the caps of receiver.py), not by what a header says, each datagram that is
recognisably bad costs a counter, and a legitimate message still completes exactly once, right.
"""
from unittest import mock

import numpy as np
from hypothesis import given, settings, strategies as st

from hostapps import codec
from hostapps.assembly import mlt_options
from hostapps.mlt import MltStats, wire
from hostapps.mlt import receiver as mlt_receiver
from hostapps.mlt.peers import Peers
from hostapps.mlt.receiver import Delivery, Receiver, reassembly_bytes
from hostapps.mlt.sender import Sender
from hostapps.transport import MessageKey, Peer

SENDER, RECEIVER = Peer("worker", 0), Peer("server", 0)
HOST = "10.0.0.1"
TAG, TIMEOUT, FRAGMENT, LARGEST = 7, 5.0, 100, 1200  # the job's limits: fragment size, largest message
KEY = MessageKey(3, 1, 0)  # the legitimate message's
REMEMBERED = 8  # the receiver's cap on completed messages, small enough for forgeries to reach it
# What a datagram the receiver recognises as bad may cost: one of these counters.
COUNTERS = ("malformed", "foreign", "oversized", "over_budget", "mismatched", "duplicates", "late_probes", "stale")
U16, U32, U64 = 2**16 - 1, 2**32 - 1, 2**64 - 1


def raw(kind: int = codec.KIND_DATA, role: int = 0, rank: int = 0, step: int = 0, tag: int = TAG, iteration: int = 0,
        tensor: int = 0, offset: int = 0, length: int = 0, total: int = 0, fragment_bytes: int = FRAGMENT,
        delivered: int = 0, payload: bytes = b"") -> bytes:
    """A datagram with any header fields, packed as they are (the codec's encoder would refuse the absurd)."""
    header = codec.HEADER.pack(codec.MAGIC, codec.VERSION, kind, role, rank, step, tag, iteration, tensor, offset,
                               length, total)
    return header + codec.DATAGRAM.pack(0, fragment_bytes, delivered, 0) + payload


def legit(message: bytes, index: int, required: int, probe: bool = False) -> bytes:
    """Fragment `index` of the legitimate message as its sender sends it, or its probe (the last one's header)."""
    offset = index * FRAGMENT
    payload = b"" if probe else message[offset:offset + FRAGMENT]
    return raw(step=KEY.step, iteration=KEY.iteration, tensor=KEY.tensor, offset=offset, length=len(payload),
               total=len(message), delivered=required, payload=payload)


@st.composite
def absurd(draw, message: bytes) -> bytes:
    """A DATA datagram a receiver of this job must recognise as bad: its fragment size is not the job's or it
    declares more than the job's largest message (the legitimate key's, or any), or it is not of our job or
    peers, or its header does not hold together."""
    total = draw(st.one_of(st.integers(0, U64), st.just(len(message)), st.integers(LARGEST + 1, U64)))
    fragment_bytes = draw(st.one_of(st.integers(0, U32), st.just(U32), st.sampled_from([1, 4, FRAGMENT + 4])))
    if fragment_bytes == FRAGMENT and total <= LARGEST:
        fragment_bytes = U32  # on the job's grid: not recognisably bad
    legit_key = draw(st.booleans())
    length = draw(st.one_of(st.just(0), st.integers(0, 300), st.integers(0, U32)))
    fields = dict(
        step=KEY.step if legit_key else draw(st.integers(0, U16)),
        iteration=KEY.iteration if legit_key else draw(st.integers(0, U32)),
        tensor=KEY.tensor if legit_key else draw(st.integers(0, U32)),
        offset=draw(st.one_of(st.just(0), st.integers(0, U64))), length=length, total=total,
        fragment_bytes=fragment_bytes, delivered=draw(st.one_of(st.just(0), st.integers(0, U64))),
        payload=draw(st.binary(max_size=300)) if draw(st.booleans()) else bytes(min(length, 300)))
    stranger = draw(st.sampled_from([{}, {"tag": TAG + 1}, {"rank": 9}, {"role": 1}, {"kind": 0}, {"kind": 99}]))
    return raw(**fields, **stranger)


@st.composite
def forged_probe(draw, message: bytes) -> bytes:
    """A probe of the legitimate message on the job's grid, as anyone on its sender's host could send it: not
    recognisable, it must still neither complete the message short of what its sender requires nor hold it up."""
    return raw(step=KEY.step, iteration=KEY.iteration, tensor=KEY.tensor, total=len(message),
               delivered=draw(st.integers(0, len(message))))


@st.composite
def other_message(draw) -> tuple[MessageKey, bytes]:
    """A one-datagram message of another key, of an older iteration: indistinguishable from a real one."""
    key = MessageKey(draw(st.integers(0, KEY.iteration - 1)), draw(st.integers(0, U32)), draw(st.integers(0, U16)))
    return key, raw(step=key.step, iteration=key.iteration, tensor=key.tensor, length=4, total=4,
                    delivered=4, payload=b"\x01\x02\x03\x04")


@st.composite
def scenarios(draw):
    """The legitimate message (size, loss bound, what its sender requires) and what arrives: its fragments in
    any order with duplicates, its probes, forgeries and ticks; then, once it is complete, late duplicates,
    late probes, more forgeries and ticks, with the clock jumping past the sender's timeout."""
    size = draw(st.integers(1, LARGEST))
    message = np.random.default_rng(draw(st.integers(0, U32))).bytes(size)
    loss_bound = draw(st.sampled_from([0.0, 0.1, 0.3]))
    fragments = wire.fragment_count(size, FRAGMENT)
    exact = loss_bound == 0 or draw(st.booleans())
    lost_ok = 0 if exact else min(int(loss_bound * size) // FRAGMENT, fragments - 1) * FRAGMENT
    required = size - lost_ok
    order = draw(st.permutations(range(fragments)))

    def noise(late: bool):
        return st.one_of(
            st.tuples(st.just("absurd"), absurd(message)),
            st.tuples(st.just("forged probe"), forged_probe(message)),
            st.tuples(st.just("other"), other_message()),
            st.tuples(st.just("bytes"), st.binary(max_size=120)),
            st.tuples(st.just("tick"), st.floats(0, 3 * TIMEOUT if late else 0.004)),
            st.tuples(st.just("duplicate"), st.integers(0, fragments - 1)),
            st.tuples(st.just("probe"), st.just(None)))
    events = []
    for index in order:
        events += draw(st.lists(noise(False), max_size=3)) + [("fragment", index)]
    events += draw(st.lists(noise(True), max_size=12))
    return message, loss_bound, required, events


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_whatever_arrives_costs_a_counter_and_bounded_memory_and_the_real_message_completes_once(scenario):
    message, loss_bound, required, events = scenario
    with mock.patch.object(mlt_receiver, "MAX_REMEMBERED", REMEMBERED):
        stats = MltStats()
        machine = Receiver(RECEIVER, TAG, mlt_options(mtu_payload=FRAGMENT, loss_bound=loss_bound,
                                                      max_message_bytes=LARGEST), TIMEOUT, stats)
        peers = Peers(TAG)
        peers.hosts[SENDER] = HOST
        now, sent, deliveries = 0.0, set(), {}
        complete = False
        for what, detail in events:
            if what == "tick":
                now += detail
                actions = machine.tick(now)
            else:
                data = {"absurd": lambda: detail, "bytes": lambda: detail, "forged probe": lambda: detail,
                        "other": lambda: detail[1], "fragment": lambda: legit(message, detail, required),
                        "duplicate": lambda: legit(message, detail, required),
                        "probe": lambda: legit(message, wire.fragment_count(len(message), FRAGMENT) - 1, required,
                                               probe=True)}[what]()
                counted = sum(getattr(stats, name) for name in COUNTERS)
                actions = arrive(machine, peers, stats, data, now)
                # Recognisably bad: absurd, or a fragment again (a duplicate, or any once the message is complete)
                bad = what == "absurd" or (what == "duplicate" and detail in sent) or (
                    complete and what in ("fragment", "duplicate", "probe"))
                assert not bad or sum(getattr(stats, name) for name in COUNTERS) > counted, (what, detail)
                sent |= {detail} if what in ("fragment", "duplicate") else set()
            for action in actions:
                if isinstance(action, Delivery):
                    assert action.key not in deliveries, f"{action.key} delivered twice"
                    deliveries[action.key] = action.message
                    complete |= action.key == KEY
                elif complete:  # nothing of the message NACKed once it is complete
                    reply = codec.decode_datagram(memoryview(action.datagram))
                    key = MessageKey(reply.frame.iteration, reply.frame.tensor, reply.frame.step)
                    assert not (key == KEY and reply.frame.kind == codec.KIND_NACK)
            assert_bounded(machine)
        if not complete:  # only a probe ends the sender's pass early; quiet periods end the rest
            actions = machine.tick(now + 1.0)
            complete = any(isinstance(a, Delivery) and a.key == KEY for a in actions)
            deliveries.update({a.key: a.message for a in actions if isinstance(a, Delivery)})
        assert complete
    delivered = deliveries[KEY]  # what arrived is the message's, what did not reads zero
    for index, got in enumerate(delivered.received):
        piece = message[index * FRAGMENT:(index + 1) * FRAGMENT]
        assert delivered.buffer[index * FRAGMENT:][:len(piece)].tobytes() == (piece if got else bytes(len(piece)))
    assert delivered.delivered >= required  # whatever a forged probe said was required


def arrive(machine: Receiver, peers: Peers, stats: MltStats, data: bytes, now: float) -> list:
    """What MltTransport does with a datagram from the sender's host, up to the receiver machine."""
    try:
        datagram = codec.decode_datagram(memoryview(data))
    except codec.FrameError:
        stats.malformed += 1
        return []
    peer = peers.sender_of(datagram.frame, HOST)
    if peer is None:
        stats.foreign += 1
        return []
    if datagram.frame.kind != codec.KIND_DATA:  # feedback and control: the sender's and the transport's
        return []
    return list(machine.on_data(peer, datagram, now))


def assert_bounded(machine: Receiver) -> None:
    """The memory the receiver holds is bounded by the job's limits and its own caps."""
    held = 0
    for (peer, _), reassembly in machine.incoming.items():
        assert reassembly.buffer.nbytes <= LARGEST and reassembly.fragment_bytes == FRAGMENT
        assert reassembly.received.size <= wire.fragment_count(LARGEST, FRAGMENT)
        held += reassembly_bytes(reassembly.total, reassembly.fragment_bytes)
    assert held == sum(machine._held_bytes.values()) <= max(mlt_receiver.INCOMPLETE_BYTES, 2 * LARGEST)
    assert len(machine.incoming) <= mlt_receiver.MAX_INCOMPLETE_MESSAGES
    assert machine.remembered() <= REMEMBERED


@st.composite
def feedback(draw) -> bytes:
    """An ACK or NACK of the sent message, from its receiver's host, with any grid, size and bitmap."""
    total = draw(st.one_of(st.just(1000), st.integers(0, U64)))
    fragment_bytes = draw(st.one_of(st.just(FRAGMENT), st.integers(0, U32)))
    bitmap = draw(st.one_of(st.binary(max_size=64), st.just(b"\xff" * codec.nack_bitmap_bytes(1000, FRAGMENT))))
    return raw(kind=draw(st.sampled_from([codec.KIND_ACK, codec.KIND_NACK])), role=1, step=KEY.step,
               iteration=KEY.iteration, tensor=KEY.tensor, length=len(bitmap), total=total,
               fragment_bytes=fragment_bytes, delivered=draw(st.integers(0, U64)), payload=bitmap)


@settings(max_examples=150, deadline=None)
@given(st.lists(feedback(), max_size=20))
def test_forged_feedback_on_another_grid_is_counted_and_a_nack_resends_only_what_the_message_has(datagrams):
    stats = MltStats()
    machine = Sender(SENDER, TAG, mlt_options(mtu_payload=FRAGMENT, max_message_bytes=LARGEST), TIMEOUT, stats)
    machine.add_peer(RECEIVER)
    message = machine.submit(RECEIVER, KEY, np.zeros(1000, np.uint8), None)
    while machine.first_datagram(message, 0.0) is not None:
        pass
    machine.pass_sent(message, 0.0)
    for data in datagrams:
        try:
            datagram = codec.decode_datagram(memoryview(data))
        except codec.FrameError:
            continue
        counted, released = stats.mismatched + stats.late_feedback, message.released
        machine.on_feedback(RECEIVER, datagram, 0.01)
        off_grid = datagram.frame.total != 1000 or (datagram.frame.kind == codec.KIND_NACK
                                                    and datagram.fragment_bytes != FRAGMENT)
        assert stats.mismatched + stats.late_feedback == counted + (released or off_grid)  # an ACK released it
        while (emission := machine.next_datagram(0.02)) is not None:
            assert emission.frame.offset < 1000 and emission.frame.total == 1000
            if emission.ends_pass:
                machine.pass_sent(emission.message, 0.02)

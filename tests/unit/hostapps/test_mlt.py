"""The loss-tolerant datagram transport: pure reassembly/rate logic, wire fuzzing, loopback transports, training."""
import csv
import errno
import itertools
import json
import random
import socket
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hostapps import assembly, codec
from hostapps.assembly import mlt_options
from hostapps.collectives import ring_phase
from hostapps.config import Model, ProcessConfig, build_model
from hostapps.mlt import (MltOptions, MltTransport, RateControl, Reassembly, fragments_to_resend,
                          least_important_fragments, missing_fragments)
from hostapps.mlt import pacing, receiver as mlt_receiver, sender as mlt_sender, wire
from hostapps.transport import MessageKey, Peer, TransportError
from helpers.loopback import LOOPBACK_MLT, run_job

KEY = MessageKey(3, 1, 0)
SENDER, RECEIVER = Peer("worker", 0), Peer("worker", 1)


def fragments_of(message: bytes, size: int) -> list[tuple[int, bytes]]:
    return [(offset, message[offset:offset + size]) for offset in range(0, len(message), size)] or [(0, b"")]


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=3000), st.integers(1, 200), st.randoms(use_true_random=False),
       st.floats(0, 0.5), st.floats(0, 0.5))
def test_reassembly_under_reordering_duplication_and_loss(message, size, rng, loss, duplication):
    fragments = fragments_of(message, size)
    kept = [f for f in fragments if rng.random() >= loss]
    arrivals = kept + [f for f in kept if rng.random() < duplication]
    rng.shuffle(arrivals)
    reassembly = Reassembly(len(message), size, now=0.0)
    for offset, payload in arrivals:
        reassembly.add(offset, memoryview(payload), now=0.0)
    expected = bytearray(len(message))  # lost fragments read as zero
    for offset, payload in kept:
        expected[offset:offset + len(payload)] = payload
    assert reassembly.buffer.tobytes() == bytes(expected)
    assert reassembly.delivered == sum(len(p) for _, p in set(kept))
    lost = sorted({o // size for o, _ in fragments} - {o // size for o, _ in kept})
    if message:
        assert list(missing_fragments(reassembly.missing_bitmap(), len(message), size)) == lost


def reassembled(total: int, size: int, lost_fragments: set[int], now: float = 0.0) -> Reassembly:
    message = bytes(range(256)) * (total // 256 + 1)
    reassembly = Reassembly(total, size, now)
    for offset, payload in fragments_of(message[:total], size):
        if offset // size not in lost_fragments:
            reassembly.add(offset, memoryview(payload), now)
    return reassembly


def test_loss_bound_decision_at_the_boundary():
    # 2001 bytes in 100-byte fragments (the last is 1 byte); p = 0.05 allows exactly 100 missing bytes.
    exactly_bound = reassembled(2001, 100, {4})
    assert exactly_bound.delivered == 1901 and exactly_bound.within_bound(0.05)
    assert exactly_bound.due(now=0.001, loss_bound=0.05, quiet_s=0.005) is None  # not quiet yet
    assert exactly_bound.due(now=0.005, loss_bound=0.05, quiet_s=0.005) == "complete"
    # Beyond its own share by less than a fragment: what its tensor's earlier messages left unspent may
    # cover it (Sender.allowance), so only the sender's required bytes decide.
    one_byte_more = reassembled(2001, 100, {4, 20})
    assert one_byte_more.delivered == 1900 and one_byte_more.within_bound(0.05)
    one_byte_more.required = 1901
    assert not one_byte_more.within_bound(0.05)
    beyond = reassembled(2001, 100, {4, 5})  # 200 missing: 100 of its own and a whole fragment more
    assert beyond.due(now=0.005, loss_bound=0.05, quiet_s=0.005) == "nack"
    assert list(missing_fragments(beyond.missing_bitmap(), 2001, 100)) == [4, 5]
    beyond.last_nack = 0.005
    assert beyond.due(now=0.006, loss_bound=0.05, quiet_s=0.005) is None  # one NACK per quiet period
    assert reassembled(2001, 100, set()).due(now=0.005, loss_bound=0.0, quiet_s=0.005) == "complete"
    assert reassembled(2001, 100, {4}).due(now=0.005, loss_bound=0.0, quiet_s=0.005) == "nack"  # p=0: all
    # Until the last fragment arrives the sender may still be sending (a stalled thread): no decision,
    # however long the quiet; its probe says when the pass is over.
    no_last = reassembled(2001, 100, {4, 20})
    assert no_last.within_bound(0.1) and no_last.due(now=10.0, loss_bound=0.1, quiet_s=0.005) is None
    no_last.add(2000, memoryview(b"x"), now=0.001)
    assert no_last.due(now=0.006, loss_bound=0.1, quiet_s=0.005) == "complete"


def test_quiet_period_stretches_for_a_slowly_paced_message():
    reassembly = Reassembly(4000, 1000, now=0.0)
    for i, offset in enumerate((0, 1000, 3000)):
        reassembly.add(offset, memoryview(bytes(1000)), now=0.01 * i)
    assert reassembly.quiet_period(0.005) == pytest.approx(0.04)
    assert reassembly.due(now=0.05, loss_bound=0.3, quiet_s=0.005) is None
    assert reassembly.due(now=0.061, loss_bound=0.3, quiet_s=0.005) == "complete"


def test_lost_bytes_read_zero_and_only_whole_elements_count_as_arrived():
    values = np.arange(1, 501, dtype=np.float32)  # 2000 bytes, 102-byte fragments, fragment 3 lost
    reassembly = Reassembly(values.nbytes, 102, now=0.0)
    for offset, payload in fragments_of(values.tobytes(), 102):
        if offset != 306:
            reassembly.add(offset, memoryview(payload), now=0.0)
    gradient = np.full(500, -1.0, dtype=np.float32)
    reassembly.copy_into(gradient)
    arrived = np.zeros(500, dtype=bool)
    reassembly.arrived_elements(arrived, 4)
    lost = slice(76, 102)  # bytes 306..407: floats 76..101 lie partly or wholly in them
    assert np.all(gradient[77:101] == 0) and not arrived[lost].any()
    assert np.array_equal(gradient[arrived], values[arrived]) and arrived.sum() == 500 - 26


def test_a_nack_is_answered_with_just_enough_fragments_important_ones_first():
    missing = np.array([2, 5, 7, 9])
    marked = np.zeros(10, dtype=bool)
    marked[[2, 7]] = True  # the sender let these go as lower-effort
    # 10 fragments of 100 bytes, the last one 50: 150 bytes short of the bound -> two fragments
    assert list(fragments_to_resend(missing, marked, 950, 100, 150)) == [5, 9]
    assert list(fragments_to_resend(missing, marked, 950, 100, 151)) == [5, 9, 2]  # fragment 9 has 50 bytes
    assert list(fragments_to_resend(missing, None, 950, 100, 100)) == [2]
    assert list(fragments_to_resend(missing, None, 950, 100, 350)) == [2, 5, 7, 9]  # loss bound 0: everything
    assert list(fragments_to_resend(missing, None, 950, 100, 0)) == []


def test_drop_marking_picks_the_smallest_fragments_up_to_the_bound():
    values = np.ones(1000, dtype=np.float32)  # 40 fragments of 100 bytes (25 values)
    values[25 * 7:25 * 8] = 1e-3
    values[25 * 30:25 * 31] = -1e-2
    marked = least_important_fragments(values, 100, 2)
    assert list(np.flatnonzero(marked)) == [7, 30]
    assert not least_important_fragments(values, 100, 0).any()
    assert least_important_fragments(values.astype(np.float64), 100, 2) is None


def test_rate_control_backs_off_on_loss_and_probes_back_up():
    rate = RateControl(1e6)
    rate.on_feedback(0.2, now=1.0)
    assert rate.rate == pytest.approx(0.9e6)
    rate.on_feedback(1.0, now=1.0 + pacing.DECREASE_INTERVAL_S / 2)  # the same congestion episode: no second back-off
    assert rate.rate == pytest.approx(0.9e6)
    for i in range(1, 21):  # one episode a second
        rate.on_feedback(1.0, now=1.0 + i)
    assert rate.rate == pytest.approx(5e4)  # the floor: 1/20 of the link
    for _ in range(100):
        rate.on_feedback(0.0, now=30.0)
    assert rate.rate == 1e6  # never above the link
    waits = [rate.reserve(1000, now=10.0) for _ in range(10)]  # 10 KB at 1 MB/s: 10 ms, minus the burst
    assert waits[-1] == pytest.approx(0.01 - pacing.PACING_BURST_S)


def test_receiver_advice_caps_the_rate_and_a_growing_share_lifts_it():
    rate = RateControl(1e6)
    rate.advise(0.25e6)  # four senders share the receiver's link
    assert rate.rate == 0.25e6
    for _ in range(10):
        rate.on_feedback(0.0, now=0.0)
    assert rate.rate == 0.25e6  # probing up stops at the advice
    rate.on_feedback(0.2, now=0.0)  # loss elsewhere on the path
    assert rate.rate == pytest.approx(0.225e6)
    rate.advise(0.5e6)  # two senders left: the share grows by 0.25e6, the back-off stays
    assert rate.rate == pytest.approx(0.475e6)
    rate.advise(1.0)
    assert rate.rate == rate.floor


def test_a_receiver_advises_each_of_its_senders_a_fair_share(loopback_addresses):
    a, b, c = loopback_addresses(3)
    receiver = MltTransport(RECEIVER, c, 0, 5.0, options=mlt_options(**{**LOOPBACK_MLT, "link_mbps": 100}))
    senders = [MltTransport(Peer("worker", 0), a, 0, 5.0, options=mlt_options(**{**LOOPBACK_MLT, "link_mbps": 100})),
               MltTransport(Peer("worker", 2), b, 0, 5.0, options=mlt_options(**{**LOOPBACK_MLT, "link_mbps": 100}))]
    threads = [threading.Thread(target=s.connect, args=({RECEIVER: c}, {})) for s in senders]
    threads.append(threading.Thread(target=receiver.connect, args=({}, {Peer("worker", 0): a, Peer("worker", 2): b})))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    threads = [threading.Thread(target=s.send, args=(RECEIVER, KEY, np.ones(250_000, np.float32))) for s in senders]
    started = time.monotonic()
    for t in threads:
        t.start()
    out = np.empty(250_000, np.float32)
    for s in senders:
        assert receiver.recv(s.me, KEY, out) == 1.0
    elapsed = time.monotonic() - started
    time.sleep(0.05)  # the last ACKs
    # Both 1 MB messages went at once, each paced to about half the receiver's link: 2 MB at 97 Mbit/s
    # take 0.17 s (unadvised, each at its own 100 Mbit/s, 0.08 s).
    assert 0.15 < elapsed < 1.0
    assert min(s._sender.pacer.rates[RECEIVER].advised * 8 / 1e6 for s in senders) == pytest.approx(
        pacing.LINK_SHARE * 100 / 2)
    for t in [threading.Thread(target=x.close) for x in [receiver, *senders]]:
        t.start()


def test_a_peer_that_closes_releases_messages_whose_ack_was_lost(loopback_addresses, monkeypatch):
    sender, receiver = transport_pair(loopback_addresses, timeout=2.0)
    send_control = receiver._send_control
    monkeypatch.setattr(receiver, "_send_control", lambda peer, datagram: None if codec.decode_datagram(
        memoryview(datagram)).frame.kind == codec.KIND_ACK else send_control(peer, datagram))
    sender.send(RECEIVER, KEY, np.ones(1000, np.float32))
    assert receiver.recv(SENDER, KEY, np.empty(1000, np.float32)) == 1.0
    started = time.monotonic()
    close_pair(sender, receiver)  # the receiver's BYE stands for every ACK it owes
    assert time.monotonic() - started < 1.0


def valid_datagram() -> bytes:
    frame = codec.Frame(codec.KIND_DATA, "worker", 2, 1, 7, 9, 4, 200, 100, 1000)
    return codec.encode_datagram_header(frame, 5, 100) + bytes(100)


def test_datagram_round_trip():
    datagram = codec.decode_datagram(memoryview(valid_datagram()))
    assert (datagram.frame.offset, datagram.sent_us, datagram.fragment_bytes, len(datagram.payload)) == (
        200, 5, 100, 100)


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.binary(max_size=200),
                 st.tuples(st.integers(0, len(valid_datagram()) - 1), st.integers(1, 255)).map(
                     lambda flip: bytes(b ^ flip[1] if i == flip[0] else b for i, b in enumerate(valid_datagram()))),
                 st.integers(0, len(valid_datagram())).map(lambda n: valid_datagram()[:n])))
def test_random_bytes_never_crash_the_datagram_decoder(data):
    try:
        datagram = codec.decode_datagram(memoryview(data))
    except codec.FrameError:
        return
    frame = datagram.frame
    assert frame.offset + frame.length <= frame.total and len(datagram.payload) == frame.length


def transport_pair(addresses, options=mlt_options(**LOOPBACK_MLT), drop=None, timeout=5.0, tag=0):
    a, b = addresses(2)
    sender = MltTransport(SENDER, a, tag, timeout, options=options, drop=drop)
    receiver = MltTransport(RECEIVER, b, tag, timeout, options=options)
    threads = [threading.Thread(target=sender.connect, args=({RECEIVER: b}, {})),
               threading.Thread(target=receiver.connect, args=({}, {SENDER: a}))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sender, receiver


def close_pair(sender, receiver):
    threads = [threading.Thread(target=t.close) for t in (sender, receiver)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_nack_retransmission_fills_the_gaps(loopback_addresses):
    first_pass_drops = set()

    def drop_every_third_once(frame):
        index = frame.offset // 1400
        if index % 3 == 0 and index not in first_pass_drops:
            first_pass_drops.add(index)
            return True
        return False
    sender, receiver = transport_pair(loopback_addresses, drop=drop_every_third_once)
    values = np.random.default_rng(0).standard_normal(50_000).astype(np.float32)
    sender.send(RECEIVER, KEY, values)
    out = np.empty_like(values)
    assert receiver.recv(SENDER, KEY, out) == 1.0
    assert np.array_equal(out, values)
    assert receiver.stats.nacks_sent >= 1 and sender.stats.fragments_retransmitted >= len(first_pass_drops) == 48
    close_pair(sender, receiver)


def test_blind_spraying_leaves_the_path_monitor_out(loopback_addresses):
    sender, receiver = transport_pair(loopback_addresses, options=mlt_options(**LOOPBACK_MLT, spray="blind"))
    observed = []
    receiver._monitor.observe = lambda *args: observed.append(args)
    sender.send(RECEIVER, KEY, np.arange(20_000, dtype=np.float32))
    receiver.recv(SENDER, KEY, np.empty(20_000, dtype=np.float32))
    close_pair(sender, receiver)
    assert observed == []


def _data_ports(options: MltOptions, loopback_addresses) -> set[int]:
    """The source ports an 80,000-float message's datagrams left from, as its receiver saw them: 229 datagrams,
    so drawn from a pool of 64 ports they leave from 62 on average (at 58 datagrams, 38 +- 2.4)."""
    sender, receiver = transport_pair(loopback_addresses, options=options)
    ports = set()
    on_bytes = receiver._on_bytes

    def seen(data, host, port, now):
        if data[3] == codec.KIND_DATA:
            ports.add(port)
        on_bytes(data, host, port, now)
    receiver._on_bytes = seen
    sender.send(RECEIVER, KEY, np.arange(80_000, dtype=np.float32))
    receiver.recv(SENDER, KEY, np.empty(80_000, dtype=np.float32))
    close_pair(sender, receiver)
    return ports


def test_one_source_port_makes_a_flow_per_peer_from_the_given_port(loopback_addresses):
    """On a per-flow fabric (sport_range 1) every datagram leaves from --source-port, so ECMP places the
    message as one flow, where the pool sprays it over many ports."""
    (_, port), = loopback_addresses(1)
    assert _data_ports(mlt_options(**LOOPBACK_MLT, sport_range=1, source_port=port), loopback_addresses) == {port}
    assert len(_data_ports(mlt_options(**LOOPBACK_MLT, sport_range=64), loopback_addresses)) > 32


def test_a_busy_source_port_falls_back_to_an_ephemeral_one_and_says_so(loopback_addresses, capfd):
    busy = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    busy.bind(("127.0.0.1", 0))
    port = busy.getsockname()[1]
    try:
        (sent_from,) = _data_ports(mlt_options(**LOOPBACK_MLT, sport_range=1, source_port=port), loopback_addresses)
    finally:
        busy.close()
    assert sent_from != port
    assert f"cannot send from 127.0.0.1:{port}" in capfd.readouterr().err


def test_each_datagram_reaches_the_path_monitor_with_its_port_and_send_stamp(loopback_addresses):
    """Every data datagram is observed once, from one of the sender's source ports, stamped with the
    sender's clock as it left (within the send's wall time)."""
    sender, receiver = transport_pair(loopback_addresses)
    observed = []
    receiver._monitor.observe = lambda peer, port, sent_us, now, dscp: observed.append((peer, port, sent_us))
    values = np.arange(20_000, dtype=np.float32)
    start_us = time.time_ns() // 1000
    sender.send(RECEIVER, KEY, values)
    end_us = time.time_ns() // 1000
    out = np.empty_like(values)
    receiver.recv(SENDER, KEY, out)
    close_pair(sender, receiver)
    assert len(observed) == wire.fragment_count(values.nbytes, sender.options.mtu_payload)
    assert {peer for peer, _, _ in observed} == {SENDER}
    assert {port for _, port, _ in observed} <= set(sender._paths.ports)
    assert all(start_us % (1 << 32) <= sent_us <= end_us % (1 << 32) for _, _, sent_us in observed)


class RefusingSocket:
    """A source socket whose sends are refused at random, as an nft output drop refuses them (EPERM)."""

    def __init__(self, sock: socket.socket, rng: random.Random):
        self.sock, self.rng = sock, rng

    def sendmsg(self, *args):
        if self.rng.random() < 0.2:
            raise PermissionError(errno.EPERM, "Operation not permitted")
        return self.sock.sendmsg(*args)

    def close(self):
        self.sock.close()


def test_datagrams_the_local_stack_refuses_count_as_lost_and_are_retransmitted(loopback_addresses):
    sender, receiver = transport_pair(loopback_addresses)
    rng = random.Random(0)
    sender._sources = [RefusingSocket(sock, rng) for sock in sender._source_pool()]
    values = np.arange(50_000, dtype=np.float32)
    sender.send(RECEIVER, KEY, values)
    out = np.empty_like(values)
    assert receiver.recv(SENDER, KEY, out) == 1.0 and np.array_equal(out, values)
    stats = sender.stats  # a refused last fragment is recovered by the probe and the NACK it brings
    assert stats.datagrams_refused > 0 and stats.fragments_retransmitted + stats.probes >= stats.datagrams_refused
    close_pair(sender, receiver)


def test_loss_within_the_bound_completes_without_retransmission(loopback_addresses):
    options = mlt_options(**LOOPBACK_MLT, loss_bound=0.05, drop_marking=True)
    sender, receiver = transport_pair(loopback_addresses, options, drop=lambda frame: frame.offset == 1400)
    values = np.ones(35_000, dtype=np.float32)  # 100 fragments; 1 dropped, the 5 smallest marked LE
    values[350 * 2:350 * 7] = 1e-6
    sender.send(RECEIVER, KEY, values, tolerate_loss=True)
    out = np.empty_like(values)
    assert receiver.recv(SENDER, KEY, out) == pytest.approx(0.99)
    assert np.all(out[350:700] == 0) and np.array_equal(out[700:], values[700:])
    assert receiver.stats.nacks_sent == 0 and sender.stats.fragments_retransmitted == 0
    assert sender.stats.datagrams_marked == 5
    assert json.loads(json.dumps(sender.counters()))["datagrams_marked"] == 5  # summary.json takes them
    close_pair(sender, receiver)


def test_each_datagram_carries_its_dscp_from_any_source_socket(loopback_addresses):
    """One pool of source sockets serves every class: the DSCP goes with each datagram."""
    options = mlt_options(**LOOPBACK_MLT, loss_bound=0.05, drop_marking=True, sport_range=16)
    sender, receiver = transport_pair(loopback_addresses, options)
    sender.set_dscp(RECEIVER, 40)
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    listener.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    sender._peers.addresses[RECEIVER] = listener.getsockname()  # data goes to the listener instead
    values = np.ones(35_000, dtype=np.float32)  # 100 fragments, the 5 smallest marked LE
    values[350 * 2:350 * 7] = 1e-6
    sender.send(RECEIVER, KEY, values, tolerate_loss=True)
    tos = []
    for _ in range(100):
        _, ancillary, _, _ = listener.recvmsg(65536, 64)
        tos += [data[0] for level, kind, data in ancillary if (level, kind) == (socket.IPPROTO_IP, socket.IP_TOS)]
    assert sorted(tos) == [mlt_sender.LOWER_EFFORT_DSCP << 2] * 5 + [40 << 2] * 95
    assert len(sender._sources) == 16
    listener.close()
    sender.abort()
    receiver.abort()


def test_sending_to_a_process_that_is_no_peer_fails_alone(loopback_addresses):
    sender, receiver = transport_pair(loopback_addresses)
    with pytest.raises(TransportError, match="worker9 is not a peer of worker0"):
        sender.send(Peer("worker", 9), KEY, np.ones(10, np.float32))
    sender.send(RECEIVER, KEY, np.ones(10, np.float32))
    assert receiver.recv(SENDER, KEY, np.empty(10, np.float32)) == 1.0
    close_pair(sender, receiver)


def test_an_aborting_peer_fails_the_other_fast_and_a_dead_one_within_the_timeout(loopback_addresses):
    sender, receiver = transport_pair(loopback_addresses, timeout=1.0)
    started = time.monotonic()
    receiver.abort()
    with pytest.raises(TransportError, match="worker1 .* aborted"):
        sender.recv(RECEIVER, KEY, np.empty(4, np.float32))
    assert time.monotonic() - started < 0.5
    sender.abort()
    sender, receiver = transport_pair(loopback_addresses, timeout=1.0)
    receiver._shutdown()  # dies silently: no ABORT frame
    sender.send(RECEIVER, KEY, np.ones(1000, np.float32))
    with pytest.raises(TransportError,
                       match="worker1 .* did not acknowledge tensor 1 step 0 of iteration 3 within 1.0 s"):
        sender.close()
    assert sender.stats.probes >= 3  # it kept asking before it gave up
    assert time.monotonic() - started < 3


def test_aborting_wakes_a_thread_waiting_to_receive(loopback_addresses):
    sender, receiver = transport_pair(loopback_addresses, timeout=30.0)
    errors = []
    waiting = threading.Thread(target=lambda: errors.append(pytest.raises(
        TransportError, receiver.recv, SENDER, KEY, np.empty(4, np.float32))))
    waiting.start()
    time.sleep(0.1)
    receiver.abort()  # as a worker's failing comm thread does while its compute thread waits for parameters
    waiting.join(2.0)
    assert not waiting.is_alive() and "worker1 aborted" in str(errors[0].value)
    sender.abort()


LOOPBACK = dict(transport="mlt", **LOOPBACK_MLT)


def test_training_over_mlt_matches_tcp(loopback_addresses):
    # The largest tag the frame header holds: every transport carries and checks it.
    options = dict(iterations=20, batch=32, eval_every=0, model=Model(width=64, depth=2), momentum=0.5, tag=2**32 - 1)
    for mode, shards, slicing in (("allreduce", 0, {}), ("ps", 2, {}), ("ps", 2, {"ps_slice_bytes": 4096})):
        tcp = run_job(loopback_addresses, 4, mode, shards, **options, **slicing)
        datagrams = run_job(loopback_addresses, 4, mode, shards, **options, **slicing, **LOOPBACK)
        for a, b in zip(tcp, datagrams):
            assert np.abs(a["model"].params - b["model"].params).max() < 1e-4
            assert a["job"] == b["job"] == 2**32 - 1


@pytest.mark.parametrize("changes, largest", [
    (dict(), 16640),                                           # fc1 and fc2: 64 x 64 + 64 floats
    (dict(fusion="ddp"), 4 * (4160 + 4160 + 650)),             # one bucket of every layer
    (dict(send_order="bytescheduler", partition_bytes=4096), 3328),  # fc1 in 5 partitions of at most 4096 bytes
    (dict(mode="ps", servers=[("127.0.0.1", 3)]), 16640),      # a layer; its slices are smaller
    # 1-float layers: the agreement's int64
    (dict(model=Model("resnet50", scale=1e-9), send_order="bytescheduler", partition_bytes=1024), 8),
])
def test_the_largest_message_of_a_job_comes_from_its_model(changes, largest):
    cfg = ProcessConfig(**{**dict(role="worker", rank=0, workers=[("127.0.0.1", 1), ("127.0.0.1", 2)],
                                  model=Model(width=64, depth=2)), **changes})
    assert assembly.largest_message_bytes(cfg, build_model(cfg)) == largest


# 33024: the 66048-byte fc2 goes as two slices of 24 datagrams and fc1 as two of 12, where the bound spares
# no datagram of its own: its tensor's first slice leaves its share to the second (Sender.allowance).
@pytest.mark.parametrize("ps_slice_bytes", [0, 33024])
def test_training_converges_with_random_loss_within_the_bound(loopback_addresses, monkeypatch, ps_slice_bytes):
    transports = []
    received = {"worker": [], "server": []}  # (peer, iteration, tensor, bytes, delivered fraction) of each message
    rng = random.Random(1)

    def lossy_transport(me, listen, tag, timeout, log, options):
        def logged(*message):
            iteration, tensor, _, total, direction, peer, *_, fraction = message
            if direction == "recv":
                received[me.role].append((peer, iteration, tensor, total, fraction))
            log(*message)
        transports.append(MltTransport(me, listen, tag, timeout, options, logged,
                                       drop=lambda frame: rng.random() < 0.01))
        return transports[-1]
    monkeypatch.setattr(assembly, "MltTransport", lossy_transport)
    summaries = run_job(loopback_addresses, 2, "ps", 1, model=Model(width=128), loss_bound=0.05, eval_every=0,
                        ps_slice_bytes=ps_slice_bytes, **LOOPBACK)
    assert summaries[0]["final_accuracy"] >= 0.9
    assert sum(t.stats.datagrams_dropped for t in transports) > 0
    # The bound holds over each tensor a worker pushes, whatever its slices lost.
    tensors: dict[tuple, list[float]] = {}
    for peer, iteration, tensor, total, fraction in received["server"]:
        delivered, sent = tensors.setdefault((peer, iteration, tensor), [0.0, 0.0])
        tensors[(peer, iteration, tensor)] = [delivered + total * fraction, sent + total]
    fractions = [delivered / sent for delivered, sent in tensors.values()]
    assert min(fractions) >= 0.95 and any(f < 1 for f in fractions)
    assert {fraction for *_, fraction in received["worker"]} == {1.0}  # pulls are exact
    assert np.array_equal(summaries[0]["model"].params, summaries[1]["model"].params)


def test_allreduce_replicas_stay_bit_identical_with_loss_on_one_workers_link(loopback_addresses, monkeypatch, tmp_path):
    rng = random.Random(2)

    def lossy_transport(me, listen, tag, timeout, log, options):  # 1% of worker 0's datagrams lost
        return MltTransport(me, listen, tag, timeout, options, log,
                            drop=lambda frame: me.rank == 0 and rng.random() < 0.01)
    monkeypatch.setattr(assembly, "MltTransport", lossy_transport)
    # fc1's chunks: 44 kB in 32 datagrams, one of which may stay missing under the bound.
    summaries = run_job(loopback_addresses, 3, model=Model(width=512), loss_bound=0.05, iterations=12,
                        eval_every=0, **LOOPBACK)
    assert all(np.array_equal(summaries[0]["model"].params, s["model"].params) for s in summaries)
    rows = []
    for s in summaries:
        s["recorder"].write(str(tmp_path / str(s["rank"])), {t: (str(t), str(t)) for t in range(3)}, {},
                            lambda tensor, step: ring_phase(3, step))
        with open(tmp_path / str(s["rank"]) / "iterations.csv") as f:
            rows += list(csv.DictReader(f))
    reduce = [float(r["delivered_fraction_reduce"]) for r in rows]
    assert min(reduce) >= 0.95 and any(f < 1 for f in reduce)  # some reduce-scatter message came short
    assert {r["delivered_fraction_gather"] for r in rows} == {"1.0000"}  # the all-gather is exact


def forge(to, frame: codec.Frame, fragment_bytes: int, payload: bytes = b"", source: str = "127.0.0.1",
          delivered: int = 0) -> None:
    """One datagram as anyone on `source` could send it to the transport listening at `to`."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((source, 0))
        sock.sendto(codec.encode_datagram_header(frame, 0, fragment_bytes, delivered) + payload, to)


def data_frame(key: MessageKey, offset: int, length: int, total: int, sender: Peer = SENDER, tag: int = 0):
    return codec.Frame(codec.KIND_DATA, sender.role, sender.rank, key.step, tag, key.iteration, key.tensor,
                       offset, length, total)


def test_a_forged_huge_message_is_never_allocated_nor_holds_up_the_real_one(loopback_addresses, monkeypatch):
    allocated = []
    reassembly = mlt_receiver.Reassembly
    monkeypatch.setattr(mlt_receiver, "Reassembly",
                        lambda total, *args: allocated.append(total) or reassembly(total, *args))
    values = np.arange(1000, dtype=np.float32)
    # The job's largest message is exactly this one: a message one float larger is refused too.
    sender, receiver = transport_pair(loopback_addresses, mlt_options(**LOOPBACK_MLT, max_message_bytes=values.nbytes,
                                                                     loss_bound=0.5), timeout=3.0)
    # 62 bytes from the sender's host under the real message's key, declaring 1 GiB in 1-byte fragments.
    forge(receiver.listen_address, data_frame(KEY, 0, 1, 1 << 30), 1, b"x")
    forge(receiver.listen_address, data_frame(KEY, 0, 4, values.nbytes + 4), 4, b"xxxx")
    # A probe of the real size in one fragment of 4 GiB: no sender of the job cuts a message so.
    forge(receiver.listen_address, data_frame(KEY, 0, 0, values.nbytes), 2**32 - 1)
    time.sleep(0.05)
    started = time.monotonic()
    sender.send(RECEIVER, KEY, values, tolerate_loss=True)
    out = np.empty_like(values)
    assert receiver.recv(SENDER, KEY, out) == 1.0 and np.array_equal(out, values)
    assert time.monotonic() - started < 1.0
    assert receiver.stats.oversized == 2 and receiver.stats.mismatched == 1 and allocated == [values.nbytes]
    close_pair(sender, receiver)


def test_datagrams_from_another_host_or_job_are_dropped(loopback_addresses):
    sender, receiver = transport_pair(loopback_addresses, tag=2**32 - 1)  # the largest tag the header holds
    key = MessageKey(5, 0, 0)
    message = data_frame(key, 0, 4, 4, tag=2**32 - 1)
    forge(receiver.listen_address, message, 1400, np.float32(1).tobytes(), source="127.0.0.2")  # not the sender's host
    forge(receiver.listen_address, message._replace(tag=7), 1400, np.float32(2).tobytes())  # another job's
    forge(receiver.listen_address, message._replace(rank=5), 1400, np.float32(3).tobytes())  # no peer of ours
    forge(receiver.listen_address, message, 1400, np.float32(4).tobytes())  # the sender's host, any port
    out = np.empty(1, np.float32)
    assert receiver.recv(SENDER, key, out) == 1.0 and out[0] == 4
    assert receiver.stats.foreign == 3 and receiver.stats.duplicates == 0
    sender.send(RECEIVER, KEY, np.ones(10, np.float32))
    assert receiver.recv(SENDER, KEY, np.empty(10, np.float32)) == 1.0
    close_pair(sender, receiver)


# Room for three 2000-byte messages (in 1400-byte fragments: 2002 bytes of memory, see reassembly_bytes), or for
# two of them and a 4000-byte one (4003 bytes).
@pytest.mark.parametrize("cap, value", [("MAX_INCOMPLETE_MESSAGES", 3), ("INCOMPLETE_BYTES", 2 * 2002 + 4003)])
def test_a_peers_incomplete_messages_are_capped(loopback_addresses, monkeypatch, cap, value):
    monkeypatch.setattr(mlt_receiver, cap, value)
    sender, receiver = transport_pair(loopback_addresses, mlt_options(**LOOPBACK_MLT, max_message_bytes=4000))
    stray = MessageKey(9, 0, 0)
    for tensor in range(5):  # first fragments of 2-fragment messages whose rest does not come
        forge(receiver.listen_address, data_frame(stray._replace(tensor=tensor), 0, 1400, 2000), 1400, bytes(1400))
    values = np.arange(1000, dtype=np.float32)
    sender.send(RECEIVER, KEY, values)  # its 3 fragments are refused too while three messages are held
    time.sleep(0.05)
    assert receiver.stats.over_budget == 5 and len(receiver._receiver.incoming) == 3
    forge(receiver.listen_address, data_frame(stray, 1400, 600, 2000), 1400, bytes(600))  # one completes
    out = np.empty_like(values)  # the sender's probe finds room now
    assert receiver.recv(SENDER, KEY, out) == 1.0 and np.array_equal(out, values)
    assert receiver.recv(SENDER, stray, np.empty(500, np.float32)) == 1.0
    close_pair(sender, receiver)


def test_processes_that_cut_messages_differently_fail_to_connect_with_one_clear_line(loopback_addresses):
    """Each would drop the other's DATA as off its grid: they say so at once instead of timing out."""
    a, b = loopback_addresses(2)
    pair = [MltTransport(SENDER, a, 0, 3.0, options=mlt_options(link_mbps=10000, mtu_payload=1400)),
            MltTransport(RECEIVER, b, 0, 3.0, options=mlt_options(link_mbps=10000, mtu_payload=8908))]
    errors = []

    def connect(transport, dial, accept):
        try:
            transport.connect(dial, accept)
        except TransportError as e:
            errors.append(str(e))
    started = time.monotonic()
    threads = [threading.Thread(target=connect, args=(pair[0], {RECEIVER: b}, {})),
               threading.Thread(target=connect, args=(pair[1], {}, {SENDER: a}))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert time.monotonic() - started < 1.0
    assert sorted(errors) == [
        f"worker0 (127.0.0.1:{a[1]}) cuts messages into 1400-byte fragments, worker1 into 8908: every process of a "
        "job needs the same --mtu-payload",
        f"worker1 (127.0.0.1:{b[1]}) cuts messages into 8908-byte fragments, worker0 into 1400: every process of a "
        "job needs the same --mtu-payload"]
    for transport in pair:
        transport.abort()


def test_a_nack_for_another_fragment_grid_is_dropped_and_the_message_still_delivered(loopback_addresses):
    frames = itertools.count()
    sender, receiver = transport_pair(loopback_addresses, drop=lambda frame: next(frames) < 3, timeout=3.0)
    values = np.arange(1000, dtype=np.float32)  # 3 fragments of 1400 bytes, all lost on the first pass
    sender.send(RECEIVER, KEY, values)
    # A NACK of the message cut in 100-byte fragments, fragments 3..39 missing: beyond the sender's 3.
    nack = codec.Frame(codec.KIND_NACK, RECEIVER.role, RECEIVER.rank, KEY.step, 0, KEY.iteration, KEY.tensor,
                       0, 5, values.nbytes)
    forge(sender.listen_address, nack, 100, b"\xf8" + b"\xff" * 4, delivered=300)
    out = np.empty_like(values)  # the sender's probe ends its pass; the receiver NACKs it whole
    assert receiver.recv(SENDER, KEY, out) == 1.0 and np.array_equal(out, values)
    assert sender.stats.mismatched == 1 and all(thread.is_alive() for thread in sender._threads)
    close_pair(sender, receiver)


def fail_first(method, when=lambda *args, **kwargs: True):
    """`method`, except that its first call for which `when` holds raises as a bug would."""
    failed = []

    def wrapper(*args, **kwargs):
        if not failed and when(*args, **kwargs):
            failed.append(True)
            raise RuntimeError("a bug")
        return method(*args, **kwargs)
    return wrapper


def test_a_failure_handling_one_datagram_is_counted_and_the_threads_go_on(loopback_addresses, monkeypatch, capsys):
    sender, receiver = transport_pair(loopback_addresses, timeout=3.0)
    monkeypatch.setattr(receiver, "_on_data", fail_first(receiver._on_data))  # as if the first fragment were lost
    monkeypatch.setattr(sender, "_emit", fail_first(sender._emit, lambda emission: not emission.first))
    values = np.arange(1000, dtype=np.float32)
    sender.send(RECEIVER, KEY, values)  # the NACK's retransmission fails once; the next NACK's goes through
    out = np.empty_like(values)
    assert receiver.recv(SENDER, KEY, out) == 1.0 and np.array_equal(out, values)
    assert receiver.counters()["internal_errors"] == 1 and sender.counters()["internal_errors"] == 1
    warnings = capsys.readouterr().err.splitlines()  # the bug is visible in the log too
    assert warnings == ["warning: worker1: mlt failed handling a datagram: RuntimeError('a bug') (counted in "
                        "internal_errors)", "warning: worker0: mlt failed handling a retransmission: "
                        "RuntimeError('a bug') (counted in internal_errors)"]
    assert all(thread.is_alive() for thread in (*sender._threads, *receiver._threads))
    close_pair(sender, receiver)

"""mlt's sender and receiver state machines without sockets, threads or a real clock: events in, actions out."""
import math
import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hostapps import codec
from hostapps.assembly import mlt_options
from hostapps.mlt import MltOptions, MltStats, wire
from hostapps.mlt.pacing import FLOOR_SHARE, LINK_SHARE, PACING_BURST_S, HostPacer
from hostapps.mlt.peers import Peers
from hostapps.mlt.receiver import MAX_LINGER_S, Delivery, Receiver, Reply
from common.classes import LOWER_EFFORT_DSCP
from hostapps.mlt.sender import LOSSY_PATH_S, MAX_RTO_S, MIN_RTO_S, RTO_S, Emission, Failure, Outgoing, Sender
from hostapps.transport import MessageKey, Peer

SENDER, RECEIVER, OTHER = Peer("worker", 0), Peer("server", 0), Peer("worker", 1)
RANK = Peer("worker", 3)  # a receiver other than a shard: an all-reduce rank
KEY = MessageKey(3, 1, 0)
TAG, TIMEOUT, FRAGMENT = 7, 5.0, 100


def options(**changes) -> MltOptions:
    return mlt_options(**{"mtu_payload": FRAGMENT, "link_mbps": 100.0, **changes})


def sender(timeout: float = TIMEOUT, **changes) -> Sender:
    machine = Sender(SENDER, TAG, options(**changes), timeout, MltStats())
    machine.add_peer(RECEIVER)
    machine.add_peer(OTHER)
    return machine


def receiver(timeout: float = TIMEOUT, me: Peer = RECEIVER, **changes) -> Receiver:
    return Receiver(me, TAG, options(**changes), timeout, MltStats())


def datagram(data: bytes) -> codec.Datagram:
    return codec.decode_datagram(memoryview(data))


def on_the_wire(emission: Emission) -> codec.Datagram:
    return datagram(emission.header + bytes(emission.payload))


def data(key: MessageKey, index: int, message: bytes, fragment: int = FRAGMENT, required: int = 0) -> codec.Datagram:
    """Fragment `index` of `message` as SENDER sends it, saying `required` bytes must arrive."""
    payload = message[index * fragment:(index + 1) * fragment]
    frame = wire.data_frame(SENDER, TAG, key, index * fragment, len(payload), len(message))
    return datagram(codec.encode_datagram_header(frame, index, fragment, required) + payload)


def probe(key: MessageKey, message: bytes, fragment: int = FRAGMENT, required: int = 0) -> codec.Datagram:
    """SENDER's probe of `message`: its last fragment's header, without the payload."""
    offset = (wire.fragment_count(len(message), fragment) - 1) * fragment
    frame = wire.data_frame(SENDER, TAG, key, offset, 0, len(message))
    return datagram(codec.encode_datagram_header(frame, 1, fragment, required))


def first_pass(machine: Sender, message: Outgoing, now: float = 0.0) -> list[Emission]:
    """The message's first pass as its caller sends it, reported sent at its end."""
    emissions = []
    while (emission := machine.first_datagram(message, now)) is not None:
        emissions.append(emission)
    machine.pass_sent(message, now)
    return emissions


def drain(machine: Sender, now: float = 0.0) -> list[Emission]:
    """Every resend and probe the sender has to send, each pass reported sent as it ends."""
    emissions = []
    while (emission := machine.next_datagram(now)) is not None:
        emissions.append(emission)
        if emission.ends_pass:
            machine.pass_sent(emission.message, now)
    return emissions


def submit(machine: Sender, peer: Peer = RECEIVER, key: MessageKey = KEY, payload: bytes | None = None,
           tolerate_loss: bool = False) -> Outgoing:
    data = np.frombuffer(MESSAGE if payload is None else payload, np.uint8).copy()
    return machine.submit(peer, key, data, None, machine.allowance(peer, key, data.size, tolerate_loss))


def feedback_of(actions) -> list[codec.Datagram]:
    return [datagram(a.datagram) for a in actions if isinstance(a, Reply)
            and datagram(a.datagram).frame.kind in (codec.KIND_ACK, codec.KIND_NACK)]


MESSAGE = bytes(range(256)) * 4  # 1024 bytes: 11 fragments, the last of 24 bytes


# --- receiver

def test_a_whole_message_is_acked_and_delivered_its_sender_advised_its_share_while_it_lasts():
    machine = receiver()
    advice, = machine.on_data(SENDER, data(KEY, 0, MESSAGE), now=0.0)  # a sender that was not active: advised now
    assert advice.peer == SENDER and datagram(advice.datagram).frame.kind == codec.KIND_RATE
    for index in range(1, 10):
        assert machine.on_data(SENDER, data(KEY, index, MESSAGE), now=0.001 * index) == ()
    ack, delivery = machine.on_data(SENDER, data(KEY, 10, MESSAGE), now=0.01)
    assert ack.peer == SENDER and isinstance(delivery, Delivery)
    answer = datagram(ack.datagram)
    assert (answer.frame.kind, answer.frame.total, answer.delivered, answer.fragment_bytes) == (
        codec.KIND_ACK, 1024, 1024, FRAGMENT)
    assert datagram(advice.datagram).advised_kbps == int(LINK_SHARE * 100 * 1000)  # the only sender: the whole link
    assert answer.advised_kbps == int(LINK_SHARE * 100 * 1000)  # its share lingers past its message (next test)
    assert delivery.message.buffer.tobytes() == MESSAGE and machine.incoming == {}


def test_a_quiet_message_within_the_bound_completes_and_one_below_it_is_nacked_each_quiet_period():
    within = receiver(loss_bound=0.1)  # its sender allows one 100-byte fragment missing (Sender.allowance)
    for index in set(range(11)) - {4}:
        within.on_data(SENDER, data(KEY, index, MESSAGE, required=924), now=0.0)
    assert feedback_of(within.tick(0.004)) == []  # not quiet yet (quiet_s is 5 ms)
    actions = within.tick(0.005)
    assert [a.message.delivered for a in actions if isinstance(a, Delivery)] == [924]
    assert [(f.frame.kind, f.delivered) for f in feedback_of(actions)] == [(codec.KIND_ACK, 924)]

    below = receiver(loss_bound=0.1)
    for index in set(range(11)) - {4, 7}:
        below.on_data(SENDER, data(KEY, index, MESSAGE, required=924), now=0.0)
    nack, = feedback_of(below.tick(0.005))
    assert nack.frame.kind == codec.KIND_NACK and nack.delivered == 824
    assert list(wire.missing_fragments(nack.payload, 1024, FRAGMENT)) == [4, 7]
    assert feedback_of(below.tick(0.009)) == []  # one NACK per quiet period
    assert len(feedback_of(below.tick(0.0101))) == 1 and below.stats.nacks_sent == 2


def test_an_exact_message_is_nacked_until_whole_whatever_the_loss_bound():
    machine = receiver(loss_bound=0.5)  # 512 bytes may be missing, but its sender says all 1024 must arrive
    for index in set(range(11)) - {4}:
        machine.on_data(SENDER, data(KEY, index, MESSAGE, required=len(MESSAGE)), now=0.0)
    nack, = feedback_of(machine.tick(0.005))
    assert nack.frame.kind == codec.KIND_NACK and list(wire.missing_fragments(nack.payload, 1024, FRAGMENT)) == [4]
    ack, delivery = machine.on_data(SENDER, data(KEY, 4, MESSAGE, required=len(MESSAGE)), now=0.006)
    assert datagram(ack.datagram).frame.kind == codec.KIND_ACK and delivery.message.buffer.tobytes() == MESSAGE


def test_no_decision_before_the_last_fragment_arrives_however_quiet():
    machine = receiver(loss_bound=0.5)
    for index in range(10):  # all but the last: within the bound, but the sender may still be sending
        machine.on_data(SENDER, data(KEY, index, MESSAGE), now=0.0)
    assert feedback_of(machine.tick(TIMEOUT - 0.01)) == [] and KEY in {key for _, key in machine.incoming}
    # a stray: forgotten after the timeout
    assert feedback_of(machine.tick(TIMEOUT + 0.01)) == [] and machine.incoming == {}
    assert machine._held_messages[SENDER] == 0 and machine._held_bytes[SENDER] == 0


def test_a_late_duplicate_is_acked_again_at_most_once_per_quiet_period():
    machine = receiver()
    for index in range(11):
        machine.on_data(SENDER, data(KEY, index, MESSAGE), now=0.0)
    assert machine.on_data(SENDER, data(KEY, 10, MESSAGE), now=0.001) == ()  # within the quiet period of the ACK
    ack, = machine.on_data(SENDER, data(KEY, 10, MESSAGE), now=0.006)  # a probe: our ACK was lost
    assert datagram(ack.datagram).frame.kind == codec.KIND_ACK and datagram(ack.datagram).delivered == 1024
    assert machine.stats.duplicates == 2


def test_a_probe_ends_the_pass_and_is_answered_at_once():
    """A lost last fragment: the probe says the pass is over (the sender heard nothing for its RTO), so the
    receiver NACKs what is missing, or completes a message within its bound, without waiting a quiet
    period; a probe of a message none of which came is NACKed whole."""
    lost_last = receiver(loss_bound=0.0)
    for index in range(10):
        lost_last.on_data(SENDER, data(KEY, index, MESSAGE, required=1024), now=0.0)
    assert feedback_of(lost_last.tick(0.019)) == []  # however quiet: the sender may still be sending
    nack, = feedback_of(lost_last.on_data(SENDER, probe(KEY, MESSAGE, required=1024), now=0.02))
    assert nack.frame.kind == codec.KIND_NACK and list(wire.missing_fragments(nack.payload, 1024, FRAGMENT)) == [10]
    assert feedback_of(lost_last.tick(0.021)) == []  # one NACK per quiet period
    assert lost_last.stats.duplicates == 0 and lost_last.stats.nacks_sent == 1

    within = receiver(loss_bound=0.1)
    for index in range(10):  # the last fragment (24 bytes) is within the bound
        within.on_data(SENDER, data(KEY, index, MESSAGE, required=924), now=0.0)
    actions = within.on_data(SENDER, probe(KEY, MESSAGE, required=924), now=0.001)  # quiet or not
    assert [a.message.delivered for a in actions if isinstance(a, Delivery)] == [1000]

    unseen = receiver()
    nack, = feedback_of(unseen.on_data(SENDER, probe(KEY, MESSAGE, required=1024), now=0.0))
    assert nack.delivered == 0 and list(wire.missing_fragments(nack.payload, 1024, FRAGMENT)) == list(range(11))

    mismatched = receiver()
    mismatched.on_data(SENDER, data(KEY, 0, MESSAGE), now=0.0)
    assert feedback_of(mismatched.on_data(SENDER, probe(KEY, MESSAGE, fragment=200), now=0.01)) == []
    assert mismatched.stats.mismatched == 1 and feedback_of(mismatched.tick(1.0)) == []  # not the pass's end


def test_a_probe_of_a_completed_message_is_acked_again_and_is_no_duplicate():
    machine = receiver()
    for index in range(11):
        machine.on_data(SENDER, data(KEY, index, MESSAGE), now=0.0)
    ack, = machine.on_data(SENDER, probe(KEY, MESSAGE), now=0.006)
    assert datagram(ack.datagram).frame.kind == codec.KIND_ACK and datagram(ack.datagram).delivered == 1024
    assert machine.stats.duplicates == 0


def test_oversized_and_over_budget_messages_are_counted_not_held(monkeypatch):
    machine = receiver(max_message_bytes=1000)
    assert feedback_of(machine.on_data(SENDER, data(KEY, 0, MESSAGE), now=0.0)) == []  # declares 1024 bytes
    assert machine.stats.oversized == 1 and machine.incoming == {}
    monkeypatch.setattr("hostapps.mlt.receiver.MAX_INCOMPLETE_MESSAGES", 2)
    small = MESSAGE[:300]
    for tensor in range(3):
        machine.on_data(SENDER, data(KEY._replace(tensor=tensor), 0, small), now=0.0)
    assert machine.stats.over_budget == 1 and len(machine.incoming) == 2
    machine.on_data(OTHER, data(KEY, 0, small), now=0.0)  # the cap is per peer
    assert len(machine.incoming) == 3


def advised(actions) -> dict[Peer, int]:
    return {a.peer: datagram(a.datagram).advised_kbps for a in actions
            if isinstance(a, Reply) and datagram(a.datagram).frame.kind == codec.KIND_RATE}


def test_each_sender_with_a_message_in_flight_is_advised_its_share_at_once():
    whole, half = int(LINK_SHARE * 100 * 1000), int(LINK_SHARE * 100 * 1000 / 2)
    machine = receiver(me=RANK)
    assert advised(machine.on_data(SENDER, data(KEY, 0, MESSAGE), now=0.0)) == {SENDER: whole}
    assert advised(machine.on_data(SENDER, data(KEY, 1, MESSAGE), now=0.0)) == {}  # no change, no advice
    # OTHER starts while SENDER's message is in flight: both are re-advised on OTHER's first datagram
    assert advised(machine.on_data(OTHER, data(KEY, 0, MESSAGE), now=0.1)) == {SENDER: half, OTHER: half}
    assert advised(machine.tick(0.1)) == {SENDER: half, OTHER: half}  # and again every ADVICE_INTERVAL_S
    for index in range(1, 10):
        machine.on_data(OTHER, data(KEY, index, MESSAGE), now=0.1)
    ack, delivery, advice = machine.on_data(OTHER, data(KEY, 10, MESSAGE), now=0.1)  # OTHER's message is over
    assert advised([advice]) == {SENDER: whole} and datagram(ack.datagram).advised_kbps == 0  # OTHER: none
    assert advised(machine.tick(0.2)) == {SENDER: whole}
    one = machine.on_data(OTHER, data(KEY._replace(tensor=3), 0, MESSAGE[:100]), now=0.2)
    assert advised(one) == {} and len(feedback_of(one)) == 1  # a one-datagram message: over as it begins


def test_a_pusher_between_two_slices_keeps_its_share_so_the_others_are_not_advised_more_for_a_gap():
    """A shard's pushers send slice after slice, the next one paced gap behind the last: re-advising the others
    the finished one's share at each slice's end would overload the link by a frame per boundary."""
    whole = int(LINK_SHARE * 100 * 1000)
    machine = receiver()  # RECEIVER is a shard
    machine.on_data(SENDER, data(KEY, 0, MESSAGE), now=0.0)
    machine.on_data(OTHER, data(KEY, 0, MESSAGE), now=0.0)
    for index in range(1, 11):  # SENDER's datagrams 4 ms apart: its slice ends at 40 ms, it lingers 2 gaps
        actions = machine.on_data(SENDER, data(KEY, index, MESSAGE), now=0.004 * index)
    assert advised(actions) == {} and any(isinstance(a, Delivery) for a in actions)
    shares = advised(machine.tick(0.047))  # the periodic advice: SENDER still counted, OTHER not given the link
    assert set(shares) == {SENDER, OTHER} and shares[OTHER] < whole
    nxt = KEY._replace(tensor=2)
    assert advised(machine.on_data(SENDER, data(nxt, 0, MESSAGE), now=0.044)) == {}  # its next slice: no change
    for index in range(1, 11):
        machine.on_data(SENDER, data(nxt, index, MESSAGE), now=0.044 + 0.004 * index)  # ends at 84 ms
    shares = advised(machine.tick(0.0915))
    assert set(shares) == {SENDER, OTHER} and shares[OTHER] < whole
    assert advised(machine.tick(0.0925)) == {OTHER: whole}  # 2 gaps (8 ms) after SENDER's last datagram


def test_a_slow_pushers_linger_is_bounded():
    whole = int(LINK_SHARE * 100 * 1000)
    machine = receiver()
    for index in range(11):  # a datagram a second from each; OTHER's message stays one short
        machine.on_data(SENDER, data(KEY, index, MESSAGE), now=float(index))
        if index < 10:
            machine.on_data(OTHER, data(KEY, index, MESSAGE), now=float(index))
    shares = advised(machine.tick(10.0 + MAX_LINGER_S - 0.001))
    assert set(shares) == {SENDER, OTHER} and shares[OTHER] < whole
    assert advised(machine.tick(10.0 + MAX_LINGER_S + 0.001)) == {OTHER: whole}


def test_an_all_reduce_ranks_sender_between_two_messages_is_not_held_a_share():
    """An all-reduce rank's senders pause between messages while their own inputs arrive: the other sender
    gets the link at once."""
    whole = int(LINK_SHARE * 100 * 1000)
    machine = receiver(me=RANK)
    machine.on_data(SENDER, data(KEY, 0, MESSAGE), now=0.0)
    machine.on_data(OTHER, data(KEY, 0, MESSAGE), now=0.0)
    for index in range(1, 11):
        actions = machine.on_data(SENDER, data(KEY, index, MESSAGE), now=0.004 * index)
    assert advised(actions) == {OTHER: whole}


def test_the_senders_of_the_most_important_class_share_the_link_and_the_others_wait_at_the_floor():
    """A worker receiving pulls from several shards (a receiver other than a shard)."""
    floor = int(FLOOR_SHARE * 100 * 1000)
    machine = Receiver(Peer("worker", 3), TAG, options(layer_dscp={5: 40, 6: 8}), TIMEOUT, MltStats())
    third = Peer("worker", 2)  # tensor 5 in CS5, tensor 6 in CS1 (lower effort)
    machine.on_data(SENDER, data(KEY, 0, MESSAGE), now=0.0)  # CS0
    machine.on_data(third, data(KEY._replace(tensor=6), 0, MESSAGE), now=0.0)  # lower effort: after CS0
    assert advised(machine.tick(0.0)) == {SENDER: int(LINK_SHARE * 100 * 1000) - floor, third: floor}
    assert advised(machine.on_data(OTHER, data(KEY._replace(tensor=5), 0, MESSAGE), now=0.0)) == {
        SENDER: floor, OTHER: int(LINK_SHARE * 100 * 1000) - 2 * floor}


def test_a_shard_gives_the_pusher_behind_the_others_more_of_its_link_until_it_catches_up():
    """Every slice waits for its last piece: the pusher furthest behind gates them all."""
    machine = receiver()  # RECEIVER is a shard
    link = LINK_SHARE * 100 * 1000
    for index in range(6):
        machine.on_data(SENDER, data(KEY, index, MESSAGE), now=0.0)
    machine.on_data(OTHER, data(KEY, 0, MESSAGE), now=0.0)
    shares = advised(machine.tick(0.0))
    assert shares[OTHER] > link / 2 > shares[SENDER]  # OTHER is 500 bytes behind
    for index in range(1, 10):
        machine.on_data(OTHER, data(KEY, index, MESSAGE), now=0.001)  # OTHER ahead now: 1000 bytes to 600
    shares = advised(machine.tick(0.02))
    assert shares[SENDER] > link / 2 > shares[OTHER]
    machine.on_data(OTHER, data(KEY, 10, MESSAGE), now=0.002)
    for index in range(6, 11):
        machine.on_data(SENDER, data(KEY, index, MESSAGE), now=0.002)  # both done with iteration 3
    after = KEY._replace(iteration=4)
    machine.on_data(SENDER, data(after, 0, MESSAGE), now=0.003)
    machine.on_data(OTHER, data(after, 0, MESSAGE), now=0.003)
    shares = advised(machine.tick(0.04))
    assert shares[SENDER] == shares[OTHER] == int(link / 2)  # level again, in the next iteration


def test_a_pusher_an_iteration_ahead_counts_the_whole_iteration_ahead():
    machine = receiver()
    for index in range(11):
        machine.on_data(SENDER, data(KEY, index, MESSAGE), now=0.0)
        machine.on_data(OTHER, data(KEY, index, MESSAGE), now=0.0)
    machine.on_data(SENDER, data(KEY._replace(iteration=4), 0, MESSAGE), now=0.001)  # iteration 4's first piece
    machine.on_data(OTHER, data(KEY._replace(iteration=4, tensor=2), 0, MESSAGE), now=0.001)
    for index in range(1, 11):
        machine.on_data(SENDER, data(KEY._replace(iteration=4), index, MESSAGE), now=0.002)
    machine.on_data(SENDER, data(KEY._replace(iteration=5), 0, MESSAGE), now=0.003)  # SENDER in iteration 5
    shares = advised(machine.tick(0.0))
    assert shares[OTHER] > shares[SENDER]


def test_a_parameter_server_shard_splits_its_link_evenly_among_level_pushers_whatever_their_classes():
    """It aggregates a slice only once every worker's piece is in: no class of one worker goes before another's."""
    third = int(LINK_SHARE * 100 * 1000 / 3)
    machine = receiver(layer_dscp={5: 40, 6: 8})  # RECEIVER is a shard
    machine.on_data(SENDER, data(KEY, 0, MESSAGE), now=0.0)
    machine.on_data(Peer("worker", 2), data(KEY._replace(tensor=6), 0, MESSAGE), now=0.0)
    machine.on_data(OTHER, data(KEY._replace(tensor=5), 0, MESSAGE), now=0.0)
    assert advised(machine.tick(0.0)) == {SENDER: third, OTHER: third, Peer("worker", 2): third}


# --- sender

def test_first_passes_take_the_link_whole_message_by_whole_message():
    machine = sender()
    older = submit(machine, RECEIVER)
    newer = submit(machine, OTHER, KEY._replace(tensor=2))
    assert machine.has_turn(older) and not machine.has_turn(newer)  # either peer may take the whole link
    first = machine.first_datagram(older, 0.0)
    assert not machine.has_turn(newer)
    first_pass(machine, older)
    assert machine.has_turn(newer) and machine.first_datagram(newer, 0.0).peer == OTHER
    assert first.message is older


def test_a_message_whose_first_pass_is_out_waits_for_none_ahead():
    """Its caller returns at once, to submit what became ready meanwhile: a PS's send thread for one worker,
    held in a 1 MB pull until every other worker's was out, would submit the front layer, updated long
    before, last, and the workers would restart in lock-step."""
    machine = sender()
    sent = submit(machine, RECEIVER, payload=MESSAGE[:300])
    first_pass(machine, sent)
    ahead = submit(machine, OTHER, KEY._replace(tensor=2))  # takes the whole link
    assert machine.first_datagram(ahead, 0.0) is not None
    assert machine.has_turn(sent) and machine.first_datagram(sent, 0.0) is None
    third = Peer("worker", 2)
    machine.add_peer(third)
    assert not machine.has_turn(submit(machine, third, KEY._replace(tensor=3)))  # one not out yet still waits


def test_first_passes_go_by_class_iteration_peer_served_most_fewest_bytes_left_then_age():
    machine = sender(layer_dscp={5: 40})  # tensor 5 in CS5
    third = Peer("worker", 2)
    machine.add_peer(third)
    bulk = submit(machine, RECEIVER)
    short = submit(machine, OTHER, KEY._replace(tensor=2), payload=MESSAGE[:300])  # 3 fragments against 11
    assert machine.has_turn(short) and not machine.has_turn(bulk)
    first_pass(machine, short)  # OTHER was sent 300 bytes of iteration 3: its next message goes first
    more = submit(machine, OTHER, KEY._replace(tensor=3))
    assert machine.has_turn(more) and not machine.has_turn(bulk)
    older = submit(machine, third, KEY._replace(iteration=2))  # an older iteration, whatever was served
    assert machine.has_turn(older) and not machine.has_turn(more)
    urgent = submit(machine, RECEIVER, KEY._replace(tensor=5))  # the higher class, whatever its iteration
    assert machine.has_turn(urgent) and not machine.has_turn(older)
    machine.set_dscp(third, LOWER_EFFORT_DSCP)
    scavenger = submit(machine, third, KEY._replace(tensor=6), payload=MESSAGE[:100])
    assert not machine.has_turn(scavenger)  # lower effort goes last, even with one fragment



def test_a_parameter_server_finishes_the_worker_it_served_most_before_any_class_of_the_next():
    """A worker needs every layer before it goes on: the shard's pull of its last, least important layer goes
    before another worker's front layer.  A worker pushing to its shards keeps the class first."""
    shard, first, second = Peer("server", 0), Peer("worker", 0), Peer("worker", 1)
    machine = Sender(shard, TAG, options(layer_dscp={1: 40, 3: 8}), TIMEOUT, MltStats())  # fc1 CS5, out CS1
    machine.add_peer(first)
    machine.add_peer(second)
    first_pass(machine, machine.submit(first, KEY._replace(tensor=1), np.frombuffer(MESSAGE, np.uint8).copy(), None))
    last_layer = machine.submit(first, KEY._replace(tensor=3), np.frombuffer(MESSAGE, np.uint8).copy(), None)
    front = machine.submit(second, KEY._replace(tensor=1), np.frombuffer(MESSAGE, np.uint8).copy(), None)
    assert machine.has_turn(last_layer) and not machine.has_turn(front)
    pusher = sender(layer_dscp={1: 40, 3: 8})  # a worker (SENDER) with two shards: RECEIVER and OTHER
    first_pass(pusher, submit(pusher, RECEIVER, KEY._replace(tensor=1)))
    low = submit(pusher, RECEIVER, KEY._replace(tensor=3))
    high = submit(pusher, OTHER, KEY._replace(tensor=1))
    assert pusher.has_turn(high) and not pusher.has_turn(low)

def test_an_allreduce_worker_sends_the_lowest_step_first_whatever_it_sent_each_peer():
    """A pipeline's oldest segment is what every rank waits for: the peer served most goes first no more."""
    machine = sender(allreduce_precedence=True)
    first_pass(machine, submit(machine, RECEIVER, KEY._replace(step=1)))  # RECEIVER served most this iteration
    later = submit(machine, RECEIVER, KEY._replace(step=9))
    older = submit(machine, OTHER, KEY._replace(step=4))
    assert machine.has_turn(older) and not machine.has_turn(later)
    previous = submit(machine, RECEIVER, KEY._replace(iteration=2, step=30))  # an older iteration still first
    assert machine.has_turn(previous) and not machine.has_turn(older)


def test_an_allreduce_worker_sends_to_a_slowed_peer_first_and_beside_it_to_one_at_the_links_rate():
    machine = sender(allreduce_precedence=True)
    alone = submit(machine, RECEIVER, KEY._replace(step=1))           # its receiver's link is its own
    shared = submit(machine, OTHER, KEY._replace(step=5))             # its receiver shares its link: half
    machine.advise(OTHER, 100e6 / 8 / 2)
    assert machine.has_turn(shared) and machine.has_turn(alone)        # side by side: the link full
    machine.advise(OTHER, 100e6 / 8)
    assert machine.has_turn(alone) and not machine.has_turn(shared)    # both at the link's rate: the lower step


def test_a_peer_advised_its_receivers_whole_link_is_not_slowed_so_the_lower_step_goes_first():
    """A receiver alone with us advises its link's share, just below the ceiling; a peer sent only one-datagram
    messages is never advised.  The first is not slowed: the lower step goes first whichever peer it is to."""
    machine = sender(allreduce_precedence=True)
    machine.advise(RECEIVER, LINK_SHARE * 100e6 / 8)
    later = submit(machine, RECEIVER, KEY._replace(step=9))
    crossing = submit(machine, OTHER, KEY._replace(step=4), payload=MESSAGE[:100])  # one datagram, never advised
    assert machine.has_turn(crossing) and not machine.has_turn(later)
    machine.advise(RECEIVER, 100e6 / 8 / 2)  # RECEIVER's receiver shares its link: now it is slowed, and first
    assert machine.has_turn(later)


def test_a_first_pass_goes_beside_those_ahead_while_their_peers_leave_the_link_free():
    machine = sender()
    ahead = submit(machine, RECEIVER)
    beside = submit(machine, OTHER, KEY._replace(tensor=2))
    assert machine.advise(RECEIVER, 100e6 / 8 / 2)  # RECEIVER's receiver shares its link: half of ours is free
    assert machine.has_turn(ahead) and machine.has_turn(beside)
    assert not machine.advise(RECEIVER, 100e6 / 8 / 2)  # the same advice changes nothing
    machine.advise(RECEIVER, 100e6 / 8)
    assert not machine.has_turn(beside)
    machine.pacer.rates[RECEIVER].on_feedback(0.5, now=0.0)  # a loss backs RECEIVER's rate off to 3/4:
    assert machine.has_turn(beside)                           # a quarter of the link is free
    machine.forget(RECEIVER)  # its peer closed or failed: no longer ahead
    assert machine.has_turn(beside)


def test_a_first_pass_is_every_fragment_in_order_paced_at_the_link():
    machine = sender()
    message = submit(machine)
    emissions = []
    while (emission := machine.first_datagram(message, now=10.0)) is not None:
        emissions.append(emission)
    frames = [on_the_wire(e).frame for e in emissions]
    assert [(f.offset, f.length) for f in frames] == [(100 * i, 100) for i in range(10)] + [(1000, 24)]
    assert b"".join(bytes(e.payload) for e in emissions) == MESSAGE
    assert [e.ends_pass for e in emissions] == [False] * 10 + [True] and all(e.first for e in emissions)
    # Slots at the host's link rate, after a burst allowance.
    link = LINK_SHARE * 100e6 / 8
    assert emissions[-1].at == pytest.approx(10 + sum(wire.wire_bytes(f.length) for f in frames) / link
                                             - PACING_BURST_S)
    assert message.busy and message.probe_at == math.inf and machine.next_datagram(10.0) is None
    machine.pass_sent(message, now=10.02)
    assert not message.busy and message.probe_at == pytest.approx(10.02 + RTO_S)


def nack(message: bytes, missing: list[int], fragment: int = FRAGMENT, key: MessageKey = KEY) -> codec.Datagram:
    received = np.ones(wire.fragment_count(len(message), fragment), dtype=bool)
    received[missing] = False
    bitmap = wire.missing_bitmap(received)
    delivered = len(message) - sum(len(message[i * fragment:(i + 1) * fragment]) for i in missing)
    return datagram(wire.feedback(RECEIVER, TAG, key, codec.KIND_NACK, len(message), fragment, delivered,
                                  bitmap=bitmap))


def test_a_nack_produces_just_enough_resends_and_a_busy_message_is_not_served_twice():
    machine = sender(loss_bound=0.1)  # 1024 bytes: 102 may be missing, one whole 100-byte fragment
    message = submit(machine, tolerate_loss=True)
    machine.on_feedback(RECEIVER, nack(MESSAGE, [2, 5, 10]), now=0.0)  # during the first pass: ignored
    first = first_pass(machine, message)
    assert len(first) == 11 and drain(machine) == []
    assert {on_the_wire(e).delivered for e in first} == {1024 - 100}  # the bytes the receiver must hold
    machine.on_feedback(RECEIVER, nack(MESSAGE, [2, 5, 10]), now=0.01)  # 224 missing: 124 short of the bound
    assert machine.ready
    machine.on_feedback(RECEIVER, nack(MESSAGE, [2, 5, 10]), now=0.011)  # the resends are not out yet: ignored
    resent = drain(machine)
    assert [on_the_wire(e).frame.offset for e in resent] == [200, 500]
    assert not any(e.first for e in resent) and resent[-1].ends_pass
    assert machine.stats.fragments_retransmitted == 2 and not message.busy


def test_an_exact_message_resends_every_fragment_a_nack_names_whatever_the_loss_bound():
    machine = sender(loss_bound=0.1)
    message = submit(machine)
    assert {on_the_wire(e).delivered for e in first_pass(machine, message)} == {1024}  # all must arrive
    machine.on_feedback(RECEIVER, nack(MESSAGE, [2, 5, 10]), now=0.01)  # 224 missing: within 0.1 but exact
    assert [on_the_wire(e).frame.offset for e in drain(machine)] == [200, 500, 1000]


def test_a_tensor_in_slices_too_small_to_lose_a_fragment_still_spares_its_share():
    """Hand-checked: 5% of 16 slices of 1000 bytes in 100-byte fragments.  Each adds 50 bytes, half a fragment:
    every second slice may miss one fragment; per slice the bound (50 bytes) would spare none."""
    machine = sender(loss_bound=0.05)
    slices = [machine.allowance(RECEIVER, KEY._replace(step=2 * part), 1000, True) for part in range(16)]
    assert slices == [0, 100] * 8 and sum(slices) == 0.05 * 16 * 1000
    # Another tensor, another peer and the next iteration start from nothing; an exact message takes none.
    assert machine.allowance(RECEIVER, KEY._replace(tensor=2), 1000, True) == 0
    assert machine.allowance(OTHER, KEY, 1000, True) == 0
    assert machine.allowance(RECEIVER, KEY._replace(step=98), 1000, False) == 0
    assert machine.allowance(RECEIVER, KEY._replace(iteration=4), 1000, True) == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 5000), min_size=1, max_size=30), st.sampled_from([0.01, 0.05, 0.2]))
def test_a_tensor_never_misses_more_than_its_bound_and_each_message_keeps_a_fragment(sizes, loss_bound):
    machine = sender(loss_bound=loss_bound)
    allowed = [machine.allowance(RECEIVER, KEY._replace(step=2 * part), size, True) for part, size in enumerate(sizes)]
    assert sum(allowed) <= loss_bound * sum(sizes)
    for size, allowance in zip(sizes, allowed):
        assert allowance % FRAGMENT == 0 and allowance <= (wire.fragment_count(size, FRAGMENT) - 1) * FRAGMENT
        assert allowance <= wire.most_missing_bytes(size, loss_bound, FRAGMENT)  # what its receiver accepts


def test_a_nack_resends_important_fragments_first_and_never_marks_them():
    values = np.ones(250, np.float32)  # 10 fragments of 100 bytes (25 floats)
    values[25 * 3:25 * 4] = 1e-6       # fragment 3 is the least important
    machine = sender(loss_bound=0.1, drop_marking=True)
    allowance = machine.allowance(RECEIVER, KEY, values.nbytes, tolerate_loss=True)  # 100 of 1000 bytes
    marked = machine.lower_effort(values, allowance)
    assert allowance == 100 and list(np.flatnonzero(marked)) == [3]
    assert machine.allowance(RECEIVER, KEY, values.nbytes, tolerate_loss=False) == 0  # an exact message: all of it
    assert not machine.lower_effort(values, 0).any()
    first = first_pass(machine, machine.submit(RECEIVER, KEY, values.view(np.uint8).copy(), marked, allowance))
    assert [e.dscp for e in first if e.lower_effort] == [LOWER_EFFORT_DSCP] and first[3].lower_effort
    machine.on_feedback(RECEIVER, nack(values.tobytes(), [3, 6]), now=0.01)  # 100 bytes short: one fragment
    assert [(on_the_wire(e).frame.offset, e.lower_effort) for e in drain(machine)] == [(600, False)]
    assert sender(drop_marking=True).allowance(RECEIVER, KEY, values.nbytes, True) == 0  # no loss bound: none
    assert Sender(RECEIVER, TAG, options(loss_bound=0.1, drop_marking=True), TIMEOUT,
                  MltStats()).lower_effort(values, 100) is None  # a server's parameters are never marked


def test_a_lost_last_fragment_is_probed_after_the_rto_which_doubles():
    machine = sender()
    message = submit(machine)
    first_pass(machine, message, now=0.0)
    assert machine.tick(RTO_S - 0.001) == [] and machine.next_datagram(RTO_S - 0.001) is None
    assert machine.tick(RTO_S) == []
    sent, = drain(machine, now=RTO_S)  # the last fragment's header alone
    assert (on_the_wire(sent).frame.offset, on_the_wire(sent).frame.length) == (1000, 0)
    assert wire.is_probe(sent.frame) and not sent.first and machine.stats.probes == 1
    assert message.probe_at == pytest.approx(3 * RTO_S)  # the next after twice the RTO
    machine.tick(3 * RTO_S)
    drain(machine, now=3 * RTO_S)
    assert message.probe_at == pytest.approx(3 * RTO_S + 4 * RTO_S) and machine.rto(message) <= MAX_RTO_S


def test_a_probe_re_sends_the_last_fragment_only_to_a_peer_that_nacked_lately():
    machine = sender()
    lossy = submit(machine)
    first_pass(machine, lossy, now=0.0)
    machine.on_feedback(RECEIVER, nack(MESSAGE, [3]), now=0.01)  # the path lost a datagram
    drain(machine, now=0.01)
    machine.tick(0.01 + 2 * RTO_S)
    probe, = drain(machine, now=0.01 + 2 * RTO_S)  # the fragment is likely lost: the probe repairs it
    assert (probe.frame.offset, probe.frame.length) == (1000, 24) and machine.stats.probes == 1
    machine.on_feedback(RECEIVER, datagram(wire.feedback(RECEIVER, TAG, KEY, codec.KIND_ACK, 1024, FRAGMENT, 1024)),
                        now=0.3)
    clean = submit(machine, key=KEY._replace(tensor=2))
    first_pass(machine, clean, now=0.01 + LOSSY_PATH_S)
    machine.tick(0.01 + LOSSY_PATH_S + MAX_RTO_S)
    probe, = drain(machine, now=0.01 + LOSSY_PATH_S + MAX_RTO_S)  # no NACK for a while: its header
    assert probe.message is clean and wire.is_probe(probe.frame) and machine.stats.probes == 2


def test_the_rto_follows_the_peers_feedback_delay_within_its_bounds():
    """A message is probed after its peer's smoothed feedback delay plus 4 times its variation
    (RFC 6298), between MIN_RTO_S and RTO_S, not after a fixed 100 ms; feedback after a probe is not
    timed (it may answer the pass)."""
    machine = sender()
    for k, delay in enumerate([0.004, 0.012, 0.008]):  # three NACKed passes, answered after these delays
        key = MessageKey(k, 1, 0)
        message = submit(machine, key=key)
        first_pass(machine, message, now=float(k))
        machine.on_feedback(RECEIVER, nack(MESSAGE, [1], key=key), now=k + delay)
        drain(machine, now=k + delay)
    # smoothed 4 -> 5 -> 5.375 ms, variation 2 -> 3.5 -> 3.375 ms: 5.375 + 4 x 3.375 = 18.875 ms
    assert machine.rto(message) == pytest.approx(0.018875)
    probe_at = message.probe_at
    assert probe_at == pytest.approx(2 + 0.008 + 0.018875)
    machine.tick(probe_at)
    drain(machine, now=probe_at)
    assert message.backoff == 1 and machine.rto(message) == pytest.approx(2 * 0.018875)
    machine.on_feedback(RECEIVER, nack(MESSAGE, [1], key=message.key), now=probe_at + 0.5)  # late: not a sample
    assert machine.rto(message) == pytest.approx(0.018875)
    fast = sender()
    quick = submit(fast)
    first_pass(fast, quick, now=0.0)
    fast.on_feedback(RECEIVER, nack(MESSAGE, [1]), now=0.0001)
    assert fast.rto(quick) == MIN_RTO_S  # a loopback answer is no reason to probe within a thread switch


def test_a_message_unacknowledged_for_the_timeout_fails_its_peer_and_feedback_defers_that():
    machine = sender()
    message = submit(machine)
    first_pass(machine, message, now=0.0)
    machine.on_feedback(RECEIVER, nack(MESSAGE, [1]), now=1.0)  # feedback: the peer is alive
    drain(machine, now=1.0)
    assert machine.tick(TIMEOUT + 0.5) == [] and message.deadline == pytest.approx(1.0 + TIMEOUT)
    assert machine.tick(1.0 + TIMEOUT) == [
        Failure(RECEIVER, "did not acknowledge tensor 1 step 0 of iteration 3 within 5.0 s")]


def test_an_ack_releases_the_message_and_what_it_had_left_to_send():
    machine = sender()
    message = submit(machine)
    first_pass(machine, message)
    machine.on_feedback(RECEIVER, nack(MESSAGE, [1, 2]), now=0.01)
    machine.next_datagram(0.01)
    ack = datagram(wire.feedback(RECEIVER, TAG, KEY, codec.KIND_ACK, 1024, FRAGMENT, 1024))
    machine.on_feedback(RECEIVER, ack, now=0.02)
    assert message.released and machine.outgoing == {} and machine.next_datagram(0.02) is None
    assert machine.first_datagram(submit(machine, key=KEY._replace(tensor=2)), 0.02) is not None
    machine.on_feedback(RECEIVER, ack, now=0.03)  # a duplicate ACK
    assert machine.stats.late_feedback == 1


def test_feedback_on_another_grid_or_size_is_counted_and_ignored():
    machine = sender()
    first_pass(machine, submit(machine))
    machine.on_feedback(RECEIVER, nack(MESSAGE, [1], fragment=50), now=0.01)
    machine.on_feedback(RECEIVER, datagram(wire.feedback(RECEIVER, TAG, KEY, codec.KIND_ACK, 1000, FRAGMENT, 1000)),
                        now=0.01)
    assert machine.stats.mismatched == 2 and machine.next_datagram(0.01) is None and len(machine.outgoing) == 1


def test_a_bye_releases_the_peers_unacknowledged_messages_only():
    machine = sender()
    gone = [submit(machine, key=KEY._replace(tensor=t)) for t in range(2)]
    first_pass(machine, gone[0])
    machine.on_feedback(RECEIVER, nack(MESSAGE, [1, 2], key=gone[0].key), now=0.01)
    machine.first_datagram(gone[1], 0.01)
    kept = submit(machine, OTHER)
    first_pass(machine, kept)
    machine.on_feedback(OTHER, nack(MESSAGE, [4]), now=0.01)
    machine.forget(RECEIVER)
    assert all(m.released for m in gone) and not kept.released and list(machine.outgoing) == [(OTHER, KEY)]
    assert machine.first_datagram(gone[1], 0.01) is None  # its caller stops sending
    assert [(e.peer, on_the_wire(e).frame.offset) for e in drain(machine, 0.01)] == [(OTHER, 400)]


def test_a_peers_passes_take_turns():
    machine = sender()
    for tensor in (1, 2):
        first_pass(machine, submit(machine, key=KEY._replace(tensor=tensor)))
        machine.on_feedback(RECEIVER, nack(MESSAGE, [1, 2, 3], key=KEY._replace(tensor=tensor)), now=0.01)
    assert [on_the_wire(machine.next_datagram(0.01)).frame.tensor for _ in range(6)] == [1, 2, 1, 2, 1, 2]


def test_resends_interleave_peers_and_a_slow_peer_does_not_hold_up_a_fast_one():
    machine = sender(link_mbps=1000)
    payload = bytes(100 * FRAGMENT)
    for peer in (RECEIVER, OTHER):
        first_pass(machine, submit(machine, peer, payload=payload), now=10.0)
        machine.on_feedback(peer, nack(payload, list(range(100))), now=10.0)  # loss bound 0: all of them again
    order = [machine.next_datagram(now=10.0).peer for _ in range(6)]
    assert order == [RECEIVER, OTHER] * 3  # equal rates: turns
    machine.advise(OTHER, 1.0)  # OTHER's receiver advises the floor: 1/20 of the link
    order = [machine.next_datagram(now=10.0).peer for _ in range(40)]
    assert 1 <= order.count(OTHER) <= 3


def test_the_host_pacer_keeps_every_peer_together_under_the_link():
    pacer = HostPacer(1e6)
    for peer in (RECEIVER, OTHER):
        pacer.add(peer)
    departures = [pacer.schedule([(RECEIVER, 1000), (OTHER, 1000)], now=10.0)[1] for _ in range(100)]
    assert departures[-1] == pytest.approx(10 + 100 * 1000 / (LINK_SHARE * 1e6) - PACING_BURST_S)


def test_only_our_peers_datagrams_from_their_hosts_count():
    peers = Peers(TAG)
    peers.hosts[SENDER] = "10.0.0.1"
    frame = wire.data_frame(SENDER, TAG, KEY, 0, 4, 4)
    assert peers.sender_of(frame, "10.0.0.1") == SENDER
    assert peers.sender_of(frame, "10.0.0.2") is None
    assert peers.sender_of(frame._replace(tag=TAG + 1), "10.0.0.1") is None
    assert peers.sender_of(frame._replace(rank=5), "10.0.0.1") is None


# --- both ends, through a lossy network with a simulated clock

def exchange(values: np.ndarray, loss_bound: float, lost, tolerate_loss: bool = True) -> tuple[Delivery, Sender]:
    """Send `values` from a Sender to a Receiver, ticking both whenever the sender idles; `lost()` drops each
    datagram either way but RATE advice.  Timeouts so long that only a bug could fail the exchange."""
    tx, rx = sender(1000.0, loss_bound=loss_bound), receiver(1000.0, loss_bound=loss_bound)
    message = tx.submit(RECEIVER, KEY, values.view(np.uint8).copy(), None,
                        tx.allowance(RECEIVER, KEY, values.nbytes, tolerate_loss))
    now, delivered = 0.0, []
    while tx.outgoing:
        assert now < 600, "no progress"
        if (emission := tx.first_datagram(message, now) or tx.next_datagram(now)) is not None:
            now = max(now, emission.at)
            if emission.ends_pass:
                tx.pass_sent(emission.message, now)
            actions = () if lost() else rx.on_data(SENDER, on_the_wire(emission), now)
        else:
            now += rx.quiet_s / 2
            actions = rx.tick(now)
            assert tx.tick(now) == []
        delivered += [a for a in actions if isinstance(a, Delivery)]
        for reply in (datagram(a.datagram) for a in actions if isinstance(a, Reply)):
            if reply.advised_kbps:
                tx.advise(RECEIVER, reply.advised_kbps * 125)
            if reply.frame.kind != codec.KIND_RATE and not lost():
                tx.on_feedback(RECEIVER, reply, now)
    assert len(delivered) == 1
    return delivered[0], tx


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3000), st.sampled_from([0.0, 0.01, 0.1]), st.floats(0, 0.4), st.randoms(use_true_random=False),
       st.booleans())
def test_every_message_arrives_within_its_bound_whatever_is_lost(floats, loss_bound, loss, rng, tolerate_loss):
    values = np.arange(1, floats + 1, dtype=np.float32)
    delivery, tx = exchange(values, loss_bound, lambda: rng.random() < loss, tolerate_loss)
    out = np.full_like(values, -1.0)
    delivery.message.copy_into(out)
    arrived = out != 0
    assert np.array_equal(out[arrived], values[arrived])  # what arrived is right; what did not reads zero
    assert values.nbytes - delivery.message.delivered <= wire.allowed_missing_bytes(values.nbytes, loss_bound)
    assert values.nbytes - delivery.message.delivered <= tx.allowance(RECEIVER, KEY._replace(iteration=9),
                                                                      values.nbytes, tolerate_loss)
    assert (loss_bound > 0 and tolerate_loss) or delivery.message.delivered == values.nbytes  # exact: all of it


def test_a_loss_free_exchange_needs_no_retransmission():
    delivery, tx = exchange(np.ones(5000, np.float32), 0.0, lambda: False)
    assert delivery.message.delivered == 20000 and tx.stats.fragments_retransmitted == tx.stats.probes == 0


def test_a_lost_ack_is_recovered_by_a_probe_and_the_duplicates_re_ack():
    lost = iter([False] * 11 + [True])  # every fragment, then the ACK
    delivery, tx = exchange(np.ones(256, np.float32), 0.0, lambda: next(lost, False))
    assert delivery.message.delivered == 1024 and tx.stats.probes == 1


def test_random_loss_on_a_long_message_is_repaired_with_just_enough_resends():
    rng = random.Random(0)
    values = np.ones(25_000, np.float32)  # 1000 fragments
    delivery, tx = exchange(values, 0.05, lambda: rng.random() < 0.1)
    assert 0.95 <= delivery.message.delivered_fraction < 1
    # About 10% lost, the bound takes 5%: roughly 5% resent (and the resends' own losses), not all 10%.
    assert 40 <= tx.stats.fragments_retransmitted <= 80


# --- what a receiver trusts of a header: a message's grid is the job's

def forged_probe(key: MessageKey, total: int, fragment: int, required: int = 0) -> codec.Datagram:
    """62 bytes as anyone on SENDER's host could send them: a probe of `key` in `fragment`-byte pieces."""
    frame = wire.data_frame(SENDER, TAG, key, 0, 0, total)
    return datagram(codec.encode_datagram_header(frame, 0, fragment, required))


@pytest.mark.parametrize("loss_bound", [0.0, 0.1])
def test_a_forged_probe_on_another_grid_is_counted_and_neither_completes_nor_holds_up_the_real_message(loss_bound):
    machine = receiver(loss_bound=loss_bound, max_message_bytes=len(MESSAGE))
    actions = machine.on_data(SENDER, forged_probe(KEY, len(MESSAGE), 2**32 - 1), now=0.0)
    assert actions == () and machine.incoming == {} and machine.stats.mismatched == 1
    delivered = [a for index in range(11)
                 for a in machine.on_data(SENDER, data(KEY, index, MESSAGE, required=len(MESSAGE)), now=0.001)
                 if isinstance(a, Delivery)]
    assert [d.message.buffer.tobytes() for d in delivered] == [MESSAGE] and machine.stats.duplicates == 0


def test_a_probe_on_the_jobs_grid_never_completes_a_message_none_of_whose_bytes_arrived():
    """Whatever it says its sender requires: at least one fragment of every message arrives (Sender.allowance)."""
    machine = receiver(loss_bound=0.5)
    one_fragment = MESSAGE[:FRAGMENT]
    nack, = feedback_of(machine.on_data(SENDER, forged_probe(KEY, len(one_fragment), FRAGMENT), now=0.0))
    assert nack.frame.kind == codec.KIND_NACK and nack.delivered == 0
    ack, delivery = machine.on_data(SENDER, data(KEY, 0, one_fragment), now=0.001)
    assert delivery.message.buffer.tobytes() == one_fragment


def test_the_required_bytes_of_a_message_are_the_most_any_of_its_datagrams_says():
    """A forged first datagram saying nothing is required cannot make an exact message complete short."""
    machine = receiver(loss_bound=0.5)
    machine.on_data(SENDER, forged_probe(KEY, len(MESSAGE), FRAGMENT), now=0.0)
    for index in set(range(11)) - {4}:
        machine.on_data(SENDER, data(KEY, index, MESSAGE, required=len(MESSAGE)), now=0.001)
    nack, = feedback_of(machine.tick(0.01))
    assert nack.frame.kind == codec.KIND_NACK and list(wire.missing_fragments(nack.payload, 1024, FRAGMENT)) == [4]



# --- what a receiver remembers of its completed messages

def complete(machine: Receiver, peer: Peer, key: MessageKey, message: bytes, now: float) -> None:
    for index in range(wire.fragment_count(len(message), FRAGMENT)):
        machine.on_data(peer, data(key, index, message), now=now)


def kinds(actions) -> list[str]:
    """What the actions are: ACK, NACK (of any message) or a delivery."""
    return [{codec.KIND_ACK: "ACK", codec.KIND_NACK: "NACK"}[f.frame.kind] for f in feedback_of(actions)] + [
        "delivery" for a in actions if isinstance(a, Delivery)]


def test_a_late_probe_or_duplicate_after_thousands_of_completions_is_acked_never_nacked_nor_delivered_again():
    machine = receiver()
    for iteration in range(2500):  # 5000 one-datagram messages from two peers
        for peer in (SENDER, OTHER):
            complete(machine, peer, KEY._replace(iteration=iteration), MESSAGE[:FRAGMENT], now=iteration / 10_000)
    first = KEY._replace(iteration=0)
    assert kinds(machine.on_data(SENDER, probe(first, MESSAGE[:FRAGMENT]), now=1.0)) == ["ACK"]  # its ACK was lost
    assert kinds(machine.on_data(SENDER, data(first, 0, MESSAGE[:FRAGMENT]), now=1.001)) == []  # one per quiet period
    assert kinds(machine.on_data(SENDER, data(first, 0, MESSAGE[:FRAGMENT]), now=1.01)) == ["ACK"]
    assert machine.stats.late_probes == 1 and machine.stats.duplicates == 2
    assert all(kinds(machine.tick(1.0 + t / 100)) == [] for t in range(200))  # nothing incoming: no NACK


def test_a_completed_message_is_remembered_while_its_sender_may_still_send_it_then_stays_done():
    """Its sender gives up `timeout` after the last feedback it heard: a message heard of again is remembered
    that long again (and a second more for the feedback on its way); then any of its datagrams is stale."""
    machine = receiver()
    complete(machine, SENDER, KEY, MESSAGE, now=0.0)
    assert kinds(machine.on_data(SENDER, data(KEY, 10, MESSAGE), now=TIMEOUT)) == ["ACK"]  # a late duplicate
    machine.tick(2 * TIMEOUT + 0.5)
    assert kinds(machine.on_data(SENDER, probe(KEY, MESSAGE), now=2 * TIMEOUT + 0.5)) == ["ACK"]
    machine.tick(3 * TIMEOUT + 2.0)  # silent since for longer than the sender's timeout: forgotten
    assert machine.remembered() == 0
    late = 3 * TIMEOUT + 2.0
    for datagram_ in (probe(KEY, MESSAGE), data(KEY, 10, MESSAGE), data(KEY._replace(tensor=9), 0, MESSAGE)):
        assert kinds(machine.on_data(SENDER, datagram_, now=late)) == []
    assert machine.stats.stale == 3 and machine.incoming == {}
    assert kinds(machine.tick(late + 1.0)) == []
    # A later iteration is news: it is received as ever.
    assert "NACK" in kinds(machine.on_data(SENDER, probe(KEY._replace(iteration=4), MESSAGE), now=late))


def test_a_peers_remembered_messages_are_capped_oldest_iteration_first(monkeypatch):
    monkeypatch.setattr("hostapps.mlt.receiver.MAX_REMEMBERED", 4)
    machine = receiver()
    for iteration in range(5):
        for tensor in range(2):
            complete(machine, SENDER, MessageKey(iteration, tensor, 0), MESSAGE[:FRAGMENT], now=0.0)
    complete(machine, OTHER, KEY, MESSAGE[:FRAGMENT], now=0.0)  # the cap is per peer
    assert machine.remembered() == 4 + 1
    assert kinds(machine.on_data(SENDER, probe(MessageKey(4, 1, 0), MESSAGE[:FRAGMENT]), now=0.01)) == ["ACK"]
    assert kinds(machine.on_data(SENDER, probe(MessageKey(2, 0, 0), MESSAGE[:FRAGMENT]), now=0.01)) == []
    assert machine.stats.stale == 1
    assert kinds(machine.on_data(OTHER, probe(KEY, MESSAGE[:FRAGMENT]), now=0.01)) == ["ACK"]

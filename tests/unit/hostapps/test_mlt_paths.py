"""Congestion-aware spraying (hostapps.mlt.paths): the receiver names the source ports whose datagrams
queued, the sender avoids them.  tests/unit/hostapps/test_mlt.py times real datagrams on loopback."""
import random

import pytest

from hostapps import codec
from hostapps.mlt import paths, wire
from hostapps.transport import Peer

SENDER, OTHER = Peer("worker", 0), Peer("worker", 1)
FRAME = 9000  # bytes; at 50 Mbit/s 3 frames are 4.32 ms, so the threshold is its floor, 5 ms


def monitor() -> paths.PathMonitor:
    return paths.PathMonitor(FRAME, 50.0)


def test_the_threshold_is_a_few_frames_at_the_link_rate_and_at_least_its_floor():
    assert paths.PathMonitor(FRAME, 10.0).queue_delay_us == pytest.approx(3 * FRAME * 8 / 10)
    floor_us = 1e6 * paths.MIN_QUEUE_DELAY_S
    assert monitor().queue_delay_us == paths.PathMonitor(FRAME, 10_000.0).queue_delay_us == floor_us


def observe(watch: paths.PathMonitor, peer: Peer, port: int, delay: float, arrival: float) -> None:
    """A datagram that arrived at `arrival` (seconds), `delay` after it was sent."""
    watch.observe(peer, port, round((arrival - delay) * 1e6), arrival)


def observe_all(watch: paths.PathMonitor, peer: Peer, sends: list[tuple[int, float, float]]) -> float:
    """Datagrams sent as (port, send time, delay), in the order they arrive; the last arrival."""
    arrivals = sorted(((port, delay, sent + delay) for port, sent, delay in sends), key=lambda a: a[2])
    for port, delay, arrival in arrivals:
        observe(watch, peer, port, delay, arrival)
    return arrivals[-1][2]


def test_ports_whose_datagrams_were_overtaken_are_reported_congested_and_the_others_clear():
    """A datagram a millisecond; even ports cross a spine whose queue holds 20 ms of bulk traffic."""
    watch = monitor()
    sends = [(port, (port - 1000) / 1000, 0.0005 + (0.020 if port % 2 == 0 else 0.0)) for port in range(1000, 1064)]
    end = observe_all(watch, SENDER, sends)
    reported = watch.report(end)
    assert set(reported) == {SENDER}
    # overtaken by an odd port's datagram sent more than 5 ms later: all but the last three even ones
    assert reported[SENDER].congested == list(range(1000, 1058, 2))
    # clear: the odd ports that arrived after the eleventh congested one (the episode began then: the tenth
    # arrived 18 ms after the first, and an episode needs ten over 20 ms), and the last three even ones,
    # which nothing sent later enough overtook (the next report would name them)
    assert reported[SENDER].clear == sorted([*range(1041, 1064, 2), 1058, 1060, 1062])
    assert watch.flagged == 29
    assert watch.report(end + paths.REPORT_INTERVAL_S) == {}  # reported once


def test_without_congestion_nothing_is_reported():
    watch = monitor()
    end = observe_all(watch, SENDER, [(1000 + i, i / 1000, 0.0005) for i in range(200)])
    assert watch.report(end) == {}
    # a stray overtaken datagram: only its port is named
    observe(watch, SENDER, 1, 0.030, end + 0.001)
    observe(watch, SENDER, 2, 0.0005, end + 0.002)
    assert watch.report(end + 0.01) == {SENDER: paths.PathReport([1], [])}
    # EPISODE_STRIKES of them (each within STRIKE_GAP_S of the last, over EPISODE_SPAN_S) begin an episode:
    # the ports that went through are named meanwhile
    strikes, spacing = paths.EPISODE_STRIKES, 0.003
    assert (strikes - 1) * spacing >= paths.EPISODE_SPAN_S and spacing <= paths.STRIKE_GAP_S
    start = end + 0.002 + 2 * paths.STRIKE_GAP_S  # the stray one does not count
    for i in range(strikes):  # each overtaken by one sent 29 ms later
        observe(watch, SENDER, 50 + i, 0.0005, start + i * spacing)
        observe(watch, SENDER, 10 + i, 0.030, start + 0.0005 + i * spacing)
    flagged = start + 0.0005 + (strikes - 1) * spacing
    for i in range(2):
        observe(watch, SENDER, 100 + i, 0.0005, flagged + 0.001 + i / 1000)
    assert watch.report(flagged + 0.01) == {SENDER: paths.PathReport(list(range(10, 10 + strikes)), [100, 101])}
    late = flagged + 0.01 + paths.ADAPT_S
    observe(watch, SENDER, 102, 0.0005, late)
    assert watch.report(late + paths.REPORT_INTERVAL_S) == {}  # the episode is over


def test_stray_congested_datagrams_apart_begin_no_episode():
    watch = monitor()
    for i in range(5):  # overtaken datagrams 2 x STRIKE_GAP_S apart, each between clear ones
        at = i * 2 * paths.STRIKE_GAP_S
        watch.observe(SENDER, 200 + i, round((at + 0.020) * 1e6), at + 0.0205)
        watch.observe(SENDER, 100 + i, round(at * 1e6), at + 0.030)  # overtaken by 20 ms
        watch.observe(SENDER, 300 + i, round((at + 0.021) * 1e6), at + 0.031)
    assert watch.report(1.0) == {SENDER: paths.PathReport([100, 101, 102, 103, 104], [])}


def test_a_stalls_backlog_arriving_at_once_begins_no_episode():
    """Ten datagrams held 40-50 ms and let go within 12 ms (a host's backlog after a CPU stall, as on an
    unloaded fabric): overtaken, so their ports are named, but no episode begins."""
    watch = monitor()
    held = range(40, 40 + paths.EPISODE_STRIKES)
    end = observe_all(watch, SENDER, [
        (1000 + i, i / 1000, 0.090 + (i - held[0]) * 0.012 / (len(held) - 1) - i / 1000 if i in held else 0.0005)
        for i in range(120)])
    assert watch.flagged == len(held)
    assert watch.report(end) == {SENDER: paths.PathReport([1000 + i for i in held], [])}


@pytest.mark.parametrize("delay", [
    lambda i: 0.0005 + 0.0004 * i,                    # the receiver's downlink fills: 0.4 ms more per datagram
    lambda i: 0.0005 + (0.130 - i / 1000 if 100 <= i < 130 else 0.0),  # a switch thread stalls 30 ms
], ids=["downlink-queue", "stall"])
def test_queueing_every_path_shares_marks_nothing(delay):
    """What every path shares delays datagrams in the order they were sent: none overtakes another."""
    watch = monitor()
    end = observe_all(watch, SENDER, [(1000 + i, i / 1000, delay(i)) for i in range(200)])
    assert watch.report(end) == {} and watch.flagged == 0


def test_senders_are_compared_with_themselves_and_reports_are_spaced():
    watch = monitor()
    observe(watch, SENDER, 1, 0.0005, 0.0205)  # sent at 0.020
    observe(watch, OTHER, 2, 0.030, 0.031)     # sent at 0.001 by another sender: nothing overtook it
    observe(watch, SENDER, 3, 0.030, 0.031)    # sent at 0.001: overtaken by port 1's
    assert watch.report(0.031) == {SENDER: paths.PathReport([3], [])}
    observe(watch, SENDER, 4, 0.030, 0.032)
    assert watch.report(0.032 + paths.REPORT_INTERVAL_S / 2) == {}
    assert watch.report(0.032 + paths.REPORT_INTERVAL_S) == {SENDER: paths.PathReport([4], [])}


def test_send_stamps_wrap_around():
    watch = monitor()
    watch.observe(SENDER, 1, paths.STAMP_RANGE - 1000, 0.0)
    watch.observe(SENDER, 2, 20_000, 0.001)                   # sent 21 ms later, after the stamps wrapped
    watch.observe(SENDER, 3, paths.STAMP_RANGE - 500, 0.002)  # overtaken by 20.5 ms
    assert watch.report(0.01) == {SENDER: paths.PathReport([3], [])}


PORTS = list(range(2000, 2064))
CONGESTED = PORTS[::2]


def picks(chooser: paths.PathChooser, peer: Peer, now: float, count: int = 2000) -> list[int]:
    return [PORTS[chooser.pick(peer, now)] for _ in range(count)]


def test_without_reports_every_port_is_used():
    assert set(picks(paths.PathChooser(PORTS, random.Random(3)), SENDER, 0.0)) == set(PORTS)


def test_the_sender_avoids_the_congested_ports_for_a_while():
    chooser = paths.PathChooser(PORTS, random.Random(7))
    assert chooser.hear(SENDER, paths.PathReport(CONGESTED, []), now=0.0) == 32
    chosen = picks(chooser, SENDER, 0.1)
    # no clear port to reuse: 8 random draws each, a congested port only when all 8 were (1/256 of the picks)
    assert sum(p in CONGESTED for p in chosen) <= 2000 / 256 * 3
    assert set(chosen) - set(CONGESTED) == set(PORTS) - set(CONGESTED)
    assert 800 < sum(p in CONGESTED for p in picks(chooser, OTHER, 0.1)) < 1200  # another peer's paths differ
    later = picks(chooser, SENDER, 1.5 * paths.AVOID_S + 0.01)
    assert 800 < sum(p in CONGESTED for p in later) < 1200  # every path is tried again


def test_while_congested_the_sender_sends_from_the_clear_ports_until_one_queues():
    chooser = paths.PathChooser(PORTS, random.Random(5))
    chooser.hear(SENDER, paths.PathReport([2000], [2001, 2003, 2000, 2005, 9999]), now=0.0)
    # 2000 is congested and 9999 not ours: the three clear ones only, each in turn at random
    assert set(picks(chooser, SENDER, 0.1, 300)) == {2001, 2003, 2005}
    chooser.hear(SENDER, paths.PathReport([2003], [2007]), now=0.2)
    assert set(picks(chooser, SENDER, 0.2, 300)) == {2001, 2005, 2007}
    # once the last congestion is ADAPT_S old, the sender sprays over every port not avoided
    late = 0.2 + paths.ADAPT_S + 0.01
    assert len(set(picks(chooser, SENDER, late))) > 50
    # a stray congested port alone begins no episode; a new episode starts from its own clear ports
    chooser.hear(SENDER, paths.PathReport([2010], []), now=late)
    assert len(set(picks(chooser, SENDER, late))) > 50
    chooser.hear(SENDER, paths.PathReport([2012], [2011]), now=late)
    assert set(picks(chooser, SENDER, late, 50)) == {2011}


def test_the_sender_never_avoids_nearly_every_port():
    chooser = paths.PathChooser(list(range(100)), random.Random(1))
    assert chooser.hear(SENDER, paths.PathReport(list(range(100)), []), now=0.0) == int(paths.MAX_AVOIDED_SHARE * 100)
    assert chooser.hear(SENDER, paths.PathReport(list(range(100)), []), now=0.1) == int(paths.MAX_AVOIDED_SHARE * 100)
    assert chooser.hear(SENDER, paths.PathReport([5], []), now=10.0) == 1  # the others expired


def test_a_paths_frame_round_trips_and_a_malformed_one_is_refused():
    report = paths.PathReport([1, 40000], [65535])
    assert wire.path_report(codec.decode_datagram(memoryview(wire.paths(SENDER, 5, report)))) == report
    for step, payload in [(0, b"abc"), (3, b"abcd")]:
        frame = codec.Frame(codec.KIND_PATHS, "worker", 0, step, 5, 0, 0, 0, len(payload), len(payload))
        with pytest.raises(codec.FrameError, match="16-bit ports"):
            codec.decode_datagram(memoryview(codec.encode_datagram_header(frame, 0, 0) + payload))


def test_only_datagrams_of_one_class_are_compared():
    """Strict priority lets a later datagram of a higher class overtake on any path: no congestion."""
    watch = monitor()
    watch.observe(SENDER, 2, round(0.020 * 1e6), 0.0205, dscp=40)    # CS5, sent at 0.020, arrives first
    observe(watch, SENDER, 1, 0.030, 0.031)                          # CS0, sent at 0.001: another class
    watch.observe(SENDER, 3, round(0.002 * 1e6), 0.032, dscp=40)     # CS5, sent at 0.002: overtaken
    assert watch.report(0.04) == {SENDER: paths.PathReport([3], [])}

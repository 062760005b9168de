"""ControllerCore (controller/core.py) driving fake switches wired as a fabric
(tests/helpers/fakeswitch.py): each event is the core's call, each answer is applied to the
switches, and packets go from host to host through what it installed."""
import itertools

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from ryu.lib.packet import arp
from ryu.ofproto import ofproto_v1_5_parser as parser

from controller import pipeline
from controller.core import ControllerCore
from controller.priority import FlowClass
from controller.routing import LB_MODES, plan_fabric
from controller.scheduling import JobFlow, Layer, RegisteredJob
from controller.topology import Host
from helpers.fabric_views import LEAF, SPINE, ip, leaf_spine
from helpers.fakeswitch import CONTROLLER, CoreNetwork, arp_frame, host_mac, tcp_frame


def discovered(wiring, lb: str = "ecmp", pinned: bool = False) -> CoreNetwork:
    """A core with every switch of `wiring` connected (its hosts known in advance if `pinned`)."""
    hosts = [Host(h.ip, host_mac(h.ip), h.dpid, h.port) for h in wiring.hosts.values()] if pinned else []
    net = CoreNetwork(ControllerCore(lb, hosts), wiring)
    for dpid in sorted(wiring.switches):
        net.connect(dpid)
    return net


def delivered(net: CoreNetwork, pairs) -> bool:
    """Whether every (src, dst) TCP packet reaches dst along every path the switches may pick."""
    return all({e.end for e in net.send(src, tcp_frame(src, dst))} == {dst} for src, dst in pairs)


def marks_held(net: CoreNetwork, dpid: int) -> set[tuple]:
    """The classify-table marks switch `dpid` holds: (priority, match, dscp)."""
    return {(e.priority, tuple(sorted(e.match.items())), e.instructions[0].actions[0].value)
            for e in net.fabric.switches[dpid].flows(0) if e.priority != 0}


def marks_wanted(core: ControllerCore, dpid: int) -> set[tuple]:
    return {(pipeline.mark_priority(f), tuple(sorted(pipeline.mark_match(f).items())), f.dscp)
            for f in core.wanted_by_switch().get(dpid, {}).values()}


@pytest.mark.parametrize("lb", LB_MODES)
def test_hosts_reach_each_other_once_discovered_and_after_arp(lb):
    wiring = leaf_spine(2, 3, 2)
    net = discovered(wiring, lb)
    assert net.core.view.links == wiring.links and net.core.view.hosts == {}
    h1, h3, h6 = ip(1), ip(3), ip(6)
    for src, dst in ((h1, h3), (h6, h1)):
        net.received.clear()
        net.send(src, arp_frame(arp.ARP_REQUEST, src, dst))
        assert dst in net.received, "flooded to the unknown target"
        net.send(dst, arp_frame(arp.ARP_REPLY, dst, src))
        assert net.received.get(src), "the reply reaches the asker"
    assert not net.core.held._held, "every packet held behind barriers went"
    assert net.core.installed == plan_fabric(net.core.view, lb)
    assert delivered(net, itertools.permutations((h1, h3, h6), 2))
    assert [e.end for e in net.send(ip(2), tcp_frame(ip(2), ip(5)))] == [CONTROLLER], \
        "to an unknown host: up to the controller, which learns the sender"
    assert ip(2) in net.core.view.hosts and delivered(net, [(h1, ip(2))])


def test_a_link_going_down_reroutes_and_a_leaf_cut_off_is_unreachable():
    wiring = leaf_spine(2, 3, 2)
    net = discovered(wiring, pinned=True)
    hosts = sorted(wiring.hosts)
    assert delivered(net, itertools.permutations(hosts, 2))
    net.cut((LEAF + 1, 3))  # leaf1's uplink to spine1
    assert net.core.installed == plan_fabric(net.core.view, "ecmp")
    assert delivered(net, itertools.permutations(hosts, 2))
    assert all(3 not in g.ports() for g in net.fabric.switches[LEAF + 1].groups.values())
    net.cut((LEAF + 1, 4))  # and to spine2: leaf1's hosts are cut off
    for src in (ip(3), ip(6)):
        assert {e.end for e in net.send(src, tcp_frame(src, ip(1)))} <= {"dropped", CONTROLLER}
    assert delivered(net, itertools.permutations(hosts[2:], 2))


def job(a: str, b: str) -> RegisteredJob:
    """Policy `layer`: the flow a -> b:5001 gets CS6 (48); lower-effort datagrams CS1."""
    return RegisteredJob("j1", "layer", (a, b), (Layer(0, "conv", 10), Layer(1, "fc", 20)),
                         (JobFlow((0,), a, b, "tcp", None, 5001, 5001),))


@pytest.mark.parametrize("gone_first", [True, False])
def test_a_switch_that_reconnects_gets_its_routes_and_marks_again(gone_first):
    """Its tables are wiped by the base pipeline; a new connection may come before the old one
    is seen to close."""
    wiring = leaf_spine(2, 2, 2)
    net = discovered(wiring, pinned=True)
    h1, h3 = ip(1), ip(3)
    net.core.register_job(job(h1, h3))
    net.deliver(net.core.stats_requests())
    net.run()

    def check():
        ends = net.send(h1, tcp_frame(h1, h3))
        assert {e.end for e in ends} == {h3} and {e.packet["ip_dscp"] for e in ends} == {48}
        assert marks_held(net, LEAF + 1) == marks_wanted(net.core, LEAF + 1) != set()

    check()
    if gone_first:
        net.disconnect(LEAF + 1)
        assert LEAF + 1 not in net.core.view.switches and net.core.installed.keys() == wiring.switches.keys() - {
            LEAF + 1}
    net.connect(LEAF + 1)
    check()
    assert delivered(net, itertools.permutations(sorted(wiring.hosts), 2))


def test_a_packet_held_behind_barriers_goes_when_a_switch_never_answers():
    wiring = leaf_spine(2, 2, 2)
    net = discovered(wiring)
    net.received.clear()  # the probes
    net.hold_barriers = True
    net.send(ip(1), arp_frame(arp.ARP_REQUEST, ip(1), ip(3)))
    assert not net.received and len(net.held) == 1
    net.deliver(net.core.release(net.held.pop()))
    net.run()
    assert sorted(net.received) == [ip(2), ip(3), ip(4)]
    net.received.clear()
    net.release_barriers()
    assert not net.received, "sent once"


def test_a_mark_installation_stops_for_a_switch_that_left():
    wiring = leaf_spine(1, 2, 1)
    net = discovered(wiring, pinned=True)
    flows = [FlowClass(ip(1), ip(2), 40, "udp", 1 + i) for i in range(50)]
    net.core.set_flow_classes(flows + [FlowClass(ip(2), ip(1), 8)])
    updates = net.core.mark_updates()
    assert [next(updates)[0] for _ in range(10)] == [LEAF + 1] * 10
    net.core.switch_gone(LEAF + 1)  # while this pass waits to send its next update
    assert [dpid for dpid, _ in updates] == [LEAF + 2], "leaf1's stopped, leaf2's done"


FLOWS = st.lists(st.builds(lambda src, dst, port, dscp: FlowClass(ip(src), ip(dst), dscp, "udp", port),
                           st.sampled_from([1, 2, 3]), st.sampled_from([1, 2, 3]), st.integers(1, 6),
                           st.sampled_from([8, 40, 48])), max_size=12)
CHANGES = st.one_of(st.tuples(st.just("set"), FLOWS, st.booleans()), st.tuples(st.just("remove"), FLOWS | st.none()))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(CHANGES, st.integers(0, 8)), min_size=1, max_size=8), st.data())
def test_marks_end_as_the_last_request_wants_however_requests_interleave(requests, data):
    """Each change starts a pass of mark updates, as each REST request does, which sends some
    of them before the next request comes; then the passes finish in any order: at the end
    every switch holds the marks wanted last."""
    wiring = leaf_spine(1, 2, 2)
    net = discovered(wiring, pinned=True)
    passes = []
    for (change, *args), sent in requests:
        if change == "set":
            net.core.set_flow_classes(*args)
        else:
            net.core.remove_flow_classes(*args)
        passes.append(net.core.mark_updates())
        for dpid, msg in itertools.islice(passes[-1], sent):
            net.queue(dpid, msg)
    for which in data.draw(st.permutations(range(len(passes)))):
        for dpid, msg in passes[which]:
            net.queue(dpid, msg)
    net.run()
    for dpid in wiring.switches:
        assert marks_held(net, dpid) == marks_wanted(net.core, dpid)


class PortCounters:
    """An OFPPortStats as the switch reports it."""

    def __init__(self, port_no: int, n: int) -> None:
        self.port_no = port_no
        self.tx_bytes, self.rx_bytes, self.tx_packets, self.rx_packets = 10 * n, 20 * n, n, 2 * n
        self.tx_dropped = self.rx_dropped = 0


def test_statistics_are_kept_per_switch_and_forgotten_with_it():
    wiring = leaf_spine(1, 1, 1)
    net = discovered(wiring, pinned=True)
    rows = net.core.port_stats_reply(LEAF + 1, [PortCounters(1, 3), PortCounters(0xFFFFFFFE, 9)], 12.3456)
    assert rows == [{"time_s": 12.346, "switch": "leaf1", "port": 1, "tx_bytes": 30, "rx_bytes": 60,
                     "tx_packets": 3, "rx_packets": 6, "tx_dropped": 0, "rx_dropped": 0}]
    buckets = [parser.OFPBucketCounter(packet_count=5, byte_count=0)]
    net.core.group_stats_reply(LEAF + 1, [parser.OFPGroupStats(group_id=7, bucket_stats=buckets)])
    assert net.core.describe_ports() == rows and net.core.group_stats == {LEAF + 1: {7: [5]}}
    assert net.core.port_stats_reply(SPINE + 9, [PortCounters(1, 1)], 0.0) == [], "an unknown switch"
    net.disconnect(LEAF + 1)
    assert net.core.describe_ports() == [] and net.core.group_stats == {}

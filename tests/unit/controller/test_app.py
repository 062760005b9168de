"""The real Ryu app (controller/app.py) driving a fabric of fake switches: its handlers get the
events Ryu would give them, built from Ryu's own message classes, and what it sends goes to the
fake switches (tests/helpers/fakeswitch.py). No OVS, no Ryu event loop, no sockets: the glue
between Ryu's events, the pipeline's decisions and the switches, from discovery to marks."""
import controller.manager  # noqa: F401  (the eventlet shim, before Ryu's app modules)

import collections
import logging

import pytest
from ryu.controller import ofp_event
from ryu.lib import hub
from ryu.lib.packet import arp, ethernet, ipv4, packet, tcp
from ryu.ofproto import ofproto_v1_5, ofproto_v1_5_parser as parser

from controller.app import FabricController
from controller.openflow import ETH_ARP, ETH_IP
from controller.routing import plan_fabric
from controller.scheduling import JobFlow, Layer, RegisteredJob
from controller.topology import Host
from helpers.fabric_views import LEAF, SPINE, ip, leaf_spine
from helpers.fakeswitch import CONTROLLER, FakeFabric, fields_of


class WiredDatapath:
    """What the app uses of a Ryu Datapath: what it sends waits in `outbox` for the network."""
    ofproto, ofproto_parser = ofproto_v1_5, parser

    def __init__(self, dpid: int) -> None:
        self.id = dpid
        self.outbox: list = []
        self.xid = 0

    def send_msg(self, msg) -> None:
        if msg.xid is None:
            self.xid += 1
            msg.set_xid(self.xid)
        self.outbox.append(msg)


class Network:
    """Fake switches wired as `wiring` (a FabricView of the real fabric, which the app does not
    see), each connected to `app` through a WiredDatapath."""

    def __init__(self, app: FabricController, wiring) -> None:
        self.app, self.wiring = app, wiring
        self.fabric = FakeFabric(wiring)
        self.dps = {dpid: WiredDatapath(dpid) for dpid in self.fabric.switches}
        self.received: dict[str, list[bytes]] = collections.defaultdict(list)  # host -> frames
        self.hold_barriers = False
        self.barrier_replies: list = []  # held ones

    def connect(self, dpid: int) -> None:
        msg = parser.OFPSwitchFeatures(self.dps[dpid], datapath_id=dpid)
        self.app.switch_features_handler(ofp_event.EventOFPSwitchFeatures(msg))
        self.run()

    def run(self) -> None:
        """Hand what the app sent to the switches, and what they answer to the app, until
        nothing moves (barrier replies wait while `hold_barriers`)."""
        while any(dp.outbox for dp in self.dps.values()):
            for dpid, dp in self.dps.items():
                while dp.outbox:
                    self.switch_gets(dpid, dp.outbox.pop(0))

    def release_barriers(self) -> None:
        replies, self.barrier_replies = self.barrier_replies, []
        for reply in replies:
            self.app.barrier_reply_handler(ofp_event.EventOFPBarrierReply(reply))
        self.run()

    def switch_gets(self, dpid: int, msg) -> None:
        dp = self.dps[dpid]
        if isinstance(msg, parser.OFPPortDescStatsRequest):
            self.app.port_desc_reply_handler(ofp_event.EventOFPPortDescStatsReply(
                parser.OFPPortDescStatsReply(dp, body=self.port_descs(dpid))))
        elif isinstance(msg, parser.OFPPacketOut):
            for end in self.fabric.packet_out(dpid, msg):
                self.arrived(end)
        elif isinstance(msg, parser.OFPBarrierRequest):
            self.fabric.switches[dpid].apply([msg])
            reply = parser.OFPBarrierReply(dp)
            reply.xid = msg.xid
            if self.hold_barriers:
                self.barrier_replies.append(reply)
            else:
                self.app.barrier_reply_handler(ofp_event.EventOFPBarrierReply(reply))
        elif not isinstance(msg, (parser.OFPPortStatsRequest, parser.OFPGroupStatsRequest)):
            self.fabric.switches[dpid].apply([msg])

    def port_descs(self, dpid: int) -> list:
        switch = self.wiring.switches[dpid]
        local = parser.OFPPort(port_no=ofproto_v1_5.OFPP_LOCAL, name=switch.name.encode(),
                               config=0, state=0)
        return [local] + [self.port(dpid, p) for p in sorted(switch.ports)]

    def port(self, dpid: int, port: int) -> parser.OFPPort:
        down = port in self.fabric.switches[dpid].dead
        name = f"{self.wiring.switches[dpid].name}-eth{port}"
        return parser.OFPPort(port_no=port, name=name.encode(), config=0,
                              state=ofproto_v1_5.OFPPS_LINK_DOWN if down else 0)

    def arrived(self, end) -> None:
        if end.end == CONTROLLER:
            dpid, pkt = end.hops[-1]
            msg = parser.OFPPacketIn(self.dps[dpid], match=parser.OFPMatch(in_port=pkt["in_port"]),
                                     data=end.data)
            self.app.packet_in_handler(ofp_event.EventOFPPacketIn(msg))
        elif end.end != "dropped":
            self.received[end.end].append(end.data)

    def send(self, host: str, data: bytes) -> list:
        """Host `host` sends the frame `data`; every way it can end."""
        ends = self.fabric.send(host, fields_of(data), data)
        for end in ends:
            self.arrived(end)
        self.run()
        return ends

    def cut(self, end: tuple[int, int]) -> None:
        """A link goes down: each end's switch reports its port."""
        for dpid, port in (end, self.fabric.cut(end)):
            msg = parser.OFPPortStatus(self.dps[dpid], reason=ofproto_v1_5.OFPPR_MODIFY,
                                       desc=self.port(dpid, port))
            self.app.port_status_handler(ofp_event.EventOFPPortStatus(msg))
        self.run()


def mac(host: str) -> str:
    return f'02:00:00:00:00:{int(host.rsplit(".", 1)[1]):02x}'


def arp_frame(opcode: int, src: str, dst: str) -> bytes:
    frame = packet.Packet()
    frame.add_protocol(ethernet.ethernet("ff:ff:ff:ff:ff:ff", mac(src), ETH_ARP))
    frame.add_protocol(arp.arp(opcode=opcode, src_mac=mac(src), src_ip=src,
                               dst_mac="00:00:00:00:00:00", dst_ip=dst))
    frame.serialize()
    return bytes(frame.data)


def tcp_frame(src: str, dst: str, dport: int = 5001) -> bytes:
    frame = packet.Packet()
    frame.add_protocol(ethernet.ethernet(mac(dst), mac(src), ETH_IP))
    frame.add_protocol(ipv4.ipv4(src=src, dst=dst, proto=6))
    frame.add_protocol(tcp.tcp(src_port=40000, dst_port=dport))
    frame.serialize()
    return bytes(frame.data)


@pytest.fixture
def app():
    """The real controller app (Ryu's app manager is not running, nor are its loops)."""
    fabric_app = FabricController()
    for thread in fabric_app.threads:
        hub.kill(thread)
    yield fabric_app
    logging.getLogger().removeHandler(fabric_app.errors)


@pytest.mark.parametrize("lb", ["ecmp", "spray", "single"])
def test_the_app_discovers_the_fabric_routes_and_reroutes(app, lb):
    app.lb = lb
    wiring = leaf_spine(2, 3, 2)
    net = Network(app, wiring)
    for dpid in sorted(net.dps):
        net.connect(dpid)
    assert app.view.links == wiring.links, "every link found by the probes"
    assert app.view.hosts == {} and sorted(net.received) == sorted(wiring.hosts), "probed too"
    net.received.clear()
    h1, h3, h5 = ip(1), ip(3), ip(5)
    # h1 asks for h3, whom nobody knows yet: the request waits until every switch has its
    # route to h1, then floods to every host but h1.
    net.hold_barriers = True
    net.send(h1, arp_frame(arp.ARP_REQUEST, h1, h3))
    assert set(app.view.hosts) == {h1} and not net.received
    assert {reply.datapath.id for reply in net.barrier_replies} == set(wiring.switches)
    net.release_barriers()
    assert sorted(net.received) == sorted(set(wiring.hosts) - {h1})
    # h3 answers; the answer waits for the routes to h3, then goes to h1 only.
    net.received.clear()
    net.send(h3, arp_frame(arp.ARP_REPLY, h3, h1))
    assert not net.received and net.barrier_replies
    net.release_barriers()
    assert list(net.received) == [h1]
    # Now the switches route h1 <-> h3 themselves, along every bucket choice.
    for src, dst in ((h1, h3), (h3, h1)):
        assert {e.end for e in net.send(src, tcp_frame(src, dst))} == {dst}
    # An IP packet to a host not known yet teaches the controller its sender.
    net.hold_barriers = False
    assert [e.end for e in net.send(h5, tcp_frame(h5, ip(6)))] == [CONTROLLER]
    assert h5 in app.view.hosts and {e.end for e in net.send(h1, tcp_frame(h1, h5))} == {h5}
    # leaf1's first uplink goes down: the app reroutes, the groups drop the dead port.
    net.cut((LEAF + 1, 3))
    assert app.installed == plan_fabric(app.view, lb)
    for src, dst in ((h1, h3), (h3, h1), (h5, h1), (h1, h5)):
        assert {e.end for e in net.send(src, tcp_frame(src, dst))} == {dst}
    assert all(3 not in g.ports() for g in net.fabric.switches[LEAF + 1].groups.values())
    assert app.errors.count == 0


def test_a_jobs_marks_reach_the_switches_and_follow_a_reconnect(app):
    """Hosts known in advance (the runner's hosts file) come back with their switch, and so do
    their marks."""
    wiring = leaf_spine(2, 2, 2)
    h1, h3 = ip(1), ip(3)
    for host in (h1, h3):
        app.view.pin_host(Host(host, mac(host), wiring.hosts[host].dpid, wiring.hosts[host].port))
    net = Network(app, wiring)
    for dpid in sorted(net.dps):
        net.connect(dpid)
    assert set(app.view.hosts) == {h1, h3}
    job = RegisteredJob("j1", "layer", (h1, h3), (Layer(0, "conv", 10), Layer(1, "fc", 20)),
              (JobFlow((1,), h1, h3, "tcp", None, 5001, 5001),))
    app.register_job(job)
    net.run()
    ends = net.send(h1, tcp_frame(h1, h3))
    assert {e.end for e in ends} == {h3} and {e.packet["ip_dscp"] for e in ends} == {40}
    assert len(net.fabric.switches[LEAF + 1].flows(0)) == 1 + 2  # miss, the flow, LE of h1
    assert len(net.fabric.switches[SPINE + 1].flows(0)) == 1
    # leaf1 reconnects (wiped by the base pipeline): the app installs routes and marks again.
    dp = net.dps[LEAF + 1]
    app.state_change_handler(ofp_event.EventOFPStateChange(dp))
    net.connect(LEAF + 1)
    ends = net.send(h1, tcp_frame(h1, h3))
    assert {e.end for e in ends} == {h3} and {e.packet["ip_dscp"] for e in ends} == {40}
    assert app.remove_job("j1")
    net.run()
    assert all(len(switch.flows(0)) == 1 for switch in net.fabric.switches.values())
    assert app.errors.count == 0

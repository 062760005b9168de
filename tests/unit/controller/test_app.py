"""The real Ryu app (controller/app.py) driving a fabric of fake switches: its handlers get the
events Ryu would give them, built from Ryu's own message classes, and what it sends goes to the
fake switches (tests/helpers/fakeswitch.py). No OVS, no Ryu event loop, no sockets: the glue
between Ryu's events, the pipeline's decisions and the switches, from discovery to marks."""
import controller.manager  # noqa: F401  (the eventlet shim, before Ryu's app modules)

import json
import logging

import pytest
import webob
from ryu.controller import ofp_event
from ryu.lib import hub
from ryu.lib.packet import arp
from ryu.ofproto import ofproto_v1_5, ofproto_v1_5_parser as parser

from controller.app import FabricController
from controller.routing import plan_fabric
from controller.scheduling import JobFlow, Layer, RegisteredJob
from controller.topology import Host
from helpers.fabric_views import LEAF, SPINE, ip, leaf_spine
from helpers.fakeswitch import CONTROLLER, FakeNetwork, arp_frame, host_mac, tcp_frame


class WiredDatapath:
    """What the app uses of a Ryu Datapath: what it sends goes to the network's outbox."""
    ofproto, ofproto_parser = ofproto_v1_5, parser

    def __init__(self, net: FakeNetwork, dpid: int) -> None:
        self.net, self.id = net, dpid

    def send_msg(self, msg) -> None:
        self.net.queue(self.id, msg)


class AppNetwork(FakeNetwork):
    """Fake switches connected to the Ryu app through WiredDatapaths: each event is the Ryu
    event its handler gets, built from Ryu's own message classes."""

    def __init__(self, app: FabricController, wiring) -> None:
        super().__init__(wiring)
        self.app = app
        self.dps = {dpid: WiredDatapath(self, dpid) for dpid in self.fabric.switches}

    def switch_features(self, dpid: int) -> None:
        msg = parser.OFPSwitchFeatures(self.dps[dpid], datapath_id=dpid)
        self.app.switch_features_handler(ofp_event.EventOFPSwitchFeatures(msg))

    def port_desc_reply(self, dpid: int, ports: list) -> None:
        msg = parser.OFPPortDescStatsReply(self.dps[dpid], body=ports)
        self.app.port_desc_reply_handler(ofp_event.EventOFPPortDescStatsReply(msg))

    def switch_gone(self, dpid: int) -> None:
        self.app.state_change_handler(ofp_event.EventOFPStateChange(self.dps[dpid]))

    def port_status(self, dpid: int, port, reason: int) -> None:
        msg = parser.OFPPortStatus(self.dps[dpid], reason=reason, desc=port)
        self.app.port_status_handler(ofp_event.EventOFPPortStatus(msg))

    def packet_in(self, dpid: int, in_port: int, data: bytes) -> None:
        msg = parser.OFPPacketIn(self.dps[dpid], match=parser.OFPMatch(in_port=in_port), data=data)
        self.app.packet_in_handler(ofp_event.EventOFPPacketIn(msg))

    def barrier_reply(self, dpid: int, xid: int) -> None:
        reply = parser.OFPBarrierReply(self.dps[dpid])
        reply.xid = xid
        self.app.barrier_reply_handler(ofp_event.EventOFPBarrierReply(reply))


@pytest.fixture
def app():
    """The real controller app (Ryu's app manager is not running, nor are its loops)."""
    fabric_app = FabricController()
    for thread in fabric_app.threads:
        hub.kill(thread)
    yield fabric_app
    logging.getLogger().removeHandler(fabric_app.core.errors)


@pytest.mark.parametrize("lb", ["ecmp", "spray", "single"])
def test_the_app_discovers_the_fabric_routes_and_reroutes(app, lb):
    app.core.lb = lb
    wiring = leaf_spine(2, 3, 2)
    net = AppNetwork(app, wiring)
    for dpid in sorted(net.dps):
        net.connect(dpid)
    assert app.core.view.links == wiring.links, "every link found by the probes"
    assert app.core.view.hosts == {} and sorted(net.received) == sorted(wiring.hosts), "probed too"
    net.received.clear()
    h1, h3, h5 = ip(1), ip(3), ip(5)
    # h1 asks for h3, whom nobody knows yet: the request waits until every switch has its
    # route to h1, then floods to every host but h1.
    net.hold_barriers = True
    net.send(h1, arp_frame(arp.ARP_REQUEST, h1, h3))
    assert set(app.core.view.hosts) == {h1} and not net.received
    assert {dpid for dpid, _ in net.barrier_replies} == set(wiring.switches)
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
    assert h5 in app.core.view.hosts and {e.end for e in net.send(h1, tcp_frame(h1, h5))} == {h5}
    # leaf1's first uplink goes down: the app reroutes, the groups drop the dead port.
    net.cut((LEAF + 1, 3))
    assert app.core.installed == plan_fabric(app.core.view, lb)
    for src, dst in ((h1, h3), (h3, h1), (h5, h1), (h1, h5)):
        assert {e.end for e in net.send(src, tcp_frame(src, dst))} == {dst}
    assert all(3 not in g.ports() for g in net.fabric.switches[LEAF + 1].groups.values())
    assert app.core.errors.count == 0


def test_a_jobs_marks_reach_the_switches_and_follow_a_reconnect(app):
    """Hosts known in advance (the runner's hosts file) come back with their switch, and so do
    their marks."""
    wiring = leaf_spine(2, 2, 2)
    h1, h3 = ip(1), ip(3)
    for host in (h1, h3):
        app.core.view.pin_host(Host(host, host_mac(host), wiring.hosts[host].dpid, wiring.hosts[host].port))
    net = AppNetwork(app, wiring)
    for dpid in sorted(net.dps):
        net.connect(dpid)
    assert set(app.core.view.hosts) == {h1, h3}
    job = RegisteredJob("j1", "layer", (h1, h3), (Layer(0, "conv", 10), Layer(1, "fc", 20)),
              (JobFlow((1,), h1, h3, "tcp", None, 5001, 5001),))
    app.core.register_job(job)
    app.install_marks()
    net.run()
    ends = net.send(h1, tcp_frame(h1, h3))
    assert {e.end for e in ends} == {h3} and {e.packet["ip_dscp"] for e in ends} == {40}
    assert len(net.fabric.switches[LEAF + 1].flows(0)) == 1 + 2  # miss, the flow, LE of h1
    assert len(net.fabric.switches[SPINE + 1].flows(0)) == 1
    # leaf1 reconnects (wiped by the base pipeline): the app installs routes and marks again.
    net.switch_gone(LEAF + 1)
    net.connect(LEAF + 1)
    ends = net.send(h1, tcp_frame(h1, h3))
    assert {e.end for e in ends} == {h3} and {e.packet["ip_dscp"] for e in ends} == {40}
    assert app.core.remove_job("j1")
    app.install_marks()
    net.run()
    assert all(len(switch.flows(0)) == 1 for switch in net.fabric.switches.values())
    assert app.core.errors.count == 0


def test_a_job_posted_over_rest_gets_its_paths_pinned_on_the_switches_and_unpinned_with_it(app):
    """intensity-paths through the real REST API: the answer names each pair's path, the pins reach
    the switches with it, and DELETE takes them off."""
    wiring = leaf_spine(2, 2, 2)
    for host in wiring.hosts.values():
        app.core.view.pin_host(Host(host.ip, host_mac(host.ip), host.dpid, host.port))
    net = AppNetwork(app, wiring)
    for dpid in sorted(net.dps):
        net.connect(dpid)
    h1, h3 = ip(1), ip(3)
    document = {"job": "j1", "policy": "fifo", "hosts": [h1, h3], "sharing": "intensity-paths",
                "layers": [{"index": 0, "name": "l0", "bytes": 1000, "fwd_ms": 1, "bwd_ms": 1}], "comm_ms": 1}

    def request(method: str, path: str, body=None) -> webob.Response:
        req = webob.Request.blank(path, method=method, base_url="http://127.0.0.1:8080",
                                  body=None if body is None else json.dumps(body).encode())
        if body is not None:
            req.headers["Content-Type"] = "application/json"
        response = req.get_response(app.wsgi)
        net.run()
        return response

    answer = request("POST", "/jobs", document)
    assert answer.status_code == 200
    assert answer.json["paths"] == [{"src": h1, "dst": h3, "via": ["leaf1", "spine1", "leaf2"]},
                                    {"src": h3, "dst": h1, "via": ["leaf2", "spine1", "leaf1"]}]
    ends = net.send(h1, tcp_frame(h1, h3))
    assert {e.path for e in ends} == {(LEAF + 1, SPINE + 1, LEAF + 2)}
    assert request("DELETE", "/jobs/j1").status_code == 200
    assert {e.path for e in net.send(h1, tcp_frame(h1, h3))} == {(LEAF + 1, SPINE + 1, LEAF + 2),
                                                                 (LEAF + 1, SPINE + 2, LEAF + 2)}
    assert app.core.errors.count == 0

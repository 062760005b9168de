"""The controller's decisions (controller/pipeline.py) applied to fake switches wired as the
fabric (tests/helpers/fakeswitch.py): no OVS, no Ryu event loop. Packets are followed from
host to host along every choice a select group may make."""
import collections
import itertools

import pytest
from hypothesis import given, settings, strategies as st
from ryu.lib.packet import arp, ethernet, packet
from ryu.ofproto import ofproto_v1_5 as ofp

from controller import openflow, pipeline
from controller.openflow import ETH_ARP, ETH_IP, ETH_LLDP
from controller.pipeline import (FLOOD_ECHO_S, PROBE_MAGIC, Arp, HeldPackets, WantedMarks,
                                 base_pipeline, mark_changes, mark_update, marks_by_switch,
                                 probe, probe_origin, route_changes)
from controller.priority import FlowClass
from controller.routing import LB_MODES, SwitchPlan, plan_fabric
from controller.scheduling import JobFlow, Layer, RegisteredJob
from helpers.fabric_views import LEAF, SPINE, fat_tree, hop_counts, ip, leaf_spine
from helpers.fakeswitch import CONTROLLER, FakeFabric, FakeSwitch, FakeSwitchError

FABRICS = {"2x2x2": lambda: leaf_spine(2, 2, 2), "3x3x2": lambda: leaf_spine(3, 3, 2),
           "fat-tree k=4": fat_tree}


def installed(view, lb):
    """Fake switches wired as `view`, given the base pipeline and then the routes of `lb`, as
    the controller sends them to switches that just connected; and the plans."""
    fabric = FakeFabric(view)
    fabric.apply({dpid: base_pipeline() for dpid in fabric.switches})
    plans = plan_fabric(view, lb)
    fabric.apply(route_changes({dpid: SwitchPlan() for dpid in view.switches}, plans).messages)
    return fabric, plans


def tcp(src, dst, dport=5001, sport=40000, dscp=0):
    return {"eth_type": ETH_IP, "ipv4_src": src, "ipv4_dst": dst, "ip_proto": 6,
            "tcp_src": sport, "tcp_dst": dport, "ip_dscp": dscp}


def udp(src, dst, dport=7000, sport=50000, dscp=0):
    return {"eth_type": ETH_IP, "ipv4_src": src, "ipv4_dst": dst, "ip_proto": 17,
            "udp_src": sport, "udp_dst": dport, "ip_dscp": dscp}


def shortest_paths(view, src, dst):
    """How many shortest switch paths lead from switch `src` to `dst` (over view.links)."""
    dist = hop_counts(view, dst)
    peers = collections.defaultdict(list)
    for (a, _), (b, _) in view.links.items():
        peers[a].append(b)

    def ways(here):
        return 1 if here == dst else sum(ways(p) for p in peers[here] if dist[p] == dist[here] - 1)

    return ways(src)


def check_all_reach(view, fabric, lb):
    """Every host reaches every other along each bucket choice, over a shortest path; multipath
    modes use every shortest path, `single` one."""
    for src, dst in itertools.permutations(view.hosts.values(), 2):
        ends = fabric.send(src.ip, tcp(src.ip, dst.ip))
        assert {e.end for e in ends} == {dst.ip}, f"{src.ip} -> {dst.ip}: {ends}"
        length = hop_counts(view, dst.dpid)[src.dpid] + 1
        assert {len(e.path) for e in ends} == {length}
        paths = {e.path for e in ends}
        assert len(paths) == (1 if lb == "single" else shortest_paths(view, src.dpid, dst.dpid))


@pytest.mark.parametrize("lb", LB_MODES)
@pytest.mark.parametrize("name", FABRICS)
def test_every_host_reaches_every_host_along_every_bucket_choice(name, lb):
    view = FABRICS[name]()
    fabric, _ = installed(view, lb)
    check_all_reach(view, fabric, lb)
    groups = [g for switch in fabric.switches.values() for g in switch.groups.values()]
    if lb == "single":
        assert groups == []
    else:
        assert groups and {g.selection_method for g in groups} == {"dp_hash"}
        assert all(b.watch_port == port for g in groups
                   for b, port in zip(g.buckets, g.ports())), "each bucket watches its port"


def dead_ends(fabric):
    """Every (dpid, port) a group of a fake switch outputs to or watches while it is down."""
    return {(dpid, port) for dpid, switch in fabric.switches.items()
            for group in switch.groups.values()
            for port in group.ports() + [b.watch_port for b in group.buckets]
            if port in switch.dead}


@pytest.mark.parametrize("lb", LB_MODES)
@pytest.mark.parametrize("name", FABRICS)
def test_a_dead_uplink_leaves_every_group_that_had_it(name, lb):
    view = FABRICS[name]()
    fabric, plans = installed(view, lb)
    leaf = LEAF + 1
    uplink = min(port for (dpid, port) in view.links if dpid == leaf)
    if lb != "single":
        assert any(uplink in g.ports() for g in fabric.switches[leaf].groups.values())
    peer = fabric.cut((leaf, uplink))
    if lb != "single":
        # Before the controller hears of it, the switch skips the bucket of the dead port.
        for src, dst in itertools.product(view.hosts.values(), repeat=2):
            if src.dpid == leaf and dst.dpid != leaf:
                assert {e.end for e in fabric.send(src.ip, tcp(src.ip, dst.ip))} == {dst.ip}
    for end in ((leaf, uplink), peer):  # the port-status of each end
        view.set_port(*end, f"eth{end[1]}", False)
    new = plan_fabric(view, lb)
    fabric.apply(route_changes(plans, new).messages)
    assert dead_ends(fabric) == set()
    for dpid, switch in fabric.switches.items():
        assert set(switch.groups) == set(new[dpid].groups), "groups no longer used are gone"
    check_all_reach(view, fabric, lb)


def check_order(messages):
    """Groups go last, behind a barrier sent after every flow change: no flow still points at a
    group when it goes. (That new groups come before the flows using them, the fake switch
    checks: it refuses a flow using a group it does not have.)"""
    kinds = [(type(m).__name__, getattr(m, "command", None)) for m in messages]
    deletes = [i for i, kind in enumerate(kinds) if kind == ("OFPGroupMod", ofp.OFPGC_DELETE)]
    if deletes:
        flows = [i for i, (name, _) in enumerate(kinds) if name == "OFPFlowMod"]
        barrier = kinds.index(("OFPBarrierRequest", None))
        assert max(flows, default=-1) < barrier < min(deletes) and deletes[-1] == len(kinds) - 1


def state(switch):
    """A fake switch's flows and groups, comparable."""
    flows = {(table, e.priority, tuple(sorted(e.match.items())), str(e.instructions))
             for table, entries in switch.tables.items() for e in entries}
    return flows, {gid: (str(g.buckets), g.selection_method) for gid, g in switch.groups.items()}


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(LB_MODES), st.lists(st.integers(0, 17), min_size=1, max_size=6))
def test_changes_bring_every_switch_to_its_plan_and_barriers_are_the_changed_ones(lb, toggles):
    """Links of a 3x3x2 go down and up again; after each change the switches hold exactly what a
    fresh install of the new plans gives, and the barrier set is the switches whose plan
    changed."""
    view = leaf_spine(3, 3, 2)
    wiring = dict(view.links)
    uplinks = sorted(end for end in wiring if LEAF < end[0] < SPINE)
    fabric, plans = installed(view, lb)
    for i in toggles:
        leaf_end = uplinks[i % len(uplinks)]
        spine_end = wiring[leaf_end]
        up = not view.port_up(*leaf_end)
        for end in (leaf_end, spine_end):
            view.set_port(*end, f"eth{end[1]}", up)
        if up:
            view.add_link(leaf_end, spine_end)
        new = plan_fabric(view, lb)
        changes = route_changes(plans, new)
        assert changes.barriers == {d for d in view.switches if plans[d] != new[d]}
        for messages in changes.messages.values():
            check_order(messages)
        fabric.apply(changes.messages)
        plans = new
    fresh, _ = installed(view, lb)
    for dpid, switch in fabric.switches.items():
        assert state(switch) == state(fresh.switches[dpid]), hex(dpid)


def test_the_barrier_set_is_exactly_the_switches_whose_routes_changed():
    view = leaf_spine(3, 3, 2)
    plans = plan_fabric(view, "ecmp")
    assert route_changes(plans, plans).barriers == set()
    # leaf1 - spine1 down: leaf1 and spine1 reroute, leaves 2-3 drop spine1 towards leaf1;
    # spines 2 and 3 reach everything as before.
    for end in ((LEAF + 1, 3), (SPINE + 1, 1)):
        view.set_port(*end, "x", False)
    after_cut = plan_fabric(view, "ecmp")
    assert route_changes(plans, after_cut).barriers == {LEAF + 1, LEAF + 2, LEAF + 3, SPINE + 1}
    # A new host: every switch gets a route to it; learning it again changes nothing.
    view.set_port(LEAF + 2, 9, "free", True)
    assert view.learn_host("10.0.9.9", "02:00:00:00:09:09", LEAF + 2, 9)
    learnt = plan_fabric(view, "ecmp")
    assert route_changes(after_cut, learnt).barriers == set(view.switches)
    assert not view.learn_host("10.0.9.9", "02:00:00:00:09:09", LEAF + 2, 9)
    assert route_changes(learnt, plan_fabric(view, "ecmp")).barriers == set()
    # Only connected switches count: a switch without an installed plan is not asked.
    partial = {d: p for d, p in after_cut.items() if d != LEAF + 3}
    assert route_changes(partial, learnt).barriers == set(view.switches) - {LEAF + 3}


# -- DSCP marks -----------------------------------------------------------------------------------
def sync_marks(fabric, view, wanted, have):
    """Bring every fake switch's marks to those `wanted` holds, as the app does; `have` is what
    each switch holds (dpid -> key -> class), updated."""
    by_switch = marks_by_switch(view, wanted.classes())
    for dpid in fabric.switches:
        held, want = have.setdefault(dpid, {}), by_switch.get(dpid, {})
        for key in mark_changes(held, want):
            update = mark_update(held.get(key), want.get(key))
            fabric.switches[dpid].apply([update])
            if key in want:
                held[key] = want[key]
            else:
                del held[key]


def three_layer_job(a, b, c):
    """ClassPolicy `layer` on three layers: layer 0 gets CS6 (48), 1 CS5 (40), 2 CS4 (32)."""
    layers = (Layer(0, "conv", 100), Layer(1, "fc1", 200), Layer(2, "fc2", 300))
    flows = (JobFlow((0,), a, b, "tcp", None, 5001, 5001),
             JobFlow((2,), b, a, "tcp", None, 6000, 6007),
             JobFlow((1,), c, a, "udp"))
    return RegisteredJob("j1", "layer", (a, b, c), layers, flows)


def marked(fabric, src, pkt):
    """The DSCP the packet carries after each switch on each of its paths (all must arrive)."""
    ends = fabric.send(src, pkt)
    assert {e.end for e in ends} == {pkt["ipv4_dst"]}
    return {tuple(p["ip_dscp"] for _, p in e.hops) for e in ends}


def job_fabric(name):
    view = FABRICS[name]()
    fabric, _ = installed(view, "ecmp")
    hosts = sorted(view.hosts.values(), key=lambda h: (h.dpid, h.port))
    a, neighbour, b, c = hosts[0], hosts[1], hosts[2], hosts[-1]  # a's neighbour: no job host
    assert a.dpid == neighbour.dpid != b.dpid
    wanted = WantedMarks()
    wanted.register(three_layer_job(a.ip, b.ip, c.ip))
    have = {}
    sync_marks(fabric, view, wanted, have)
    return view, fabric, wanted, have, (a.ip, neighbour.ip, b.ip, c.ip)


@pytest.mark.parametrize("name", FABRICS)
def test_a_jobs_classes_mark_its_flows_at_the_ingress_switch_only(name):
    view, fabric, wanted, have, (a, _, b, c) = job_fabric(name)
    marks_on = {d for d, switch in fabric.switches.items() if len(switch.flows(0)) > 1}
    assert marks_on == {view.hosts[h].dpid for h in (a, b, c)}
    for src, pkt, dscp in [
            (a, tcp(a, b, dport=5001), 48), (a, tcp(a, b, dport=5002), 0),
            (b, tcp(b, a, dport=6000), 32), (b, tcp(b, a, dport=6007), 32),
            (b, tcp(b, a, dport=5999), 0), (b, tcp(b, a, dport=6008), 0),
            (c, udp(c, a, dport=1), 40), (c, udp(c, a, dport=65535), 40),
            (a, udp(a, c), 0), (c, tcp(c, a), 0), (a, tcp(a, b, dport=5001, sport=1), 48)]:
        length = hop_counts(view, view.hosts[pkt["ipv4_dst"]].dpid)[view.hosts[src].dpid] + 1
        assert marked(fabric, src, pkt) == {(dscp,) * length}, (src, pkt)
    wanted.remove("j1")
    sync_marks(fabric, view, wanted, have)
    assert all(len(switch.flows(0)) == 1 for switch in fabric.switches.values()), "unmarked"
    assert marked(fabric, a, tcp(a, b, dport=5001)) == {(0,) * 3}


@pytest.mark.parametrize("name", FABRICS)
def test_lower_effort_datagrams_of_a_jobs_hosts_go_to_cs1(name):
    """LE (1) -> CS1 (8) wins over the flow's own class; a host outside the job keeps LE."""
    view, fabric, wanted, _, (a, neighbour, b, c) = job_fabric(name)
    for src, pkt, dscp in [(a, tcp(a, b, dport=5001, dscp=1), 8), (c, udp(c, a, dscp=1), 8),
                           (b, udp(b, c, dscp=1), 8), (a, udp(a, b, dscp=2), 2),
                           (neighbour, tcp(neighbour, b, dscp=1), 1)]:
        assert {path[-1] for path in marked(fabric, src, pkt)} == {dscp}, (src, pkt)
    le = [(f.src, f.dst, f.in_dscp, f.dscp, pipeline.mark_priority(f))
          for f in marks_by_switch(view, wanted.classes())[view.hosts[a].dpid].values()
          if f.in_dscp is not None]
    assert le == [(a, None, 1, 8, pipeline.PRIO_MARK_BY_DSCP)]
    assert pipeline.PRIO_MARK_BY_DSCP > pipeline.PRIO_MARK


def test_marks_follow_the_latest_class_and_are_replaced_in_place():
    """A REST mark and a job's mark of one match: the job's wins; replacing a class sends one
    add (same match and priority), removing it one strict delete."""
    view = leaf_spine(2, 2, 2)
    fabric, _ = installed(view, "ecmp")
    a, b = ip(1), ip(3)
    wanted, have = WantedMarks(), {}
    rest = FlowClass(a, b, 16, "tcp", None, 5001)
    wanted.set_rest([rest])
    sync_marks(fabric, view, wanted, have)
    assert marked(fabric, a, tcp(a, b)) == {(16, 16, 16)}
    wanted.register(three_layer_job(a, b, ip(4)))
    sync_marks(fabric, view, wanted, have)
    assert marked(fabric, a, tcp(a, b)) == {(48, 48, 48)}
    assert len(fabric.switches[LEAF + 1].flows(0)) == 1 + 2, "miss, the flow, LE of a"
    wanted.remove("j1")
    sync_marks(fabric, view, wanted, have)
    assert marked(fabric, a, tcp(a, b)) == {(16, 16, 16)}
    assert mark_update(rest, rest) is None and mark_update(None, None) is None


# -- the base pipeline, discovery, ARP ------------------------------------------------------------
def test_the_base_pipeline_wipes_the_switch_and_sends_probes_arp_and_unknown_ip_up():
    switch = FakeSwitch(1, [1, 2, 3])
    switch.apply([openflow.select_group(6, (1, 2)),
                  openflow.flow_add(1, 500, pipeline.route_match(ip(9)), [openflow.to_group(6)])])
    switch.apply(base_pipeline())
    assert switch.groups == {} and [len(switch.flows(t)) for t in (0, 1)] == [1, 3]
    for pkt in ({"eth_type": ETH_LLDP}, {"eth_type": ETH_ARP}, tcp(ip(1), ip(9))):
        assert switch.process(pkt, 1) == [[(CONTROLLER, {**pkt, "in_port": 1})]]
    assert switch.process({"eth_type": 0x86DD}, 1) == [[]], "anything else is dropped"


def test_the_fake_switch_refuses_what_ovs_refuses():
    switch = FakeSwitch(1, [1, 2])
    with pytest.raises(FakeSwitchError, match="group 6 does not exist"):
        switch.apply([openflow.flow_add(1, 500, pipeline.route_match(ip(1)),
                                        [openflow.to_group(6)])])
    with pytest.raises(FakeSwitchError, match="tcp_dst without ip_proto=6"):
        switch.apply([openflow.flow_add(0, 800, openflow.match(eth_type=ETH_IP, tcp_dst=80))])
    with pytest.raises(FakeSwitchError, match="IPv4 fields without eth_type"):
        switch.apply([openflow.flow_add(0, 800, openflow.match(ip_dscp=1))])
    # Deleting a group deletes the flows that use it.
    switch.apply([openflow.select_group(6, (1, 2)),
                  openflow.flow_add(1, 500, pipeline.route_match(ip(1)), [openflow.to_group(6)]),
                  openflow.group_delete(6)])
    assert switch.flows(1) == [] and switch.groups == {}


@given(st.integers(1, (1 << 64) - 1), st.integers(1, openflow.OFPP_MAX))
def test_a_probe_names_where_it_was_sent_from(dpid, port):
    msg = probe(dpid, port)
    assert [a.port for a in msg.actions] == [port]
    assert msg.data[:6] == pipeline.PROBE_DST_BYTES and msg.data[12:14] == b"\x88\xcc"
    assert probe_origin(msg.data[14:]) == (dpid, port)


@pytest.mark.parametrize("payload", [b"", b"\x02\x07\x04LLDP from a real switch",
                                     PROBE_MAGIC + b"\x00" * 11])
def test_frames_that_are_not_our_probes_name_nothing(payload):
    assert probe_origin(payload) is None


def test_a_probe_reaches_the_controller_from_the_far_end_of_each_link():
    view = leaf_spine(2, 2, 2)
    fabric, _ = installed(view, "ecmp")
    for dpid in view.switches:
        msgs = pipeline.probes(view, dpid)
        assert [m.actions[0].port for m in msgs] == sorted(view.switches[dpid].live_ports())
        for msg in msgs:
            port = msg.actions[0].port
            ends = fabric.packet_out(dpid, msg)
            if (dpid, port) in view.links:
                assert [e.end for e in ends] == [CONTROLLER]
                far, in_port = ends[0].hops[-1][0], ends[0].packet["in_port"]
                assert (far, in_port) == view.links[(dpid, port)]
                assert probe_origin(ends[0].data[14:]) == (dpid, port)
            else:
                assert [e.end for e in ends] == [fabric.hosts[(dpid, port)]]


def arp_frame(opcode, src_ip, dst_ip, src_mac="02:00:00:00:00:01"):
    frame = packet.Packet()
    frame.add_protocol(ethernet.ethernet("ff:ff:ff:ff:ff:ff", src_mac, ETH_ARP))
    frame.add_protocol(arp.arp(opcode=opcode, src_mac=src_mac, src_ip=src_ip,
                               dst_mac="00:00:00:00:00:00", dst_ip=dst_ip))
    frame.serialize()
    return frame.get_protocol(arp.arp), bytes(frame.data)


def edge_ports(view):
    """Every live port that leads to no switch (an oracle for FabricView.edge_ports)."""
    return {(d, p) for d, s in view.switches.items() for p, (_, up) in s.ports.items()
            if up and (d, p) not in view.links}


@pytest.mark.parametrize("name", FABRICS)
def test_arp_for_an_unknown_target_floods_every_edge_port_but_the_ingress(name):
    view = FABRICS[name]()
    view.set_port(LEAF + 1, 99, "free", True)  # an edge port with nothing behind
    fabric, _ = installed(view, "ecmp")
    sender = view.hosts[ip(1)]
    request, data = arp_frame(arp.ARP_REQUEST, sender.ip, "10.0.99.99", sender.mac)
    decision = Arp().packet_in(view, sender.dpid, sender.port, request, data, now=0.0)
    assert not decision.learnt
    outs = [(dpid, msg.actions[0].port) for dpid, msg in decision.packet_outs]
    assert sorted(outs) == sorted(edge_ports(view) - {(sender.dpid, sender.port)})
    ends = collections.Counter(e.end for dpid, msg in decision.packet_outs
                               for e in fabric.packet_out(dpid, msg))
    assert ends == collections.Counter({h: 1 for h in view.hosts if h != sender.ip}
                                       | {"dropped": 1}), "each other host gets it once"


def test_arp_learns_the_sender_delivers_to_a_known_target_and_ignores_its_own_echo():
    view = leaf_spine(2, 2, 2)
    fabric, _ = installed(view, "ecmp")
    arp_handler, target = Arp(), view.hosts[ip(4)]
    view.set_port(LEAF + 1, 9, "new", True)
    request, data = arp_frame(arp.ARP_REQUEST, "10.0.9.9", target.ip, "02:00:00:00:09:09")
    decision = arp_handler.packet_in(view, LEAF + 1, 9, request, data, now=0.0)
    assert decision.learnt and view.hosts["10.0.9.9"].port == 9
    assert [(d, m.actions[0].port) for d, m in decision.packet_outs] == [(target.dpid,
                                                                          target.port)]
    assert [e.end for e in fabric.packet_out(*decision.packet_outs[0])] == [target.ip]
    # A flood's echo (the same request within FLOOD_ECHO_S, anywhere) is ignored; a reply not.
    unknown, data = arp_frame(arp.ARP_REQUEST, ip(1), "10.0.99.99")
    assert arp_handler.packet_in(view, LEAF + 1, 1, unknown, data, now=10.0).packet_outs
    assert arp_handler.packet_in(view, LEAF + 2, 1, unknown, data, now=10.1) is None
    reply, data_reply = arp_frame(arp.ARP_REPLY, ip(1), "10.0.99.99")
    assert arp_handler.packet_in(view, LEAF + 1, 1, reply, data_reply, now=10.2) is not None
    assert arp_handler.packet_in(view, LEAF + 2, 1, unknown, data,
                                 now=10.2 + FLOOD_ECHO_S - 0.01) is None
    assert arp_handler.packet_in(view, LEAF + 2, 1, unknown, data,
                                 now=10.2 + FLOOD_ECHO_S + 0.01) is not None


# -- packets held behind barriers -----------------------------------------------------------------
def sent_barrier(xid: int):
    """A barrier request as the switch's connection left it: with its xid."""
    request = openflow.barrier()
    request.set_xid(xid)
    return request


def test_held_packets_go_once_every_barrier_is_answered_or_at_the_timeout():
    held = HeldPackets()
    unsent = openflow.barrier()  # held before it is sent: its xid comes later
    first = held.hold([(1, unsent), (2, sent_barrier(11))], [(3, "arp reply")])
    second = held.hold([(2, sent_barrier(12))], [(4, "other")])
    unsent.set_xid(10)
    assert held.answered(1, 10) == [] and held.answered(9, 10) == []
    assert held.answered(2, 11) == [(3, "arp reply")]
    assert held.release(first) == [] and held.answered(2, 11) == [], "released once"
    assert held.release(second) == [(4, "other")], "a switch that never answers"
    assert held.answered(2, 12) == []

"""FabricView: the controller's picture of switches, ports, links and hosts (no OpenFlow)."""
import pytest
from hypothesis import given, settings, strategies as st

from controller.topology import FabricView, Host
from helpers.fabric_views import add_switch


@pytest.fixture
def view():
    """Two switches: 1 (ports 1..4) and 2 (ports 1..4), linked 1:3 <-> 2:3; h1 on 1:1, h2 on 2:1."""
    v = FabricView()
    add_switch(v, 1, "s1", 4)
    add_switch(v, 2, "s2", 4)
    assert v.add_link((1, 3), (2, 3))
    assert v.learn_host("10.0.0.1", "00:00:00:00:00:01", 1, 1)
    assert v.learn_host("10.0.0.2", "00:00:00:00:00:02", 2, 1)
    return v


def check_invariants(v: FabricView) -> None:
    for end, peer in v.links.items():
        assert v.links.get(peer) == end, "links are stored both ways"
        assert end != peer
        for dpid, port in (end, peer):
            assert v.port_up(dpid, port), f"link end {(dpid, port)} is a live port"
    for ip, host in v.hosts.items():
        assert host.ip == ip
        assert v.port_up(host.dpid, host.port), f"{ip} sits on a live port"
        assert not v.is_fabric_port(host.dpid, host.port), f"{ip} is not on a fabric port"


# -- switches ---------------------------------------------------------------------------------
def test_add_switch_records_ports_and_live_ports():
    v = FabricView()
    assert v.add_switch(7, "s7", {1: ("s7-eth1", True), 2: ("s7-eth2", False)})
    assert v.switches[7].name == "s7"
    assert v.switches[7].live_ports() == {1}
    assert v.port_up(7, 1) and not v.port_up(7, 2) and not v.port_up(7, 3) and not v.port_up(8, 1)


def test_remove_switch_forgets_its_links_both_ways_and_its_hosts(view):
    assert view.remove_switch(2)
    assert 2 not in view.switches
    assert view.links == {}
    assert set(view.hosts) == {"10.0.0.1"}
    assert view.neighbours(1) == []
    assert view.edge_ports(1) == [1, 2, 3, 4], "the former fabric port is an edge port again"
    assert not view.remove_switch(2), "removing an unknown switch changes nothing"


def test_add_switch_again_forgets_what_was_known(view):
    assert view.add_switch(2, "s2", {1: ("s2-eth1", True), 3: ("s2-eth3", True)})
    assert view.links == {}
    assert "10.0.0.2" not in view.hosts
    assert view.switches[2].ports == {1: ("s2-eth1", True), 3: ("s2-eth3", True)}


def test_reconnect_with_another_shape_gives_the_new_shape_only(view):
    view.add_switch(2, "leaf9", {5: ("leaf9-eth5", True), 6: ("leaf9-eth6", False)})
    switch = view.switches[2]
    assert switch.name == "leaf9"
    assert set(switch.ports) == {5, 6}
    assert switch.live_ports() == {5}
    assert view.edge_ports(2) == [5]
    assert not view.port_up(2, 3) and not view.port_up(2, 1)
    assert (1, 3) not in view.links, "the peer's end of the old link is gone too"
    assert not view.learn_host("10.0.0.2", "00:00:00:00:00:02", 2, 1), "old port 1 is gone"
    check_invariants(view)


# -- ports ------------------------------------------------------------------------------------
def test_set_port_down_removes_links_and_hosts_on_that_port_only(view):
    assert view.learn_host("10.0.0.3", "00:00:00:00:00:03", 1, 2)
    assert view.set_port(1, 3, "s1-eth3", False)
    assert view.links == {}
    assert not view.port_up(1, 3)
    assert view.set_port(1, 1, "s1-eth1", False)
    assert set(view.hosts) == {"10.0.0.2", "10.0.0.3"}
    assert not view.set_port(1, 1, "s1-eth1", False), "the same state again is no change"
    assert view.set_port(1, 1, "s1-eth1", True)
    assert "10.0.0.1" not in view.hosts, "a port coming back does not bring its hosts back"
    check_invariants(view)


def test_set_port_up_again_does_not_restore_the_link(view):
    view.set_port(2, 3, "s2-eth3", False)
    view.set_port(2, 3, "s2-eth3", True)
    assert view.links == {}, "links come back only with a new probe"
    assert view.add_link((2, 3), (1, 3))
    assert view.neighbours(1) == [(3, 2)]


def test_set_port_on_unknown_switch_is_no_change():
    v = FabricView()
    assert not v.set_port(9, 1, "x", True)
    assert v.switches == {}


def test_set_port_adds_a_new_port(view):
    assert view.set_port(1, 9, "s1-eth9", True)
    assert 9 in view.edge_ports(1)


def test_delete_port_removes_port_link_and_hosts(view):
    assert view.delete_port(1, 3)
    assert 3 not in view.switches[1].ports
    assert view.links == {}
    assert view.delete_port(2, 1)
    assert "10.0.0.2" not in view.hosts


def test_delete_unknown_port_is_no_change(view):
    before = dict(view.switches[1].ports)
    assert not view.delete_port(1, 42)
    assert view.switches[1].ports == before


# -- links ------------------------------------------------------------------------------------
def test_add_link_is_stored_both_ways(view):
    assert view.links == {(1, 3): (2, 3), (2, 3): (1, 3)}
    assert view.is_fabric_port(1, 3) and view.is_fabric_port(2, 3)
    assert not view.add_link((1, 3), (2, 3)), "a known link again is no change"
    assert not view.add_link((2, 3), (1, 3))


@pytest.mark.parametrize("a, b", [
    ((1, 4), (2, 9)),  # unknown port
    ((1, 4), (3, 1)),  # unknown switch
    ((1, 4), (1, 4)),  # a probe back to its own port
])
def test_add_link_needs_two_distinct_live_ports(view, a, b):
    assert not view.add_link(a, b)
    assert not view.add_link(b, a)
    assert not view.is_fabric_port(*a)


def test_add_link_refuses_a_down_port(view):
    view.set_port(2, 4, "s2-eth4", False)
    assert not view.add_link((1, 4), (2, 4))
    assert not view.add_link((2, 4), (1, 4))
    assert (1, 4) not in view.links


def test_add_link_moves_a_recabled_port(view):
    add_switch(view, 3, "s3", 4)
    assert view.add_link((1, 3), (3, 2))
    assert view.links == {(1, 3): (3, 2), (3, 2): (1, 3)}
    assert view.neighbours(2) == []
    assert 3 in view.edge_ports(2)


def test_add_link_purges_hosts_learnt_on_fabric_ports(view):
    # Before the probe arrived, floods over 1:4 and 2:4 taught hosts there.
    assert view.learn_host("10.0.0.2", "00:00:00:00:00:02", 1, 4)
    assert view.learn_host("10.0.0.9", "00:00:00:00:00:09", 2, 4)
    assert view.add_link((1, 4), (2, 4))
    assert set(view.hosts) == {"10.0.0.1"}
    check_invariants(view)


def test_links_between_ports_of_one_switch_are_allowed(view):
    assert view.add_link((1, 2), (1, 4))
    assert view.neighbours(1) == [(2, 1), (3, 2), (4, 1)]


# -- hosts ------------------------------------------------------------------------------------
def test_learn_host(view):
    assert view.hosts["10.0.0.1"] == Host("10.0.0.1", "00:00:00:00:00:01", 1, 1)
    assert not view.learn_host("10.0.0.1", "00:00:00:00:00:01", 1, 1), "known: no change"
    assert view.learn_host("10.0.0.1", "00:00:00:00:00:01", 1, 2), "moved: a change"
    assert view.hosts["10.0.0.1"].port == 2
    assert view.learn_host("10.0.0.1", "00:00:00:00:00:aa", 1, 2), "new MAC: a change"
    assert view.hosts["10.0.0.1"].mac == "00:00:00:00:00:aa"


@pytest.mark.parametrize("dpid, port, why", [
    (1, 3, "fabric port"),
    (2, 3, "fabric port (other end)"),
    (1, 9, "unknown port"),
    (5, 1, "unknown switch"),
])
def test_learn_host_refuses(view, dpid, port, why):
    assert not view.learn_host("10.0.0.7", "00:00:00:00:00:07", dpid, port), why
    assert "10.0.0.7" not in view.hosts


def test_learn_host_refuses_a_down_port(view):
    view.set_port(1, 2, "s1-eth2", False)
    assert not view.learn_host("10.0.0.7", "00:00:00:00:00:07", 1, 2)
    assert "10.0.0.7" not in view.hosts


# -- queries ----------------------------------------------------------------------------------
def test_edge_ports_are_live_non_fabric_ports_sorted(view):
    view.set_port(1, 2, "s1-eth2", False)
    view.set_port(1, 10, "s1-eth10", True)
    assert view.edge_ports(1) == [1, 4, 10]
    assert view.edge_ports(2) == [1, 2, 4]
    assert view.edge_ports(99) == []


def test_neighbours(view):
    add_switch(view, 3, "s3", 4)
    view.add_link((1, 4), (3, 1))
    view.add_link((1, 2), (3, 2))
    assert view.neighbours(1) == [(2, 3), (3, 2), (4, 3)]
    assert view.neighbours(3) == [(1, 1), (2, 1)]
    assert view.neighbours(99) == []


# -- properties -------------------------------------------------------------------------------
DPIDS = st.integers(1, 3)
PORTS = st.integers(1, 4)
OPS = st.one_of(
    st.tuples(st.just("add_switch"), DPIDS, st.dictionaries(PORTS, st.booleans(), max_size=4)),
    st.tuples(st.just("remove_switch"), DPIDS),
    st.tuples(st.just("set_port"), DPIDS, PORTS, st.booleans()),
    st.tuples(st.just("delete_port"), DPIDS, PORTS),
    st.tuples(st.just("add_link"), st.tuples(DPIDS, PORTS), st.tuples(DPIDS, PORTS)),
    st.tuples(st.just("learn_host"), st.integers(1, 4), DPIDS, PORTS),
)


def apply(v: FabricView, op: tuple) -> bool:
    kind, *args = op
    if kind == "add_switch":
        dpid, ports = args
        return v.add_switch(dpid, f"s{dpid}", {p: (f"s{dpid}-eth{p}", up) for p, up in ports.items()})
    if kind == "set_port":
        dpid, port, up = args
        return v.set_port(dpid, port, f"s{dpid}-eth{port}", up)
    if kind == "learn_host":
        n, dpid, port = args
        return v.learn_host(f"10.0.0.{n}", f"00:00:00:00:00:0{n}", dpid, port)
    return getattr(v, kind)(*args)


def snapshot(v: FabricView):
    return ({d: (s.name, dict(s.ports)) for d, s in v.switches.items()}, dict(v.links), dict(v.hosts))


@settings(max_examples=150, deadline=None)
@given(st.lists(OPS, max_size=30))
def test_any_event_sequence_keeps_the_view_consistent(ops):
    v = FabricView()
    for op in ops:
        before = snapshot(v)
        changed = apply(v, op)
        check_invariants(v)
        if not changed:
            assert snapshot(v) == before, f"{op} said no change but changed the view"


def test_pinned_hosts_stay_where_they_are_pinned():
    """Hosts from the runner's hosts file: learnt when their switch connects, not moved by a packet
    seen on an uplink whose link is not discovered yet, back when their port comes back."""
    view = FabricView()
    pinned = Host("10.0.0.1", "00:00:00:00:00:01", 0x1001, 1)
    assert not view.pin_host(pinned), "its switch is not connected yet"
    view.add_switch(0x2001, "spine1", {1: ("spine1-eth1", True)})
    view.add_switch(0x1001, "leaf1", {1: ("leaf1-eth1", True), 3: ("leaf1-eth3", True)})
    assert view.hosts == {"10.0.0.1": pinned}
    assert not view.learn_host("10.0.0.1", "00:00:00:00:00:01", 0x2001, 1), "a spine port, link unknown"
    assert view.hosts["10.0.0.1"] == pinned
    assert view.set_port(0x1001, 1, "leaf1-eth1", False) and "10.0.0.1" not in view.hosts
    assert view.set_port(0x1001, 1, "leaf1-eth1", True) and view.hosts["10.0.0.1"] == pinned
    assert view.learn_host("10.0.0.2", "00:00:00:00:00:02", 0x2001, 1), "others are learnt as before"

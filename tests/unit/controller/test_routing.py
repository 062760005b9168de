"""plan_fabric on hand-built views of leaf-spine and fat-tree fabrics; group ids; properties."""
import itertools
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from controller.routing import (LB_MODES, MAX_GROUP_ID, SELECTION_METHOD, Group, Output, choose_single,
                                group_id_of, plan_fabric)
from controller.topology import FabricView
from helpers.fabric_views import (AGG, LEAF, SPINE, add_switch, fat_tree, hop_counts, ip,
                          leaf_spine)
from helpers import REPO

def check_plan(view, plans):
    """Every route leads one hop closer to its host's switch (so no loops), every group holds
    exactly the tied next hops, and a switch routes a host iff the host's switch is reachable."""
    assert set(plans) == set(view.switches)
    for host in view.hosts.values():
        dist = hop_counts(view, host.dpid)
        for dpid, plan in plans.items():
            out = plan.routes.get(host.ip)
            assert (out is not None) == (dpid in dist), f"{host.ip} at {dpid:#x}"
            if out is None:
                continue
            if dpid == host.dpid:
                assert out == Output(port=host.port)
                continue
            tied = {p for (d, p), (peer, _) in view.links.items()
                    if d == dpid and dist.get(peer) == dist[dpid] - 1}
            ports = plan.groups[out.group_id].ports if out.group_id is not None else (out.port,)
            assert set(ports) <= tied, f"{dpid:#x} -> {host.ip} via {ports}: not all closer"
            if out.group_id is not None:
                assert set(ports) == tied and len(ports) > 1
            for port in ports:
                assert view.port_up(dpid, port)
    for plan in plans.values():
        for gid, group in plan.groups.items():
            assert gid == group.group_id == group_id_of(group.ports)
            assert gid in {o.group_id for o in plan.routes.values()}, "no unused groups"


def uplinks(hosts, spines):
    return tuple(range(hosts + 1, hosts + spines + 1))


# -- leaf-spine -------------------------------------------------------------------------------
@pytest.mark.parametrize("lb", ["ecmp", "spray"])
@pytest.mark.parametrize("spines, leaves, hosts", [(2, 2, 2), (3, 2, 2), (3, 4, 1)])
def test_leaf_spine_multipath_uses_one_select_group_over_all_spines(lb, spines, leaves, hosts):
    view = leaf_spine(spines, leaves, hosts)
    plans = plan_fabric(view, lb)
    check_plan(view, plans)
    up = uplinks(hosts, spines)
    group = Group(group_id_of(up), up, SELECTION_METHOD)
    for leaf in range(1, leaves + 1):
        plan = plans[LEAF + leaf]
        assert plan.groups == {group.group_id: group}
        for n in range(1, leaves * hosts + 1):
            local = (n - 1) // hosts + 1 == leaf
            expected = Output(port=(n - 1) % hosts + 1) if local else Output(group_id=group.group_id)
            assert plan.routes[ip(n)] == expected
    for s in range(1, spines + 1):
        plan = plans[SPINE + s]
        assert plan.groups == {}
        assert plan.routes == {ip(n): Output(port=(n - 1) // hosts + 1)
                               for n in range(1, leaves * hosts + 1)}


@pytest.mark.parametrize("spines", [2, 3])
def test_single_uses_plain_outputs_spread_over_uplinks(spines):
    hosts, leaves = 3, 3
    view = leaf_spine(spines, leaves, hosts)
    plans = plan_fabric(view, "single")
    check_plan(view, plans)
    again = plan_fabric(view, "single")
    up = uplinks(hosts, spines)
    chosen = {}  # destination -> uplinks it takes from the leaves it is not on
    for leaf in range(1, leaves + 1):
        plan = plans[LEAF + leaf]
        assert plan.groups == {}
        assert plan.routes == again[LEAF + leaf].routes, "the same plan every time"
        remote = [ip(n) for n in range(1, leaves * hosts + 1) if (n - 1) // hosts + 1 != leaf]
        assert {plan.routes[d].port for d in remote} == set(up), "spread over every uplink"
        for d in remote:
            assert plan.routes[d].group_id is None
            chosen.setdefault(d, set()).add(plan.routes[d].port)
    assert all(len(ports) == 1 for ports in chosen.values()), "one uplink per destination"


def test_choose_single_picks_by_destination_address():
    assert choose_single((4, 3), "10.0.0.3") == 4  # int(10.0.0.3) is odd: the second of (3, 4)
    assert choose_single((3, 4), "10.0.0.4") == 3
    assert choose_single((7,), "10.0.0.5") == 7
    picks = {choose_single((5, 6, 7), ip(n)) for n in range(1, 4)}
    assert picks == {5, 6, 7}


@pytest.mark.parametrize("lb", LB_MODES)
def test_failed_uplink_leaves_every_group_and_route(lb):
    view = leaf_spine(2, 2, 2)
    assert view.set_port(LEAF + 1, 3, "leaf1-eth3", False)  # leaf1 -- spine1 down at leaf1
    plans = plan_fabric(view, lb)
    check_plan(view, plans)
    leaf1, leaf2 = plans[LEAF + 1], plans[LEAF + 2]
    assert leaf1.groups == {}
    assert leaf1.routes[ip(3)] == leaf1.routes[ip(4)] == Output(port=4)
    # spine1 reaches leaf1's hosts only the long way round (via leaf2 and spine2), so leaf2
    # must not send them to spine1.
    assert plans[SPINE + 1].routes[ip(1)] == plans[SPINE + 1].routes[ip(2)] == Output(port=2)
    assert leaf2.routes[ip(1)] == leaf2.routes[ip(2)] == Output(port=4)
    assert plans[SPINE + 1].routes[ip(3)] == Output(port=2)
    if lb != "single":
        assert leaf2.groups == {}, "a group for leaf2's own hosts is not needed"
    for plan in plans.values():
        for group in plan.groups.values():
            assert 3 not in group.ports


def test_failed_uplink_in_three_spines_shrinks_the_group():
    view = leaf_spine(3, 2, 2)
    view.set_port(SPINE + 2, 1, "spine2-eth1", False)  # leaf1 -- spine2 down at spine2
    plans = plan_fabric(view, "ecmp")
    check_plan(view, plans)
    assert plans[LEAF + 1].routes[ip(3)] == Output(group_id=group_id_of((3, 5)))
    assert plans[LEAF + 1].groups == {group_id_of((3, 5)): Group(group_id_of((3, 5)), (3, 5), SELECTION_METHOD)}
    assert plans[LEAF + 2].routes[ip(1)] == Output(group_id=group_id_of((3, 5)))
    assert plans[SPINE + 2].routes[ip(1)] == Output(port=2), "round through leaf2"


def test_unreachable_destinations_get_no_route():
    view = leaf_spine(2, 3, 1)
    view.set_port(LEAF + 3, 2, "leaf3-eth2", False)
    view.set_port(LEAF + 3, 3, "leaf3-eth3", False)
    plans = plan_fabric(view, "ecmp")
    check_plan(view, plans)
    assert plans[LEAF + 3].routes == {ip(3): Output(port=1)}
    assert plans[LEAF + 3].groups == {}
    for dpid in (LEAF + 1, LEAF + 2, SPINE + 1, SPINE + 2):
        assert ip(3) not in plans[dpid].routes
        assert ip(1) in plans[dpid].routes


def test_no_hosts_no_routes():
    view = leaf_spine(2, 2, 1)
    view.hosts.clear()
    assert all(p.routes == {} and p.groups == {} for p in plan_fabric(view, "ecmp").values())


def test_unknown_lb_mode_raises_naming_lb():
    with pytest.raises(ValueError, match=r"^lb: 'roundrobin' is not allowed") as err:
        plan_fabric(leaf_spine(2, 2, 1), "roundrobin")
    for mode in LB_MODES:
        assert mode in str(err.value)


# -- fat-tree ---------------------------------------------------------------------------------
@pytest.mark.parametrize("lb", LB_MODES)
def test_fat_tree_k4(lb):
    view = fat_tree(4)
    assert len(view.switches) == 20 and len(view.hosts) == 16 and len(view.links) == 2 * 32
    plans = plan_fabric(view, lb)
    check_plan(view, plans)
    for plan in plans.values():
        assert len(plan.routes) == 16, "every switch routes every host"
    edge1, agg1, core1 = plans[LEAF + 1], plans[AGG + 1], plans[SPINE + 1]
    assert edge1.routes[ip(1)] == Output(port=1)
    assert core1.routes[ip(16)] == Output(port=4), "core port pod+1 faces that pod"
    assert agg1.routes[ip(3)] == Output(port=2), "agg port e faces edge e of its pod"
    if lb == "single":
        assert all(plan.groups == {} for plan in plans.values())
    else:
        up = Group(group_id_of((3, 4)), (3, 4), SELECTION_METHOD)
        # Edge: every non-local host (same pod or not) through both aggregation switches.
        assert edge1.groups == {up.group_id: up}
        assert {edge1.routes[ip(n)] for n in range(3, 17)} == {Output(group_id=up.group_id)}
        # Aggregation: other pods through both its cores; own pod down the one edge link.
        assert agg1.groups == {up.group_id: up}
        assert {agg1.routes[ip(n)] for n in range(5, 17)} == {Output(group_id=up.group_id)}
        assert core1.groups == {}


def test_fat_tree_failed_core_link():
    view = fat_tree(4)
    view.set_port(SPINE + 1, 4, "core1-eth4", False)  # core1 -- pod 3 (agg7) down at core1
    plans = plan_fabric(view, "spray")
    check_plan(view, plans)
    # agg1 reaches pod 3 through core2 only; core1 now goes round through any other pod.
    assert plans[AGG + 1].routes[ip(13)] == Output(port=4)
    around = plans[SPINE + 1].routes[ip(13)]
    assert plans[SPINE + 1].groups[around.group_id].ports == (1, 2, 3)
    assert all(4 not in g.ports for plan in plans.values() for g in plan.groups.values()
               if plan is plans[SPINE + 1])


# -- group ids --------------------------------------------------------------------------------
def test_group_id_is_the_port_bitmap_below_31():
    assert group_id_of((1,)) == 2
    assert group_id_of((3, 4)) == group_id_of((4, 3)) == 0b11000
    assert group_id_of((30,)) == 1 << 30


def test_group_ids_are_distinct_per_bucket_set_and_ranges_never_meet():
    sets = [c for r in (1, 2, 3) for c in itertools.combinations(range(1, 41), r)]
    ids = {}
    for ports in sets:
        gid = group_id_of(ports)
        assert 0 < gid <= MAX_GROUP_ID
        assert (gid < 1 << 31) == (max(ports) < 31), ports
        assert group_id_of(tuple(reversed(ports))) == gid
        assert ids.setdefault(gid, ports) == ports, f"{ports} and {ids[gid]} share id {gid}"


@given(st.sets(st.integers(1, 200), min_size=1, max_size=8))
def test_group_id_does_not_depend_on_port_order(ports):
    ports = sorted(ports)
    assert group_id_of(tuple(ports)) == group_id_of(tuple(reversed(ports)))


def test_group_ids_for_high_ports_are_the_same_in_every_process():
    code = "from controller.routing import group_id_of; print(group_id_of((31, 48, 100)))"
    root = str(REPO)
    seen = {subprocess.run([sys.executable, "-c", code], cwd=root, text=True, check=True,
                           capture_output=True, env={**os.environ, "PYTHONHASHSEED": seed}
                           ).stdout.strip() for seed in ("1", "2")}
    assert seen == {str(group_id_of((31, 48, 100)))}


# -- properties -------------------------------------------------------------------------------
@st.composite
def damaged_leaf_spines(draw):
    spines, leaves, hosts = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 3))
    view = leaf_spine(spines, leaves, hosts)
    links = list(itertools.product(range(1, leaves + 1), range(1, spines + 1)))
    failed = draw(st.lists(st.sampled_from(links), unique=True))
    for leaf, s in failed:
        end = draw(st.sampled_from(["leaf", "spine", "both"]))
        if end in ("leaf", "both"):
            view.set_port(LEAF + leaf, hosts + s, "", False)
        if end in ("spine", "both"):
            view.set_port(SPINE + s, leaf, "", False)
    return view, hosts


@settings(max_examples=150, deadline=None)
@given(damaged_leaf_spines(), st.sampled_from(LB_MODES))
def test_random_leaf_spine_failures_route_loop_free_and_iff_reachable(damaged, lb):
    view, hosts = damaged
    plans = plan_fabric(view, lb)
    check_plan(view, plans)
    for dpid, plan in plans.items():
        if lb == "single":
            assert plan.groups == {}
        for group in plan.groups.values():
            assert group.selection_method == "dp_hash"  # the 5-tuple, UDP ports included
            assert dpid > SPINE or min(group.ports) > hosts, "leaf groups only over uplinks"


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 3), st.sampled_from(LB_MODES))
def test_intact_leaf_spine_routes_everything(spines, leaves, hosts, lb):
    view = leaf_spine(spines, leaves, hosts)
    plans = plan_fabric(view, lb)
    check_plan(view, plans)
    for plan in plans.values():
        assert set(plan.routes) == {ip(n) for n in range(1, leaves * hosts + 1)}


@st.composite
def random_fabrics(draw):
    """Any graph of up to 6 switches (odd cycles, parallel links, loops back to a switch)."""
    view = FabricView()
    n = draw(st.integers(1, 6))
    for dpid in range(1, n + 1):
        add_switch(view, dpid, f"s{dpid}", 8)
    ends = st.tuples(st.integers(1, n), st.integers(1, 8))
    for a, b in draw(st.lists(st.tuples(ends, ends), max_size=12)):
        view.add_link(a, b)
    for h in range(1, draw(st.integers(1, 4)) + 1):
        view.learn_host(ip(h), "00:00:00:00:00:01", draw(st.integers(1, n)), draw(st.integers(1, 8)))
    return view


@settings(max_examples=150, deadline=None)
@given(random_fabrics(), st.sampled_from(LB_MODES))
def test_any_fabric_routes_loop_free_and_iff_reachable(view, lb):
    check_plan(view, plan_fabric(view, lb))

"""Placement of a fabric across servers (Mininet Cluster Edition's placers), and the checks made
before any network exists (the servers' own: tests/unit/emulation/test_preflight.py). No fabric, no SSH."""
import subprocess
from collections import Counter

import pytest

from emulation.cluster import controller_address
from topologies.cluster import ClusterError, crossing_links, placement
from topologies.layout import fat_tree, leaf_spine


def servers(count: int) -> list[str]:
    return ["localhost"] + [f"s{i}" for i in range(2, count + 1)]


def test_switchbin_keeps_a_leafs_hosts_with_it_and_gives_each_server_a_share_of_every_tier():
    layout = leaf_spine(4, 8, 4)  # 32 hosts, 12 switches
    for count in (2, 4):
        where = placement(layout, servers(count), "switchbin")
        for link in layout.links:
            if link.tier == "host":
                assert where[link.a.name] == where[link.b.name], link
        roles = Counter((where[node.name], node.role) for node in layout.switches)
        assert all(roles[server, "leaf"] == 8 // count and roles[server, "spine"] == 4 // count
                   for server in servers(count)), roles
        # Every leaf links every spine: a leaf reaches the spines of the other servers through tunnels.
        assert len(crossing_links(layout, where)) == 8 * 4 * (count - 1) // count


def test_switchbin_on_two_and_four_servers_of_a_small_fabric():
    layout = leaf_spine(2, 2, 2)
    where = placement(layout, servers(2), "switchbin")
    assert where == {"leaf1": "localhost", "spine1": "localhost", "h1": "localhost", "h2": "localhost",
                     "leaf2": "s2", "spine2": "s2", "h3": "s2", "h4": "s2"}
    assert sorted(sorted(link.names) for link in crossing_links(layout, where)) == [["leaf1", "spine2"],
                                                                                    ["leaf2", "spine1"]]
    where = placement(layout, servers(4), "switchbin")
    assert sorted(where[name] for name in ("leaf1", "leaf2", "spine1", "spine2")) == sorted(servers(4))
    assert len(crossing_links(layout, where)) == 4  # every fabric link, no host link


def test_switchbin_on_a_fat_tree_keeps_pods_together():
    layout = fat_tree(4)  # 4 pods of 2 edge and 2 aggregation switches, 4 cores, 16 hosts
    where = placement(layout, servers(4), "switchbin")
    for pod in range(4):
        pod_switches = [f"edge{2 * pod + e}" for e in (1, 2)] + [f"agg{2 * pod + a}" for a in (1, 2)]
        assert len({where[name] for name in pod_switches}) == 1, pod
    # Only aggregation-core links cross: each core sits with one pod and links the other three.
    assert {link.tier for link in crossing_links(layout, where)} == {"fabric"}
    assert len(crossing_links(layout, where)) == 12


def test_roundrobin_deals_every_node_in_turn():
    layout = leaf_spine(2, 2, 2)
    where = placement(layout, servers(2), "roundrobin")
    assert Counter(where.values()) == {"localhost": 4, "s2": 4}
    assert len(crossing_links(layout, where)) > 2  # hosts and their leaves part


def test_placement_that_cannot_fit_is_refused_naming_the_field():
    with pytest.raises(ClusterError, match=r"^cluster\.placement: switchbin gives every server a switch; 5 servers "
                                           r"but 4 switches"):
        placement(leaf_spine(2, 2, 2), servers(5), "switchbin")
    with pytest.raises(ClusterError, match=r"^cluster\.placement: 'random' is not allowed"):
        placement(leaf_spine(2, 2, 2), servers(2), "random")


def test_controller_listens_on_loopback_alone_and_on_the_route_towards_the_servers_otherwise():
    assert controller_address(["localhost"]) == "127.0.0.1"

    def route(argv, **_):
        assert argv[:3] == ["ip", "route", "get"] and argv[3] == "192.0.2.20"
        return subprocess.CompletedProcess(argv, 0, "192.0.2.20 dev eth0 src 192.0.2.10 uid 0\n    cache\n", "")
    assert controller_address(["localhost", "192.0.2.20"], run=route) == "192.0.2.10"


def test_a_fabric_on_an_unreachable_server_is_refused_before_anything_starts():
    from emulation.fabric import Fabric
    with pytest.raises(ClusterError, match=r"^cluster\.servers\[1\]: nohost\.invalid: its name has no IPv4 address"):
        Fabric("leafspine", {"spines": 2, "leaves": 2, "hosts_per_leaf": 2}, servers=["localhost", "nohost.invalid"])
    with pytest.raises(ClusterError, match=r"^cluster\.placement: switchbin gives every server a switch"):
        Fabric("leafspine", {"spines": 1, "leaves": 1, "hosts_per_leaf": 2},
               servers=["localhost", "nohost.invalid", "b"])

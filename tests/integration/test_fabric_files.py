"""Integration: fabrics described by a file (topologies/files.py): on every shipped example, every host
reaches every other in every LB mode, and the controller spreads a leaf's traffic over all its uplinks
(a 3-tier Clos: edges over their aggregation switches, those over the cores)."""
from __future__ import annotations

import pytest

from helpers.fabric import LB_MODES, REPO, make_fabric
from topologies.files import read_fabric

EXAMPLES = sorted((REPO / "experiments" / "topologies").glob("*.yaml"))


@pytest.fixture(scope="module", params=[(path, lb) for path in EXAMPLES for lb in LB_MODES],
                ids=lambda p: f"{p[0].stem}-{p[1]}")
def fabric(request, tmp_path_factory):
    path, lb = request.param
    yield from make_fabric(tmp_path_factory, "file", {"path": str(path), "host_bw": 100, "fabric_bw": 100}, lb)


def test_pingall(fabric):
    assert fabric.net.pingAll(timeout=1) == 0


def test_links_run_at_their_speed(fabric):
    layout = read_fabric(fabric.params["path"])
    for link in fabric.net.links:
        ends = frozenset((link.intf1.node.name, link.intf2.node.name))
        speed = next(item.speed for item in layout.links if item.names == ends)
        assert link.intf1.bw == link.intf2.bw == 100 * speed


def test_groups_spread_over_every_uplink(fabric):
    groups = fabric.rest("/fabric/groups")
    if fabric.lb == "single":
        assert all(groups[name] == [] for name in groups)
        return
    layout = read_fabric(fabric.params["path"])
    for switch in layout.switches:
        if switch.role in ("leaf", "edge"):
            uplinks = [port for port, peer in layout.ports(switch.name).items() if peer.is_switch]
            assert groups[switch.name] and all(len(group["ports"]) == len(uplinks) for group in groups[switch.name])

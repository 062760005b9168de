"""Integration: every host reaches every other in every LB mode, on a square leaf-spine and on a
k=4 fat-tree (the 3-spine fabric has its own module)."""
from __future__ import annotations

import pytest

from fabric_tools import LB_MODES, make_fabric

pytestmark = pytest.mark.integration

SHAPES = {"square": ("leafspine", {"spines": 2, "leaves": 2, "hosts": 2}),
          "fattree": ("fattree", {"k": 4})}


@pytest.fixture(scope="module", params=[(shape, lb) for shape in SHAPES for lb in LB_MODES],
                ids=lambda p: f"{p[0]}-{p[1]}")
def fabric(request, tmp_path_factory):
    kind, params = SHAPES[request.param[0]]
    yield from make_fabric(tmp_path_factory, kind, params, request.param[1])


def test_pingall(fabric):
    assert fabric.net.pingAll(timeout=1) == 0


def test_groups_follow_the_lb_mode(fabric):
    groups = fabric.rest("/fabric/groups")
    edges = [name for name in groups if name.startswith(("leaf", "edge"))]
    if fabric.lb == "single":
        assert all(groups[name] == [] for name in groups)
        return
    # Every leaf/edge switch spreads over its two uplinks; in a fat-tree aggregation switches
    # spread over their two cores too.
    assert all(len(g["ports"]) == 2 for name in edges for g in groups[name])
    assert all(groups[name] for name in edges)
    method = "dp_hash" if fabric.lb == "spray" else "default"
    assert {g["selection_method"] for gs in groups.values() for g in gs} == {method}

"""Integration: every host reaches every other in every LB mode, on a square leaf-spine and on a
k=4 fat-tree (the 3-spine fabric has its own module); a real mlt job is sprayed per packet."""
from __future__ import annotations

import pytest

from helpers.fabric import LB_MODES, PYTHON, REPO, delta, make_fabric, spine_rx

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


@pytest.mark.parametrize("fabric", [("square", "spray")], indirect=True, ids=["square-spray"])
def test_spray_splits_an_mlt_training_job(fabric, tmp_path):
    """A real job over the mlt transport: its datagrams leave leaf1 over both spines evenly.
    (Two spines: OVS maps dp_hash onto a power-of-two number of slots, so with 3 buckets one
    gets about 0.4 of the hash space; docs/platform.md.)"""
    common = ["--workers", "10.0.0.1:7000", "--servers", "10.0.0.3:7100", "--mode", "ps",
              "--transport", "mlt", "--link-mbps", "100", "--width", "256", "--iterations", "5",
              "--batch", "16", "--timeout", "20",
              "--sport-range", "512"]  # a 512-port sample of the hash: split within ~2 points
    before = spine_rx(fabric, 1)
    server = fabric.popen("h3", [PYTHON, "-m", "hostapps", "server", "--rank", "0",
                                       "--out", str(tmp_path / "s"), *common], cwd=REPO)
    worker = fabric.popen("h1", [PYTHON, "-m", "hostapps", "worker", "--rank", "0",
                                       "--out", str(tmp_path / "w"), *common], cwd=REPO)
    assert worker.wait(60) == 0, worker.stderr.read().decode()[-500:]
    assert server.wait(20) == 0, server.stderr.read().decode()[-500:]
    share = delta(spine_rx(fabric, 1), before)
    total = sum(share.values())
    print("mlt job, packets per spine:", {s: round(p / total, 3) for s, p in share.items()})
    assert total > 1000  # 5 pushes of ~270 KB in 1400-byte datagrams
    assert all(abs(p / total - 1 / 2) <= 0.10 for p in share.values()), share

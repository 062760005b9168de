"""Integration: every host reaches every other in every LB mode, on a square leaf-spine and on a
k=4 fat-tree (the 3-spine fabric has its own module); a real mlt job is sprayed per packet, and around a
spine full of bulk traffic."""
from __future__ import annotations

import json
import time

import pytest

from helpers.fabric import LB_MODES, PYTHON, REPO, delta, iperf, make_fabric, spine_rx


SHAPES = {"square": ("leafspine", {"spines": 2, "leaves": 2, "hosts_per_leaf": 2}),
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
    # ecmp too: OVS's default hash leaves UDP ports out, dp_hash places each UDP flow by its 5-tuple
    assert {g["selection_method"] for gs in groups.values() for g in gs} == {"dp_hash"}


def run_mlt_ps_job(fabric, out, *options: str, counter: str = "rx_packets") -> dict[str, int]:
    """A PS job over mlt, its worker on h1 and its server on h3, to the end; what leaf1 sent each spine
    (`counter`: packets or bytes)."""
    common = ["--workers", "10.0.0.1:7000", "--servers", "10.0.0.3:7100", "--mode", "ps", "--transport", "mlt",
              "--link-mbps", "100", "--batch", "16", "--timeout", "20", *options]
    before = spine_rx(fabric, 1, counter)
    server = fabric.popen("h3", [PYTHON, "-m", "hostapps", "server", "--rank", "0", "--out", str(out / "s"), *common],
                          cwd=REPO)
    worker = fabric.popen("h1", [PYTHON, "-m", "hostapps", "worker", "--rank", "0", "--out", str(out / "w"), *common],
                          cwd=REPO)
    assert worker.wait(60) == 0, worker.stderr.read().decode()[-500:]
    assert server.wait(20) == 0, server.stderr.read().decode()[-500:]
    return delta(spine_rx(fabric, 1, counter), before)


@pytest.mark.parametrize("fabric", [("square", "spray")], indirect=True, ids=["square-spray"])
def test_spray_splits_an_mlt_training_job(fabric, tmp_path):
    """A real job over the mlt transport: its bytes leave leaf1 over both spines evenly (bytes: its
    control frames, small, leave from one socket, so they take one spine).
    (Two spines: OVS maps dp_hash onto a power-of-two number of slots, so with 3 buckets one
    gets about 0.4 of the hash space; docs/platform.md.) mlt steers its datagrams by the receiver's
    per-path reports, so on a loaded machine the split drifts from even (0.39 once in a CI run)."""
    share = run_mlt_ps_job(fabric, tmp_path, "--width", "256", "--iterations", "5", counter="rx_bytes")
    total = sum(share.values())
    print("mlt job, bytes per spine:", {s: round(p / total, 3) for s, p in share.items()})
    assert total > 1_000_000  # 5 pushes of ~270 KB
    assert all(abs(p / total - 1 / 2) <= 0.15 for p in share.values()), share


@pytest.mark.parametrize("fabric", [("square", "spray")], indirect=True, ids=["square-spray"])
def test_spray_steers_an_mlt_job_around_a_spine_full_of_bulk_traffic(fabric, tmp_path):
    """Bulk TCP from h2 to h4 holds one of leaf1's uplinks (a TCP 5-tuple takes one path) and fills its
    queue; a worker on h1 pushing to a server on h3 over mlt moves its datagrams to the other spine once
    the server names the source ports whose datagrams were overtaken (hostapps.mlt.paths).  Sprayed blind,
    half of them would queue behind the bulk."""
    iperf_server, bulk = iperf(fabric, "h2", "h4", 5301, 25)
    time.sleep(2)  # TCP at full rate
    before = spine_rx(fabric, 1)
    time.sleep(1)
    bulk_spine = max(delta(spine_rx(fabric, 1), before).items(), key=lambda item: item[1])[0]
    received = run_mlt_ps_job(fabric, tmp_path, "--width", "512", "--iterations", "10")
    bulk.kill()
    iperf_server.kill()
    sent = json.loads((tmp_path / "w" / "summary.json").read_text())["transport"]
    queued = json.loads((tmp_path / "s" / "summary.json").read_text())["transport"]["datagrams_queued"]
    # what the free spine took from leaf1 is the job's (its data, and the worker's few control frames)
    free = sum(packets for spine, packets in received.items() if spine != bulk_spine)
    print(f"bulk on {bulk_spine}; the worker sent {sent['datagrams_sent']} datagrams, the free spine carried "
          f"{free} packets from leaf1; {queued} datagrams queued, {sent['paths_reports']} reports")
    assert sent["datagrams_sent"] > 1000 and queued > 0 and sent["paths_reports"] > 0
    assert free >= 0.8 * sent["datagrams_sent"]

"""The job's traffic and the bounds it puts on an iteration (experiments/traffic.py), and the tight
bound made of them (experiments/metrics.py), on hand-computed cases of the smoke spec's 2x2x2
leaf-spine: workers h1..h4 (all-reduce) or h1..h3 with the server on h4 (ps), 100 Mbit/s links."""
from __future__ import annotations

import math

import pytest

from experiments import metrics, runplan, traffic
from experiments.metrics import comm_lower_bound_s, wire_bytes_per_payload_byte
from experiments.spec import Run, load_spec
from helpers import REPO

SMOKE = REPO / "experiments" / "smoke.yaml"
MB = 1_000_000


def run_of(mode: str, *sets: str) -> Run:
    return next(run for run in load_spec(SMOKE, list(sets)).runs if run.job.mode == mode)


def seconds(payload_bytes: float, mbps: float, mtu: int = 9000) -> float:
    return payload_bytes * wire_bytes_per_payload_byte(mtu, "tcp") * 8 / (mbps * 1e6)


def test_uplinks_slower_than_the_host_links_bound_the_ring():
    run = run_of("allreduce", "topology.fabric_bw=25")
    # h2 -> h3 and h4 -> h1 cross the spines: 1.5 models each, half over each of a leaf's uplinks,
    # 0.75 model at 25 Mbit/s: twice the host links' 1.5 models at 100 Mbit/s (the fluid bound).
    assert traffic.link_bound_s(run, [MB]) == pytest.approx(seconds(0.75 * MB, 25))
    fluid = comm_lower_bound_s("allreduce", MB, 100, 4, 1, 9000, "tcp")
    assert traffic.link_bound_s(run, [MB]) == pytest.approx(2 * fluid)
    assert traffic.link_bound_s(run_of("allreduce"), [MB]) == pytest.approx(fluid), "uplinks at line rate"


def test_shards_count_by_their_real_bytes():
    run = run_of("ps", "job.servers=2")  # workers h1 h2, shards on h3 (the 3 MB layer) and h4 (1 MB)
    assert traffic.host_traffic(run, [3 * MB, MB]) == pytest.approx({
        (worker, server): sent * wire_bytes_per_payload_byte(9000, "tcp")
        for worker in ("h1", "h2") for server, sent in (("h3", 3 * MB), ("h4", MB))} | {
        (server, worker): sent * wire_bytes_per_payload_byte(9000, "tcp")
        for worker in ("h1", "h2") for server, sent in (("h3", 3 * MB), ("h4", MB))})
    # h3 takes 2 workers x 3 MB; equal shards would be 2 x 2 MB
    assert traffic.link_bound_s(run, [3 * MB, MB]) == pytest.approx(seconds(6 * MB, 100))
    assert comm_lower_bound_s("ps", 4 * MB, 100, 2, 2, 9000, "tcp") == pytest.approx(seconds(4 * MB, 100))


def test_framing_at_mtu_1500_costs_four_percent_more_than_jumbo_frames():
    jumbo = traffic.link_bound_s(run_of("allreduce"), [MB])
    standard = traffic.link_bound_s(run_of("allreduce", "topology.mtu=1500"), [MB])
    # TCP segments of mtu - 52 bytes in frames of mtu + 14: 1514/1448 against 9014/8948
    assert standard / jumbo == pytest.approx((1514 / 1448) / (9014 / 8948))
    assert standard == pytest.approx(1.5 * MB * 1514 / 1448 * 8 / 100e6)


def test_the_tail_is_the_front_layer_after_the_last_gradient():
    # ps: 3 workers push the 1 MB front layer into h4's link, then pull it back
    assert traffic.tail_comm_s(run_of("ps"), [MB, 2 * MB]) == pytest.approx(seconds(6 * MB, 100))
    # sliced: the pulls of all but the last 256 KiB slice overlap the pushes
    sliced = run_of("ps", "exclude=[{mode: allreduce}]", "job.ps_slice_bytes=262144")
    assert traffic.tail_comm_s(sliced, [MB, 2 * MB]) == pytest.approx(seconds(3 * (MB + 262144), 100))
    # all-reduce: the front layer around the ring of 4, 2(n-1)/n of it over each link
    assert traffic.tail_comm_s(run_of("allreduce"), [MB, 2 * MB]) == pytest.approx(seconds(1.5 * MB, 100))


@pytest.mark.parametrize("link,compute,tail,expected", [
    (0.4, 0.3, 0.05, 0.4),     # the busiest link
    (0.2, 0.3, 0.05, 0.35),    # compute and the tail after it
])
def test_tight_bound(link, compute, tail, expected):
    assert metrics.tight_bound_s(link, compute, tail) == pytest.approx(expected)


def test_tight_bound_is_unknown_without_its_parts():
    assert math.isnan(metrics.tight_bound_s(math.nan, 0.3, 0.05))
    assert math.isnan(metrics.tight_bound_s(0.4, 0.3, math.nan))


# --- the all-reduce algorithms' bounds: alpha-beta, tick by tick (h1 h2 on leaf1, h3 h4 on leaf2)

FRAME_BITS = 9014 * 8  # an MTU-9000 frame on the wire


def hops_s(fabric: float = 100, host: float = 100, cross: bool = True) -> float:
    """A message's last frame through the links after its first: leaf-spine-leaf-host, or leaf-host."""
    return FRAME_BITS * ((2 / fabric if cross else 0) + 1 / host) / 1e6


def allreduce_run(collective: str, *sets: str) -> Run:
    # a pipeline segment larger than the 1 MB model: one segment, every tick by hand
    pipeline = ("job.partition_bytes=1048576",) if collective != "ring" else ()
    return run_of("allreduce", f"job.collective={collective}", *pipeline, "exclude=[{mode: ps}]", *sets)


@pytest.mark.parametrize("collective,expected", [
    # 6 ticks of a quarter model; h2 -> h3 and h4 -> h1 cross the spines
    ("ring", 6 * (seconds(MB / 4, 100) + hops_s())),
    # halving: half to the leaf neighbour, a quarter across; doubling: back again
    ("halving_doubling", seconds(1.5 * MB, 100) + 2 * hops_s(cross=False) + 2 * hops_s()),
    # NCCL's trees of 4, 0 -> 2 -> {1, 3} and 3 -> 1 -> {0, 2}, rerooted: 2 -> {1, 3, 0} and 1 -> {0, 2, 3}, half
    # the model each: h3 (h2) takes three halves from its children in the first tick and sends three to them in
    # the second; both ticks cross the spines
    ("tree", seconds(3 * MB, 100) + 2 * hops_s()),
    # half the model to the leaf neighbour, a quarter to the rank holding the same half on the other leaf, back
    # again: on 2 x 2 ranks the same ticks as halving-doubling
    ("hierarchical", seconds(1.5 * MB, 100) + 2 * hops_s(cross=False) + 2 * hops_s()),
])
def test_each_collectives_alpha_beta_cost_by_hand(collective, expected):
    run = allreduce_run(collective)
    assert traffic.alpha_beta_s(run, MB) == pytest.approx(expected)
    # the bound: the busiest link carrying every byte, or the chain of the rounds' latencies; never more
    # than the cost of the all-reduce alone, which adds the two round by round
    latency = sum(latency for latency, _ in traffic.tick_seconds(run, traffic.allreduce_ticks(run, MB)))
    bound = traffic.comm_bound_s(run, [MB])
    assert bound == pytest.approx(max(traffic.link_bound_s(run, [MB]), latency)) and bound < expected


def test_uplinks_slower_than_the_host_links_bound_a_collective_that_crosses_them_at_once():
    # At 25 Mbit/s a leaf's two uplinks carry its two quarter models of halving's second tick (and doubling's
    # first) at the pace of one at 100; the ring's one flow across each way, an eighth a tick, at that of half.
    assert traffic.alpha_beta_s(allreduce_run("halving_doubling", "topology.fabric_bw=25"), MB) == pytest.approx(
        seconds(3 * MB, 100) + 2 * hops_s(25, cross=False) + 2 * hops_s(25))
    assert traffic.alpha_beta_s(allreduce_run("ring", "topology.fabric_bw=25"), MB) == pytest.approx(
        6 * (seconds(MB / 2, 100) + hops_s(25)))


def test_a_pipelined_collective_pays_its_fill_and_gains_the_overlap():
    one = allreduce_run("tree")
    piped = run_of("allreduce", "job.collective=tree", "job.partition_bytes=65536", "exclude=[{mode: ps}]")
    ticks = traffic.allreduce_ticks(piped, MB)
    # 250000 floats in segments of 4 datagrams (of 2227 floats) in each half, 17816 floats: 14 segments, the last
    # 576 folded into the 14th; 2 ticks each, one behind the other
    assert len(ticks) == 14 + 2 - 1
    # h2 and h3 (the root of one tree, a leaf of the other) send 2 models, h1 and h4 (a leaf of both) 1
    assert sum(nbytes for messages in ticks for _, _, nbytes in messages) == 6 * MB
    # one segment: the busiest host link carries 3 models in its 2 ticks (1.5 in each);
    # 14: 2 models over 15 ticks, its sends and receives in the same ticks
    assert traffic.alpha_beta_s(piped, MB) < 0.85 * traffic.alpha_beta_s(one, MB)


def test_the_hierarchical_all_reduce_sends_fewer_bytes_over_the_spines_than_the_ring():
    """Only the cross-leaf rings cross: 2(L-1)/L of the model out of each of L leaves (2(L-1)/(hL) from each of
    its h ranks), where the ring's one edge out of each leaf carries 2(n-1)/n of it."""
    for leaves, hosts in ((2, 2), (2, 4), (4, 2), (3, 3)):
        sets = [f"topology.leaves={leaves}", f"topology.hosts_per_leaf={hosts}", f"job.batch={48 * leaves * hosts}"]
        crossing = {}
        for collective in ("ring", "hierarchical"):
            carried = traffic.directed_traffic(allreduce_run(collective, *sets), [MB])
            crossing[collective] = sum(sent for (near, far), sent in carried.items()
                                       if near.startswith("leaf") and far.startswith("spine"))
        n, wire = leaves * hosts, wire_bytes_per_payload_byte(9000, "tcp")
        assert crossing["ring"] == pytest.approx(leaves * 2 * (n - 1) / n * MB * wire, rel=1e-5)
        assert crossing["hierarchical"] == pytest.approx(leaves * 2 * (leaves - 1) / leaves * MB * wire, rel=1e-5)
        assert crossing["hierarchical"] < crossing["ring"]


def test_the_hierarchical_runs_are_told_their_workers_leaves():
    run = run_of("allreduce", "job.collective=hierarchical", "job.workers=[h1, h2, h4]", "exclude=[{mode: ps}]")
    assert [process.config.leaves for process in runplan.processes(run)] == [[1, 1, 2]] * 3
    assert all(process.config.leaves == [] for process in runplan.processes(run_of("allreduce")))

"""The job's traffic and the bounds it puts on an iteration (experiments/traffic.py), and the tight
bound made of them (experiments/metrics.py), on hand-computed cases of the smoke spec's 2x2x2
leaf-spine: workers h1..h4 (all-reduce) or h1..h3 with the server on h4 (ps), 100 Mbit/s links."""
from __future__ import annotations

import math

import pytest

from experiments import metrics, traffic
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

"""Lower bounds, TicTac efficiency, iteration times, baseline comparisons, delivered fractions,
link utilization and imbalance against hand values."""
import math

import pandas as pd
import pytest

from experiments import metrics
from experiments.results import PORT_COLUMNS

MB = 1_000_000  # bytes; 100 Mbit/s carries 12.5 MB/s, so one MB takes 0.08 s


@pytest.mark.parametrize("mode,workers,servers,expected_s", [
    ("allreduce", 4, 0, 2 * 3 / 4 * 0.08),   # 0.12: each link carries 1.5 models
    ("allreduce", 2, 0, 0.08),               # 2(n-1)/n = 1
    ("allreduce", 1, 0, 0.0),                # nothing to exchange
    ("ps", 3, 1, 0.24),                      # the one shard receives 3 models
    ("ps", 4, 2, 0.16),                      # 2 shards share 4 models
    ("ps", 2, 4, 0.08),                      # shards are idle: the worker's own link binds
])
def test_comm_lower_bound_matches_hand_values(mode, workers, servers, expected_s):
    # TCP at MTU 9000: a 9014-byte frame carries 8948 bytes of payload
    bound = metrics.comm_lower_bound_s(mode, MB, 100, workers, servers, 9000, "tcp")
    assert bound == pytest.approx(expected_s * 9014 / 8948)


def test_comm_lower_bound_scales_inversely_with_rate():
    assert metrics.comm_lower_bound_s("ps", MB, 1000, 3, 1, 9000, "tcp") == pytest.approx(0.024 * 9014 / 8948)


@pytest.mark.parametrize("mtu, transport, frame, payload", [
    (9000, "tcp", 9014, 8948), (1500, "tcp", 1514, 1448),
    # mlt: payload_for_mtu, plus its 61-byte header, UDP/IP 28 and Ethernet 14
    (9000, "mlt", 8908 + 61 + 28 + 14, 8908), (1500, "mlt", 1408 + 103, 1408),
])
def test_framing_follows_the_mtu(mtu, transport, frame, payload):
    assert metrics.wire_bytes_per_payload_byte(mtu, transport) == pytest.approx(frame / payload)
    assert metrics.comm_lower_bound_s("allreduce", MB, 100, 2, 0, mtu, transport) == \
        pytest.approx(0.08 * frame / payload)


def test_comm_lower_bound_rejects_unknown_mode_and_transport():
    with pytest.raises(ValueError, match="mode: 'ring' is not allowed"):
        metrics.comm_lower_bound_s("ring", MB, 100, 2, 1, 9000, "tcp")
    with pytest.raises(ValueError, match="transport: 'quic' is not allowed"):
        metrics.comm_lower_bound_s("ps", MB, 100, 2, 1, 9000, "quic")


@pytest.mark.parametrize("comm,comp,iteration,expected", [
    (1.0, 2.0, 2.0, 1.0),        # perfect overlap: T = max
    (1.0, 2.0, 3.0, 0.0),        # none: T = comm + comp
    (1.0, 1.0, 1.5, 0.5),
    (1.0, 1.0, 0.5, 1.5),        # T below the max: not clipped, the data disagree
    (1.0, 1.0, 2.5, -0.5),       # T above the sum: slower than serial
])
def test_tictac_efficiency(comm, comp, iteration, expected):
    assert metrics.tictac_efficiency(comm, comp, iteration) == pytest.approx(expected)


@pytest.mark.parametrize("comm,comp", [(0.0, 2.0), (2.0, 0.0), (0.0, 0.0), (math.nan, 1.0), (1.0, math.nan)])
def test_tictac_efficiency_is_nan_without_room_to_overlap(comm, comp):
    assert math.isnan(metrics.tictac_efficiency(comm, comp, 1.0))


def _iterations(rows):
    columns = ["role", "rank", "iteration", "start_s", "end_s", "compute_s", "test_accuracy"]
    return pd.DataFrame(rows, columns=columns)


def test_iteration_times_use_last_worker_completion_and_skip_first_and_last_iteration():
    """The first has no predecessor; the last also waits for its own push and pull (the drain)."""
    iterations = _iterations([
        ("worker", 0, 0, 100.0, 105.0, 1, None), ("worker", 1, 0, 100.0, 106.0, 1, None),
        ("worker", 0, 1, 106.0, 107.0, 1, None), ("worker", 1, 1, 106.0, 107.5, 1, None),
        ("worker", 0, 2, 107.5, 109.5, 1, None), ("worker", 1, 2, 107.5, 109.0, 1, None),
        ("worker", 0, 3, 109.5, 113.0, 1, 0.95), ("worker", 1, 3, 109.5, 112.5, 1, None),
        ("server", 0, 2, 100.0, 200.0, 0, None),  # servers do not define iterations
    ])
    assert metrics.iteration_times_s(iterations).tolist() == [1.5, 2.0]
    assert metrics.time_to_accuracy_s(iterations, 0.9) == pytest.approx(13.0)
    assert math.isnan(metrics.time_to_accuracy_s(iterations, 0.99))


def test_straggler_is_the_mean_spread_of_worker_ends_over_steady_iterations():
    iterations = _iterations([
        ("worker", 0, 0, 100.0, 105.0, 1, None), ("worker", 1, 0, 100.0, 109.0, 1, None),  # first: skipped
        ("worker", 0, 1, 109.0, 110.0, 1, None), ("worker", 1, 1, 109.0, 110.5, 1, None),
        ("worker", 2, 1, 109.0, 110.25, 1, None),
        ("worker", 0, 2, 110.5, 112.0, 1, None), ("worker", 1, 2, 110.5, 111.5, 1, None),
        ("server", 0, 2, 100.0, 200.0, 0, None),  # servers are not workers
    ])
    assert metrics.straggler_s(iterations) == pytest.approx((0.5 + 0.5) / 2)
    assert math.isnan(metrics.straggler_s(iterations[iterations["rank"] == 0]))


def test_comm_time_is_mean_time_a_worker_iteration_had_transfers_in_flight():
    tensors = pd.DataFrame([
        ("worker", 0, 0, 0.0, 9.0),                                    # first iteration: ignored
        ("worker", 0, 1, 10.2, 11.0), ("worker", 0, 1, 10.0, 10.5),    # overlapping: 1.0
        ("worker", 1, 1, 10.0, 13.0), ("worker", 1, 1, 11.0, 12.0),    # nested: 3.0
        ("worker", 0, 2, 20.0, 20.5), ("worker", 0, 2, 21.0, 21.5),    # a gap of compute: 1.0
        ("server", 0, 1, 0.0, 50.0),
    ], columns=["role", "rank", "iteration", "start_s", "end_s"])
    assert metrics.comm_time_s(tensors) == pytest.approx(5 / 3)
    assert metrics.tensor_time_p99_s(tensors.iloc[2:3]) == pytest.approx(0.5)


# Two repetitions of each scheme in ps, one in allreduce.
BASELINE_RUNS = pd.DataFrame({
    "scheme": ["base", "base", "fast", "fast", "base", "fast"],
    "mode": ["ps", "ps", "ps", "ps", "allreduce", "allreduce"],
    "iter_time_mean_s": [1.0, 3.0, 1.0, 4.0, 5.0, 2.5],
    "final_accuracy": [0.90, 0.94, 0.95, 0.89, 0.80, 0.85],
})


def test_speedup_is_baseline_rep_mean_over_run_time_per_other_axes():
    runs = BASELINE_RUNS
    speedup = metrics.speedup_vs_baseline(runs, ["scheme", "mode"], "scheme", "base")
    assert speedup.tolist() == pytest.approx([2.0, 2 / 3, 2.0, 0.5, 1.0, 2.0])
    assert metrics.speedup_vs_baseline(runs, ["scheme"], "scheme", "base").tolist() == pytest.approx(
        [3.0, 1.0, 3.0, 0.75, 0.6, 1.2])
    assert metrics.speedup_vs_baseline(runs, ["scheme"], None, None).isna().all()


def test_speedup_pairs_each_run_with_the_baseline_of_its_repetition():
    # ps: repetitions 1 and 2 of each; allreduce: the baseline's repetition 1, the other scheme's 2 only
    runs = BASELINE_RUNS.assign(rep=[1, 2, 1, 2, 1, 2])
    speedup = metrics.speedup_vs_baseline(runs, ["scheme", "mode"], "scheme", "base")
    assert speedup.tolist() == pytest.approx([1.0, 1.0, 1.0, 0.75, 1.0, 2.0])  # the last: no rep 2, its mean


def test_delivered_fraction_is_byte_weighted_over_received_messages():
    tensors = pd.DataFrame({
        "direction": ["recv", "recv", "send"],
        "bytes": [300, 100, 1000],
        "delivered_fraction": [0.9, 0.5, 1.0],   # senders always log 1
    })
    assert metrics.delivered_fraction(tensors) == pytest.approx((300 * 0.9 + 100 * 0.5) / 400)
    assert metrics.min_delivered_fraction(tensors) == pytest.approx(0.5)
    sent_only = tensors[tensors["direction"] == "send"]
    assert math.isnan(metrics.delivered_fraction(sent_only))
    assert math.isnan(metrics.min_delivered_fraction(sent_only))


def test_uplink_imbalance_is_byte_weighted_mean_of_leaves_max_over_mean():
    rows = [
        ("leaf1", "3", "fabric", 300), ("leaf1", "3", "fabric", 300), ("leaf1", "4", "fabric", 200),  # 600/400
        ("leaf2", "3", "fabric", 100), ("leaf2", "4", "fabric", 100),                                 # even
        ("leaf3", "3", "fabric", 0), ("leaf3", "4", "fabric", 0),           # idle: no weight
        ("leaf1", "1", "host", 5000),                                       # a host port
        ("spine1", "1", "fabric", 900), ("spine1", "2", "fabric", 0),       # downlinks
    ]
    links = pd.DataFrame(rows, columns=["switch", "port", "tier", "tx_bytes"])
    links["role"] = links["switch"].str.rstrip("0123456789")
    assert metrics.uplink_imbalance(links) == pytest.approx((1.5 * 800 + 1.0 * 200) / 1000)
    assert math.isnan(metrics.uplink_imbalance(links.assign(tx_bytes=0)))
    edges = links.assign(role=links["role"].replace("leaf", "edge"))
    assert metrics.uplink_imbalance(edges) == metrics.uplink_imbalance(links), "edges are leaves"
    assert math.isnan(metrics.uplink_imbalance(links.assign(role="agg"))), "only the switches hosts hang off"


PORT_RATES = pd.DataFrame([
    ("leaf1", 3, "spine1", 100.0, "fabric", "leaf"), ("leaf1", 4, "spine2", 100.0, "fabric", "leaf"),
    ("leaf1", 1, "h1", 50.0, "host", "leaf"),
], columns=["switch", "port", "peer", "rate_mbps", "tier", "role"])


def _ports(rows):
    return pd.DataFrame(rows, columns=PORT_COLUMNS)


def test_link_utilization_from_cumulative_counters():
    ports = _ports([
        (0.0, "leaf1", 3, 0, 0, 0, 0, 0, 0),
        (1.0, "leaf1", 3, 6_250_000, 1_250_000, 5000, 1000, 2, 0),    # 50 Mbit/s of 100
        (3.0, "leaf1", 3, 18_750_000, 1_250_000, 15000, 1000, 2, 1),  # 50 Mbit/s over 2 s
        (4.0, "leaf1", 3, 100, 100, 1, 1, 0, 0),                      # counters reset: dropped
        (0.0, "leaf1", 1, 0, 0, 0, 0, 0, 0),
        (1.0, "leaf1", 1, 6_250_000, 0, 10, 0, 0, 0),                 # 50 Mbit/s of 50
        (0.0, "leaf1", 4294967294, 0, 0, 0, 0, 0, 0),                 # LOCAL: no rate, dropped
        (1.0, "leaf1", 4294967294, 99, 0, 0, 0, 0, 0),
    ])
    # the runner's samples at other times: class queue drops (summed over classes) and socket drops
    queues = pd.DataFrame([
        (0.5, "leaf1", 3, 0, 4), (0.5, "leaf1", 3, 1, 1), (2.0, "leaf1", 3, 0, 9), (2.0, "leaf1", 3, 1, 1),
        (3.0, "leaf1", 3, 0, 12), (3.0, "leaf1", 3, 1, 3),
    ], columns=["time_s", "switch", "port", "cs", "dropped_pkts"])
    sockets = pd.DataFrame([(0.0, "leaf1", 3, 7), (3.0, "leaf1", 3, 8), (0.0, "leaf1", 1, 0)],
                           columns=["time_s", "switch", "port", "socket_drops"])
    links = metrics.link_utilization(ports, PORT_RATES, queues, sockets)
    assert list(links.columns) == metrics.LINK_COLUMNS
    fabric = links[links["port"] == "3"]
    assert fabric["interval_s"].tolist() == [1.0, 2.0]
    assert fabric["tx_mbps"].tolist() == pytest.approx([50.0, 50.0])
    assert fabric["tx_util_frac"].tolist() == pytest.approx([0.5, 0.5])
    assert fabric["rx_util_frac"].tolist() == pytest.approx([0.1, 0.0])
    assert fabric["tx_dropped_pkts"].tolist() == [2, 0] and fabric["rx_dropped_pkts"].tolist() == [0, 1]
    # (0, 1]: no sample at 0 s, so unknown; (1, 3]: 15 at 3 s minus 5 at 0.5 s
    assert math.isnan(fabric["queue_drops_pkts"].iloc[0]) and fabric["queue_drops_pkts"].iloc[1] == 10
    assert fabric["socket_drops_pkts"].tolist() == [0, 1]
    assert links[links["port"] == "1"]["tx_util_frac"].tolist() == pytest.approx([1.0])
    assert set(links["port"]) == {"1", "3"}


def test_link_imbalance_is_max_over_mean_of_fabric_ports():
    links = pd.DataFrame({
        "switch": ["leaf1"] * 5, "port": ["3", "3", "4", "4", "1"],
        "tier": ["fabric"] * 4 + ["host"], "tx_util_frac": [0.6, 0.4, 0.0, 0.2, 0.9],
    })
    # per port means 0.5 and 0.1: max 0.5 / mean 0.3; the host port does not count
    assert metrics.link_imbalance(links) == pytest.approx(0.5 / 0.3)
    idle = links.assign(tx_util_frac=0.0)
    assert math.isnan(metrics.link_imbalance(idle))
    assert math.isnan(metrics.link_imbalance(links[links["tier"] == "host"]))


@pytest.mark.parametrize("comm,comp,iteration,why", [
    (1.0, 0.05, 1.0, "compute 5% of the iteration"),   # an MLP's compute: E would divide by noise
    (0.02, 1.0, 1.0, "communication 2% of the iteration"),
    (math.nan, 1.0, 1.0, "communication unknown"),
    (0.5, 0.5, 1.0, ""),
])
def test_overlap_is_undefined_where_one_part_is_negligible(comm, comp, iteration, why):
    assert metrics.overlap_undefined(comm, comp, iteration) == why
    assert math.isnan(metrics.tictac_efficiency(comm, comp, iteration)) == bool(why)

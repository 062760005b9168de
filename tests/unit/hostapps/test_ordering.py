"""Ordering policies: the order each picks, TAC's timing rule, and that ordering never changes the math."""
import numpy as np
import pytest

from hostapps.allreduce import Ring, Segment, run_allreduce
from hostapps.collectives import MAX_PS_SLICES, PS_PULL, PS_PUSH, float_parts, make_buckets, ps_key
from hostapps.config import ConfigError, Model, ProcessConfig, build_model
from hostapps.profiles import PROFILES, Op, ProfileModel
from hostapps.send_orders import (TimeOracle, Unit, make_send_order, needed_at, tac_order, tic_priorities,
                                  time_oracle, transfer_dependencies)
from hostapps.sendloop import SendQueue
from hostapps.transport import MessageKey, Peer
from helpers.loopback import connect_mesh, run_threads
from helpers.loopback import run_job

NO_TIMES = TimeOracle([0.0] * 8, [0.0] * 8)


def layer_unit(layer: int, iteration: int = 0, nbytes: int = 100) -> Unit:
    return Unit(iteration, layer, (layer,), nbytes)


def picked_order(policy_name: str, ready: list[Unit]) -> list[int]:
    policy, left, order = make_send_order(policy_name, NO_TIMES), list(ready), []
    while left:
        order.append(left.pop(policy.pick(left, 0.0)).tensor)
    return order


@pytest.mark.parametrize("name, expected", [("ready", [5, 7, 2, 6]), ("priority", [2, 5, 6, 7]),
                                            ("tic", [2, 5, 6, 7]), ("bytescheduler", [2, 5, 6, 7]),
                                            ("caramel", [5, 7, 2, 6])])
def test_each_policy_orders_a_ready_set_as_documented(name, expected):
    assert picked_order(name, [layer_unit(t) for t in (5, 7, 2, 6)]) == expected


def test_front_layers_first_serves_the_older_iteration_first():
    assert picked_order("priority", [layer_unit(3, 1), layer_unit(0, 1), layer_unit(7, 0)]) == [7, 0, 3]


def test_ps_slices_of_a_layer_and_their_keys():
    # A layer of 2600 floats at flat offset 1000, cut at 4096 bytes (1024 floats): ceil(10400 / 4096) = 3
    # contiguous slices of 867, 867 and 866 floats, none above 4096 bytes.
    parts = float_parts(slice(1000, 3600), 4096)
    assert parts == [slice(1000, 1867), slice(1867, 2734), slice(2734, 3600)]
    assert float_parts(slice(1000, 3600), 0) == float_parts(slice(1000, 3600), 10400) == [slice(1000, 3600)]
    assert [ps_key(7, 4, k, PS_PUSH) for k in range(3)] == [MessageKey(7, 4, step) for step in (0, 2, 4)]
    assert [ps_key(7, 4, k, PS_PULL) for k in range(3)] == [MessageKey(7, 4, step) for step in (1, 3, 5)]
    assert ps_key(7, 4, MAX_PS_SLICES - 1, PS_PULL).step == 0xFFFF  # the last step the 16-bit field holds


def test_front_layers_first_takes_a_layer_s_slices_in_order():
    ready = [Unit(0, 3, (3,), 100, part, 3) for part in (2, 0, 1)] + [Unit(0, 1, (1,), 100, 1, 2)]
    policy, order = make_send_order("priority", NO_TIMES), []
    while ready:
        unit = ready.pop(policy.pick(ready, 0.0))
        order.append((unit.tensor, unit.part))
    assert order == [(1, 1), (3, 0), (3, 1), (3, 2)]


def test_bytescheduler_batch_stays_within_credit_and_the_agreed_arrivals():
    queue = SendQueue(make_send_order("bytescheduler", NO_TIMES))
    for tensor, layer in enumerate([9, 9, 9, 1, 1, 0]):  # partitions of layers 9, 1 and 0, in ready order
        queue.put(Unit(0, tensor, (layer,), 100))
    # Only the first four arrivals are on every rank: layer 9's partitions and one of layer 1's.
    assert [u.tensor for u in queue.take(visible=4, credit_bytes=250)] == [3, 0]
    assert [u.tensor for u in queue.take(credit_bytes=300)] == [5, 4, 1]  # layer 0 preempts the rest of 9
    assert [u.tensor for u in queue.take(credit_bytes=0)] == [2]


def test_tac_lets_a_small_tensor_through_while_the_front_one_is_computed():
    """Hand-checked.  Forward 10 ms per op; transfers 2, 1, 10, 1 ms for tensors 0..3.  Last iteration
    tensors became ready at +0 (3), +1 (2), +2 (1), +5 ms (0).  Now, at +1 ms, 3 and 2 are ready.

    TIC sends 2 (1..11 ms), then 0 (11..13), 1, 3: forward runs 13..53 ms.
    TAC sees tensor 0 due at +5 ms; deferring 2 costs nothing (1 + 10 ms of transfers before 2 <= 20 ms
    of forward ops 0 and 1), so it sends 3 (fits before +5), then 1 (ready at +2, fits), waits, sends 0
    at +5 (5..7), then 2 (7..17): forward runs 7..47 ms, 6 ms less stall.
    """
    tac = make_send_order("tac", TimeOracle([0.010] * 4, [0.002, 0.001, 0.010, 0.001]))
    for tensor, at in ((3, 0.0), (2, 0.001), (1, 0.002), (0, 0.005)):
        tac.became_ready(layer_unit(tensor, 0), 100.0 + at)
    t0 = 200.0
    tac.became_ready(layer_unit(3, 1), t0)
    tac.became_ready(layer_unit(2, 1), t0 + 0.001)
    ready = [layer_unit(3, 1), layer_unit(2, 1)]
    assert ready[tac.pick(ready, t0 + 0.001)].tensor == 3
    ready.pop(0)
    tac.became_ready(layer_unit(1, 1), t0 + 0.002)
    ready.append(layer_unit(1, 1))
    assert ready[tac.pick(ready, t0 + 0.002)].tensor == 1
    ready.pop(1)
    assert tac.pick(ready, t0 + 0.003) is None  # 2 does not fit before 0 is due: wait for it
    tac.became_ready(layer_unit(0, 1), t0 + 0.005)
    ready.append(layer_unit(0, 1))
    assert [u.tensor for u in ready] == [2, 0] and ready[tac.pick(ready, t0 + 0.005)].tensor == 0
    assert picked_order("tic", [layer_unit(3, 1), layer_unit(2, 1)])[0] == 2


def test_tac_sends_the_front_tensor_when_deferring_it_would_stall_the_forward():
    tac = make_send_order("tac", TimeOracle([0.001] * 4, [0.002, 0.001, 0.010, 0.001]))  # forward cannot hide 2
    for tensor, at in ((3, 0.0), (2, 0.001), (1, 0.002), (0, 0.005)):
        tac.became_ready(layer_unit(tensor, 0), at)
    for tensor, at in ((3, 10.0), (2, 10.001)):
        tac.became_ready(layer_unit(tensor, 1), at)
    ready = [layer_unit(3, 1), layer_unit(2, 1)]
    assert ready[tac.pick(ready, 10.001)].tensor == 2


def test_tac_sends_a_slice_into_a_gap_its_whole_layer_would_overrun():
    """The setting of the hand-checked test above at +2.5 ms, with only tensor 2 (10 ms) ready and tensor 0
    due at +5 ms: whole, 2 does not fit and TAC waits; in 5 slices of 2 ms, its first slice fits."""
    oracle = TimeOracle([0.010] * 4, [0.002, 0.001, 0.010, 0.001])
    for parts in (1, 5):
        tac = make_send_order("tac", oracle)
        for tensor, at in ((3, 0.0), (2, 0.001), (1, 0.002), (0, 0.005)):
            tac.became_ready(Unit(0, tensor, (tensor,), 100, 0, parts), 100.0 + at)
        t0 = 200.0
        for tensor, at in ((3, 0.0), (1, 0.001)):  # sent already
            tac.became_ready(Unit(1, tensor, (tensor,), 100, 0, parts), t0 + at)
        ready = [Unit(1, 2, (2,), 100, part, parts) for part in range(parts)]
        for unit in ready:
            tac.became_ready(unit, t0 + 0.002)
        assert tac.pick(ready, t0 + 0.0025) == (None if parts == 1 else 0)


def test_tac_predicts_a_sliced_layer_ready_at_its_first_slice():
    tac = make_send_order("tac", TimeOracle([0.010] * 4, [0.002, 0.001, 0.010, 0.001]))
    for tensor, part, at in ((3, 0, 0.0), (2, 0, 0.001), (2, 1, 0.001), (1, 0, 0.002), (0, 0, 0.005), (0, 1, 0.009)):
        tac.became_ready(Unit(0, tensor, (tensor,), 100, part, 2), 100.0 + at)
    for tensor, at in ((3, 0.0), (1, 0.001), (2, 0.002)):
        tac.became_ready(Unit(1, tensor, (tensor,), 100, 0, 2), 200.0 + at)
    # Tensor 0 is due at +5 ms (its first slice), not +9 ms: a 5 ms slice of tensor 2 at +2.5 ms must wait.
    assert tac.pick([Unit(1, 2, (2,), 100, 0, 2)], 200.0025) is None


# Two branches off a stem, joined by a parameter-free add, then a head.  Parameters are numbered in
# layer order as a profile lists them (the branch b1 after the whole branch a, as ResNet-50 lists a
# block's downsample after its main path).
#   p0 stem -> p1 a1 -> p2 a2 -> add -> p4 head
#           \-> p3 b1 --------/
BRANCHED = (Op("stem", (), (0,)), Op("a1", (0,), (1,)), Op("a2", (1,), (2,)), Op("b1", (0,), (3,)),
            Op("add", (2, 3), ()), Op("head", (4,), (4,)))
BRANCHED_TRANSFER_S = [1.0, 2.0, 1.0, 2.0, 1.0]


def branched_forward_s(b1_s: float) -> list[float]:
    return [1.0, 1.0, 1.0, b1_s, 1.0]


def test_tic_ranks_a_transfer_by_the_transfers_its_first_consumer_needs():
    # Ops need {0}, {0,1}, {0,1,2}, {0,3}, {0,1,2,3}, all five: b1 (2 transfers) runs before a2 (3).
    assert transfer_dependencies(BRANCHED)[4] == {0, 1, 2, 3}
    assert tic_priorities(BRANCHED) == {0: 1, 1: 2, 2: 3, 3: 2, 4: 5}
    oracle = TimeOracle(branched_forward_s(4.0), BRANCHED_TRANSFER_S, BRANCHED)
    tic, left, order = make_send_order("tic", oracle), [layer_unit(t) for t in (4, 3, 2, 1, 0)], []
    while left:
        order.append(left.pop(tic.pick(left, 0.0)).tensor)
    assert order == [0, 1, 3, 2, 4]  # 1 and 3 tie: layer order; the chain's order is 0, 1, 2, 3, 4


@pytest.mark.parametrize("b1_s, expected", [
    # After p0: ops a1 and b1 both wait for 2 s of transfer (least op.M): candidates p1 and p3.
    # P (compute each alone unblocks): p1 1 s (a1), p3 4 s (b1); M+: p1 3 s (a2 needs p1+p2), p3 5 s.
    # p3 first overlaps min(P3, M1) = min(4, 2) = 2 s, p1 first min(P1, M3) = min(1, 2) = 1 s: p3 first.
    # Then a1 needs the least (p1), then p2 unblocks a2 and the add, then p4.
    (4.0, [0, 3, 1, 2, 4]),
    # With b1 1 s both overlap 1 s: the lower M+ (p1, 3 s) goes first; then a2 needs 1 s (p2) < b1's 2 s.
    (1.0, [0, 1, 2, 3, 4]),
])
def test_tac_orders_a_branched_dag_by_the_compute_each_transfer_unblocks(b1_s, expected):
    assert tac_order(BRANCHED, branched_forward_s(b1_s), BRANCHED_TRANSFER_S) == expected
    tac, left, order = make_send_order("tac", TimeOracle(branched_forward_s(b1_s), BRANCHED_TRANSFER_S,
                                                         BRANCHED)), [layer_unit(t) for t in range(5)], []
    while left:  # all ready, no prediction yet: the plan's order
        order.append(left.pop(tac.pick(left, 0.0)).tensor)
    assert order == expected


def test_needed_at_runs_each_op_once_its_transfers_are_in():
    # Order 0, 3, 1, 2, 4: stem (1 s) runs on p0, b1 (4 s) on p3, a1 (1 s) on p1, a2 and the add on p2.
    assert needed_at(BRANCHED, branched_forward_s(4.0), [0, 3, 1, 2, 4]) == {0: 0.0, 3: 1.0, 1: 5.0, 2: 6.0, 4: 7.0}


def test_resnet50_profile_is_a_well_formed_branched_dag():
    profile = PROFILES["resnet50"]()
    graph, names = profile.graph, [layer.name for layer in profile.layers]
    assert all(i < at for at, op in enumerate(graph) for i in op.inputs), "a topological order: acyclic"
    read = [param for op in graph for param in op.params]
    assert sorted(read) == list(range(len(profile.layers))), "every parameter is read by exactly one op"
    assert all(names[param] == op.name for op in graph for param in op.params)
    adds = [op for op in graph if not op.params]
    assert len(adds) == 16 and all(len(op.inputs) == 2 for op in adds)  # one per bottleneck block
    consumers = {i for op in graph for i in op.inputs}
    assert set(range(len(graph))) - consumers == {len(graph) - 1}, "every op but fc feeds another"
    # The downsample branch runs beside the block's main path: TIC ranks it with the block's first conv.
    priority = tic_priorities(graph)
    assert priority[names.index("layer1.0.downsample.0")] == priority[names.index("layer1.0.conv1")] == 3


def test_caramel_buckets_double_from_the_first():
    assert make_buckets([10] * 8, 10, growth=2) == [(7,), (6, 5), (4, 3, 2, 1), (0,)]


def test_pipelined_segments_reduce_to_the_mean_on_every_rank(loopback_addresses):
    world, rng = 3, np.random.default_rng(0)
    peers = [Peer("worker", r) for r in range(world)]
    transports = connect_mesh(peers, loopback_addresses(world))
    inputs = [rng.normal(size=1000).astype(np.float32) for _ in range(world)]
    arrays = [x.copy() for x in inputs]

    def reduce(rank):
        segments = [Segment(7, k * Ring(world).steps, arrays[rank][lo:lo + 200]) for k, lo in
                    enumerate(range(0, 1000, 200))]
        return lambda: run_allreduce(transports[rank], Ring(world), rank, 0, segments, np.empty(100, np.float32))
    try:
        run_threads([reduce(r) for r in range(world)])
    finally:
        run_threads([t.close for t in transports])
    np.testing.assert_allclose(arrays[0], np.mean(inputs, axis=0), rtol=1e-5, atol=1e-6)
    assert all(np.array_equal(arrays[0], a) for a in arrays)


OPTIONS = dict(iterations=12, batch=32, eval_every=0, model=Model(width=64, depth=2), momentum=0.5)


@pytest.mark.parametrize("policy", ["caramel", "bytescheduler"])
def test_allreduce_policies_keep_the_single_worker_parameters(loopback_addresses, policy):
    single = run_job(loopback_addresses, 1, **OPTIONS)[0]["model"].params
    # Small partitions so that every layer is cut and batches mix layers.
    for result in run_job(loopback_addresses, 4, send_order=policy, partition_bytes=4096, credit_bytes=12288,
                          **OPTIONS):
        assert np.abs(result["model"].params - single).max() < 1e-4


def test_random_order_takes_every_ready_unit_in_a_seeded_arbitrary_order():
    ready = [layer_unit(t) for t in range(20)]
    order = picked_order("random", ready)
    assert sorted(order) == list(range(20)) and order != list(range(20))
    assert picked_order("random", ready) == order  # repeatable


@pytest.mark.parametrize("policy", ["random", "priority", "tic", "tac"])
def test_ps_policies_keep_the_ready_order_parameters(loopback_addresses, policy):
    ready = run_job(loopback_addresses, 4, "ps", 2, **OPTIONS)[0]["model"].params
    for result in run_job(loopback_addresses, 4, "ps", 2, send_order=policy, **OPTIONS):
        assert np.abs(result["model"].params - ready).max() < 1e-5


@pytest.mark.parametrize("policy", ["ready", "priority", "tac"])
def test_ps_policies_with_slices_keep_the_whole_layer_parameters(loopback_addresses, policy):
    whole = run_job(loopback_addresses, 4, "ps", 2, **OPTIONS)[0]["model"].params
    for result in run_job(loopback_addresses, 4, "ps", 2, send_order=policy, ps_slice_bytes=4096, **OPTIONS):
        assert np.allclose(result["model"].params, whole, atol=1e-6)


def test_profile_job_with_tac_and_bytescheduler_runs(loopback_addresses):
    profile = dict(model=Model("resnet50", scale=0.001), iterations=3, eval_every=0)
    assert run_job(loopback_addresses, 2, "ps", 1, send_order="tac", **profile)[0]["iterations"] == 3
    sliced = run_job(loopback_addresses, 2, "ps", 1, send_order="tac", ps_slice_bytes=1024, **profile)
    assert sliced[0]["iterations"] == 3
    partitioned = run_job(loopback_addresses, 2, send_order="bytescheduler", partition_bytes=1024, **profile)
    assert partitioned[0]["iterations"] == 3


def _arrival_orders(summary: dict, iterations: range) -> list[list[int]]:
    """Per iteration, the parameter tensors a worker received, in the order they arrived."""
    received = [m for m in summary["recorder"].messages if m.direction == "recv"]
    return [[m.tensor for m in sorted((m for m in received if m.iteration == it), key=lambda m: m.end_s)]
            for it in iterations]


@pytest.mark.parametrize("policy", ["random", "tic", "tac"])
@pytest.mark.parametrize("task", ["train", "inference"])
def test_tensorflow_semantics_return_every_parameter_at_once_in_the_send_order(loopback_addresses, task, policy):
    # --ps-update iteration (training) and inference make the shard's parameters ready all at once, so the
    # order they reach a worker is the send order's plan alone: TIC's and TAC's on ResNet-50's DAG.
    profile = Model("resnet50", scale=0.001)
    summaries = run_job(loopback_addresses, 2, "ps", 1, model=profile, iterations=3, eval_every=0,
                        ps_update="iteration", task=task, send_order=policy)
    model = ProfileModel(PROFILES["resnet50"](), 0.001, 100.0)
    oracle = time_oracle(model, 100.0)
    plan = {"tic": sorted(range(len(model.layers)), key=lambda t: (tic_priorities(oracle.graph)[t], t)),
            "tac": tac_order(oracle.graph, oracle.forward_s, oracle.transfer_s)}
    pulled = range(1, 3) if task == "train" else range(3)  # training's iteration 0 starts from the seed
    orders = _arrival_orders(summaries[0], pulled)
    for order in orders:
        assert sorted(order) == list(range(len(model.layers)))  # every parameter, once
        if policy in plan:
            assert order == plan[policy]
        else:
            assert order != sorted(order) and order != sorted(order, reverse=True)
    if policy == "random":
        assert orders[0] != orders[1]


def test_inference_pulls_the_parameters_each_iteration_asks_for_and_changes_none(loopback_addresses):
    options = dict(iterations=3, batch=32, model=Model(width=64, depth=2))
    untrained = build_model(ProcessConfig(role="worker", rank=0, workers=[("127.0.0.1", 1)], **options))
    summaries = run_job(loopback_addresses, 2, "ps", 2, task="inference", **options)
    layers = len(untrained.layers)
    for summary in summaries:
        assert np.array_equal(summary["model"].params, untrained.params)
        assert summary["final_accuracy"] == summaries[0]["final_accuracy"]
        sent = summary["recorder"].messages
        # Only requests go up: one per shard and iteration, under the tensor after the model's last.
        assert sorted((m.iteration, m.tensor, m.peer) for m in sent if m.direction == "send") == [
            (it, layers, f"server{s}") for it in range(3) for s in range(2)]
        assert [sorted(order) for order in _arrival_orders(summary, range(3))] == [list(range(layers))] * 3


@pytest.mark.parametrize("mode, policy", [("allreduce", "tac"), ("ps", "caramel"), ("ps", "bytescheduler")])
def test_a_send_order_of_the_other_mode_is_refused(mode, policy):
    cfg = ProcessConfig(role="worker", rank=0, workers=[("127.0.0.1", 1)],
                        servers=[("127.0.0.1", 2)] if mode == "ps" else [], mode=mode, send_order=policy)
    with pytest.raises(ConfigError, match=f"--send-order: '{policy}' is not allowed \\(ready, best or "):
        cfg.validate()

"""Caramel's parts: transfer boundaries, computation schedules, the cost model, adaptive batching, and that
none of it changes what training computes."""
import itertools
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hostapps.caramel import (Job, Ring, adaptive_batches, caramel_pieces, caramel_schedule, dataflow_schedule,
                              doubling_batches, job_of, lawler_backward, per_tensor, predict, segment_counts,
                              transfer_boundaries)
from hostapps.allreduce import make_allreduce
from hostapps.collectives import make_buckets
from hostapps.config import ConfigError, Model, ProcessConfig, build_model, config_from_args, process_arguments
from hostapps.profiles import (PROFILES, Op, ProfileModel, Schedule, chain_graph, gradient_order, listing_schedule,
                               schedule_error)
from helpers.loopback import run_job

# Two branches off a stem, joined by a parameter-free add, then a head; tensor k is read by the op
# named after it (p0 stem, p1 a1, p2 a2, p3 b1, p4 head).
#   stem -> a1 -> a2 -> add -> head
#        \-> b1 ---------/
BRANCHED = (Op("stem", (), (0,)), Op("a1", (0,), (1,)), Op("a2", (1,), (2,)), Op("b1", (0,), (3,)),
            Op("add", (2, 3), ()), Op("head", (4,), (4,)))
# Per op: forward 1, 1, 1, 4, 0, 1 s (8 s); backward twice that (16 s).
BRANCHED_JOB = Job(BRANCHED, (1.0, 1.0, 1.0, 4.0, 0.0, 1.0), (2.0, 2.0, 2.0, 8.0, 0.0, 2.0), (100,) * 5)


def test_transfer_boundaries_of_a_branched_dag_in_the_listing_schedule():
    """Backprop head, add, b1, a2, a1, stem ends at 2, 2, 10, 12, 14, 16 s: each tensor's gradient then.
    The next forward pass starts at 16 s and reaches stem, a1, a2, b1, add, head at +0, 1, 2, 3, 7, 7 s."""
    bounds = transfer_boundaries(BRANCHED_JOB, listing_schedule(BRANCHED))
    assert (bounds.backward_s, bounds.forward_s) == (16.0, 8.0)
    assert bounds.start == {4: 2.0, 3: 10.0, 2: 12.0, 1: 14.0, 0: 16.0}
    assert bounds.end == {0: 16.0, 1: 17.0, 2: 18.0, 3: 19.0, 4: 23.0}
    assert [bounds.window(p) for p in range(5)] == [0.0, 3.0, 6.0, 9.0, 21.0]


def test_a_schedule_that_runs_the_short_branch_first_widens_its_windows():
    """Backprop head, add, a2, a1, b1, stem: a2 and a1 end at 4 and 6 s, b1 at 14; forward stem, b1, a1, a2
    reaches them at +0, 1, 5, 6 s.  a1's window grows from 3 to 15 s and a2's from 6 to 18, at b1's cost
    (9 to 3 s)."""
    schedule = Schedule((0, 3, 1, 2, 4, 5), (5, 4, 2, 1, 3, 0))
    bounds = transfer_boundaries(BRANCHED_JOB, schedule)
    assert bounds.start == {4: 2.0, 2: 4.0, 1: 6.0, 3: 14.0, 0: 16.0}
    assert bounds.end == {0: 16.0, 3: 17.0, 1: 21.0, 2: 22.0, 4: 23.0}
    assert [bounds.window(p) for p in range(5)] == [0.0, 15.0, 18.0, 3.0, 21.0]


def test_lawler_runs_backprop_so_the_earliest_due_gradient_is_ready_first():
    """Due a1 before b1 (as the listing forward pass needs them): b1, free to run last of the branches, goes
    last; the add and head before every branch, the stem after them all."""
    due = {0: 16.0, 1: 15.0, 2: 16.0, 3: 17.0, 5: 21.0}
    assert lawler_backward(BRANCHED_JOB, due) == (5, 4, 2, 1, 3, 0)
    assert lawler_backward(BRANCHED_JOB, {**due, 3: 10.0}) == (5, 4, 3, 2, 1, 0)


@st.composite
def dags(draw, max_ops=14):
    """A random forward DAG listed in a topological order, every tensor read by one op (some ops none)."""
    ops, tensors = [], 0
    for i in range(draw(st.integers(1, max_ops))):
        inputs = tuple(sorted(draw(st.sets(st.integers(0, i - 1), max_size=3)))) if i else ()
        count = draw(st.integers(0 if i else 1, 2))
        ops.append(Op(f"op{i}", inputs, tuple(range(tensors, tensors + count))))
        tensors += count
    return tuple(ops)


@st.composite
def jobs(draw, max_ops=14):
    graph = draw(dags(max_ops))
    seconds = st.floats(0.0, 0.05)
    tensors = sum(len(op.params) for op in graph)
    return Job(graph, tuple(draw(seconds) for _ in graph), tuple(draw(seconds) for _ in graph),
               tuple(draw(st.integers(4, 400_000)) for _ in range(tensors)))


RING = Ring(4, 50e6 / 8, 0.001)


@settings(max_examples=200, deadline=None)
@given(jobs(), st.integers(0, 2**32 - 1))
def test_every_schedule_respects_every_data_dependency(job, seed):
    for schedule in (listing_schedule(job.graph), dataflow_schedule(job.graph, seed), caramel_schedule(job, RING),
                     caramel_schedule(job, RING, lambda job, schedule: adaptive_batches(job, schedule, RING))):
        assert schedule_error(job.graph, schedule) is None
        assert sorted(gradient_order(job.graph, schedule)) == list(range(len(job.nbytes)))


@settings(max_examples=100, deadline=None)
@given(jobs())
def test_caramel_never_plans_a_slower_schedule_than_the_listing_one(job):
    listing = listing_schedule(job.graph)
    chosen = caramel_schedule(job, RING)
    assert (predict(job, chosen, per_tensor(job, chosen), RING).iteration_s
            <= predict(job, listing, per_tensor(job, listing), RING).iteration_s + 1e-9)


def test_a_wrong_schedule_is_named():
    assert schedule_error(BRANCHED, Schedule((0, 3, 1, 2, 4, 5), (5, 4, 2, 1, 0, 3))) == \
        "backward runs stem before b1, which reads it"
    assert schedule_error(BRANCHED, Schedule((1, 0, 2, 3, 4, 5), (5, 4, 3, 2, 1, 0))) == \
        "forward runs a1 before stem, which it reads"
    assert "not a permutation" in schedule_error(BRANCHED, Schedule((0, 1, 2), (5, 4, 3, 2, 1, 0)))


def test_dataflow_schedules_are_arbitrary_and_the_same_for_the_same_seed():
    graph = PROFILES["inception_v3"]().graph
    assert dataflow_schedule(graph, 7) == dataflow_schedule(graph, 7)
    assert dataflow_schedule(graph, 7) != dataflow_schedule(graph, 8)
    assert dataflow_schedule(graph, 7) != listing_schedule(graph)


def test_a_chain_leaves_no_schedule_but_its_own():
    chain = chain_graph(6)
    assert dataflow_schedule(chain, 3) == listing_schedule(chain)
    job = Job(chain, (0.01,) * 6, (0.02,) * 6, (40_000,) * 6)
    assert caramel_schedule(job, RING) == listing_schedule(chain)


# -- the cost model --------------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(st.integers(1, 50_000_000), st.integers(1024, 1 << 20), st.integers(2, 8), st.sampled_from([350, 2237]))
def test_segment_counts_are_those_segment_bounds_cuts(nbytes, segment_bytes, world, grid):
    expected = len(make_allreduce("ring", world).segments(max(1, nbytes // 4), segment_bytes // 4, grid,
                                                            pipeline=True))
    assert segment_counts(np.array([nbytes]), segment_bytes, world, grid)[0] == expected


def ticked_seconds(ring: Ring, nbytes: int) -> float:
    """Ring.seconds tick by tick: in tick t the active segments each send a chunk."""
    steps = 2 * (ring.world - 1)
    segments = int(segment_counts(np.array([nbytes]), ring.segment_bytes, ring.world, ring.grid)[0]) \
        if ring.segment_bytes else 1
    chunk = nbytes / segments / ring.world / ring.bytes_per_s
    total = 0.0
    for tick in range(steps + segments - 1):
        active = sum(1 for s in range(segments) if s <= tick < s + steps)
        total += chunk + max(ring.step_s, (active - 1) * chunk)
    return total


@settings(max_examples=200, deadline=None)
@given(st.integers(4, 4_000_000), st.sampled_from([0, 4096, 65536]), st.integers(2, 6), st.floats(0.0, 0.005))
def test_the_ring_cost_in_closed_form_is_its_tick_by_tick_sum(nbytes, segment_bytes, world, step_s):
    ring = Ring(world, 50e6 / 8, step_s, segment_bytes, 350)
    assert ring.seconds(nbytes) == pytest.approx(ticked_seconds(ring, nbytes), rel=1e-9, abs=1e-12)
    assert make_allreduce("ring", world).max_segments() >= 1


def test_an_unpipelined_ring_pays_its_step_latency_at_every_step():
    ring = Ring(4, 1e6, 0.001)
    assert ring.seconds(4000) == pytest.approx(6 * (0.001 + 1000 / 1e6))
    assert Ring(1, 1e6, 0.001).seconds(4000) == 0.0


# -- batching --------------------------------------------------------------------------------------------
def small_tensor_chain(tensors: int = 40) -> Job:
    """A chain of many small tensors and a few large ones, compute comparable to its all-reduce."""
    sizes = tuple(200_000 if k % 10 == 9 else 400 for k in range(tensors))
    return Job(chain_graph(tensors), (0.004,) * tensors, (0.008,) * tensors, sizes)


def test_batching_chooses_larger_batches_as_the_per_transfer_overhead_grows():
    job, schedule = small_tensor_chain(), listing_schedule(chain_graph(40))
    counts = [len(adaptive_batches(job, schedule, Ring(4, 50e6 / 8, step_ms / 1000)))
              for step_ms in (0.01, 0.3, 1.0, 3.0, 10.0)]
    assert counts == sorted(counts, reverse=True) and counts[0] > counts[-1]


def test_batches_are_runs_of_the_gradient_sequence_covering_every_tensor_once():
    job = job_of(ProfileModel(PROFILES["inception_v3"](), 0.005, 50), 12)
    schedule = dataflow_schedule(job.graph, 1)
    units = adaptive_batches(job, schedule, Ring(4, 50e6 / 8, 0.001, 65536, 2237))
    assert [p for unit in units for p in unit] == gradient_order(job.graph, schedule)


def partitions(order):
    """Every way to cut a sequence into runs."""
    for cuts in itertools.product((False, True), repeat=len(order) - 1):
        units, current = [], [order[0]]
        for item, cut in zip(order[1:], cuts):
            if cut:
                units.append(tuple(current))
                current = []
            current.append(item)
        yield units + [tuple(current)]


@settings(max_examples=60, deadline=None)
@given(jobs(max_ops=6), st.floats(0.0, 0.004), st.sampled_from([0, 8192]))
def test_adaptive_batches_reach_the_least_lateness_of_any_partition(job, step_s, segment_bytes):
    ring = Ring(4, 50e6 / 8, step_s, segment_bytes, 350)
    schedule = listing_schedule(job.graph)
    order = gradient_order(job.graph, schedule)
    best = min(predict(job, schedule, units, ring).lateness_s for units in partitions(order))
    assert predict(job, schedule, adaptive_batches(job, schedule, ring), ring).lateness_s <= best + 2e-5


def test_doubling_batches_on_the_reverse_order_are_the_former_buckets():
    sizes = (10,) * 8
    job = Job(chain_graph(8), (0.0,) * 8, (0.0,) * 8, sizes)
    assert doubling_batches(job, listing_schedule(job.graph), 10) == make_buckets(list(sizes), 10, growth=2)


# -- the model in a schedule and its layout ----------------------------------------------------------------
def test_a_profile_model_runs_its_ops_in_the_schedule_and_readies_each_gradient_once():
    model = ProfileModel(PROFILES["inception_v3"](), 1e-6, 1e6)
    schedule = dataflow_schedule(model.graph, 5)
    model.run_in(schedule)
    needed: list[int] = []
    model.forward(None, needed.append)
    assert needed == [p for op in schedule.forward for p in model.graph[op].params]
    assert list(model.backward()) == model.gradient_order() == gradient_order(model.graph, schedule)
    with pytest.raises(ValueError, match="not a schedule of inception_v3: backward runs "):
        model.run_in(Schedule(schedule.forward, tuple(reversed(schedule.backward))))


def test_a_layout_makes_runs_of_gradients_contiguous_and_keeps_every_layer_s_values():
    model = ProfileModel(PROFILES["bert_base_tf"](), 1e-5, 100)
    for i in range(len(model.layers)):
        model.layer_params(i)[...] = i
    order = list(reversed(model.gradient_order()))
    model.lay_out(order)
    assert all(np.all(model.layer_params(i) == i) for i in range(len(model.layers)))
    run = tuple(order[10:20])
    assert model.layer_slice(run).stop - model.layer_slice(run).start == sum(model.layers[i].size for i in run)
    with pytest.raises(ValueError, match="not adjacent"):
        model.layer_slice((order[0], order[2]))


def test_caramel_jobs_are_laid_out_for_their_units():
    options = dict(role="worker", rank=0, workers=[("127.0.0.1", 1 + r) for r in range(4)], link_mbps=50,
                   model=Model("inception_v3", scale=0.005))
    model = build_model(ProcessConfig(**options, send_order="caramel", backward="dataflow"))
    assert model.gradient_order() != list(reversed(range(len(model.layers))))
    assert [model.layer_slice((layer,)).start for layer in reversed(model.gradient_order())] == \
        sorted(model.layer_slice((layer,)).start for layer in range(len(model.layers)))


def test_new_profiles_are_well_formed_dags():
    for name in ("inception_v3", "bert_base_tf"):
        profile = PROFILES[name]()
        graph = profile.graph
        assert all(i < at for at, op in enumerate(graph) for i in op.inputs), "a topological order"
        read = sorted(param for op in graph for param in op.params)
        assert read == list(range(len(profile.layers))), "every tensor read by exactly one op"
        assert {i for op in graph for i in op.inputs} == set(range(len(graph) - 1)), "only the last op is unread"
    inception = PROFILES["inception_v3"]()
    assert inception.params == 23_817_352  # keras.applications.InceptionV3, trainable
    assert sum(layer.params for layer in inception.layers if layer.name.endswith("/beta")) * 2 == 34_432
    assert len(inception.layers) == 190 and len(PROFILES["bert_base_tf"]().layers) == 201
    assert math.isclose(sum(layer.flops for layer in inception.layers) / 32 / 2, 5.73e9, rel_tol=0.01)


# -- training computes the same ----------------------------------------------------------------------------
def test_caramel_ends_with_the_baseline_s_parameters(loopback_addresses):
    """The framework default (per-tensor all-reduce in a dataflow order) and full Caramel (its schedule,
    adaptive batches laid out contiguously, pipelined segments), same seed: the same parameters, layer by
    layer (each layer's emulated gradient has its own value, so a unit cut across the wrong layers shows)."""
    job = dict(model=Model("inception_v3", scale=0.0002), iterations=3, eval_every=0, seed=3, link_mbps=1000,
               partition_bytes=1024, caramel_step_ms=3.0)
    baseline = run_job(loopback_addresses, 3, send_order="ready", backward="dataflow", **job)
    caramel = run_job(loopback_addresses, 3, send_order="caramel", backward="caramel", **job)
    cfg = ProcessConfig(role="worker", rank=0, workers=[("127.0.0.1", 1 + r) for r in range(3)],
                        send_order="caramel", backward="caramel", **job)
    assert max(len(unit) for unit in caramel_pieces(build_model(cfg), cfg)) > 10, "units of many tensors"
    for before, after in zip(baseline, caramel):
        names = [layer.name for layer in before["model"].layers]
        for i, name in enumerate(names):
            np.testing.assert_array_equal(before["model"].layer_params(i), after["model"].layer_params(i),
                                          err_msg=name)
    assert not np.all(baseline[0]["model"].params == baseline[0]["model"].params[0])


@pytest.mark.parametrize("knobs", [dict(caramel_batching="doubling"), dict(caramel_batching="none"),
                                   dict(caramel_pipelining="none"), dict(caramel_step_ms=0.01)])
def test_every_caramel_variant_keeps_the_single_worker_parameters(loopback_addresses, knobs):
    options = dict(iterations=8, batch=32, eval_every=0, model=Model(width=64, depth=2), momentum=0.5)
    single = run_job(loopback_addresses, 1, **options)[0]["model"].params
    for result in run_job(loopback_addresses, 4, send_order="caramel", partition_bytes=4096, **knobs, **options):
        assert np.abs(result["model"].params - single).max() < 1e-4


@pytest.mark.parametrize("knobs, message", [
    (dict(caramel_batching="none"), "--caramel-batching: 'none' is not allowed ('adaptive' here: only send order "
                                    "caramel's all-reduce uses it, not send order ready in allreduce mode"),
    (dict(caramel_pipelining="none", send_order="bytescheduler"), "--caramel-pipelining: 'none' is not allowed"),
    (dict(caramel_step_ms=0.5), "--caramel-step-ms: 0.5 is not allowed (1.0 here: only Caramel's plans use it"),
    (dict(caramel_step_ms=0.5, send_order="caramel", caramel_batching="doubling"), "--caramel-step-ms: 0.5"),
    (dict(send_order="caramel", caramel_pipelining="none", partition_bytes=4096),
     "--partition-bytes: 4096 is not allowed (65536 here: caramel cuts no segments with caramel_pipelining none"),
])
def test_a_caramel_knob_that_changes_nothing_is_refused(knobs, message):
    cfg = ProcessConfig(role="worker", rank=0, workers=[("127.0.0.1", 1)], model=Model("inception_v3"), **knobs)
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        cfg.validate()


@pytest.mark.parametrize("knobs", [dict(backward="caramel", caramel_step_ms=0.5),
                                   dict(send_order="caramel", caramel_step_ms=0.5),
                                   dict(send_order="caramel", caramel_batching="doubling", caramel_pipelining="none",
                                        partition_bytes=4096)])
def test_caramel_knobs_that_act_are_allowed(knobs):
    ProcessConfig(role="worker", rank=0, workers=[("127.0.0.1", 1)], model=Model("inception_v3"), **knobs).validate()


@pytest.mark.parametrize("knobs", [dict(caramel_pipelining="none", caramel_batching="doubling", backward="dataflow"),
                                   dict(caramel_pipelining="none", caramel_step_ms=0.5, backward="caramel")])
def test_caramel_knobs_survive_the_command_line_the_runner_writes(knobs):
    cfg = ProcessConfig(role="worker", rank=0, workers=[("127.0.0.1", 1)], send_order="caramel",
                        model=Model("inception_v3"), **knobs)
    assert config_from_args(["worker", *process_arguments(cfg)]) == cfg

"""Inter-job sharing (controller/sharing.py): two jobs' classes under each policy, on fake switches
wired as a leaf-spine (tests/helpers/fakeswitch.py), CASSINI-style offsets on hand-computed
periods, and what POST and GET /jobs of the real app tell the runner."""
import dataclasses

import pytest

from common.classes import GRADIENT_DSCPS
from controller.pipeline import WantedMarks
from controller.priority import CapacityError
from controller.scheduling import JobFlow, Layer, RegisteredJob, describe_job, parse_job, sharing_of
from controller.sharing import (MAX_JOBS, MIN_PACE_MARGIN, PACE_MARGIN, JobTiming, TimeShift, bands, interleave,
                                pace_margin, paced, paces, placement, share)
from helpers.fabric_views import ip, leaf_spine
from unit.controller.test_pipeline import installed, marked, sync_marks, tcp
from unit.controller.test_rest import controller_app, refused, request

CS6, CS5, CS4, CS3, CS2 = GRADIENT_DSCPS


def job(name, src, dst, policy="fifo", sharing="fair", fwd_ms=10.0, bwd_ms=20.0, comm_ms=None):
    """A two-layer job whose one TCP connection carries both layers; compute fwd_ms + bwd_ms."""
    layers = (Layer(0, "a", 1000, fwd_ms / 2, bwd_ms / 2), Layer(1, "b", 1000, fwd_ms / 2, bwd_ms / 2))
    flows = (JobFlow((0, 1), src, dst, "tcp", None, 7000, 7000),)
    return RegisteredJob(name, policy, (src, dst), layers, flows, sharing, comm_ms)


# compute-heavy: 300 ms of compute over 30 ms on its busiest link (intensity 10);
# communication-heavy: 30 ms over 60 ms (intensity 0.5)
HEAVY = dict(fwd_ms=100.0, bwd_ms=200.0, comm_ms=30.0)
LIGHT = dict(fwd_ms=10.0, bwd_ms=20.0, comm_ms=60.0)


def two_jobs_marked(sharing, policy="fifo"):
    """The DSCP each job's connection carries through a 2x2x2 leaf-spine, the compute-heavy job
    (h1 -> h3) registered first, the communication-heavy one (h2 -> h4) second."""
    view = leaf_spine(2, 2, 2)
    fabric, _ = installed(view, "ecmp")
    wanted, have = WantedMarks(), {}
    wanted.register(job("heavy", ip(1), ip(3), policy, sharing, **HEAVY))
    wanted.register(job("light", ip(2), ip(4), policy, sharing, **LIGHT))
    sync_marks(fabric, view, wanted, have)
    return {name: {path[-1] for path in marked(fabric, src, tcp(src, dst, dport=7000))}
            for name, src, dst in [("heavy", ip(1), ip(3)), ("light", ip(2), ip(4))]}


@pytest.mark.parametrize("sharing, policy, expected", [
    ("fair", "fifo", {"heavy": {0}, "light": {0}}),            # one class for both: as no sharing at all
    ("timeshift", "fifo", {"heavy": {0}, "light": {0}}),       # the same classes, apart in time
    ("fair", "layer", {"heavy": {CS6}, "light": {CS6}}),       # each job's front layer in the top class
    ("intensity", "fifo", {"heavy": {CS6}, "light": {CS4}}),   # bands CS6-CS5 and CS4-CS2
    ("intensity", "layer", {"heavy": {CS6}, "light": {CS4}}),  # each connection its band's most urgent
])
def test_two_jobs_classes_on_the_switches_under_each_policy(sharing, policy, expected):
    assert two_jobs_marked(sharing, policy) == expected


def test_intensity_puts_the_more_intense_job_first_whatever_the_order_it_came_in():
    jobs = [job("light", ip(2), ip(4), "layer", "intensity", **LIGHT),
            job("heavy", ip(1), ip(3), "layer", "intensity", **HEAVY)]
    shared = sharing_of(jobs)
    assert shared.bands == {"heavy": (CS6, CS5), "light": (CS4, CS3, CS2)}
    assert shared.intensity == {"light": 0.5, "heavy": 10.0}
    described = describe_job(jobs[0], shared)
    assert [layer["dscp"] for layer in described["layers"]] == [CS4, CS3]  # layer order inside its band
    assert described["band"] == [CS4, CS3, CS2] and described["start_offset_ms"] == 0


def test_equal_intensities_share_every_class_as_fair():
    jobs = [job("a", ip(1), ip(3), "layer", "intensity", **HEAVY),
            job("b", ip(2), ip(4), "layer", "intensity", **HEAVY)]
    assert share("intensity", jobs).bands == share("fair", jobs).bands == {"a": GRADIENT_DSCPS, "b": GRADIENT_DSCPS}


def test_a_ranking_longer_than_the_classes_is_compressed_in_order():
    levels = {f"j{i}": i for i in range(7)}
    assigned = bands(levels)
    assert all(len(band) == 1 for band in assigned.values())
    order = [GRADIENT_DSCPS.index(assigned[f"j{i}"][0]) for i in range(7)]
    assert order == sorted(order) and order[0] == 0 and order[-1] == 4
    assert bands({"a": 0, "b": 1, "c": 2}) == {"a": (CS6,), "b": (CS5, CS4), "c": (CS3, CS2)}


def test_the_bands_follow_a_job_that_leaves():
    wanted = WantedMarks()
    wanted.register(job("heavy", ip(1), ip(3), "fifo", "intensity", **HEAVY))
    wanted.register(job("light", ip(2), ip(4), "fifo", "intensity", **LIGHT))
    assert {f.dscp for f in wanted.job_classes["light"] if f.in_dscp is None} == {CS4}
    wanted.remove("heavy")
    assert {f.dscp for f in wanted.job_classes["light"] if f.in_dscp is None} == {0}, "alone: its own classes"


def test_one_sharing_policy_for_every_registered_job():
    wanted = WantedMarks()
    wanted.register(job("a", ip(1), ip(3), sharing="fair"))
    with pytest.raises(CapacityError, match="sharing: 'intensity' is not allowed while job a"):
        wanted.register(job("b", ip(2), ip(4), sharing="intensity"))
    wanted.register(job("a", ip(1), ip(3), sharing="intensity"))  # the only job may change it
    assert wanted.jobs["a"].sharing == "intensity"


def test_the_job_document_takes_sharing_and_comm_ms():
    document = {"job": "j", "policy": "fifo", "hosts": ["10.0.0.1"], "layers": [{"index": 0, "name": "a", "bytes": 4}],
                "sharing": "timeshift", "comm_ms": 12.5}
    parsed = parse_job(document)
    assert (parsed.sharing, parsed.comm_ms) == ("timeshift", 12.5)
    with pytest.raises(ValueError, match="sharing"):
        parse_job({**document, "sharing": "crux"})
    assert MAX_JOBS == 16


# -- timeshift ------------------------------------------------------------------------------------
def timing(name, forward, backward, comm, period=None, comm_start=None, p99=None):
    return JobTiming(name, forward, backward, comm, period, comm_start, p99)


def test_the_pace_stretches_the_periods_by_the_latest_measured_lateness_or_a_fixed_margin():
    # a's iterations alone: 200 ms, the 99th percentile 206 (3% late); b's 200 and 202 (1%)
    a, b = timing("a", 60, 40, 40, period=200, p99=206), timing("b", 60, 40, 40, period=200, p99=202)
    assert pace_margin([a, b]) == pytest.approx(0.03) and paces([a, b]) == pytest.approx({"a": 206.0, "b": 206.0})
    steady = timing("c", 60, 40, 40, period=200, p99=200)  # never late: the least margin still
    assert pace_margin([steady]) == MIN_PACE_MARGIN
    unmeasured = timing("d", 60, 40, 40, period=200)  # one job's lateness unknown: the fixed margin for all
    assert pace_margin([a, unmeasured]) == PACE_MARGIN and paces([a, unmeasured]) == pytest.approx(
        {"a": 210.0, "d": 210.0})


def test_two_jobs_of_one_period_interleave_their_phases():
    # Each: 60 ms forward, 40 ms backward with its 40 ms of communication: period 100 ms,
    # communicating in [60, 100). Moved by s, the second communicates in [60 + s, 100 + s) mod 100:
    # apart from the first for 40 <= s <= 60; the smallest is 40.
    offsets = interleave([timing("a", 60, 40, 40), timing("b", 60, 40, 40)])
    assert offsets == {"a": 0.0, "b": pytest.approx(40.0)}


def test_a_job_of_half_the_period_fits_twice_into_the_others_gap():
    # b: 200 ms period (140 forward, 60 backward and communication), placed first (the longer
    # communication), busy in [140, 200). a: 100 ms period (70 + 30, communicating 30 ms from 70),
    # busy in [70 + s, 100 + s) and [170 + s, 200 + s) of the 200 ms circle; both gaps miss b's
    # phase for 30 <= s <= 40, and s < 30 overlaps it in the second.
    offsets = interleave([timing("a", 70, 30, 30), timing("b", 140, 60, 60)])
    assert offsets == {"a": pytest.approx(30.0), "b": 0.0}


def test_phases_that_cannot_all_fit_overlap_least():
    # Two jobs communicating 70 of 100 ms: at least 40 ms overlap, from s = 30 on; 30 is the first.
    offsets = interleave([timing("a", 30, 70, 70), timing("b", 30, 70, 70)])
    assert offsets["b"] == pytest.approx(30.0)


def test_fair_and_intensity_start_every_job_at_once():
    jobs = [job("heavy", ip(1), ip(3), **HEAVY), job("light", ip(2), ip(4), **LIGHT)]
    for policy in ("fair", "intensity"):
        assert share(policy, jobs).offsets_ms == {"heavy": 0.0, "light": 0.0}
    shifted = [job("a", ip(1), ip(3), fwd_ms=60.0, bwd_ms=40.0, comm_ms=40.0),
               job("b", ip(2), ip(4), fwd_ms=60.0, bwd_ms=40.0, comm_ms=40.0)]
    # paced at 105 ms (100 ms and its margin): b's phase right after a's, to the slot (0.525 ms)
    assert share("timeshift", shifted).offsets_ms == {"a": 0.0, "b": pytest.approx(40.0, abs=0.6)}
    assert share("timeshift", shifted).paces_ms == {"a": pytest.approx(105.0), "b": pytest.approx(105.0)}
    assert share("fair", shifted).paces_ms == {"a": 0.0, "b": 0.0}


def test_paces_are_harmonics_of_the_longest_period_with_its_margin():
    # the shipped spec's measured periods: one circle of 1.05 x 580 ms for all three
    measured = [timing("vgg", 10, 10, 300, period=470), timing("resnet", 10, 10, 200, period=580),
                timing("bert", 10, 10, 300, period=450)]
    assert paces(measured) == pytest.approx({"vgg": 609.0, "resnet": 609.0, "bert": 609.0})
    # a job of under half the period keeps to half the circle: 1.05 x 45 = 47.25 fits twice in 105
    assert paces([timing("a", 60, 40, 40), timing("b", 20, 25, 25)]) == pytest.approx({"a": 105.0, "b": 52.5})
    assert paces([]) == {}


def test_jobs_whose_phases_cannot_fit_apart_run_free_from_their_offsets():
    # each communicates 70 ms of its 100 ms: on any circle more than a tenth of it overlaps, so
    # pacing would only slow them (CASSINI would not place them together)
    crowded = [timing("a", 30, 70, 70), timing("b", 30, 70, 70)]
    offsets, paces_ms = TimeShift.decide(crowded)
    assert paces_ms == {"a": 0.0, "b": 0.0} and offsets == interleave(crowded)
    assert placement(paced(crowded))[1] > 0.1
    fitting = [timing("a", 60, 40, 40), timing("b", 60, 40, 40)]
    assert placement(paced(fitting))[1] == 0.0 and TimeShift.decide(fitting)[1] == pytest.approx(
        {"a": 105.0, "b": 105.0})


def test_measured_periods_and_phases_replace_the_modelled_ones():
    # modelled, both jobs 100 ms periods communicating from 60 ms for 40 ms; measured, a runs 200 ms
    # and communicates from 20 ms: the circle is 210 ms and b's phase goes where a's is not
    a = timing("a", 60, 40, 40, period=200, comm_start=20)
    assert (a.period_ms, a.comm_start_ms) == (200, 20)
    b = timing("b", 60, 40, 40, period=200, comm_start=20)
    offsets = interleave(paced([a, b]))
    assert offsets["a"] == 0.0 and 39 <= offsets["b"] <= 171  # [20, 60] of 210 apart from [20 + s, 60 + s]: to the slot
    registered = [job("a", ip(1), ip(3), sharing="timeshift", fwd_ms=60.0, bwd_ms=40.0, comm_ms=40.0),
                  job("b", ip(2), ip(4), sharing="timeshift", fwd_ms=60.0, bwd_ms=40.0, comm_ms=40.0)]
    measured_jobs = [dataclasses.replace(one, period_ms=200.0, comm_start_ms=20.0) for one in registered]
    assert share("timeshift", measured_jobs).paces_ms == pytest.approx({"a": 210.0, "b": 210.0})
    assert share("timeshift", measured_jobs).offsets_ms == pytest.approx(offsets)


# -- the REST API ----------------------------------------------------------------------------------
def rest_job(name, src, dst, sharing, fwd_ms, bwd_ms, comm_ms):
    return {"job": name, "policy": "fifo", "hosts": [src, dst], "sharing": sharing, "comm_ms": comm_ms,
            "layers": [{"index": 0, "name": "a", "bytes": 1000, "fwd_ms": fwd_ms, "bwd_ms": bwd_ms}],
            "flows": [{"src": src, "dst": dst, "proto": "tcp", "dport": 7000}]}


def test_post_and_get_jobs_tell_each_job_its_band_and_start_offset():
    with controller_app() as app:
        heavy = rest_job("heavy", ip(1), ip(3), "intensity", **HEAVY)
        light = rest_job("light", ip(2), ip(4), "intensity", **LIGHT)
        assert request(app, "POST", "/jobs", light).json["band"] == list(GRADIENT_DSCPS)  # alone: every class
        posted = request(app, "POST", "/jobs", heavy).json
        assert (posted["band"], posted["layers"][0]["dscp"]) == ([CS6, CS5], CS6)
        shown = {job["job"]: job for job in request(app, "GET", "/jobs").json}
        assert shown["light"]["band"] == [CS4, CS3, CS2] and shown["light"]["intensity"] == 0.5
        refused(request(app, "POST", "/jobs", rest_job("other", ip(5), ip(6), "timeshift", **LIGHT)), 409,
                "sharing: 'timeshift' is not allowed while job")
        for name in ("heavy", "light"):
            assert request(app, "DELETE", f"/jobs/{name}").status_int == 200
        a = rest_job("a", ip(1), ip(3), "timeshift", 60.0, 40.0, 40.0)
        b = rest_job("b", ip(2), ip(4), "timeshift", 60.0, 40.0, 40.0)
        request(app, "POST", "/jobs", a)
        assert request(app, "POST", "/jobs", b).json["start_offset_ms"] == pytest.approx(40.0, abs=0.6)
        shown = request(app, "GET", "/jobs").json
        assert [job["start_offset_ms"] for job in shown] == [0.0, pytest.approx(40.0, abs=0.6)]
        assert [job["pace_ms"] for job in shown] == [105.0, 105.0]
        for name in ("a", "b"):
            request(app, "DELETE", f"/jobs/{name}")
        measured = {**a, "period_ms": 200.0, "comm_start_ms": 20.0}
        assert request(app, "POST", "/jobs", measured).json["pace_ms"] == 210.0
        request(app, "DELETE", "/jobs/a")
        refused(request(app, "POST", "/jobs", {**measured, "period_p99_ms": -1}), 400, "period_p99_ms")
        request(app, "POST", "/jobs", {**measured, "period_p99_ms": 204.0})  # 2% late at the 99th percentile
        late = {**b, "period_ms": 200.0, "comm_start_ms": 20.0, "period_p99_ms": 202.0}
        assert request(app, "POST", "/jobs", late).json["pace_ms"] == pytest.approx(204.0)

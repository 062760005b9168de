"""Several jobs on one fabric, without a fabric: the `jobs:` section's validation (each refusal one
line naming the field), each job's plan (id, tag, document), and the aggregation of a generated
results folder into per-job rows, multijob.csv, the summary and the per-job plot."""
import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from experiments import multijob, results
from experiments.__main__ import run_list
from experiments.plan import plan_text
from experiments.plots import plot_all
from experiments.runplan import dry_run, job_tag, plan_jobs
from experiments.spec import SpecError, alone_runs, parse_spec
from experiments.statistics import paired_ratio
from experiments.summary import write_summary
from hostapps.config import config_from_args, process_arguments
from unit.experiments.test_results import START, write_network_records

SHARING = {"baseline": "fair", "values": {policy: {"controller.sharing": policy}
                                          for policy in ("fair", "intensity", "timeshift")}}
SPEC = {
    "name": "two_jobs",
    "topology": {"spines": 2, "leaves": 2, "hosts_per_leaf": 2, "host_bw": 40, "fabric_bw": 40},
    "jobs": [{"name": "mlp", "workers": ["h1", "h3"], "iterations": 4},
             {"name": "resnet", "workers": ["h2", "h4"], "iterations": 4,
              "model": {"name": "resnet50", "scale": 0.01}, "start_s": 1.0}],
    "matrix": {"sharing": SHARING},
    "repetitions": 2,
}


def with_paths(document: dict) -> None:
    """The spec's matrix with intensity-paths among its sharing policies."""
    document["matrix"]["sharing"]["values"]["intensity-paths"] = {"controller.sharing": "intensity-paths"}


def spec_with(change) -> dict:
    document = copy.deepcopy(SPEC)
    change(document)
    return document


# -- validation ---------------------------------------------------------------------------------
@pytest.mark.parametrize("change, message", [
    (lambda d: d["jobs"][1].update(workers=["h3", "h4"]),
     "jobs.1.workers.0: h3 is also jobs.0's (each host runs one job's process)"),
    (lambda d: d["jobs"][1].update(mode="ps", servers=["h1"]),
     "jobs.1.servers.0: h1 is also jobs.0's (each host runs one job's process)"),
    (lambda d: d["jobs"][1].update(workers=2),
     "jobs.1.workers: 2 is not allowed (a list of distinct host names: each of several jobs names its own hosts)"),
    (lambda d: d["jobs"][1].update(name="mlp"), "jobs.1.name: 'mlp' is not allowed (a name apart from jobs.0's)"),
    (lambda d: d["jobs"][1].update(loss_bound=0.1),
     "jobs.1.loss_bound: 0.1 is not allowed (0 with transport tcp (a loss bound needs the loss-tolerant transport: "
     "jobs.1.transport mlt))"),
    (lambda d: d["jobs"][0].update(collective="tree", mode="ps", servers=["h2"], workers=["h1"]),
     "jobs.1.workers.0: h2 is also jobs.0's (each host runs one job's process)"),
    (lambda d: d["jobs"][1].update(start_s=50),
     "jobs.1.start_s: 50 is not allowed (seconds 0..15 after the run's jobs start, when this job's first "
     "iteration starts)"),
    (lambda d: d.update(jobs=[{"workers": [f"h{i}"]} for i in range(1, 18)], topology={"leaves": 9}),
     "jobs: 17 jobs are not allowed (at most 16: the controller holds 16 jobs)"),
    (lambda d: d.update(jobs=d["jobs"][:1]),
     "jobs: [{iterations: 4, name: mlp, workers: [h1, h3]}] is not allowed ([] for the one job of `job`, or a list "
     "of 2..16 jobs (the controller holds 16), each on hosts of its own)"),
    (lambda d: d.update(job={"mode": "ps"}),
     "job: {mode: ps} is not allowed (left out with jobs: each job of jobs has its own fields)"),
    (lambda d: d.update(controller={"sharing": "crux"}),
     "controller.sharing: 'crux' is not allowed (one of fair, intensity, intensity-paths, timeshift)"),
    (lambda d: (with_paths(d), d.update(topology={**d["topology"], "spines": 1})),
     "controller.sharing: 'intensity-paths' is not allowed (fair, intensity or timeshift here: no job has two "
     "hosts on switches joined by more than one shortest path, so there is no path to choose and it would change "
     "nothing)"),
    (lambda d: (with_paths(d), d.update(jobs=[
        {"name": "a", "workers": ["h1", "h2"], "iterations": 4}, {"name": "b", "workers": ["h3", "h4"],
                                                                   "iterations": 4}])),
     "controller.sharing: 'intensity-paths' is not allowed (fair, intensity or timeshift here: no job has two "),
])
def test_a_bad_jobs_section_is_one_line_naming_the_field(change, message):
    with pytest.raises(SpecError) as error:
        parse_spec(spec_with(change))
    assert str(error.value).startswith(f"spec error: {message}")


def test_each_job_runs_alone_first_in_each_repetition_then_every_policy():
    spec = parse_spec(SPEC)
    assert [run.run_id for run in spec.runs[:5]] == [
        "alone=mlp,rep=1", "alone=resnet,rep=1", "sharing=fair,rep=1", "sharing=intensity,rep=1",
        "sharing=timeshift,rep=1"]
    assert len(spec.runs) == 10
    assert alone_runs(spec)[("sharing=timeshift,rep=2", "resnet")] == "alone=resnet,rep=2"
    second = spec.runs[5]
    assert second.config.job.seed == 1 and second.alone == "mlp" and second.config.jobs == []
    assert [entry.seed for entry in spec.runs[7].config.jobs] == [1, 1]
    assert "3 matrix points x 2 repetition(s), and 4 of a job alone" in run_list(spec)


# -- plans --------------------------------------------------------------------------------------
def test_each_job_is_planned_under_its_own_id_number_and_hosts():
    spec = parse_spec(SPEC)
    run = next(run for run in spec.runs if run.run_id == "sharing=intensity,rep=1")
    plans = plan_jobs(run)
    assert [(plan.job_id, plan.name, plan.number, plan.start_s) for plan in plans] == [
        ("run3.mlp", "mlp", 0, 0.0), ("run3.resnet", "resnet", 1, 1.0)]
    assert [[process.host for process in plan.processes] for plan in plans] == [["h1", "h3"], ["h2", "h4"]]
    documents = [plan.document for plan in plans]
    assert [document["sharing"] for document in documents] == ["intensity", "intensity"]
    assert documents[1]["comm_ms"] > documents[0]["comm_ms"] > 0  # resnet's 2 MB against the MLP's 70 KB
    fair = plan_jobs(next(run for run in spec.runs if run.run_id == "sharing=fair,rep=1"))
    assert [plan.document for plan in fair] == [None, None]  # fair and fifo: nothing for the controller
    tags = {job_tag(base, number) for base in (0, 5, 2**27 - 1) for number in range(16)}
    assert len(tags) == 48 and max(tags) < 2**31


def test_under_intensity_paths_each_jobs_document_carries_its_bytes_from_host_to_host():
    spec = parse_spec(spec_with(with_paths))
    run = next(run for run in spec.runs if run.run_id == "sharing=intensity-paths,rep=1")
    documents = [plan.document for plan in plan_jobs(run)]
    assert [document["sharing"] for document in documents] == ["intensity-paths"] * 2
    traffic = documents[1]["traffic"]  # resnet's ring of two: each worker sends the other its model, framed
    assert [(entry["src"], entry["dst"]) for entry in traffic] == [("10.0.0.2", "10.0.0.4"), ("10.0.0.4", "10.0.0.2")]
    model = sum(layer["bytes"] for layer in documents[1]["layers"])
    assert traffic[0]["bytes"] == traffic[1]["bytes"] and model < traffic[0]["bytes"] < 1.05 * model
    intensity = plan_jobs(next(run for run in spec.runs if run.run_id == "sharing=intensity,rep=1"))
    assert "traffic" not in intensity[1].document


def test_plan_shows_the_paths_intensity_paths_will_pin():
    text = plan_text("two_jobs", dry_run(parse_spec(spec_with(with_paths))))
    assert ("  sharing=intensity-paths,rep=1: paths pinned by intensity-paths, the most intense job first\n"
            "    resnet: h2->h4 via spine1, h4->h2 via spine1\n"
            "    mlp: h1->h3 via spine2, h3->h1 via spine2") in text
    assert "sharing=intensity,rep=1: paths pinned" not in text


def test_a_pinned_pairs_flows_move_to_the_uplink_of_its_path():
    placed = {"uplinks": {"leaf1": {"spine1": ["vgg worker0->worker1", "resnet worker0->worker1"]},
                          "leaf2": {"spine1": ["vgg worker1->worker0"], "spine2": ["resnet worker1->worker0"]}},
              "max_flows_per_uplink": 2}
    flows = [("vgg worker0->worker1", "10.0.0.1", "10.0.0.4"), ("vgg worker1->worker0", "10.0.0.4", "10.0.0.1"),
             ("resnet worker0->worker1", "10.0.0.2", "10.0.0.5"), ("resnet worker1->worker0", "10.0.0.5", "10.0.0.2")]
    jobs = [{"job": "run3.vgg", "paths": [{"src": "10.0.0.1", "dst": "10.0.0.4", "via": ["leaf1", "spine2", "leaf2"]},
                                          {"src": "10.0.0.4", "dst": "10.0.0.1", "via": ["leaf2", "spine2", "leaf1"]}]},
            {"job": "run3.resnet", "paths": [{"src": "10.0.0.2", "dst": "10.0.0.5",
                                              "via": ["leaf1", "spine1", "leaf2"]}]}]
    assert multijob.pinned_placement(placed, flows, jobs) == {
        "uplinks": {"leaf1": {"spine1": ["resnet worker0->worker1"], "spine2": ["vgg worker0->worker1"]},
                    "leaf2": {"spine2": ["resnet worker1->worker0", "vgg worker1->worker0"]}},
        "max_flows_per_uplink": 2}
    assert multijob.pinned_placement(placed, flows, [{"job": "x"}]) is placed


def test_plan_shows_each_jobs_hosts_and_the_links_they_share():
    spec = parse_spec(SPEC)
    text = plan_text(spec.name, dry_run(spec))
    assert "sharing=fair,rep=1 [resnet]" in text
    assert ("    resnet: allreduce resnet50 tcp, workers h2,h4; start 1 s; 2 flows (worker0->worker1, "
            "worker1->worker0)") in text
    assert "links shared by jobs: 4: leaf1-spine1 (mlp+resnet)" in text


def test_a_worker_takes_its_start_time_on_the_command_line():
    plan = plan_jobs(parse_spec(SPEC).runs[2])[0]
    config = plan.processes[0].config.__class__(**{**plan.processes[0].config.__dict__, "start_at": 1234.5})
    assert config_from_args(["worker", *process_arguments(config)]).start_at == 1234.5


# -- results ------------------------------------------------------------------------------------
# Iteration times (s) of each job alone and beside the other, per policy; each iteration computes
# 0.2 s of it on each worker.
PERIODS = {"alone": {"mlp": 0.5, "resnet": 0.4},
           "fair": {"mlp": 0.6, "resnet": 0.6}, "intensity": {"mlp": 0.5, "resnet": 0.7},
           "timeshift": {"mlp": 0.5, "resnet": 0.5}}
COMPUTE_S = 0.2


def write_job(out: Path, run, name: str, config, t0: float, period: float) -> None:
    for rank, host in enumerate(config.worker_hosts):
        rows = [{"job": 7, "role": "worker", "rank": rank, "iteration": i, "start_s": t0 + i * period,
                 "end_s": t0 + (i + 1) * period, "compute_s": COMPUTE_S, "wait_s": period - COMPUTE_S,
                 "bytes_sent": 1000, "bytes_recv": 1000, "delivered_fraction": 1.0, "delivered_fraction_reduce": 1.0,
                 "delivered_fraction_gather": 1.0, "loss": 1.0, "test_accuracy": None}
                for i in range(config.job.iterations)]
        directory = results.process_dir(out, run.run_id, host, "worker", rank)
        directory.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_csv(directory / "iterations.csv", index=False)
        pd.DataFrame(columns=results.TENSOR_COLUMNS).to_csv(directory / "tensors.csv", index=False)
        (directory / "summary.json").write_text(json.dumps({
            "final_accuracy": 0.5, "iterations": config.job.iterations, "bytes_per_iteration": 1000,
            "param_count": 250, "wall_time_s": 3.0}))


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("multijob")
    spec = parse_spec(SPEC)
    (directory / "spec.yaml").parent.mkdir(parents=True, exist_ok=True)
    results.start_output(directory, spec, resume=False)
    for run in spec.runs:
        t0 = START + 100 * run.index
        setting = "alone" if run.alone else run.axes["sharing"]
        jobs = []
        for name, job_run in zip(run.job_names, run.job_runs):
            arrival = t0 + (job_run.config.job.start_s if run.config.jobs else 0.0)
            write_job(directory, run, name, job_run.config, arrival + 0.1, PERIODS[setting][name])
            jobs.append({"name": name, "arrival_s": arrival, "link_bound_s": 0.1, "tail_comm_s": 0.01})
        write_network_records(directory, SimpleNamespace(run_id=run.run_id, axes={"scheme": "baseline"}), t0)
        results.write_run_record(directory, run, "ok", t0, t0 + 5, jobs=jobs if run.config.jobs else None,
                                 bounds=None if run.config.jobs else {"link_bound_s": 0.1, "tail_comm_s": 0.01})
    results.aggregate(directory, say=lambda line: None)
    return directory


def test_runs_csv_has_a_row_per_job_with_its_slowdown_against_alone(out):
    runs = pd.read_csv(out / "runs.csv", keep_default_na=False, na_values=[""])
    fair = runs[runs["run_id"] == "sharing=fair,rep=1"].set_index("job")
    assert list(fair.index) == ["mlp", "resnet"]
    assert fair.loc["mlp", "alone_iter_time_s"] == pytest.approx(0.5)
    assert fair.loc["mlp", "slowdown_vs_alone"] == pytest.approx(1.2)
    assert fair.loc["resnet", "slowdown_vs_alone"] == pytest.approx(1.5)
    # four iterations from 0.1 s after its arrival: 0.1 + 4 x 0.6; two workers computing 4 x 0.2 s each
    assert fair.loc["resnet", "jct_s"] == pytest.approx(2.5)
    assert fair.loc["resnet", "compute_util"] == pytest.approx(0.8 / 2.5)
    alone = runs[runs["run_id"] == "alone=mlp,rep=2"].iloc[0]
    assert alone["job"] == "mlp" and alone["slowdown_vs_alone"] == pytest.approx(1.0)
    iterations = pd.read_csv(out / "iterations.csv")
    assert set(iterations[iterations["run_id"] == "sharing=fair,rep=1"]["job"]) == {"mlp", "resnet"}


def test_multijob_csv_has_completion_times_and_utilization_against_fair(out):
    table = pd.read_csv(out / "multijob.csv").set_index("run_id")
    fair, shifted = table.loc["sharing=fair,rep=1"], table.loc["sharing=timeshift,rep=1"]
    assert fair["jct_mean_s"] == pytest.approx((2.5 + 2.5) / 2)
    assert fair["jct_max_s"] == pytest.approx(2.5)
    assert fair["cluster_util"] == pytest.approx(1.6 / 5.0)
    assert shifted["jct_mean_gain"] == pytest.approx(2.5 / 2.1)
    assert shifted["util_gain"] == pytest.approx((1.6 / 4.2) / (1.6 / 5.0) - 1)
    assert fair["jct_mean_gain"] == pytest.approx(1.0)


def test_the_summary_and_the_plots_show_the_jobs_apart(out):
    text = write_summary(out)
    assert "## Jobs sharing the fabric" in text
    # the same gain in both repetitions: a zero-width interval that excludes no gain
    assert ("| sharing=timeshift | 1.00x | 1.25x | 2.10 | 2.10 | 38.1% | 1.19x [1.19, 1.19] | 1.19x [1.19, 1.19] "
            "| +19.0% [+19.0%, +19.0%] |") in text
    assert "| sharing=fair | 1.20x | 1.50x | 2.50 | 2.50 | 32.0% | — | — | — |" in text
    assert (out / "plots" / "job_iteration_time.png") in plot_all(out)


# -- gains with their intervals, on synthetic rows ------------------------------------------------
def synthetic_runs(spec, fair: list[float], timeshift: list[float], failed: str = "") -> pd.DataFrame:
    """runs.csv rows of the spec's runs of both jobs: each job's completion time per repetition
    (fair's and timeshift's, the intensity runs as fair's); one worker each computing 1 s."""
    rows = []
    for run in spec.runs:
        if not run.config.jobs:
            continue
        jct = {"fair": fair, "timeshift": timeshift}.get(run.axes["sharing"], fair)[run.rep - 1]
        for name in run.job_names:
            rows.append({"run_id": run.run_id, "job": name, "workers": 1, "jct_s": jct, "compute_util": 1 / jct,
                         "slowdown_vs_alone": 1.0, "fidelity_ok": run.run_id != failed})
    return pd.DataFrame(rows)


def test_each_gain_has_its_paired_interval_by_repetition():
    spec = parse_spec({**SPEC, "repetitions": 3})
    fair, shifted = [10.0, 12.0, 11.0], [8.0, 9.0, 9.5]
    table = multijob.runs_table(synthetic_runs(spec, fair, shifted), spec)
    row = table[table["run_id"] == "sharing=timeshift,rep=2"].iloc[0]
    expected = paired_ratio(fair, shifted)
    assert row["jct_mean_gain"] == pytest.approx(12 / 9)  # the run's own point gain
    assert (row["jct_mean_gain_paired"], row["jct_mean_gain_low"], row["jct_mean_gain_high"]) == pytest.approx(
        (expected.estimate, expected.low, expected.high))
    assert expected.low > 1  # the pairs agree: significant
    utilization = paired_ratio([1 / t for t in shifted], [1 / t for t in fair])
    assert row["util_gain_low"] == pytest.approx(utilization.low - 1)
    assert row["util_gain_paired"] == pytest.approx(expected.estimate - 1)  # one worker a job: util = 1 / JCT
    assert table[table["scheme"] == "sharing=fair"]["jct_mean_gain_paired"].isna().all()
    assert multijob._gain_cell(row, "jct_mean_gain") == (
        f"{expected.estimate:.2f}x [{expected.low:.2f}, {expected.high:.2f}]")
    assert multijob._gain_cell(row, "util_gain").startswith(f"{expected.estimate - 1:+.1%} [")


def test_a_gain_whose_interval_holds_none_is_marked_and_an_untrusted_run_leaves_its_pair_out():
    spec = parse_spec({**SPEC, "repetitions": 3})
    noisy = multijob.runs_table(synthetic_runs(spec, [10.0, 12.0, 11.0], [8.0, 13.0, 11.5]), spec)
    row = noisy[noisy["scheme"] == "sharing=timeshift"].iloc[0]
    assert row["jct_mean_gain_low"] < 1 < row["jct_mean_gain_high"]
    assert multijob._gain_cell(row, "jct_mean_gain").endswith(" n.s.")
    assert multijob._gain_cell(row, "util_gain").endswith(" n.s.")
    guarded = multijob.runs_table(synthetic_runs(spec, [10.0, 12.0, 11.0], [8.0, 13.0, 9.0],
                                                 failed="sharing=fair,rep=2"), spec)
    row = guarded[guarded["run_id"] == "sharing=timeshift,rep=2"].iloc[0]
    expected = paired_ratio([10.0, 11.0], [8.0, 9.0])
    assert row["jct_mean_gain"] == pytest.approx(12 / 13)  # its point gain stays
    assert row["jct_mean_gain_paired"] == pytest.approx(expected.estimate)
    assert row["jct_mean_gain_low"] == pytest.approx(expected.low)


def test_the_time_shift_places_each_job_as_its_run_alone_measured_it():
    # two workers, 0.5 s iterations; each communicates from 0.1 s after its iteration starts, two
    # 0.1 s messages 0.2 s apart: an arc of 0.3 s (though only 0.2 s in flight)
    iterations = pd.DataFrame([{"role": "worker", "rank": rank, "iteration": i, "start_s": 100 + 0.5 * i,
                                "end_s": 100.5 + 0.5 * i} for rank in (0, 1) for i in range(5)])
    tensors = pd.DataFrame([{"role": "worker", "rank": rank, "iteration": i, "start_s": 100.1 + 0.5 * i + part,
                             "end_s": 100.2 + 0.5 * i + part} for rank in (0, 1) for i in range(5)
                            for part in (0.0, 0.2)])
    assert multijob.measured_timing(iterations, tensors) == pytest.approx(
        {"period_ms": 500.0, "period_p99_ms": 500.0, "comm_ms": 300.0, "comm_start_ms": 100.0})
    assert multijob.measured_timing(iterations, tensors.iloc[:0]) is None
    # iteration 2 ends 0.1 s late (iteration 3 on time): steady intervals 0.5, 0.6, 0.4 s
    late = iterations.assign(end_s=iterations["end_s"] + 0.1 * (iterations["iteration"] == 2))
    timing = multijob.measured_timing(late, tensors)
    assert timing["period_ms"] == pytest.approx(500.0) and 590.0 < timing["period_p99_ms"] <= 600.0


def test_each_jobs_bytes_go_on_the_uplink_its_flows_were_placed_on():
    placement = {"uplinks": {"leaf1": {"spine1": ["vgg worker0->worker1"], "spine2": ["bert worker0->server0"]},
                             "leaf2": {"spine2": ["vgg worker1->worker0"]}}}
    tensors = pd.DataFrame([
        # 1000 bytes arriving over 0.2 s from 10.05: 250, 500, 250 in the bins of 10.0, 10.1, 10.2
        {"role": "worker", "rank": 1, "peer": "worker0", "direction": "recv", "bytes": 1000,
         "start_s": 10.05, "end_s": 10.25},
        {"role": "worker", "rank": 0, "peer": "worker1", "direction": "recv", "bytes": 400,
         "start_s": 10.31, "end_s": 10.31},                            # all at once, on leaf2's spine2
        {"role": "worker", "rank": 1, "peer": "worker0", "direction": "send", "bytes": 999,
         "start_s": 10.0, "end_s": 10.1},                              # sends are counted where they arrive
        {"role": "worker", "rank": 1, "peer": "worker2", "direction": "recv", "bytes": 999,
         "start_s": 10.0, "end_s": 10.1},                              # a flow not placed: on no uplink
    ])
    rows = multijob.job_uplink_bytes(tensors, placement, "vgg")
    spine1 = rows[rows["uplink"] == "spine1"]
    assert list(spine1["time_s"]) == pytest.approx([10.0, 10.1, 10.2])
    assert list(spine1["bytes"]) == pytest.approx([250, 500, 250])
    assert rows[rows["switch"] == "leaf2"][["time_s", "bytes"]].values.tolist() == [[10.3, 400.0]]
    assert multijob.job_uplink_bytes(tensors, None, "vgg").empty
    assert multijob.job_uplink_bytes(tensors, placement, "bert").empty  # bert's own messages: none here


def test_the_link_timeline_draws_each_jobs_bytes_per_uplink(tmp_path):
    from experiments.plots import job_link_utilization
    uplinks = pd.DataFrame([{"run_id": f"sharing={scheme},rep=1", "scheme": f"sharing={scheme}", "job": job,
                             "switch": "leaf1", "uplink": "spine1", "time_s": 100 + 0.1 * i, "bytes": 100_000.0}
                            for scheme in ("fair", "timeshift") for job in ("vgg", "bert") for i in range(10)])
    links = pd.DataFrame([{"run_id": "sharing=fair,rep=1", "switch": "leaf1", "peer": "spine1", "time_s": 101.0,
                           "tx_mbps": 16.0, "rate_mbps": 20.0}])
    path = job_link_utilization({"job_uplinks": uplinks, "links": links}, tmp_path / "job_link_utilization.png")
    assert path is not None and path.stat().st_size > 0
    assert job_link_utilization({"job_uplinks": uplinks.iloc[:0], "links": links}, tmp_path / "none.png") is None

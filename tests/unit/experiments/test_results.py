"""Aggregation into tidy CSVs, summary.md and plots, from a generated results directory whose
raw per-run records follow the host apps', controller's and runner's contracts."""
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from experiments import results
from experiments.__main__ import main
from experiments.metrics import LINK_COLUMNS
from experiments.plots import plot_all
from experiments.spec import Run, load_spec, parse_spec
from experiments.summary import write_summary
from helpers import FIXTURES

FIXTURE_SPEC = FIXTURES / "experiments" / "two_schemes.yaml"
FAILED_RUN = "scheme=spray,mode=ps,rep=2"
SATURATED_RUN = "scheme=baseline,mode=allreduce,rep=2"
START = 1_700_000_000.0
COMPUTE_S = 0.3
COMM_SPAN_S = 0.3
MODEL_BYTES = 1_000_000
LINK_BOUND_S, TAIL_COMM_S = 0.25, 0.05  # the run records' traffic bounds: compute + tail is the tighter


def iteration_s(run: Run) -> float:
    """The fixture's iteration time: spray is faster, the second repetition 10% slower."""
    return {"baseline": 0.5, "spray": 0.4}[run.axes["scheme"]] * (1 + 0.1 * (run.rep - 1))


def final_accuracy(run: Run) -> float:
    """The fixture's final accuracy: spray's repetitions straddle the baseline's 0.92."""
    return {"baseline": 0.92, "spray": {1: 0.91, 2: 0.95}[run.rep]}[run.axes["scheme"]]


# Spray's received messages lose part of layer 0, as with the loss-tolerant transport.
DELIVERED = {"baseline": {0: 1.0, 1: 1.0}, "spray": {0: 0.96, 1: 1.0}}


def _write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path, index=False)


def write_host_records(out: Path, run: Run, t0: float) -> None:
    """iterations.csv, tensors.csv, summary.json of every process, as the host apps write them."""
    period = iteration_s(run)
    config = run.config
    processes = [(host, "worker", rank) for rank, host in enumerate(config.worker_hosts)]
    processes += [(host, "server", rank) for rank, host in enumerate(config.server_hosts)]
    for host, role, rank in processes:
        iterations, tensors = [], []
        for i in range(config.job.iterations):
            start = t0 + i * period
            evaluated = role == "worker" and i % 2 == 1
            iterations.append({
                "job": "fixture", "role": role, "rank": rank, "iteration": i, "start_s": start,
                "end_s": start + period, "compute_s": COMPUTE_S if role == "worker" else 0.0,
                "wait_s": period - COMPUTE_S, "bytes_sent": 2000, "bytes_recv": 2000, "delivered_fraction": 1.0,
                "delivered_fraction_reduce": 0.96 if i % 2 else 1.0,
                "delivered_fraction_gather": 1.0 if role == "worker" else None, "loss": 1 / (i + 1),
                "test_accuracy": {1: 0.6, 3: 0.92}.get(i) if evaluated else None,
            })
            # Each layer is sent and received over the same interval (comm time stays COMM_SPAN_S).
            for layer, direction in itertools.product(range(2), ("send", "recv")):
                tensors.append({
                    "job": "fixture", "role": role, "rank": rank, "iteration": i, "tensor": f"w{layer}",
                    "layer": layer, "bytes": MODEL_BYTES // 2, "direction": direction, "peer": "h1",
                    "start_s": start + 0.1 + layer * COMM_SPAN_S / 2,
                    "end_s": start + 0.1 + (layer + 1) * COMM_SPAN_S / 2,
                    "delivered_fraction": DELIVERED[run.axes["scheme"]][layer] if direction == "recv" else 1.0,
                })
        directory = results.process_dir(out, run.run_id, host, role, rank)
        _write_csv(directory / "iterations.csv", iterations)
        _write_csv(directory / "tensors.csv", tensors)
        (directory / "summary.json").write_text(json.dumps({
            "final_accuracy": final_accuracy(run), "iterations": config.job.iterations,
            "bytes_per_iteration": MODEL_BYTES, "param_count": MODEL_BYTES // 4, "wall_time_s": 3.0}))
        if role == "worker":  # spray's second worker ends 0.25 off the others in one parameter
            drift = 0.25 if run.axes["scheme"] == "spray" and rank == 1 else 0.0
            np.savez(directory / "model.npz", fc1=np.full((2, 3), 1.0 + drift, np.float32), out=np.zeros(3))


def write_network_records(out: Path, run: Run, t0: float) -> None:
    """ports.csv (controller), port_rates.csv, and the sampler's cpu.csv, queues.csv, sockets.csv and
    ovs.json (runner)."""
    # Mbit/s per leaf1 uplink: ECMP hashes unevenly, spray evenly.
    uplinks = {"baseline": {3: 60.0, 4: 20.0}, "spray": {3: 40.0, 4: 40.0}}[run.axes["scheme"]]
    ports = []
    for second in range(3):
        for port, mbps in [*uplinks.items(), (1, 30.0)]:
            sent = int(mbps * 1e6 / 8 * second)
            ports.append({"time_s": t0 + second, "switch": "leaf1", "port": port, "tx_bytes": sent,
                          "rx_bytes": sent // 2, "tx_packets": sent // 1500, "rx_packets": sent // 3000,
                          "tx_dropped": second, "rx_dropped": 0})
    run_path = results.run_dir(out, run.run_id)
    _write_csv(run_path / "ports.csv", ports)
    _write_csv(run_path / "port_rates.csv", [
        {"switch": "leaf1", "port": 3, "peer": "spine1", "rate_mbps": 100, "tier": "fabric", "role": "leaf"},
        {"switch": "leaf1", "port": 4, "peer": "spine2", "rate_mbps": 100, "tier": "fabric", "role": "leaf"},
        {"switch": "leaf1", "port": 1, "peer": "h1", "rate_mbps": 100, "tier": "host", "role": "leaf"}])
    cpu = 0.95 if run.run_id == SATURATED_RUN else 0.5
    _write_csv(run_path / "cpu.csv", [{"time_s": t0 + s, "cpu_util": cpu, "vswitchd_thread_util": 0.3,
                                       "mem_used_mb": 900.0}
                                      for s in range(3)])
    # leaf1's uplink 3 queues in CS0 (no backlog) and drops 2 packets of CS1 per second
    _write_csv(run_path / "queues.csv", [
        {"time_s": t0 + second, "switch": "leaf1", "port": 3, "cs": cs, "sent_bytes": 1_000_000 * second,
         "sent_pkts": 1000 * second, "dropped_pkts": 2 * second if cs == 1 else 0, "backlog_bytes": 0}
        for second in range(3) for cs in (0, 1)])
    _write_csv(run_path / "sockets.csv", [{"time_s": t0 + second, "switch": "leaf1", "port": 3, "socket_drops": 0}
                                          for second in range(3)])
    _write_csv(run_path / "drain.csv", [{"time_s": t0 + 1, "switch": "leaf1", "port": 3, "probe_s": 0.02,
                                         "backlog_bytes": 20000, "sent_bytes": 20000}])
    (run_path / "ovs.json").write_text(json.dumps({"tx_errors_by_port": {}, "tx_errors_suppressed": 0,
                                                   "datapath_drops": 0}))


def make_results(out: Path, overrides: list[str] = ()) -> None:
    """The fixture's results (its spec with --set overrides) in the host apps', controller's and
    runner's contracts."""
    spec = load_spec(FIXTURE_SPEC, list(overrides))
    results.start_output(out, spec, resume=False)
    for run in spec.runs:
        t0 = START + 100 * run.index
        write_host_records(out, run, t0)
        write_network_records(out, run, t0)
        failed = run.run_id == FAILED_RUN
        results.write_run_record(out, run, "failed" if failed else "ok", t0, t0 + 5,
                                 error="worker h2 exited with 1" if failed else "",
                                 bounds={"link_bound_s": LINK_BOUND_S, "tail_comm_s": TAIL_COMM_S})


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("results")
    make_results(directory)
    results.aggregate(directory)
    return directory


@pytest.fixture(scope="module")
def runs(out) -> pd.DataFrame:
    return pd.read_csv(out / "runs.csv").set_index("run_id", drop=False)


def test_runs_csv_has_exactly_the_contract_columns(runs):
    assert list(runs.columns) == [
        "run_id", "job", "scheme", "rep", "mode", "lb", "sched", "transport", "loss_bound", "workers", "iterations",
        "iter_time_mean_s", "iter_time_p50_s", "iter_time_p99_s", "samples_per_s", "final_accuracy",
        "time_to_accuracy_s", "bytes_sent", "lower_bound_s", "tight_bound_s", "compute_s", "comm_s",
        "tictac_efficiency", "straggler_s", "delivered_fraction_reduce", "delivered_fraction_gather",
        "replica_divergence", "speedup_vs_baseline",
        "uplink_imbalance", "max_flows_per_uplink", "placement", "cpu_util_mean", "cpu_steal_mean",
        "vswitchd_thread_util_mean", "link_rate_frac",
        "class_queue_drops_pkts", "outside_queue_drops_pkts", "app_lag_ms_p99", "fidelity_ok",
        "fidelity_reason", "alone_iter_time_s", "slowdown_vs_alone", "jct_s", "compute_util", "faults", "data_gaps"]
    assert len(runs) == 8


def test_runs_csv_metrics_of_one_run(runs):
    run = runs.loc["scheme=baseline,mode=allreduce,rep=1"]
    assert (run["scheme"], run["mode"], run["lb"], run["workers"], run["rep"]) == \
        ("baseline", "allreduce", "ecmp", 4, 1)
    assert run["iter_time_mean_s"] == pytest.approx(0.5, rel=1e-5)
    assert run["iter_time_p99_s"] == pytest.approx(0.5, rel=1e-5)
    assert run["samples_per_s"] == pytest.approx(12 / 0.5, rel=1e-5)  # the global batch
    assert run["final_accuracy"] == pytest.approx(0.92)
    assert run["time_to_accuracy_s"] == pytest.approx(4 * 0.5, rel=1e-5)  # reached at the end of iteration 3
    assert run["bytes_sent"] == 4 * 5 * 2000
    assert run["lower_bound_s"] == pytest.approx(COMPUTE_S)  # compute exceeds the 0.12 s comm bound
    assert run["tight_bound_s"] == pytest.approx(COMPUTE_S + TAIL_COMM_S)
    assert run["replica_divergence"] == 0
    assert runs.loc["scheme=spray,mode=allreduce,rep=1", "replica_divergence"] == pytest.approx(0.25)
    assert (run["compute_s"], run["comm_s"]) == (pytest.approx(COMPUTE_S), pytest.approx(COMM_SPAN_S, rel=1e-4))
    assert run["tictac_efficiency"] == pytest.approx((0.6 - 0.5) / (0.6 - 0.3), rel=1e-4)
    assert run["delivered_fraction_reduce"] == pytest.approx((3 * 1.0 + 2 * 0.96) / 5)  # iterations 1 and 3 short
    assert run["delivered_fraction_gather"] == 1.0
    ps_run = runs.loc["scheme=baseline,mode=ps,rep=1"]  # its server received no gather messages: not counted
    assert ps_run["delivered_fraction_gather"] == 1.0
    assert run["speedup_vs_baseline"] == pytest.approx(1.0)  # the baseline's run of its repetition: itself
    assert run["cpu_util_mean"] == pytest.approx(0.5) and bool(run["fidelity_ok"]) is True
    assert run["vswitchd_thread_util_mean"] == pytest.approx(0.3)
    assert run["class_queue_drops_pkts"] == 4 and run["outside_queue_drops_pkts"] == 0
    assert run["link_rate_frac"] == pytest.approx(1.0), "the one probe found the port draining its backlog"


def test_speedup_compares_within_the_same_mode_and_repetition(runs):
    assert runs.loc["scheme=spray,mode=allreduce,rep=1", "speedup_vs_baseline"] == pytest.approx(0.5 / 0.4, rel=1e-5)
    assert runs.loc["scheme=spray,mode=allreduce,rep=2", "speedup_vs_baseline"] == pytest.approx(0.55 / 0.44, rel=1e-5)
    assert runs.loc["scheme=spray,mode=ps,rep=1", "speedup_vs_baseline"] == pytest.approx(0.5 / 0.4, rel=1e-5)


def test_ps_run_counts_server_bytes_and_uses_ps_bound(runs):
    run = runs.loc["scheme=baseline,mode=ps,rep=1"]
    assert run["workers"] == 3
    assert run["bytes_sent"] == 4 * 5 * 2000  # 3 workers and 1 server
    assert run["lower_bound_s"] == pytest.approx(COMPUTE_S)  # > max(0.08, 3 * 0.08)


def test_failed_run_is_listed_without_metrics(runs):
    run = runs.loc[FAILED_RUN]
    assert run["mode"] == "ps" and run["lb"] == "spray"
    assert math.isnan(run["iter_time_mean_s"]) and math.isnan(run["speedup_vs_baseline"])


def test_saturated_run_fails_fidelity(runs):
    assert not runs.loc[SATURATED_RUN, "fidelity_ok"]
    assert runs.loc[SATURATED_RUN, "fidelity_reason"] == "machine CPU 0.95 > 0.9"


def test_queues_csv_totals_per_port_and_class(out):
    queues = pd.read_csv(out / "queues.csv")
    assert list(queues.columns) == ["run_id", *results.QUEUE_TOTAL_COLUMNS]
    one = queues[queues["run_id"] == "scheme=baseline,mode=ps,rep=1"].set_index("cs")
    assert one.loc[1, "dropped_pkts"] == 4 and one.loc[0, "sent_pkts"] == 2000


@pytest.mark.parametrize("name,columns", [
    ("iterations", results.ITERATION_COLUMNS), ("tensors", results.TENSOR_COLUMNS), ("links", LINK_COLUMNS)])
def test_combined_csvs_have_run_id_first(out, name, columns):
    frame = pd.read_csv(out / f"{name}.csv")
    assert list(frame.columns) == ["run_id", *columns]
    assert frame["run_id"].nunique() == 8


def test_links_csv_utilization(out):
    links = pd.read_csv(out / "links.csv")
    run_links = links[links["run_id"] == "scheme=baseline,mode=ps,rep=1"]
    assert len(run_links) == 3 * 2  # 3 ports, 2 intervals
    uplink = run_links[run_links["port"] == 3]
    assert uplink["tx_util_frac"].tolist() == pytest.approx([0.6, 0.6], rel=1e-5)
    assert uplink["tx_dropped_pkts"].tolist() == [1, 1]


def test_spec_yaml_round_trips_and_meta_records_environment(out):
    again = parse_spec(yaml.safe_load((out / "spec.yaml").read_text()))
    assert again.runs == load_spec(FIXTURE_SPEC).runs
    meta = json.loads((out / "meta.json").read_text())
    assert {"git_revision", "python", "numpy", "ovs", "mininet", "ryu", "kernel", "cpu", "seed"} <= set(meta)
    assert meta["numpy"] and meta["python"] and meta["seed"] == 0


def test_start_output_guards_existing_results(out, tmp_path):
    spec = load_spec(FIXTURE_SPEC)
    with pytest.raises(ValueError, match="holds results already"):
        results.start_output(out, spec, resume=False)
    results.start_output(out, spec, resume=True)
    changed = load_spec(FIXTURE_SPEC, ["job.iterations=9"])
    with pytest.raises(ValueError, match="differs from the spec given"):
        results.start_output(out, changed, resume=True)


def test_completed_runs_exclude_failed(out):
    done = results.completed_run_ids(out, load_spec(FIXTURE_SPEC))
    assert len(done) == 7 and FAILED_RUN not in done


@pytest.fixture
def broken(tmp_path) -> Path:
    """A copy of the fixture's results in which runs are broken in several ways."""
    make_results(tmp_path)
    spec = load_spec(FIXTURE_SPEC)
    runs = {run.run_id: run for run in spec.runs}
    (results.run_dir(tmp_path, "scheme=baseline,mode=allreduce,rep=1") / "run.json").write_text("")  # interrupted
    _write_csv(results.process_dir(tmp_path, "scheme=spray,mode=allreduce,rep=1", "h1", "worker", 0)
               / "iterations.csv", [{"job": "x", "role": "worker", "rank": 0}])  # another contract
    (results.process_dir(tmp_path, "scheme=baseline,mode=ps,rep=1", "h2", "worker", 1) / "summary.json").unlink()
    # the controller's port statistics stop after a second: the run lasts 5
    ports_path = results.run_dir(tmp_path, "scheme=spray,mode=allreduce,rep=2") / "ports.csv"
    ports = pd.read_csv(ports_path)
    ports[ports["time_s"] < ports["time_s"].min() + 1.5].to_csv(ports_path, index=False)
    assert runs
    return tmp_path


def test_partial_runs_are_not_complete(broken):
    done = results.completed_run_ids(broken, load_spec(FIXTURE_SPEC))
    assert "scheme=baseline,mode=allreduce,rep=1" not in done, "an unreadable run.json"
    assert "scheme=baseline,mode=ps,rep=1" not in done, "a worker's summary.json is missing"
    assert results.read_run_record(broken, "scheme=baseline,mode=allreduce,rep=1") is None


def test_aggregation_reports_broken_runs_and_goes_on(broken):
    said = []
    runs = results.aggregate(broken, say=said.append).set_index("run_id")
    assert len(runs) == 7, "the unreadable run.json is not a run yet"
    interrupted = "scheme=baseline,mode=allreduce,rep=1"
    record_line, line = said
    assert record_line == (f"aggregate: {interrupted}: {results.run_dir(broken, interrupted) / 'run.json'}: empty; "
                           "not counted as a run (--resume runs it again)")
    assert line.startswith("aggregate: scheme=spray,mode=allreduce,rep=1: its records cannot be read")
    assert "h1-worker0/iterations.csv: missing columns iteration, start_s" in line
    unreadable = runs.loc["scheme=spray,mode=allreduce,rep=1"]
    assert math.isnan(unreadable["iter_time_mean_s"]) and unreadable["data_gaps"].startswith("records unreadable")
    missing = runs.loc["scheme=baseline,mode=ps,rep=1"]
    assert math.isnan(missing["iter_time_mean_s"])
    assert missing["data_gaps"] == "records missing: h2-worker1/summary.json"
    gap = runs.loc["scheme=spray,mode=allreduce,rep=2"]
    assert gap["iter_time_mean_s"] > 0, "what does not need the port statistics is kept"
    assert math.isnan(gap["uplink_imbalance"])
    assert gap["data_gaps"] == "port statistics missing for 4.0 s: no uplink imbalance"  # last sample 1 s in
    assert runs.loc["scheme=spray,mode=ps,rep=1", "uplink_imbalance"] == pytest.approx(1.0)


def test_faults_reach_runs_csv_and_summary(tmp_path):
    make_results(tmp_path)
    spec = load_spec(FIXTURE_SPEC)
    run = spec.runs[0]
    results.write_run_record(tmp_path, run, "ok", START, START + 5,
                             faults=["3.2 s: controller exited with status -9; restarted, tables restored in 4.1 s"])
    runs = results.aggregate(tmp_path).set_index("run_id")
    assert runs.loc[run.run_id, "faults"].startswith("3.2 s: controller exited")
    summary = write_summary(tmp_path)
    assert f"- {run.run_id}: survived faults: 3.2 s: controller exited with status -9" in summary


def test_write_run_record_rejects_unknown_status(tmp_path):
    with pytest.raises(ValueError, match="status: 'done' is not allowed"):
        results.write_run_record(tmp_path, load_spec(FIXTURE_SPEC).runs[0], "done", 0.0, 1.0)


def _summary_rows(lines: list[str], scheme: str) -> list[dict[str, str]]:
    """The summary table rows of a scheme (one per mode, in spec order) as column -> cell."""
    header = next(line for line in lines if line.startswith("| scheme"))
    columns = [cell.strip() for cell in header.strip("|").split("|")]
    rows = [line for line in lines if line.startswith(f"| {scheme} ")]
    return [dict(zip(columns, [cell.strip() for cell in row.strip("|").split("|")])) for row in rows]


def test_summary_has_a_table_per_mode_and_notes(out):
    text = write_summary(out)
    assert (out / "summary.md").read_text() == text
    lines = text.splitlines()
    assert "## allreduce" in lines and "## ps" in lines
    header = next(line for line in lines if line.startswith("| scheme"))
    assert [cell.strip() for cell in header.strip("|").split("|")] == [
        "scheme", "iter time (s)", "speedup", "step", "samples/s", "final acc", "acc delta", "time-to-acc (s)",
        "p99 tensor (ms)", "delivered fraction", "uplink imbalance", "lower bound (s)", "tight bound (s)",
        "overlap E", "straggler (ms)", "fidelity"]
    baseline, baseline_ps = _summary_rows(lines, "scheme=baseline")
    assert baseline["straggler (ms)"] == "0"                # every worker ends each iteration at once
    assert baseline["iter time (s)"] == "0.525 ± 0.0354"   # over the two repetitions
    assert (baseline["lower bound (s)"], baseline["tight bound (s)"]) == ("0.3", "0.35")
    assert baseline["p99 tensor (ms)"] == "150"
    assert baseline["uplink imbalance"] == "1.5"           # ECMP: 60 / mean(60, 20) Mbit/s
    assert baseline["delivered fraction"] == "1 (min 1)"
    assert baseline["fidelity"] == "failed 1/2"
    spray, spray_ps = _summary_rows(lines, "scheme=spray")
    assert spray_ps["fidelity"] == "ok" and spray_ps["uplink imbalance"] == "1"
    assert f"- {FAILED_RUN}: failed: worker h2 exited with 1" in lines
    assert (f"- {SATURATED_RUN}: failed the fidelity guard (machine CPU 0.95 > 0.9): its times measure the machine "
            "rather than the network") in lines


def test_summary_says_why_overlap_is_undefined_where_compute_is_negligible(tmp_path):
    make_results(tmp_path)
    for iterations in tmp_path.glob("runs/*/*/iterations.csv"):
        rows = pd.read_csv(iterations)
        rows.assign(compute_s=0.01).to_csv(iterations, index=False)
    results.aggregate(tmp_path)
    baseline, _ = _summary_rows(write_summary(tmp_path).splitlines(), "scheme=baseline")
    assert pd.read_csv(tmp_path / "runs.csv")["tictac_efficiency"].isna().all()
    assert baseline["overlap E"] == "— (compute 2% of the iteration)"  # 0.01 s of 0.525 s


def test_summary_compares_with_the_baseline_of_the_same_mode(out):
    lines = write_summary(out).splitlines()
    baseline, baseline_ps = _summary_rows(lines, "scheme=baseline")
    spray, spray_ps = _summary_rows(lines, "scheme=spray")
    # paired by repetition: 0.5/0.4 (0.55/0.44 pairs with the baseline's run that failed the guard);
    # in ps the scheme's second repetition failed: one pair each, no interval
    assert baseline["speedup"] == "—" and baseline["step"] == "—"
    assert spray["speedup"] == "1.25x" and spray["step"] == "—"
    assert spray_ps["speedup"] == "1.25x"
    # final accuracy: the baseline 0.92; spray 0.91 and 0.95, of which ps has only the first
    assert (baseline["final acc"], baseline["acc delta"]) == ("0.92", "—")
    assert (spray["final acc"], spray["acc delta"]) == ("0.93", "-1.0 pt")
    assert (spray_ps["final acc"], spray_ps["acc delta"]) == ("0.91", "-1.0 pt")
    assert "- ps, not judged: spray vs baseline 1.25x." in lines


def test_summary_delivered_fraction_is_byte_weighted_with_its_minimum(out):
    spray, spray_ps = _summary_rows(write_summary(out).splitlines(), "scheme=spray")
    # layers of equal size delivered 0.96 and 1: mean 0.98; sent rows (always 1) do not count
    assert spray["delivered fraction"] == spray_ps["delivered fraction"] == "0.98 (min 0.96)"


def test_summary_legend_defines_every_column(out):
    lines = write_summary(out).splitlines()
    assert ("Per training mode, one row per scheme, repetitions averaged; "
            "compared with the baseline scheme=baseline.") in lines
    start = lines.index("Per training mode, one row per scheme, repetitions averaged; "
                        "compared with the baseline scheme=baseline.")
    legend = [line for line in lines[start:] if line.startswith("- ") and ":" in line]
    header = next(line for line in lines if line.startswith("| scheme"))
    columns = [cell.strip().split(" (")[0] for cell in header.strip("|").split("|")][1:]
    assert [line[2:].split(":")[0] for line in legend[:len(columns)]] == columns


def test_plots_are_drawn_from_csvs(out):
    written = plot_all(out)
    assert sorted(path.name for path in written) == [
        "accuracy.png", "iteration_time.png", "link_utilization.png", "speedup.png", "tensor_cdf.png"]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_scaling_plot_only_when_the_runs_have_several_fabric_sizes(tmp_path):
    from experiments.plots import scaling
    rows = [dict(mode=mode, workers=workers, iter_time_mean_s=0.1 * workers, lower_bound_s=0.05 * workers,
                 tight_bound_s=0.07 * workers,
                 fidelity_ok=workers != 28) for mode in ("allreduce", "ps") for workers in (8, 16, 32, 28)]
    runs = pd.DataFrame(rows)
    assert scaling({"runs": runs[runs["workers"] == 8]}, tmp_path / "one.png") is None
    path = scaling({"runs": runs}, tmp_path / "scaling.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_plot_command_redraws(out, capsys):
    for path in (out / "plots").glob("*.png"):
        path.unlink()
    assert main(["plot", str(out)]) == 0
    assert len(list((out / "plots").glob("*.png"))) == 5
    assert "iteration_time.png" in capsys.readouterr().out


def test_plots_skip_figures_without_data(tmp_path):
    spec = load_spec(FIXTURE_SPEC)
    results.start_output(tmp_path, spec, resume=False)
    results.write_run_record(tmp_path, spec.runs[0], "failed", 0.0, 1.0, error="no hosts")
    results.aggregate(tmp_path)
    assert plot_all(tmp_path) == []
    assert "no hosts" in write_summary(tmp_path)


def test_time_to_accuracy_cell_tells_never_reached_from_no_accuracy_at_all():
    from experiments.summary import _time_to_accuracy
    nan = float("nan")
    assert _time_to_accuracy(pd.Series([10.0, 14.0]), pd.Series([0.9, 0.9])) == "12"
    assert _time_to_accuracy(pd.Series([10.0, nan]), pd.Series([0.9, 0.8])) == "10 (1/2 reached)"
    assert _time_to_accuracy(pd.Series([nan, nan]), pd.Series([0.8, 0.8])) == "never"
    assert _time_to_accuracy(pd.Series([nan, nan]), pd.Series([nan, nan])) == "—"  # a layer profile


def test_summary_lists_the_fabrics_with_their_set_up_times(tmp_path):
    make_results(tmp_path)
    results.aggregate(tmp_path)
    record = {"hosts": 32, "switches": 12, "links": 64, "vswitchd_rss_mb": 70.5, "machine_used_mb": 3100.0,
              "build_s": 3.1, "start_s": 3.4, "stop_s": 2.9, "servers": {"localhost": ["h1"], "s2": ["h2"]},
              "crossing_links": 24, "machine_peak_mb": 6500.0}
    (tmp_path / "fabrics" / "hosts=32,rep=1").mkdir(parents=True)
    (tmp_path / "fabrics" / "hosts=32,rep=1" / "fabric.json").write_text(json.dumps(record))
    summary = write_summary(tmp_path)
    assert "## Fabrics" in summary
    assert "| hosts=32,rep=1 | 32 | 12 | 64 | 2 | 24 | 3.1 | 3.4 | 2.9 | 70.5 | 3100.0 | 6500.0 |" in summary


def test_results_made_before_a_column_was_added_still_aggregate(tmp_path):
    make_results(tmp_path)
    for iterations in tmp_path.glob("runs/*/*/iterations.csv"):
        pd.read_csv(iterations).drop(columns=["delivered_fraction_reduce", "delivered_fraction_gather"]).to_csv(
            iterations, index=False)
    runs = results.aggregate(tmp_path)
    assert runs["iter_time_mean_s"].notna().any() and runs["delivered_fraction_reduce"].isna().all()


def test_a_bucket_of_several_layers_is_read_as_its_layers_text(tmp_path):
    """A fused or partitioned all-reduce sends buckets of layers: tensors.csv names them "2+1+0"."""
    make_results(tmp_path)
    for tensors in tmp_path.glob("runs/*/*/tensors.csv"):
        table = pd.read_csv(tensors)
        table["layer"] = table["layer"].map(lambda layer: "2+1+0" if layer == 0 else layer)
        table.to_csv(tensors, index=False)
    runs = results.aggregate(tmp_path)
    assert runs["iter_time_mean_s"].notna().sum() == len(runs) - 1  # all but the failed run
    assert "2+1+0" in set(pd.read_csv(tmp_path / "tensors.csv", dtype={"layer": str})["layer"])


def test_a_run_faster_than_its_lower_bound_is_said_to_have_measured_the_shapers(tmp_path):
    make_results(tmp_path)
    results.aggregate(tmp_path)
    runs = pd.read_csv(tmp_path / "runs.csv")
    fast = runs["run_id"] == "scheme=spray,mode=ps,rep=1"
    runs.loc[fast, "lower_bound_s"] = runs.loc[fast, "iter_time_mean_s"] / 0.5
    runs.loc[~fast, "lower_bound_s"] = runs.loc[~fast, "iter_time_mean_s"] / 0.99  # within the noise allowed
    runs.to_csv(tmp_path / "runs.csv", index=False)
    notes = [line for line in write_summary(tmp_path).splitlines() if "of its lower bound" in line]
    assert notes == ["- scheme=spray,mode=ps,rep=1: ran in 0.50 of its lower bound: the bound sends every frame at "
                     "its link's rate, and each link's shaper lets up to 64kB through at once "
                     "(topologies/shaping.py), so messages this small crossed faster than that rate"]


def test_a_run_failed_by_the_guard_while_the_hypervisor_stole_is_told_apart(tmp_path):
    """stolen_failure: the runner runs such a run again; one failed by its own load, or green, it keeps."""
    make_results(tmp_path)
    runs = {run.run_id: run for run in load_spec(FIXTURE_SPEC).runs}
    saturated, green = runs[SATURATED_RUN], runs["scheme=baseline,mode=allreduce,rep=1"]
    assert results.stolen_failure(tmp_path, saturated) == "", "CPU 0.95, none of it stolen: its own load"
    assert results.stolen_failure(tmp_path, runs[FAILED_RUN]) == "", "a failed run is not judged"
    for run in (saturated, green):
        cpu_csv = results.run_dir(tmp_path, run.run_id) / "cpu.csv"
        pd.read_csv(cpu_csv).assign(steal_util=0.1).to_csv(cpu_csv, index=False)
    assert results.stolen_failure(tmp_path, saturated) == (
        "machine CPU 0.95 > 0.9 (0.10 of it stolen by the hypervisor); "
        "the hypervisor stole 10% of the CPUs on average")
    assert results.stolen_failure(tmp_path, green) == "", "green despite the steal"


def _stolen_from(out: Path, faults: list[str]) -> Run:
    """The fixture's saturated run, 10% of the CPUs stolen meanwhile, its record with these faults."""
    make_results(out)
    saturated = next(run for run in load_spec(FIXTURE_SPEC).runs if run.run_id == SATURATED_RUN)
    cpu_csv = results.run_dir(out, saturated.run_id) / "cpu.csv"
    pd.read_csv(cpu_csv).assign(steal_util=0.1).to_csv(cpu_csv, index=False)
    record = results.read_run_record(out, saturated.run_id)
    results.write_run_record(out, saturated, "ok", record["start_s"], record["end_s"], faults=faults,
                             bounds={"link_bound_s": LINK_BOUND_S, "tail_comm_s": TAIL_COMM_S})
    return saturated


def test_a_run_that_survived_faults_is_kept_whatever_was_stolen(tmp_path):
    saturated = _stolen_from(tmp_path, ["3.0 s: controller exited with status -9; restarted"])
    assert results.stolen_failure(tmp_path, saturated) == ""


def test_a_second_attempt_stolen_from_again_may_run_once_more(tmp_path):
    """The runner's note of an earlier attempt heads the run's faults: it is no fault the run survived."""
    earlier = ["ran again: an earlier attempt, kept as runs/x.stolen1, failed the guard (...)"]
    saturated = _stolen_from(tmp_path, earlier)
    assert results.stolen_failure(tmp_path, saturated, earlier).startswith("machine CPU 0.95 > 0.9")
    assert results.stolen_failure(tmp_path, saturated) == "", "read without them, the note is a fault"

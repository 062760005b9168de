"""The runner's checks before it touches the machine."""
import os

import pytest

from experiments.spec import load_spec
from helpers import REPO

SMOKE = REPO / "experiments" / "smoke.yaml"


def test_runner_refuses_to_run_without_root(monkeypatch, tmp_path):
    from experiments.runner import run_experiment
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SystemExit, match="needs root"):
        run_experiment(load_spec(SMOKE), tmp_path / "out", resume=False)
    assert not (tmp_path / "out").exists()


class FakeFabric:
    """A fabric that comes up at once and has nothing in it: what run_on_fabric needs around its runs."""

    def __init__(self, *args, workdir, **kwargs):
        workdir.mkdir(parents=True)
        self.cleaned, self.timings = [], {"build_s": 0.0}

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False

    def wait_reachable(self):
        pass


@pytest.fixture
def fake_fabric(monkeypatch):
    """The runner with a fabric that builds nothing: run_on_fabric only runs its runs."""
    from experiments import runner
    monkeypatch.setattr(runner, "Fabric", FakeFabric)
    monkeypatch.setattr(runner, "fabric_placement", lambda fab: {})
    monkeypatch.setattr(runner, "port_rates", lambda fab: None)
    monkeypatch.setattr(runner, "fabric_memory", lambda run_dirs: {})
    return runner


def test_a_run_that_fails_at_run_time_fails_alone(fake_fabric, monkeypatch, tmp_path):
    """Any exception of one run (a ConfigError of the host apps', say) is recorded as that run's
    failure, with its reason, and the next run goes on on the same fabric."""
    from experiments import runner
    from experiments.progress import Progress
    from experiments.results import read_run_record
    from hostapps.config import ConfigError
    spec = load_spec(SMOKE)
    ran = []

    def run_once(fab, out, plans, rates, stats_csv, progress, run, earlier=()):
        ran.append(run.run_id)
        if len(ran) == 1:
            raise ConfigError("--servers", "2 shards but the model has only 1 tensors")
        runner.write_run_record(out, run, "ok", 0.0, 1.0)
        return "ok"

    monkeypatch.setattr(runner, "run_once", run_once)
    with Progress(len(spec.runs), disable=True) as progress:
        runner.run_on_fabric(tmp_path, spec.runs, progress)
    assert ran == [run.run_id for run in spec.runs]
    first, second = (read_run_record(tmp_path, run.run_id) for run in spec.runs)
    assert first["status"] == "failed"
    assert first["error"] == "ConfigError: --servers: 2 shards but the model has only 1 tensors"
    assert second["status"] == "ok"
    assert progress.statuses == {"failed": 1, "ok": 1}
    assert (tmp_path / "fabrics" / spec.runs[0].run_id / "fabric.json").is_file()


def test_a_run_failed_by_the_guard_while_the_hypervisor_stole_runs_once_more(fake_fabric, monkeypatch, tmp_path):
    """The first attempt is kept beside the run, the second's record says why it ran; a second steal is
    the run's result (the spec's stolen_retries: 1 by default), as is any run the guard failed for its
    own load."""
    from experiments import runner
    from experiments.progress import Progress
    from experiments.results import read_run_record
    spec = load_spec(SMOKE)
    ran = []

    def run_once(fab, out, plans, rates, stats_csv, progress, run, earlier=()):
        ran.append(run.run_id)
        runner.write_run_record(out, run, "ok", 0.0, 1.0, faults=list(earlier))
        (runner.run_dir(out, run.run_id) / "attempt").write_text(str(ran.count(run.run_id)))
        return "ok"

    first, second = spec.runs
    monkeypatch.setattr(runner, "run_once", run_once)
    monkeypatch.setattr(runner, "stolen_failure", lambda out, run, earlier=(): "timers late; the hypervisor stole 12%"
                        if run is first else "")
    with Progress(len(spec.runs), disable=True) as progress:
        runner.run_on_fabric(tmp_path, spec.runs, progress, spec.header.stolen_retries)
    assert ran == [first.run_id, first.run_id, second.run_id]
    assert progress.statuses == {"ok": 2}
    kept = runner.run_dir(tmp_path, first.run_id).with_name(f"{first.run_id}.stolen1")
    assert (kept / "attempt").read_text() == "1"
    assert (runner.run_dir(tmp_path, first.run_id) / "attempt").read_text() == "2"
    assert read_run_record(tmp_path, first.run_id)["faults"] == [
        f"ran again: an earlier attempt, kept as runs/{first.run_id}.stolen1, failed the guard "
        "(timers late; the hypervisor stole 12%)"]
    assert read_run_record(tmp_path, second.run_id)["faults"] == []


def test_a_resumed_fabric_keeps_the_earlier_attempts_record(tmp_path):
    from experiments.runner import fabric_dir
    run = load_spec(SMOKE).runs[0]
    earlier = tmp_path / "fabrics" / run.run_id
    for attempt in (1, 2):
        earlier.mkdir(parents=True)
        (earlier / "fabric.json").write_text(f"attempt {attempt}")
        assert fabric_dir(tmp_path, run) == earlier and not earlier.exists()
    kept = sorted(path.name for path in (tmp_path / "fabrics").iterdir())
    assert kept == [f"{run.run_id}.attempt1", f"{run.run_id}.attempt2"]
    assert (tmp_path / "fabrics" / f"{run.run_id}.attempt2" / "fabric.json").read_text() == "attempt 2"


class RestFabric:
    """A fabric whose controller is the real decision code (POST, GET and DELETE /jobs over
    controller/pipeline.py's WantedMarks) and whose hosts run a stand-in for the host apps, which
    prints its iterations and exits; the command lines are kept."""

    id, servers = "fake", ["elsewhere"]  # a cluster: the placement is not probed

    def __init__(self):
        from controller.pipeline import WantedMarks
        self.wanted, self.calls, self.argv = WantedMarks(), [], {}

    def rest(self, path, method="GET", body=None, timeout=5.0):
        from controller.scheduling import describe_job, parse_job, sharing_of
        self.calls.append((method, path))
        if method == "POST":
            job = parse_job(body)
            self.wanted.register(job)
            return describe_job(job, sharing_of(list(self.wanted.jobs.values())))
        if method == "DELETE":
            self.wanted.remove(path.removeprefix("/jobs/"))
            return []
        shared = sharing_of(list(self.wanted.jobs.values()))
        return [describe_job(job, shared) for job in self.wanted.jobs.values()]

    def host(self, name):
        return name

    def popen(self, host, argv, cwd, stdout, stderr):
        import subprocess
        import sys
        self.argv[host] = argv
        return subprocess.Popen([sys.executable, "-c", "print('iteration 1/1 1.000')"], stdout=stdout, stderr=stderr,
                                start_new_session=True)

    def controller_problems(self):
        return []

    def check(self):
        return ""

    def controller_down(self):
        return ""


def test_a_run_of_several_jobs_registers_tags_and_starts_each_at_its_offset(monkeypatch, tmp_path):
    import contextlib
    import json

    import pandas as pd

    from experiments import runner
    from experiments.progress import Progress
    from experiments.runplan import plan_jobs
    from experiments.spec import parse_spec
    from hostapps.config import config_from_args
    spec = parse_spec({
        "topology": {"spines": 2, "leaves": 2, "hosts_per_leaf": 2},
        "controller": {"sharing": "timeshift"},
        "jobs": [{"name": "a", "workers": ["h1", "h3"], "iterations": 3, "model": {"name": "resnet50"}},
                 {"name": "b", "workers": ["h2", "h4"], "iterations": 3, "transport": "mlt", "start_s": 2,
                  "model": {"name": "resnet50"}}]})
    run = spec.runs[-1]
    monkeypatch.setattr(runner, "FabricSampler", lambda path, ports: contextlib.nullcontext())
    monkeypatch.setattr(runner, "ports_by_server", lambda fab: {"localhost": {}})
    fab = RestFabric()
    with Progress(1, disable=True) as progress:
        progress.start_run(run.run_id, 3)
        status = runner.run_once(fab, tmp_path, plan_jobs(run), pd.DataFrame(), tmp_path / "ports.csv", progress, run)
    assert status == "ok"
    record = json.loads((tmp_path / "runs" / run.run_id / "run.json").read_text())
    jobs = {job["name"]: job for job in record["jobs"]}
    assert [call for call in fab.calls if call[0] != "GET"] == [
        ("POST", "/jobs"), ("POST", "/jobs"), ("DELETE", "/jobs/run2.a"), ("DELETE", "/jobs/run2.b")]
    assert fab.wanted.jobs == {}
    configs = {host: config_from_args(argv[3:]) for host, argv in fab.argv.items()}
    assert configs["h1"].tag == configs["h3"].tag == jobs["a"]["tag"] != jobs["b"]["tag"] == configs["h2"].tag
    assert configs["h1"].start_at == configs["h3"].start_at == jobs["a"]["start_at_s"]
    # b arrives 2 s after a and starts at the offset the controller gave it
    assert jobs["b"]["arrival_s"] == pytest.approx(jobs["a"]["arrival_s"] + 2)
    assert configs["h2"].start_at == pytest.approx(jobs["b"]["arrival_s"] + jobs["b"]["start_offset_s"])
    offsets = sorted(job["start_offset_s"] for job in jobs.values())
    assert offsets[0] == 0 < offsets[1]  # one period: the second interleaved with the first
    assert configs["h2"].layer_dscp and not configs["h1"].layer_dscp  # mlt marks its own datagrams, TCP is marked
    assert record["status"] == "ok" and jobs["a"]["link_bound_s"] > 0
    # nothing measured alone here: the circle from the planned periods, the same pace for both
    assert configs["h1"].pace == configs["h3"].pace == jobs["a"]["pace_s"] > 0
    assert "measured" not in jobs["a"]


class Shown:
    """A stand-in live view: what the progress tells it about the jobs."""

    def __init__(self):
        self.jobs = None

    def job_iterations(self, jobs):
        self.jobs = jobs

    def iteration(self, done, ends):
        self.done = done


def test_each_jobs_rank0_worker_reports_its_iterations_to_the_live_view(tmp_path):
    import subprocess
    import sys

    from experiments import runner
    from experiments.live import LiveView
    from experiments.progress import Progress
    processes = []
    for job, host, lines in (("a", "h1", "iteration 1/3 10.0\niteration 2/3 10.5\n"), ("a", "h3", ""),
                             ("b", "h2", "iteration 1/3 11.0\n")):
        stdout, stderr = tmp_path / f"{host}.out", tmp_path / f"{host}.err"
        stdout.write_text(lines)
        popen = subprocess.Popen([sys.executable, "-c", ""], start_new_session=True)
        rank = 1 if host == "h3" else 0
        processes.append(runner.JobProcess(f"{host}-worker{rank}", host, popen, stdout, stderr, 1, job))
    for process in processes:
        process.popen.wait()
    shown = Shown()
    with Progress(1, disable=True, live=shown) as progress:
        assert runner.wait_job(processes, progress, lambda: None) == ""
    assert shown.jobs == {"a": {"hosts": ["h1", "h3"], "ends": [10.0, 10.5]}, "b": {"hosts": ["h2"], "ends": [11.0]}}
    live = LiveView("spec", ["r"], 0)
    try:
        live.run_started("r", 3, 0.1)
        live.job_iterations(shown.jobs)
        assert live.state()["current"]["jobs"] == [
            {"name": "a", "hosts": ["h1", "h3"], "done": 2, "times": [pytest.approx(0.5)]},
            {"name": "b", "hosts": ["h2"], "done": 1, "times": []}]
    finally:
        live.server.server_close()


def test_each_list_of_servers_is_checked_for_the_largest_mtu_its_runs_use():
    from types import SimpleNamespace

    from experiments.runner import cluster_mtus

    def run(servers, mtu):
        return SimpleNamespace(config=SimpleNamespace(cluster=SimpleNamespace(servers=servers)),
                               topology=SimpleNamespace(mtu=mtu))
    runs = [run([], 9000), run(["localhost", "b"], 1500), run(["localhost", "b"], 9000), run(["localhost", "c"], 1400)]
    assert cluster_mtus(runs) == {("localhost", "b"): 9000, ("localhost", "c"): 1400}

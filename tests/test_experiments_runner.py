"""The experiment runner end to end: `python -m experiments run` on the emulated fabric (root)."""
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.results import completed_run_ids, read_run_record
from experiments.spec import load_spec
from topologies.cleanup import LOCK_FILE, STATE_DIR, our_bridges, our_processes

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "experiments" / "smoke.yaml"
RUN_FILES = ["run.json", "ports.csv", "port_rates.csv", "cpu.csv"]
PROCESS_FILES = ["stdout.log", "stderr.log", "iterations.csv", "tensors.csv", "summary.json", "trace.json"]
# Two repetitions of the smoke spec with a background flow, random loss on a fabric link and a
# rate cut on a host link, all active early in each run: an interrupt finds them switched on.
DISTURBED = ["--set", "repetitions=2", "--set", "job.iterations=60",
             "--set", "background=[{src: h1, dst: h4, rate_mbps: 20, start_s: 0.5, duration_s: 3}]",
             "--set", "faults=[{kind: loss, link: leaf1-spine1, at_s: 0.5, duration_s: 3, loss_percent: 1},"
                      " {kind: rate, link: h2-leaf1, at_s: 0.5, duration_s: 3, rate_mbps: 50}]"]


def experiments_cli(*args: str, cwd: Path) -> subprocess.Popen:
    """`python -m experiments run ...` started outside the repo: a fabric starting in another
    session meanwhile kills `-m experiments` processes whose working directory is the repo as
    strays (topologies/cleanup.py), and this one is between fabrics while it aggregates."""
    return subprocess.Popen([sys.executable, "-m", "experiments", "run", *args], cwd=cwd,
                            env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    stdout, stderr = process.communicate(timeout=timeout)
    return process.returncode, stdout, stderr


def leftovers() -> list[str]:
    """Anything of a fabric, controller, host app or fault left running. Checked under the fabric
    lock, so that another test's fabric starting meanwhile does not count."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(LOCK_FILE, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = [f"bridge {name}" for name in our_bridges()]
        # Mininet node shells left without their Mininet process (another session's live test
        # may have its own).
        ps = subprocess.run(["ps", "-eo", "ppid=,pid=,args="], capture_output=True, text=True).stdout
        found += [line for line in ps.splitlines() if "mininet:" in line and line.split()[0] == "1"]
        found += [f"process {pid}" for pid in our_processes(exclude={os.getpid()})]
        tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
        found += [line for line in tables.splitlines() if "dnntb" in line]
    return found


def test_runner_refuses_to_run_without_root(monkeypatch, tmp_path):
    from experiments.runner import run_experiment
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SystemExit, match="needs root"):
        run_experiment(load_spec(SMOKE), tmp_path / "out", resume=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.integration
def test_smoke_spec_writes_every_result_and_both_modes_train_alike(tmp_path):
    out = tmp_path / "smoke"
    status, stdout, stderr = finish(experiments_cli(str(SMOKE), "--out", str(out), cwd=tmp_path), timeout=240)
    assert status == 0, stderr[-2000:]
    assert "# Experiment summary" in stdout and "## allreduce" in stdout and "## ps" in stdout
    for name in ["spec.yaml", "meta.json", "runs.csv", "iterations.csv", "tensors.csv", "links.csv",
                 "summary.md"]:
        assert (out / name).stat().st_size > 0, name
    assert list((out / "plots").glob("*.png"))
    spec = load_spec(SMOKE)
    assert completed_run_ids(out) == {run.run_id for run in spec.runs}
    for run in spec.runs:
        run_path = out / "runs" / run.run_id
        for name in RUN_FILES:
            assert (run_path / name).stat().st_size > 0, f"{run.run_id}/{name}"
        hosts = [(host, "worker", rank) for rank, host in enumerate(run.config.worker_hosts)]
        hosts += [(host, "server", rank) for rank, host in enumerate(run.config.server_hosts)]
        for host, role, rank in hosts:
            process_path = run_path / f"{host}-{role}{rank}"
            for name in PROCESS_FILES + (["model.npz"] if role == "worker" else []):
                assert (process_path / name).exists(), f"{run.run_id}/{process_path.name}/{name}"
    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == 2 and runs["iter_time_mean_s"].gt(0).all() and runs["lower_bound_s"].gt(0).all()
    links = pd.read_csv(out / "links.csv")
    assert set(links["tier"]) == {"host", "fabric"} and links["tx_bytes"].sum() > 0
    # Same seed and global batch: 4 all-reducing workers and 3 workers with one parameter server
    # train the same model (the batch's shards together are the same samples).
    allreduce = np.load(out / "runs" / "mode=allreduce,rep=1" / "h1-worker0" / "model.npz")
    ps = np.load(out / "runs" / "mode=ps,rep=1" / "h1-worker0" / "model.npz")
    assert set(allreduce.files) == set(ps.files)
    assert max(np.abs(allreduce[name] - ps[name]).max() for name in allreduce.files) < 1e-4
    assert leftovers() == []


@pytest.mark.integration
def test_interrupted_experiment_leaves_nothing_and_resumes(tmp_path):
    out = tmp_path / "disturbed"
    first_run = "mode=allreduce,rep=1"
    process = experiments_cli(str(SMOKE), "--out", str(out), *DISTURBED, cwd=tmp_path)
    deadline = time.monotonic() + 180
    while read_run_record(out, first_run) is None:
        assert process.poll() is None, process.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "the first run did not finish in time"
        time.sleep(0.2)
    time.sleep(1.0)  # into the second run, its flow and faults about to start
    process.send_signal(signal.SIGINT)
    status, _, stderr = finish(process, timeout=60)
    assert status != 0 and "--resume" in stderr
    assert leftovers() == []
    finished = completed_run_ids(out)
    assert first_run in finished and len(finished) < 4
    first_record = read_run_record(out, first_run)

    status, stdout, stderr = finish(experiments_cli(str(SMOKE), "--out", str(out), "--resume", *DISTURBED,
                                                   cwd=tmp_path), timeout=240)
    assert status == 0, stderr[-2000:]
    assert completed_run_ids(out) == {run.run_id for run in load_spec(SMOKE, DISTURBED[1::2]).runs}
    assert read_run_record(out, first_run) == first_record  # kept, not run again
    assert len(pd.read_csv(out / "runs.csv")) == 4
    iperf_log = (out / "runs" / first_run / "flow0-h1-h4.log").read_text()
    assert "Connecting to host 10.0.0.4" in iperf_log or "connected" in iperf_log, iperf_log
    assert leftovers() == []
    assert json.loads((out / "meta.json").read_text())["spec"] == "smoke"

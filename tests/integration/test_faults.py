"""Fault injection on the real fabric (root): the runner survives what it can and records it, fails
what it cannot with the reason, and leaves nothing behind; hosts reach each other from the first
packet; the REST API shrugs off garbage mid-run. (Other networks beside a fabric:
test_other_networks.py; faults a fabric's own check finds: test_fabric_health.py.)"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

from experiments.results import completed_run_ids, read_run_record
from experiments.spec import load_spec
from helpers import FIXTURES
from helpers.fabric import LB_MODES, PYTHON, experiments_cli, fabric_script, finish, leftovers
from emulation import machine
from emulation.cleanup import ProcessRecord, is_alive, our_bridges, process_record
from emulation.fabric import Fabric


FAULTS = FIXTURES / "experiments" / "faults.yaml"
FIRST, SECOND, THIRD = "rep=1", "rep=2", "rep=3"


def processes_with(*words: str) -> list[int]:
    """PIDs whose command line holds every word (as whole arguments or within one)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if all(word in cmdline for word in words):
                found.append(int(proc.name))
    return found


def wait_for_iteration(out: Path, run_id: str, iteration: int, runner: subprocess.Popen,
                       timeout: float = 120) -> None:
    """Until the run's rank-0 worker reports `iteration` done."""
    log = out / "runs" / run_id / "h1-worker0" / "stdout.log"
    deadline = time.monotonic() + timeout
    while not (log.exists() and f"iteration {iteration}/" in log.read_text()):
        assert runner.poll() is None, runner.communicate()[1][-2000:]
        assert time.monotonic() < deadline, f"{run_id} never reached iteration {iteration}"
        time.sleep(0.1)


def test_a_killed_controller_is_restarted_and_a_killed_worker_fails_only_its_run(tmp_path):
    """Three runs: the controller killed in the first (restarted, the run survives and says so), a
    worker killed in the second (that run fails within the peers' timeout), the third runs as usual."""
    out = tmp_path / "out"
    runner = experiments_cli(str(FAULTS), "--out", str(out), "--set", "repetitions=3", cwd=tmp_path)
    wait_for_iteration(out, FIRST, 5, runner)
    (controller,) = processes_with("-m controller", str(out))
    os.kill(controller, signal.SIGKILL)
    wait_for_iteration(out, SECOND, 5, runner)
    (worker,) = processes_with("hostapps worker", "--rank 1 ", str(out / "runs" / SECOND))
    killed_at = time.monotonic()
    os.kill(worker, signal.SIGKILL)
    while read_run_record(out, SECOND) is None:
        assert time.monotonic() - killed_at < 35, "the run did not fail within the peers' timeout"
        time.sleep(0.2)
    status, _, stderr = finish(runner, timeout=240)
    assert status == 1, "one run failed"
    first, second = read_run_record(out, FIRST), read_run_record(out, SECOND)
    print(first["faults"])
    assert first["status"] == "ok"
    (fault,) = first["faults"]
    assert "controller exited with status -9; restarted, tables restored in" in fault
    assert second["status"] == "failed" and second["error"] == "h2-worker1 was killed by SIGKILL"
    assert read_run_record(out, THIRD)["status"] == "ok"
    runs = pd.read_csv(out / "runs.csv").set_index("run_id")
    assert runs.loc[FIRST, "faults"] == fault and pd.isna(runs.loc[THIRD, "faults"])
    assert runs.loc[THIRD, "iter_time_mean_s"] > 0
    assert "survived faults" in (out / "summary.md").read_text()
    assert leftovers() == []


def test_a_link_down_and_back_mid_run_is_survived(tmp_path):
    out = tmp_path / "out"
    status, _, stderr = finish(experiments_cli(
        str(FAULTS), "--out", str(out), "--set", "repetitions=1", "--set", "job.iterations=20",
        "--set", "faults=[{kind: link_down, link: leaf1-spine1, at_s: 4, duration_s: 3}]", cwd=tmp_path),
        timeout=240)
    assert status == 0, stderr[-2000:]
    assert read_run_record(out, FIRST)["status"] == "ok"
    assert leftovers() == []


def test_interrupted_anywhere_leaves_nothing_and_resume_completes_every_run_once(tmp_path):
    """SIGINT at 6 random moments of a short spec, one in each sixth of 0.2-12 s after the start, so
    fabric start-up, runs and aggregation are all hit (a moment and its resume cost about 7 s); each run
    has a background flow, random loss on a fabric link and a rate cut on a host link, all active early
    in it, so an interrupt finds them switched on. A finished run is kept as it was, not run again."""
    out = tmp_path / "out"
    spec_args = ["--set", "repetitions=3", "--set", "job.iterations=5", "--set", "topology.host_bw=100",
                 "--set", "topology.fabric_bw=100",
                 "--set", "background=[{src: h1, dst: h4, rate_mbps: 20, start_s: 0.5, duration_s: 3}]",
                 "--set", "faults=[{kind: loss, link: leaf1-spine1, at_s: 0.5, duration_s: 3, loss_percent: 1},"
                          " {kind: rate, link: h2-leaf1, at_s: 0.5, duration_s: 3, rate_mbps: 50}]"]
    spec = load_spec(FAULTS, spec_args[1::2])
    rng = random.Random(7)
    moments = [0.2 + 11.8 * (sixth + rng.random()) / 6 for sixth in range(6)]
    rng.shuffle(moments)
    kept = {}
    for attempt, moment in enumerate(moments):
        runner = experiments_cli(str(FAULTS), "--out", str(out), "--resume", *spec_args, cwd=tmp_path)
        time.sleep(moment)
        runner.send_signal(signal.SIGINT)
        status, _, stderr = finish(runner, timeout=120)
        # 1: interrupted (the finished runs kept); -2: interrupted while Python was still importing
        assert status in (0, 1, -signal.SIGINT), stderr[-2000:]
        assert status != 1 or "--resume" in stderr, stderr[-2000:]
        assert leftovers() == [], f"attempt {attempt}"
        kept.update({run_id: read_run_record(out, run_id) for run_id in completed_run_ids(out, spec)})
    status, _, stderr = finish(experiments_cli(str(FAULTS), "--out", str(out), "--resume", *spec_args,
                                               cwd=tmp_path), timeout=300)
    assert status == 0, stderr[-2000:]
    assert completed_run_ids(out, spec) == {run.run_id for run in spec.runs}
    assert {run_id: read_run_record(out, run_id) for run_id in kept} == kept, "a finished run ran again"
    runs = pd.read_csv(out / "runs.csv")
    assert sorted(runs["run_id"]) == sorted(run.run_id for run in spec.runs), "each run once"
    flow_log = (out / "runs" / FIRST / "flow0-h1-h4.log").read_text()
    assert "Connecting to host 10.0.0.4" in flow_log or "connected" in flow_log, flow_log
    assert not list(out.rglob(".*.tmp*")), "no half-written file survived as a result"
    assert leftovers() == []


DIES_INSIDE_FABRIC = """
import os, signal, sys
from emulation.fabric import Fabric
with Fabric("leafspine", {"spines": 1, "leaves": 1, "hosts_per_leaf": 2}, workdir=sys.argv[2]) as fabric:
    shell = fabric.net.get(sys.argv[1]).shell
    os.kill(shell.pid, signal.SIGKILL)
    shell.wait()
"""


@pytest.mark.parametrize("node", ["h1", "leaf1"])
def test_a_node_shell_that_died_does_not_hang_the_teardown(tmp_path, node):
    """Mininet's stop reads forever from a dead node's shell (a CI run hung so, in Intf.delete)."""
    _, stderr = fabric_script(DIES_INSIDE_FABRIC, node, str(tmp_path), timeout=90,
                              hung=f"the teardown hung after {node}'s shell died")
    assert f"the shells of {node} had exited" in stderr
    assert leftovers() == []


@pytest.fixture
def interrupt_once_forked(monkeypatch):
    """A function marker -> records: the next process started whose arguments hold `marker` gets Ctrl-C
    delivered to us the moment it is forked, before Popen has returned it (the CI failure: the runner
    interrupted while starting the controller left that controller running, recorded nowhere).
    The list it returns receives that process's record (emulation.cleanup)."""
    execute_child = subprocess.Popen._execute_child

    def arm(marker: str) -> list[ProcessRecord]:
        forked: list[ProcessRecord] = []

        def forked_then_interrupted(self, args, *rest, **kwargs):
            execute_child(self, args, *rest, **kwargs)
            if not forked and any(marker in str(arg) for arg in args):
                forked.append(process_record(self.pid))
                os.kill(os.getpid(), signal.SIGINT)  # its handler runs before Popen returns

        monkeypatch.setattr(subprocess.Popen, "_execute_child", forked_then_interrupted)
        return forked
    return arm


def test_ctrl_c_as_the_controller_is_forked_leaves_nothing(tmp_path, interrupt_once_forked):
    forked = interrupt_once_forked("controller")
    with pytest.raises(KeyboardInterrupt):
        with Fabric("leafspine", {"spines": 1, "leaves": 1, "hosts_per_leaf": 2}, workdir=tmp_path):
            pytest.fail("the fabric started despite Ctrl-C")
    assert len(forked) == 1 and not is_alive(forked[0])
    assert leftovers() == []


def test_ctrl_c_as_a_host_process_is_forked_leaves_nothing(tmp_path, interrupt_once_forked):
    with pytest.raises(KeyboardInterrupt):
        with Fabric("leafspine", {"spines": 1, "leaves": 1, "hosts_per_leaf": 2}, workdir=tmp_path) as fab:
            forked = interrupt_once_forked("host-process-marker")
            fab.popen("h1", [PYTHON, "-c", "import time; time.sleep(60)", "host-process-marker"])
            pytest.fail("Ctrl-C was not delivered")
    assert len(forked) == 1 and not is_alive(forked[0])
    assert leftovers() == []


MALFORMED = [
    ("POST", "/jobs", b"{", "application/json"),
    ("POST", "/jobs", b'{"job": "x", "policy": ["x"]}', "application/json"),
    ("POST", "/jobs", b'{"job": "run0", "policy": "fifo", "hosts": [], "layers": [], "flows": []}',
     "text/plain"),
    ("POST", "/fabric/classes", b'{"flows": 5}', "application/json"),
    ("POST", "/fabric/classes", b'{"flows": null, "replace": "false"}', "application/json"),
    ("POST", "/fabric/classes", b"[" * 5000, "application/json"),
    ("POST", "/fabric/classes", b"\xff\xfe", "application/json"),
    ("DELETE", "/fabric/classes", b'{"flowz": []}', "application/json"),
    ("DELETE", "/jobs/nosuchjob", b"", "application/json"),
    ("DELETE", "/jobs/run0", b'{"x": 1}', "text/plain"),
    ("GET", "/fabric", b"", "application/json"),
    ("GET", "/fabric/groups", b"", "application/json"),
    ("GET", "/fabric/ports", b"", "application/json"),
    ("GET", "/jobs", b"", "application/json"),
]


def fuzz(port: int, rounds: int) -> dict[int, int]:
    """Every malformed request `rounds` times; the count of each status answered."""
    statuses: dict[int, int] = {}
    for _ in range(rounds):
        for method, path, body, content_type in MALFORMED:
            request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body or None, method=method,
                                             headers={"Content-Type": content_type})
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    status = response.status
            except urllib.error.HTTPError as error:
                status = error.code
            statuses[status] = statuses.get(status, 0) + 1
    return statuses


def test_rest_fuzz_during_a_run_leaves_the_controller_and_the_run_unharmed(tmp_path):
    out = tmp_path / "out"
    runner = experiments_cli(str(FAULTS), "--out", str(out), "--set", "repetitions=1", cwd=tmp_path)
    wait_for_iteration(out, FIRST, 3, runner)
    statuses = fuzz(8080, rounds=5)
    print(statuses)
    status, _, stderr = finish(runner, timeout=240)
    assert status == 0, stderr[-2000:]
    assert 500 not in statuses and set(statuses) <= {200, 400, 404, 413, 415}
    record = read_run_record(out, FIRST)
    assert record["status"] == "ok" and record["faults"] == [], "no controller error, no restart"
    (log,) = (out / "fabrics").glob("*/controller.log")
    assert "Traceback" not in log.read_text()
    assert leftovers() == []


@pytest.mark.parametrize("lb", LB_MODES)
def test_twenty_pingalls_on_a_fresh_fabric_lose_nothing(lb, tmp_path):
    """The controller learns every host from ARP (no hosts file, as with plain `mn`): the packets
    that follow an ARP reply must find their routes installed on every switch."""
    with Fabric("leafspine", {"spines": 3, "leaves": 3, "hosts_per_leaf": 2}, lb=lb, workdir=tmp_path,
                known_hosts=False) as fab:
        losses = [fab.net.pingAll(timeout=1) for _ in range(20)]
    assert losses == [0] * 20


def test_a_fabric_torn_down_mid_run_fails_that_run_and_the_next_gets_a_new_fabric(tmp_path):
    """What `mn -c` from another terminal did to a 16-host experiment (it hung, no bridge left, until
    interrupted by hand): the fabric's bridges deleted behind the runner's back."""
    out = tmp_path / "out"
    runner = experiments_cli(str(FAULTS), "--out", str(out), cwd=tmp_path)
    wait_for_iteration(out, FIRST, 5, runner)
    torn = time.monotonic()
    for bridge in our_bridges():
        subprocess.run(["ovs-vsctl", "del-br", bridge], check=True)
    while read_run_record(out, FIRST) is None:
        assert time.monotonic() - torn < 10, "the broken fabric was not noticed within seconds"
        time.sleep(0.2)
    status, _, stderr = finish(runner, timeout=240)
    assert status == 1, "one run failed"
    record = read_run_record(out, FIRST)
    assert record["status"] == "failed" and "Open vSwitch lost" in record["error"]
    assert read_run_record(out, SECOND)["status"] == "ok"
    assert "the fabric broke under rep=1" in stderr
    assert len(list((out / "fabrics").iterdir())) == 2, "a new fabric for the second run"
    assert leftovers() == []


def test_open_vswitch_restarted_mid_run_is_recovered_and_the_run_says_so(tmp_path):
    out = tmp_path / "out"
    runner = experiments_cli(str(FAULTS), "--out", str(out), "--set", "repetitions=1", cwd=tmp_path)
    wait_for_iteration(out, FIRST, 5, runner)
    try:
        machine._ovs_ctl("restart")
    finally:
        if not machine.ovs_running():
            machine.prepare()
    status, _, stderr = finish(runner, timeout=240)
    assert status == 0, stderr[-2000:]
    record = read_run_record(out, FIRST)
    (fault,) = record["faults"]
    assert record["status"] == "ok" and "ovs-vswitchd restarted (pid" in fault
    assert leftovers() == []

"""The sampler: the forwarding threads it reads, and a sampler on each other server of a cluster,
started over SSH and stopped by closing its stdin (here through a local shell, and a fake ssh)."""
import io
import json
import os
import shlex
import subprocess
import sys

import pandas as pd

from common.paths import REPO
from emulation.cluster import to_local_clock
from emulation.machine import Jiffies
from experiments import sampler
from experiments.sampler import CPU_COLUMNS, SAMPLED_FILES, RemoteSamplers, _threads, sampler_command


def test_the_threads_of_every_daemon_are_sampled_and_a_gone_one_is_left_out():
    other = subprocess.Popen(["sleep", "30"])
    try:
        threads = _threads([os.getpid(), None, other.pid])
        assert os.getpid() in threads and other.pid in threads
        other.kill()
        other.wait()
        assert other.pid not in _threads([os.getpid(), other.pid])
    finally:
        other.kill()
        other.wait()


def test_a_servers_sampler_runs_in_the_repository_until_its_stdin_ends(tmp_path):
    out = tmp_path / "run" / "servers" / "10.0.0.2 x"  # a word the server's shell must not split
    command = sampler_command(sys.executable, str(REPO), out, {"leaf2-eth1": ("leaf2", 1)})
    assert shlex.split(command)[:3] == ["cd", str(REPO), "&&"]
    done = subprocess.run(["sh", "-c", command], input="", capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert sorted(path.name for path in out.iterdir()) == ["cpu.csv", "drain.csv", "ovs.json", "queues.csv",
                                                           "sockets.csv"]
    cpu = pd.read_csv(out / "cpu.csv")
    assert list(cpu.columns) == CPU_COLUMNS and len(cpu) >= 1, "the last sample is taken as the sampler stops"
    assert cpu["steal_util"].between(0, 1).all() and (cpu["steal_util"] <= cpu["cpu_util"]).all()
    assert set(json.loads((out / "ovs.json").read_text())) == {"tx_errors_by_port", "tx_errors_suppressed",
                                                               "datapath_drops"}


def test_a_sampler_stopped_within_a_jiffy_still_writes_its_last_sample(tmp_path, monkeypatch):
    """/proc/stat counts in jiffies: a sampler whose stop comes before the next one would have no deltas,
    and no row; it waits for them."""
    readings = iter([Jiffies(10, 100, 0), Jiffies(10, 100, 0), Jiffies(15, 108, 1)])
    monkeypatch.setattr(sampler, "machine_jiffies", lambda: next(readings))
    monkeypatch.setattr(sampler, "datapath_drops", lambda coverage: 0)
    monkeypatch.setattr(sampler, "_coverage", lambda: "")
    fabric = sampler.FabricSampler(tmp_path, {})
    fabric._stop.set()  # stopped before its first interval ends
    with fabric:
        pass
    cpu = pd.read_csv(tmp_path / "cpu.csv")
    assert len(cpu) == 1 and cpu["cpu_util"].iloc[0] == 5 / 8 and cpu["steal_util"].iloc[0] == 1 / 8


class FakeSession:
    """An SSH session to a server's sampler: it ends (status `status`, saying `said`) once its stdin closes."""

    def __init__(self, argv, status=0, said=""):
        self.argv, self.returncode, self._said = argv, None, said
        self._status = status
        self.stdin = self.stdin_sent = io.StringIO()

    def communicate(self, timeout=None):
        if self.stdin is not None:
            self.stdin.flush()  # as Popen's does: a closed stdin left in place raises
        assert self.stdin_sent.closed, "the sampler is stopped by closing its stdin"
        self.returncode = self._status
        return None, self._said


def test_each_other_server_gets_a_sampler_over_ssh_and_a_failed_one_is_said(tmp_path):
    sessions = []

    def popen(argv, **options):
        assert options["stdin"] == subprocess.PIPE
        session = FakeSession(argv, *((1, "Traceback...\nOSError: no space\n") if "root@b" in argv else ()))
        sessions.append(session)
        return session

    ports = {"a": {"leaf2-eth1": ("leaf2", 1)}, "b": {"leaf3-eth1": ("leaf3", 1)}}
    with RemoteSamplers(tmp_path, ports, "/venv/python", "/repo", popen=popen) as samplers:
        assert [session.argv[:6] for session in sessions] == [
            ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", f"root@{server}"] for server in ("a", "b")]
        assert all(not session.stdin_sent.closed for session in sessions)
    command = shlex.split(sessions[0].argv[-1])
    assert command[:6] == ["cd", "/repo", "&&", "exec", "/venv/python", "-m"]
    assert command[6:8] == ["experiments.sampler", str(tmp_path / "servers" / "a")]
    assert json.loads(command[-1]) == {"leaf2-eth1": ["leaf2", 1]}
    assert samplers.errors == ["the sampler on b failed: OSError: no space"]


def test_a_servers_samples_are_put_on_this_machines_clock(tmp_path):
    pd.DataFrame({"time_s": [100.5, 101.0], "cpu_util": 0.5, "vswitchd_thread_util": 0.4,
                  "mem_used_mb": 1.0}).to_csv(tmp_path / "cpu.csv", index=False)
    to_local_clock(tmp_path, 2.5, SAMPLED_FILES)
    assert list(pd.read_csv(tmp_path / "cpu.csv")["time_s"]) == [98.0, 98.5]

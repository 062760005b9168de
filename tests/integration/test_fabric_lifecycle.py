"""Integration: one controller left running serves one fabric after another (a user running `mn`
again and again), and a switch that reconnects gets exactly the right state back."""
from __future__ import annotations

import fcntl
import os
import subprocess
import time
import urllib.request

import pytest

from helpers.fabric import REPO, wait_until
from emulation.cleanup import LOCK_FILE, STATE_DIR, STATE_FILE, FabricRecord, process_record, read_state, write_state
from emulation.errors import FabricError
from emulation.fabric import Fabric
from common.sysctl import read_sysctl
from emulation.machine import SOCKET_BUFFERS


OFP_PORT, REST_PORT = 6663, 8093


@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    """A controller started by hand (outside the repo folder, so fabric clean-up leaves it be)."""
    workdir = tmp_path_factory.mktemp("controller")
    log = workdir / "controller.log"
    proc = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "python"), "-m", "controller", "--lb", "ecmp",
         "--ofp-port", str(OFP_PORT), "--rest-port", str(REST_PORT), "--log-file", str(log)],
        cwd=workdir, env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{REST_PORT}/fabric", timeout=1)
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "controller did not start"
            time.sleep(0.2)
    yield log
    proc.terminate()
    assert proc.wait(10) == 0, "controller did not stop cleanly on SIGTERM"
    problems = [line for line in log.read_text().splitlines() if "Traceback" in line or "OpenFlow error" in line]
    assert problems == []


def fabric(params: dict, tmp_path) -> Fabric:
    return Fabric("leafspine", params, ofp_port=OFP_PORT, rest_port=REST_PORT, workdir=tmp_path,
                  own_controller=False)


def test_one_controller_serves_successive_fabrics(controller, tmp_path):
    with fabric({"spines": 2, "leaves": 2, "hosts_per_leaf": 2}, tmp_path / "a") as fab:
        fab.wait_reachable()
        # the switches' port sockets got buffers that absorb bursts (raising them is unit-tested)
        assert all(int(read_sysctl(name)) >= least for name, least in SOCKET_BUFFERS.items())
    # Same DPIDs, another shape: a third spine, three leaves, one host each.
    with fabric({"spines": 3, "leaves": 3, "hosts_per_leaf": 1}, tmp_path / "b") as fab:
        fab.wait_reachable()
        seen = fab.rest("/fabric")
        assert sorted(s["name"] for s in seen["switches"]) == \
            ["leaf1", "leaf2", "leaf3", "spine1", "spine2", "spine3"]
        assert len(seen["links"]) == 9
        assert sorted(h["ip"] for h in seen["hosts"]) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
        assert [h["port"] for h in seen["hosts"]] == [1, 1, 1]
        groups = fab.rest("/fabric/groups")
        assert all([g["ports"] for g in groups[f"leaf{i}"]] == [[2, 3, 4]] for i in (1, 2, 3))
        dump = subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", "dump-groups", "leaf1"],
                              capture_output=True, text=True, check=True).stdout
        assert dump.count("group_id=") == 1, dump


def test_reconnecting_switch_gets_its_state_back(controller, tmp_path):
    with fabric({"spines": 2, "leaves": 2, "hosts_per_leaf": 2}, tmp_path) as fab:
        fab.wait_reachable()
        flows_before = _flows("leaf1")
        subprocess.run(["ovs-vsctl", "del-controller", "leaf1"], check=True)
        wait_until(lambda: len(fab.rest("/fabric")["switches"]) == 3, "leaf1 never left", 10)
        subprocess.run(["ovs-vsctl", "set-controller", "leaf1", f"tcp:127.0.0.1:{OFP_PORT}"],
                       check=True)
        wait_until(lambda: len(fab.rest("/fabric")["links"]) == 4, "leaf1's links never came back", 10)
        fab.wait_reachable(timeout=20)
        assert _flows("leaf1") == flows_before


def _flows(switch: str) -> list[str]:
    """The switch's flow table without the counters."""
    out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", "--no-stats", "dump-flows", switch],
                         capture_output=True, text=True, check=True).stdout
    return sorted(line.strip() for line in out.splitlines() if "priority" in line)


def test_a_fabric_that_gives_up_waiting_for_the_lock_leaves_the_running_one_alone(tmp_path):
    """Until it has the lock, what the state file records (processes, marked bridges) is the running
    fabric's: a fabric that gives up waiting must not clear it on its way out."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    running = subprocess.Popen(["sleep", "120"])  # a process of the running fabric
    try:
        with open(LOCK_FILE, "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)  # as the running fabric holds it
            stale = STATE_FILE.read_text() if STATE_FILE.exists() else None
            record = FabricRecord(fabric="running", processes=[process_record(running.pid)])
            write_state(record)
            try:
                with pytest.raises(FabricError, match="another fabric is running"):
                    with Fabric("leafspine", {"spines": 1, "leaves": 1, "hosts_per_leaf": 1}, workdir=tmp_path,
                                own_controller=False, lock_timeout=0.5):
                        pass
                assert running.poll() is None, "the running fabric's process was signalled"
                assert read_state() == record
            finally:
                STATE_FILE.write_text(stale) if stale is not None else STATE_FILE.unlink(missing_ok=True)
    finally:
        running.kill()
        running.wait()

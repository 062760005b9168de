"""Shared pieces of the integration tests: building a fabric, counters, iperf3, running the
experiments CLI and checking that nothing is left behind."""
from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emulation.cleanup import LOCK_FILE, STATE_DIR, our_bridges, our_interfaces, our_nft_tables, read_state
from emulation.fabric import Fabric

from helpers import REPO
from helpers.session import started_here

PYTHON = str(REPO / ".venv" / "bin" / "python")
SPRAYER = str(REPO / "tests" / "helpers" / "udp_sprayer.py")
LB_MODES = ["ecmp", "spray", "single"]


def make_fabric(tmp_path_factory, kind: str, params: dict, lb: str):
    """A fixture body: a reachable fabric whose controller log must stay free of errors."""
    workdir = tmp_path_factory.mktemp(f"{kind}-{lb}")
    fab = Fabric(kind, params, lb=lb, workdir=workdir, stats_csv=workdir / "ports.csv",
                 stats_interval=0.5)
    with fab:
        fab.wait_reachable(timeout=60)
        yield fab
        problems = fab.controller_problems()
        assert problems == [], f"controller log has errors: {problems}"


def port_counters(switch: str, port: int) -> dict[str, int]:
    """Live OpenFlow port counters (OVSDB's statistics column lags by up to 5 s)."""
    out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", "dump-ports", switch, str(port)],
                         capture_output=True, text=True, check=True).stdout
    rx = re.search(r"rx pkts=(\d+), bytes=(\d+)", out).groups()
    tx = re.search(r"tx pkts=(\d+), bytes=(\d+)", out).groups()
    return {"rx_packets": int(rx[0]), "rx_bytes": int(rx[1]),
            "tx_packets": int(tx[0]), "tx_bytes": int(tx[1])}


def spine_rx(fab: Fabric, leaf: int, counter: str = "rx_packets") -> dict[str, int]:
    """What each spine received from leaf `leaf` (spine port j faces leaf j)."""
    spines = [s for s in fab.topo.switches() if s.startswith("spine")]
    return {s: port_counters(s, leaf)[counter] for s in spines}


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


def iperf(fab: Fabric, src: str, dst: str, port: int, seconds: float, *extra: str):
    """Start an iperf3 server on dst and a client on src; returns the client process."""
    server = fab.popen(dst, ["iperf3", "-s", "-1", "-p", str(port)])
    time.sleep(0.5)
    client = fab.popen(src, ["iperf3", "-c", fab.host(dst).IP(), "-p", str(port), "-t",
                             str(seconds), "-J", *extra])
    return server, client


def goodput_mbps(client) -> float:
    out, err = client.communicate(timeout=60)
    result = json.loads(out)
    assert "error" not in result, result["error"]
    return result["end"]["sum_received"]["bits_per_second"] / 1e6


def wait_until(condition, message: str, timeout: float, step: float = 0.1) -> None:
    """Poll `condition` until it holds; fail with `message` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(step)


def experiments_cli(*args: str, cwd: Path) -> subprocess.Popen:
    """`python -m experiments run ...` started outside the repo (as a user would, from anywhere)."""
    return subprocess.Popen([sys.executable, "-m", "experiments", "run", *args], cwd=cwd,
                            env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def fabric_script(script: str, *args: str, timeout: float, hung: str) -> tuple[str, str]:
    """Run `script`, which builds a fabric, in a Python of its own (a hang there cannot hang the
    test); its stdout and stderr. Still running after `timeout` seconds, it is killed, what it left
    cleaned up and the test failed with `hung`; exiting non-zero, the test fails with its stderr."""
    process = subprocess.Popen([PYTHON, "-c", script, *args], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        subprocess.run([PYTHON, "-m", "emulation.cleanup"], cwd=REPO, capture_output=True)
        pytest.fail(hung)
    assert process.returncode == 0, stderr[-2000:]
    return stdout, stderr


def finish(process: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    stdout, stderr = process.communicate(timeout=timeout)
    return process.returncode, stdout, stderr


def repo_processes(exclude: set[int]) -> list[int]:
    """Processes this test session started that run `-m controller|hostapps|experiments` (helpers/
    session.py). Only for asserting that nothing is left: clean-up itself signals only what the
    state file records."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in exclude:
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a == b"-m" and b.split(b".")[0] in (b"controller", b"hostapps", b"experiments")
               for a, b in zip(argv, argv[1:])) and started_here(int(proc.name)):
            pids.append(int(proc.name))
    return pids


def orphan_node_shells() -> list[str]:
    """Mininet node shells of this session left without their Mininet process (re-parented to init)."""
    ps = subprocess.run(["ps", "-eo", "ppid=,pid=,args="], capture_output=True, text=True).stdout
    return [line.strip() for line in ps.splitlines()
            if "mininet:" in line and line.split()[0] == "1" and started_here(int(line.split()[1]))]


def leftovers(exclude: set[int] = frozenset()) -> list[str]:
    """Anything of a fabric, controller, host app or fault left running. Checked under the fabric
    lock, so that another test's fabric starting meanwhile does not count."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(LOCK_FILE, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = [f"bridge {name}" for name in our_bridges()]
        found += [f"interface {name}" for name in our_interfaces()]
        found += [f"nftables table {family} {name}" for family, name in our_nft_tables()]
        found += orphan_node_shells()
        found += [f"process {pid}" for pid in repo_processes(exclude={os.getpid(), *exclude})]
        state = read_state()
        found += [f"state file of processes {[record.pid for record in state.processes]}"] if state else []
    return found


def left_on_the_server(state) -> list[str]:
    """What runs in an emulated server (emulation/emulated_server.py) besides its sshd and Open
    vSwitch (after a fabric: nothing)."""
    from emulation import emulated_server
    left = []
    for pid in emulated_server.processes_of(state):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        if pid != state.sshd["pid"] and not cmdline.startswith(("ovsdb-server", "ovs-vswitchd")):  # and monitors
            left.append(f"{pid} {cmdline}")
    return left

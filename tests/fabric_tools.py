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

from topologies.cleanup import LOCK_FILE, STATE_DIR, our_bridges, our_processes
from topologies.fabric import Fabric

REPO = Path(__file__).resolve().parent.parent
PYTHON = str(REPO / ".venv" / "bin" / "python")
SPRAYER = str(REPO / "tests" / "udp_sprayer.py")
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

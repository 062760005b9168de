"""Servers a fabric cannot span are refused before any network exists, in one line naming
`cluster.servers[i]` (emulation/preflight.py), and nothing is left running on either server: a
server without sshd, an underlay too small for the fabric's frames in VXLAN, an ovs-vswitchd that
cannot make its datapath, one that is not running. The second server is emulated
(emulation/emulated_server.py) with an underlay of 1450 bytes."""
import socket
import subprocess
from pathlib import Path

import pytest

from emulation import emulated_server
from helpers import REPO
from helpers.fabric import experiments_cli, finish, left_on_the_server, leftovers

SMOKE = REPO / "experiments" / "smoke.yaml"
NAME, SUBNET, UNDERLAY_MTU = "irefuse", "10.251.0.8/30", 1450
NO_SSHD = "127.0.0.2"  # this machine, where nothing listens on port 22


@pytest.fixture(scope="module")
def small_server():
    state = emulated_server.start(NAME, SUBNET, mtu=UNDERLAY_MTU)
    try:
        yield state
    finally:
        emulated_server.stop(NAME)
    assert emulated_server.processes_of(state) == []


def refused(tmp_path: Path, servers: str, *extra: str) -> str:
    """The runner's last line for the smoke spec on these servers; it must stop before any output."""
    out = tmp_path / "out"
    status, _, stderr = finish(experiments_cli(str(SMOKE), "--out", str(out), "--set", f"cluster.servers={servers}",
                                               *extra, cwd=tmp_path), timeout=120)
    assert status != 0
    assert not out.exists() and leftovers() == []
    return stderr.strip().splitlines()[-1]


def on_the_server(state, command: str) -> str:
    done = subprocess.run(["ssh", "-o", "BatchMode=yes", f"root@{state.server_ip}", command], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def nothing_left(state) -> None:
    """Only the server's sshd and its Open vSwitch daemons run there, and it has no bridge."""
    assert left_on_the_server(state) == []
    bridges = subprocess.run(["ssh", "-o", "BatchMode=yes", f"root@{state.server_ip}",
                              "ovs-vsctl --timeout=3 list-br 2>/dev/null"], capture_output=True, text=True, timeout=30)
    assert bridges.stdout.split() == []


def test_a_server_without_sshd_is_refused(tmp_path):
    with socket.socket() as probe:
        probe.settimeout(1)
        if probe.connect_ex((NO_SSHD, 22)) == 0:
            pytest.skip(f"something listens on {NO_SSHD}:22")
    assert refused(tmp_path, f"[localhost, {NO_SSHD}]") == (
        f"run: cluster.servers[1]: {NO_SSHD}: no SSH server answers on port 22 (ssh: connect to host {NO_SSHD} "
        "port 22: Connection refused): start sshd there (make setup-server)")


def test_an_underlay_too_small_for_the_fabrics_frames_is_refused(tmp_path, small_server):
    assert refused(tmp_path, f"[localhost, {small_server.server_ip}]") == (
        f"run: cluster.servers[1]: {small_server.server_ip}: the underlay from this machine carries packets of at "
        f"most {UNDERLAY_MTU} bytes; topology.mtu 9000 needs 9050 (VXLAN adds 50): raise the underlay's MTU or "
        "lower topology.mtu")
    nothing_left(small_server)


def test_a_daemon_that_cannot_make_its_datapath_is_refused(tmp_path, small_server):
    """A second ovs-vswitchd in a namespace with another's datapath tap cannot make its own (docs/platform.md):
    an interface of that name, `ovs-netdev`, is taken in the server's namespace (deleting it deletes its peer)."""
    taken = subprocess.run(["ip", "-n", small_server.namespace, "link", "add", "ovs-netdev", "type", "veth", "peer",
                            "name", "ovs-netdev-peer"], capture_output=True, text=True)  # no dummy in this kernel
    assert taken.returncode == 0, taken.stderr
    try:
        line = refused(tmp_path, f"[localhost, {small_server.server_ip}]", "--set", "topology.mtu=1400")
    finally:
        subprocess.run(["ip", "-n", small_server.namespace, "link", "del", "ovs-netdev"], capture_output=True)
    assert line.startswith(f"run: cluster.servers[1]: {small_server.server_ip}: its ovs-vswitchd cannot make a "
                           "userspace bridge ("), line
    nothing_left(small_server)


def test_a_server_whose_ovs_vswitchd_is_not_running_is_refused(tmp_path, small_server):
    on_the_server(small_server, "/usr/share/openvswitch/scripts/ovs-ctl stop")
    line = refused(tmp_path, f"[localhost, {small_server.server_ip}]", "--set", "topology.mtu=1400")
    assert line.startswith(f"run: cluster.servers[1]: {small_server.server_ip}: its ovs-vswitchd does not "
                           "answer ("), line
    assert line.endswith("): start Open vSwitch there (make setup-server)")
    nothing_left(small_server)

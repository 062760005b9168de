"""Fabric.check(), which the runner calls every second during a run: a fabric torn down behind its
back (by `mn -c` in another terminal, or ovs-vsctl) is reported within a second, and its teardown
still ends leaving nothing; Open vSwitch restarted under a running fabric (`ovs-ctl restart`,
machine-wide) is recovered: the ports back, shaped again, the switches reconnected, traffic going on,
OVS running with the socket buffers the fabric needs."""
from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from emulation import machine
from emulation.fabric import Fabric
from helpers.fabric import fabric_script, goodput_mbps, iperf, leftovers

TORN_DOWN = """
import json, os, signal, subprocess, sys, time
from emulation.fabric import Fabric, FabricError
how, workdir = sys.argv[1], sys.argv[2]
with Fabric("leafspine", {"spines": 2, "leaves": 2, "hosts_per_leaf": 1}, workdir=workdir) as fab:
    fab.wait_reachable()
    assert fab.check() == ""
    if how == "mn -c":  # what `mn -c` does, to this fabric only: its shells, bridges and veths
        for node in (*fab.net.hosts, *fab.net.switches, *fab.net.controllers):
            os.kill(node.shell.pid, signal.SIGKILL)
        for switch in fab.net.switches:
            subprocess.run(["ovs-vsctl", "--if-exists", "del-br", switch.name], check=True)
            for intf in switch.intfList():
                subprocess.run(["ip", "link", "del", intf.name], capture_output=True)
    else:
        subprocess.run(how.split(), check=True)
    began = time.monotonic()
    while time.monotonic() - began < 30:
        try:
            fab.check()
        except FabricError as error:
            print(json.dumps({"after_s": time.monotonic() - began, "error": str(error)}), flush=True)
            break
        time.sleep(0.1)
"""


@pytest.mark.parametrize("how, reported", [
    ("ovs-vsctl del-br leaf1", r"Open vSwitch lost 4 of the fabric's bridges and ports \(leaf1, leaf1-eth1, "
                               r"leaf1-eth2, leaf1-eth3\): deleted by another tool \(mn -c, ovs-vsctl\)\?"),
    ("ip link del spine2-eth1", r"Open vSwitch lost 2 of the fabric's bridges and ports \(leaf1-eth3, spine2-eth1\): "
                                r"deleted by another tool \(mn -c, ovs-vsctl\)\?"),  # a veth goes with its peer
    ("mn -c", r"the shells of .+ exited \(the network was torn down by another tool, e\.g\. mn -c\?\)"),
], ids=["bridge", "veth", "mn-c"])
def test_a_fabric_torn_down_behind_its_back_is_reported_within_a_second(tmp_path, how, reported):
    stdout, _ = fabric_script(TORN_DOWN, how, str(tmp_path), timeout=120, hung=f"the fabric hung after {how}")
    (report,) = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    print(report)
    assert report["after_s"] < 1.0
    assert re.fullmatch(reported, report["error"]), report["error"]
    assert leftovers() == []


OVS_STOPPED = """
import json, subprocess, sys, time
from emulation import fabric
fabric.VSWITCHD_RETURN_S = 3.0
with fabric.Fabric("leafspine", {"spines": 1, "leaves": 2, "hosts_per_leaf": 1}, workdir=sys.argv[1]) as fab:
    fab.wait_reachable()
    subprocess.run(["ovs-appctl", "-t", "ovs-vswitchd", "exit"], check=True)  # ovsdb-server stays
    began = time.monotonic()
    while time.monotonic() - began < 30:
        try:
            fab.check()
        except fabric.FabricError as error:
            print(json.dumps({"after_s": time.monotonic() - began, "error": str(error)}), flush=True)
            break
        time.sleep(0.1)
"""


@pytest.fixture
def open_vswitch_running():
    """Whatever happens in the test, Open vSwitch runs after it (it restarts it machine-wide)."""
    yield
    if not machine.ovs_running():
        machine.prepare()


def test_open_vswitch_restarted_under_a_running_fabric_is_recovered(tmp_path, open_vswitch_running):
    with Fabric("leafspine", {"spines": 1, "leaves": 2, "hosts_per_leaf": 1, "host_bw": 50}, workdir=tmp_path) as fab:
        fab.wait_reachable()
        first = fab.vswitchd
        _, client = iperf(fab, "h1", "h2", 5201, 12)
        time.sleep(2)
        faults = []
        with ThreadPoolExecutor(1) as pool:
            began = time.monotonic()
            restart = pool.submit(machine._ovs_ctl, "restart")  # as an operator would, from another terminal
            while not faults:
                assert time.monotonic() - began < 90, "the restart was never recovered nor reported"
                if fault := fab.check():
                    faults.append(fault)
                time.sleep(1.0)
            restart.result(timeout=60)
        print(faults)
        assert re.fullmatch(r"ovs-vswitchd restarted \(pid \d+ -> \d+\); ports back and shaped again, "
                            r"switches reconnected in \d+\.\d s", faults[0])
        assert fab.vswitchd == machine.vswitchd_pid() != first
        assert len(fab.shaped_ports()) == 6 and fab.unshaped_ports() == []
        assert goodput_mbps(client) > 10, "the TCP flow went on after the restart"
        fab.wait_reachable(timeout=30)
        assert fab.check() == ""
        # the new ovs-vswitchd's sockets got the buffers machine.py raised (it has sent: pings)
        assert machine.transmit_buffer_bytes() >= machine.TRANSMIT_BUFFER_BYTES
        ports = {intf.name for intf in fab.shaped_ports()}
        buffers = {s.interface: s.rcvbuf for s in machine.vswitchd_packet_sockets() if s.interface in ports}
        assert set(buffers) == ports and min(buffers.values()) >= machine.PORT_RECEIVE_BUFFER_BYTES
    assert leftovers() == []


def test_open_vswitch_stopped_under_a_fabric_fails_it_and_the_teardown_ends(tmp_path, open_vswitch_running):
    """Mininet's teardown waits forever for an ovs-vswitchd that is gone (every ovs-vsctl call waits
    for it to apply the change); the fabric removes its network without Mininet then."""
    stdout, stderr = fabric_script(OVS_STOPPED, str(tmp_path), timeout=90, hung="the teardown hung without OVS")
    (report,) = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    print(report)
    assert 3 <= report["after_s"] < 10
    assert re.fullmatch(r"Open vSwitch stopped \(ovs-vswitchd pid \d+\) and did not come back with the fabric "
                        r"in 3 s \(missing: ovs-vswitchd\)", report["error"])
    assert "ovs-vswitchd is not running; removing the network without Mininet" in stderr
    machine.prepare()
    assert machine.ovs_running()
    assert leftovers() == [], "the fabric's bridges came back with ovs-vswitchd"

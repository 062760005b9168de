"""Integration: the fabric is the network its parameters describe. Every interface at the fabric's
MTU (jumbo by default, 1500 selectable), DF pings of a full frame across the spines, the transmit
buffer OVS runs with, the hosts' TCP congestion control, and a high class that keeps its rate and
loses nothing while a lower class overloads the same port."""
from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from helpers.fabric import make_fabric
from emulation.machine import TRANSMIT_BUFFER_BYTES, port_socket_drops, transmit_buffer_bytes
from emulation.ovslog import OvsLog


SHAPE = {"spines": 2, "leaves": 2, "hosts_per_leaf": 2, "host_bw": 20, "fabric_bw": 100}


@pytest.fixture(scope="module", params=[(9000, "cubic"), (1500, "reno")], ids=["jumbo", "1500"])
def fabric(request, tmp_path_factory):
    mtu, tcp_cc = request.param
    yield from make_fabric(tmp_path_factory, "leafspine", {**SHAPE, "mtu": mtu, "tcp_cc": tcp_cc}, "ecmp")


def mtu_of(node, intf: str) -> int:
    return int(re.search(r" mtu (\d+) ", node.cmd(f"ip link show dev {intf}")).group(1))


def test_every_interface_has_the_fabric_mtu(fabric):
    mtu = fabric.params["mtu"]
    ends = 0
    for link in fabric.net.links:
        for intf in (link.intf1, link.intf2):
            assert mtu_of(intf.node, intf.name) == mtu, f"{intf.name} (ip link)"
            ends += 1
            if intf.node in fabric.net.switches:
                ovs = subprocess.run(["ovs-vsctl", "get", "Interface", intf.name, "mtu", "mtu_request"],
                                     capture_output=True, text=True, check=True).stdout.split()
                assert ovs == [str(mtu), str(mtu)], f"{intf.name} (OVS mtu, mtu_request)"
    assert ends == 2 * (4 + 4)


def test_full_frames_cross_the_spines_unfragmented(fabric):
    mtu = fabric.params["mtu"]
    h1 = fabric.host("h1")
    payload = mtu - 28  # ICMP + IP headers
    out = h1.cmd(f"ping -c 3 -i 0.2 -W 1 -M do -s {payload} 10.0.0.3")
    assert " 0% packet loss" in out, out
    too_big = h1.cmd(f"ping -c 1 -W 1 -M do -s {payload + 1} 10.0.0.3")
    assert "message too long" in too_big.lower() or "100% packet loss" in too_big, too_big


def test_hosts_run_the_pinned_congestion_control(fabric, tmp_path):
    tcp_cc = fabric.params["tcp_cc"]
    for host in fabric.hosts:
        assert host.cmd("sysctl -n net.ipv4.tcp_congestion_control").strip() == tcp_cc
    server = fabric.popen("h3", ["iperf3", "-s", "-1", "-p", "5801"])
    time.sleep(0.5)
    client = fabric.popen("h1", ["iperf3", "-c", "10.0.0.3", "-p", "5801", "-t", "1", "-J"])
    report = json.loads(client.communicate(timeout=30)[0])
    server.wait(10)
    assert report["end"]["sender_tcp_congestion"] == tcp_cc


def test_ovs_transmits_with_the_buffer_the_fabric_needs(fabric):
    fabric.net.pingAll(timeout=1)  # OVS has sent: its transmit socket exists
    assert transmit_buffer_bytes() >= TRANSMIT_BUFFER_BYTES
    assert int(open("/proc/sys/net/core/wmem_default").read()) >= TRANSMIT_BUFFER_BYTES


def class_queues(dev: str) -> dict[int, dict]:
    """Per class selector, the stats of `dev`'s class queue."""
    qdiscs = json.loads(subprocess.run(["tc", "-s", "-j", "qdisc", "show", "dev", dev],
                                       capture_output=True, text=True, check=True).stdout)
    return {int(q["parent"][-1]): q for q in qdiscs if q.get("parent", "").startswith("1:1")}


def udp(fabric, src: str, port: int, mbps: float, dscp: int, seconds: int):
    """An iperf3 UDP flow src -> h3 at `mbps` with DSCP `dscp`; returns the client process."""
    fabric.popen("h3", ["iperf3", "-s", "-1", "-p", str(port)])
    time.sleep(0.3)
    return fabric.popen(src, ["iperf3", "-c", "10.0.0.3", "-p", str(port), "-u", "-b", f"{mbps}M",
                              "-t", str(seconds), "--dscp", str(dscp), "-J"])


def test_a_higher_class_keeps_its_rate_and_loses_nothing_while_a_lower_class_overloads(fabric):
    """Into h3's 20 Mbit/s port: CS0 UDP at 40 Mbit/s (twice the link) and CS5 UDP at 8 Mbit/s.
    CS5 must get all it sends, with no loss; the overload is dropped in CS0's queue only, and
    nothing is dropped outside the class queues (OVS transmit errors, port sockets)."""
    dev = "leaf2-eth1"  # leaf2's port to h3
    log, sockets_before, before = OvsLog(), port_socket_drops(), class_queues(dev)
    flood = udp(fabric, "h2", 5901, 40, 0, 5)
    time.sleep(1)
    marked = udp(fabric, "h1", 5902, 8, 40, 3)
    report = json.loads(marked.communicate(timeout=30)[0])["end"]["sum"]
    flood.communicate(timeout=30)
    after = class_queues(dev)
    print(f"CS5 {report['bits_per_second'] / 1e6:.2f} Mbit/s, lost {report['lost_packets']} of "
          f"{report['packets']}; CS0 queue drops {after[0]['drops'] - before[0]['drops']}")
    assert report["lost_packets"] == 0 and report["packets"] > 100
    assert report["bits_per_second"] >= 0.95 * 8e6
    assert after[0]["drops"] - before[0]["drops"] > 100, "the flood overflowed its own queue"
    assert after[5]["drops"] == before[5]["drops"]
    assert log.transmit_errors().total == 0
    assert sum(port_socket_drops().values()) - sum(sockets_before.values()) == 0


def test_a_fifo_job_that_marks_droppable_datagrams_loses_those_first(fabric):
    """A job registered under `fifo` with drop marking: its LE-marked datagrams (DSCP 1) are moved
    to the droppable class, so when h1's LE flow and h2's unmarked flow overload h3's 20 Mbit/s
    port together, the loss falls on the LE flow and the unmarked one keeps its rate."""
    job = {"job": "fifo-drops", "policy": "fifo", "hosts": ["10.0.0.1", "10.0.0.2"],
           "layers": [{"index": 0, "name": "w", "bytes": 4}], "flows": []}
    fabric.rest("/jobs", "POST", job)
    try:
        lower_effort = udp(fabric, "h1", 5903, 15, 1, 5)
        unmarked = udp(fabric, "h2", 5904, 15, 0, 4)
        kept = json.loads(unmarked.communicate(timeout=30)[0])["end"]["sum"]
        dropped = json.loads(lower_effort.communicate(timeout=30)[0])["end"]["sum"]
    finally:
        fabric.rest("/jobs/fifo-drops", "DELETE")
    print(f"LE lost {dropped['lost_percent']:.1f}%, unmarked lost {kept['lost_percent']:.1f}% "
          f"at {kept['bits_per_second'] / 1e6:.2f} Mbit/s")
    assert kept["packets"] > 100 and kept["lost_percent"] < 2
    assert dropped["lost_percent"] > 20

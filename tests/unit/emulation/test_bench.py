"""The fabric benchmark's readings across servers: each other server's OVS log from where it was, and
the bytes the crossing links' ends sent into their tunnels. Nodes here run the bench's real shell
commands, over files standing in for the server's log and sysfs."""
from __future__ import annotations

import subprocess
from types import SimpleNamespace

from emulation import bench
from emulation.ovslog import OVS_LOG

SEND_ERROR = "2026-12-04T18:00:00.000Z|00001|netdev_linux|WARN|error sending Ethernet packet on {}: Resource " \
             "temporarily unavailable\n"


class Node:
    """A node whose shell runs on `server`, with that server's OVS log and /sys/class/net under `root`."""

    def __init__(self, name: str, server: str, root) -> None:
        self.name, self.server, self.root = name, server, root
        (root / "sys").mkdir(parents=True, exist_ok=True)

    def cmd(self, command: str) -> str:
        command = command.replace(str(OVS_LOG), str(self.root / "ovs.log"))
        command = command.replace("/sys/class/net", str(self.root / "sys"))
        return subprocess.run(["sh", "-c", command], capture_output=True, text=True).stdout

    def sent(self, intf: str, nbytes: int) -> None:
        path = self.root / "sys" / intf / "statistics"
        path.mkdir(parents=True, exist_ok=True)
        (path / "tx_bytes").write_text(f"{nbytes}\n")

    def log(self, text: str) -> None:
        with open(self.root / "ovs.log", "a") as log:
            log.write(text)


def link(node1: Node, name1: str, node2: Node, name2: str):
    return SimpleNamespace(intf1=SimpleNamespace(node=node1, name=name1),
                           intf2=SimpleNamespace(node=node2, name=name2))


def fabric(tmp_path):
    """A 2x2 leaf-spine split as the bench splits it: leaf1 and spine1 here, leaf2 and spine2 on srv2."""
    leaf1, spine1 = Node("leaf1", "localhost", tmp_path / "here"), Node("spine1", "localhost", tmp_path / "here")
    leaf2, spine2 = Node("leaf2", "srv2", tmp_path / "srv2"), Node("spine2", "srv2", tmp_path / "srv2")
    links = [link(leaf1, "leaf1-eth5", spine1, "spine1-eth1"), link(leaf1, "leaf1-eth6", spine2, "spine2-eth1"),
             link(leaf2, "leaf2-eth5", spine1, "spine1-eth2"), link(leaf2, "leaf2-eth6", spine2, "spine2-eth2")]
    net = SimpleNamespace(switches=[leaf1, spine1, leaf2, spine2], links=links)
    return SimpleNamespace(servers=["localhost", "srv2"], net=net), (leaf1, spine1, leaf2, spine2)


def test_only_links_between_servers_are_counted_as_tunnels_each_end_by_what_it_sent(tmp_path):
    fab, (leaf1, spine1, leaf2, spine2) = fabric(tmp_path)
    for node, intf, nbytes in ((leaf1, "leaf1-eth6", 1000), (spine2, "spine2-eth1", 20), (leaf2, "leaf2-eth5", 3000),
                               (spine1, "spine1-eth2", 40), (leaf1, "leaf1-eth5", 10**9)):
        node.sent(intf, nbytes)
    assert bench.tunnel_bytes(fab) == {"leaf1:leaf1-eth6": 1000, "spine2:spine2-eth1": 20,
                                       "leaf2:leaf2-eth5": 3000, "spine1:spine1-eth2": 40}


def test_one_fabric_on_one_machine_has_no_tunnels_and_no_other_server():
    fab = SimpleNamespace(servers=None, net=SimpleNamespace(switches=[object()], links=[object()]))
    assert bench.tunnel_bytes(fab) == {}
    assert bench.remote_switches(fab) == []


def test_another_servers_transmit_errors_are_those_logged_there_since_the_reading_began(tmp_path):
    fab, (_, _, leaf2, _) = fabric(tmp_path)
    leaf2.log(SEND_ERROR.format("leaf2-eth1") * 3)
    [there] = bench.remote_switches(fab)
    assert there.server == "srv2"
    offset = bench.log_size(there)
    assert bench.transmit_errors_since(there, offset) == 0
    leaf2.log(SEND_ERROR.format("spine2-eth2") * 2)
    assert bench.transmit_errors_since(there, offset) == 2


def test_a_server_without_an_ovs_log_reads_as_empty(tmp_path):
    fab, _ = fabric(tmp_path)
    [there] = bench.remote_switches(fab)
    assert bench.log_size(there) == 0
    assert bench.transmit_errors_since(there, 0) == 0


def test_the_row_says_what_the_tunnels_carried_and_each_servers_errors():
    row = {"case": "MTU 9000, 8 flows both ways", "flows": 8, "aggregate_mbps": 786.1, "min_flow_mbps": 97.4,
           "max_flow_mbps": 98.9, "vswitchd_cores": 0.5, "vswitchd_busiest_thread": 0.5,
           "other_vswitchd_cores": [0.4], "other_vswitchd_busiest_thread": [0.4], "segments_per_s": 11000,
           "machine_util": 0.7, "steal": 0.001, "ovs_tx_errors": 0, "other_ovs_tx_errors": {"srv2": 3},
           "port_socket_drops": 0, "received_bytes": 592_000_000, "tunnel_bytes": 599_100_000}
    line = bench.format_row(row, 100)
    assert "on srv2 3" in line
    assert "tunnels sent 599.1 MB for the flows' 592.0 MB" in line
    assert "tunnels" not in bench.format_row({**row, "tunnel_bytes": None, "other_ovs_tx_errors": {}}, 100)

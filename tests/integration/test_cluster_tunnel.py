"""A crossing link of a fabric across servers, on one machine: two network namespaces play the two
servers (an underlay veth between them sized for VXLAN), two more play a node on each, and
emulation.cluster.vxlan_tunnel joins the nodes as it does across real servers. A jumbo frame must
cross it unfragmented."""
import json
import subprocess
import uuid
from dataclasses import dataclass

import pytest

from emulation.cluster import VXLAN_OVERHEAD, vxlan_tunnel
from topologies.marks import fabric_owner, owner_of_alias

MTU = 9000


def sh(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True)


@dataclass
class NamespacedNode:
    """What vxlan_tunnel asks of a node: its server (a namespace here, a machine over SSH in a
    cluster), the server's address, a command in the server's root namespace, and where its own
    namespace is (a process in it)."""
    server: str
    serverIP: str
    node_ns: str
    pid: int = 0

    def rcmd(self, command: str) -> str:
        done = sh("ip", "netns", "exec", self.server, "sh", "-c", command)
        return done.stdout + done.stderr


@pytest.fixture
def two_servers():
    tag = uuid.uuid4().hex[:6]
    spaces = [f"dnnt-srv{i}-{tag}" for i in (1, 2)] + [f"dnnt-node{i}-{tag}" for i in (1, 2)]
    sleepers = []
    try:
        for space in spaces:
            assert sh("ip", "netns", "add", space).returncode == 0
        srv1, srv2, node1, node2 = spaces
        assert sh("ip", "link", "add", f"u1{tag}", "netns", srv1, "mtu", str(MTU + VXLAN_OVERHEAD), "type", "veth",
                  "peer", "name", f"u2{tag}", "netns", srv2, "mtu", str(MTU + VXLAN_OVERHEAD)).returncode == 0
        for space, end, address in ((srv1, f"u1{tag}", "10.250.0.1/30"), (srv2, f"u2{tag}", "10.250.0.2/30")):
            assert sh("ip", "-n", space, "addr", "add", address, "dev", end).returncode == 0
            assert sh("ip", "-n", space, "link", "set", end, "up").returncode == 0
        nodes = []
        for server, ip, space in ((srv1, "10.250.0.1", node1), (srv2, "10.250.0.2", node2)):
            sleeper = subprocess.Popen(["ip", "netns", "exec", space, "sleep", "120"])
            sleepers.append(sleeper)
            nodes.append(NamespacedNode(server, ip, space, sleeper.pid))
        yield nodes
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
        for space in spaces:
            sh("ip", "netns", "del", space)


def move(name: str, node: NamespacedNode) -> None:
    assert node.rcmd(f"ip link set {name} netns {node.pid}") == ""


def test_a_jumbo_frame_crosses_a_vxlan_link_between_two_servers(two_servers):
    node1, node2 = two_servers
    owner = fabric_owner("tunnel1")
    vxlan_tunnel(node1, node2, "leaf1-eth3", "spine1-eth1", None, None, vni=7, local_ip=node1.serverIP, move=move,
                 owner=owner)
    for node, name in ((node1, "leaf1-eth3"), (node2, "spine1-eth1")):  # what clean-up looks for
        [link] = json.loads(sh("ip", "-n", node.node_ns, "-j", "link", "show", name).stdout)
        assert owner_of_alias(link.get("ifalias")) == owner, link
    for node, address in ((node1, "192.168.250.1/24"), (node2, "192.168.250.2/24")):
        name = "leaf1-eth3" if node is node1 else "spine1-eth1"
        for command in (["link", "set", name, "mtu", str(MTU)], ["addr", "add", address, "dev", name],
                        ["link", "set", name, "up"]):
            assert sh("ip", "-n", node.node_ns, *command).returncode == 0, command
    ping = sh("ip", "netns", "exec", node1.node_ns, "ping", "-c", "3", "-W", "2", "-M", "do", "-s", str(MTU - 28),
              "192.168.250.2")
    assert ping.returncode == 0, ping.stdout + ping.stderr
    assert " 0% packet loss" in ping.stdout


def test_a_tunnel_that_cannot_be_made_names_its_end(two_servers):
    node1, node2 = two_servers
    node2.serverIP = "not-an-address"
    with pytest.raises(Exception, match="VXLAN end leaf1-eth3 on dnnt-srv1"):
        vxlan_tunnel(node1, node2, "leaf1-eth3", "spine1-eth1", None, None, vni=8, local_ip=node1.serverIP, move=move)

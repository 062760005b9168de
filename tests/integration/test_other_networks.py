"""Networks that are not a fabric's share the machine with ours: a plain Mininet network, and one
built by hand with our own Topo (as `mn --custom topologies/leafspine.py` builds it, marked
hand-run). A fabric starting and stopping beside them and `make clean-net` leave them as they
were; a fabric whose names they already use refuses to start in one line instead of tearing them
down."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from emulation.cleanup import marked_bridges
from emulation.fabric import Fabric, FabricError
from helpers import REPO
from helpers.fabric import leftovers

FOREIGN = """
import sys
from functools import partial
from mininet.net import Mininet
from mininet.node import OVSSwitch
from mininet.topo import Topo
class Foreign(Topo):
    def build(self):
        edge, core = self.addSwitch('edge1', dpid='1'), self.addSwitch('core1', dpid='2')
        self.addLink(edge, core)
        self.addLink(self.addHost('x1'), edge)
net = Mininet(topo=Foreign(), switch=partial(OVSSwitch, datapath='user', failMode='standalone'), controller=None)
net.start(); print('up', flush=True)
sys.stdin.read()
net.stop()
"""
# What `mn --custom topologies/leafspine.py --topo fattree,k=2` builds, without mn's CLI (and
# without its clean-up on errors, which is `mn -c`).
HAND_RUN = """
import sys
sys.path.insert(0, sys.argv[1])
from mininet.net import Mininet
from topologies.leafspine import topos
net = Mininet(topo=topos['fattree'](k=2), controller=None, autoSetMacs=False, autoStaticArp=False)
net.start(); print('up', flush=True)
sys.stdin.read()
net.stop()
"""
FAT_TREE_2 = ("core1", "agg1", "agg2", "edge1", "edge2")


def network(script: str) -> subprocess.Popen:
    """A network run by Debian's Python (as `mn` runs), up once this returns, stopped by closing stdin."""
    process = subprocess.Popen(["/usr/bin/python3", "-c", script, str(REPO)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "up"
    return process


def state_of(switches: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """The bridges of these names with their external ids, and their interfaces with their aliases."""
    bridges = {}
    for name in subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True).stdout.split():
        if name in switches:
            bridges[name] = subprocess.run(["ovs-vsctl", "br-get-external-id", name], capture_output=True,
                                           text=True).stdout.strip()
    links = json.loads(subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True).stdout)
    interfaces = {link["ifname"]: link.get("ifalias", "") for link in links
                  if link["ifname"].split("-")[0] in switches}
    return {"bridges": bridges, "interfaces": interfaces}


def clean_net(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "emulation.cleanup", *args], cwd=REPO, check=True,
                          capture_output=True, text=True).stdout


def test_clean_up_leaves_a_foreign_mininet_network_alone(tmp_path):
    """A plain Mininet network (not ours) whose switches are named like a fat-tree's, edge1 and
    core1, runs while one of our fabrics starts (and cleans up what a killed fabric left) and stops."""
    foreign = network(FOREIGN)
    try:
        before = state_of(("edge1", "core1"))
        assert set(before["bridges"]) == {"edge1", "core1"} and "edge1-eth1" in before["interfaces"]
        with Fabric("leafspine", {"spines": 1, "leaves": 1, "hosts_per_leaf": 1}, workdir=tmp_path / "ours"):
            pass
        clean_net()
        assert state_of(("edge1", "core1")) == before, "clean-up touched a network that is not ours"
    finally:
        foreign.communicate("", timeout=60)


def test_a_hand_run_network_of_our_topo_is_left_alone_and_a_fabric_of_its_names_refused(tmp_path):
    hand_run = network(HAND_RUN)
    try:
        before = state_of(FAT_TREE_2)
        assert set(before["bridges"]) == set(FAT_TREE_2)
        assert set(before["bridges"].values()) == {"dnn-testbed=hand-run"}
        assert len(before["interfaces"]) == 10 + 5  # a port per link end on a switch, and each bridge's own
        assert set(before["interfaces"].values()) == {"dnn-testbed hand-run"}

        with Fabric("leafspine", {"spines": 1, "leaves": 1, "hosts_per_leaf": 1}, workdir=tmp_path / "beside") as fab:
            mine = {name: owner for name, owner in marked_bridges().items() if name not in FAT_TREE_2}
            assert mine == {"spine1": f"fabric-{fab.id}", "leaf1": f"fabric-{fab.id}"}
            assert state_of(("leaf1",))["interfaces"]["leaf1-eth1"] == f"dnn-testbed fabric-{fab.id}"
            fab.wait_reachable()
        assert state_of(FAT_TREE_2) == before

        with pytest.raises(FabricError) as refused:
            with Fabric("fattree", {"k": 2}, workdir=tmp_path / "clash"):
                pytest.fail("a fabric was built over a running network of its names")
        message = str(refused.value)
        print(message)
        assert "\n" not in message
        assert message.startswith("agg1, agg1-eth1, agg1-eth2, agg2 and 11 more already exist, of a network "
                                  "built by hand with our Topo (mn): this fabric would tear it down")
        assert state_of(FAT_TREE_2) == before
        assert leftovers() == []

        said = clean_net()
        assert "left alone: the bridges agg1, agg2, core1, edge1, edge2 of networks built by hand" in said
        assert state_of(FAT_TREE_2) == before and hand_run.poll() is None
    finally:
        hand_run.communicate("", timeout=60)
    assert state_of(FAT_TREE_2) == {"bridges": {}, "interfaces": {}}
    assert leftovers() == []

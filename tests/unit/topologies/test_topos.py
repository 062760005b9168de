"""Leaf-spine and fat-tree Topos (built as graphs only, no network) and the HTB shaping lines."""
import math
import re

import pytest

from topologies.leafspine import FatTreeTopo, LeafSpineTopo, TopologyError
from topologies.nodes import DEFAULT_QUEUE_BYTES, FabricHost, FabricLink, OVSUserSwitch
from common.frames import DEFAULT_MTU
from topologies.shaping import DROPPABLE_QUEUE_PACKETS, class_id, class_queue_packets, htb_classes, htb_priority_tree


def ports_of(topo):
    """node -> {port: peer node}, from the links' port1/port2."""
    ports = {}
    for _, _, info in topo.links(withInfo=True):
        for me, peer, port in (("node1", "node2", "port1"), ("node2", "node1", "port2")):
            assert info[port] not in ports.setdefault(info[me], {}), f"{info[me]} port reused"
            ports[info[me]][info[port]] = info[peer]
    return ports


def dpids(topo):
    return {s: int(topo.nodeInfo(s)["dpid"], 16) for s in topo.switches()}


def check_common(topo, hosts: int):
    """Switch classes and DPID strings, links' classes/rates, hosts h1..hN with their addresses."""
    for s in topo.switches():
        info = topo.nodeInfo(s)
        assert info["cls"] is OVSUserSwitch
        assert re.fullmatch(r"[0-9a-f]{16}", info["dpid"]), info["dpid"]
    assert len(set(dpids(topo).values())) == len(topo.switches()), "DPIDs are distinct"
    assert topo.hosts() == [f"h{n}" for n in range(1, hosts + 1)]
    for n in range(1, hosts + 1):
        info = topo.nodeInfo(f"h{n}")
        assert info["ip"] == f"10.0.{n >> 8}.{n & 0xFF}/8"
        assert info["mac"] == f"00:00:00:00:{n >> 8:02x}:{n & 0xFF:02x}"
    for src, dst, info in topo.links(withInfo=True):
        assert info["cls"] is FabricLink
        assert info["bw"] > 0 and info["queue_bytes"] >= 9014 and info["mtu"] == DEFAULT_MTU == 9000
        assert topo.linkInfo(src, dst) == info


# -- leaf-spine -------------------------------------------------------------------------------
@pytest.mark.parametrize("spines, leaves, hosts", [(2, 2, 2), (3, 4, 1), (1, 1, 3), (4, 2, 3)])
def test_leaf_spine_shape(spines, leaves, hosts):
    topo = LeafSpineTopo(spines=spines, leaves=leaves, hosts_per_leaf=hosts, host_bw=50, fabric_bw=200)
    check_common(topo, leaves * hosts)
    assert sorted(topo.switches()) == sorted(
        [f"spine{s}" for s in range(1, spines + 1)] + [f"leaf{n}" for n in range(1, leaves + 1)])
    assert len(topo.links()) == leaves * hosts + leaves * spines
    ids = dpids(topo)
    ports = ports_of(topo)
    for s in range(1, spines + 1):
        assert ids[f"spine{s}"] == 0x2000 + s
        assert ports[f"spine{s}"] == {n: f"leaf{n}" for n in range(1, leaves + 1)}
    for leaf in range(1, leaves + 1):
        assert ids[f"leaf{leaf}"] == 0x1000 + leaf
        expected = {p: f"h{(leaf - 1) * hosts + p}" for p in range(1, hosts + 1)}
        expected.update({hosts + s: f"spine{s}" for s in range(1, spines + 1)})
        assert ports[f"leaf{leaf}"] == expected, "hosts leaf-major, then uplinks"
    for n in range(1, leaves * hosts + 1):
        assert list(ports[f"h{n}"]) == [0]
    for _, _, info in topo.links(withInfo=True):
        host_link = info["node1"].startswith("h") or info["node2"].startswith("h")
        assert info["bw"] == (50 if host_link else 200)
        assert info["queue_bytes"] == DEFAULT_QUEUE_BYTES


def test_leaf_spine_defaults_and_queue_bytes():
    topo = LeafSpineTopo(queue_bytes=100_000)
    assert len(topo.switches()) == 4 and len(topo.hosts()) == 4 and len(topo.links()) == 8
    assert {info["queue_bytes"] for _, _, info in topo.links(withInfo=True)} == {100_000}
    assert {info["bw"] for _, _, info in topo.links(withInfo=True)} == {100.0}


@pytest.mark.parametrize("cls, params", [(LeafSpineTopo, {}), (FatTreeTopo, {"k": 2})])
def test_mtu_and_tcp_cc_reach_every_link_and_host(cls, params):
    assert {info["mtu"] for _, _, info in cls(**params).links(withInfo=True)} == {9000}
    topo = cls(mtu=1500, tcp_cc="reno", **params)
    assert {info["mtu"] for _, _, info in topo.links(withInfo=True)} == {1500}
    for host in topo.hosts():
        assert topo.nodeInfo(host)["cls"] is FabricHost
        assert topo.nodeInfo(host)["tcp_cc"] == "reno"


def test_addresses_past_255_hosts():
    topo = LeafSpineTopo(spines=1, leaves=1, hosts_per_leaf=300)
    check_common(topo, 300)
    assert topo.nodeInfo("h256")["ip"] == "10.0.1.0/8"
    assert topo.nodeInfo("h300")["mac"] == "00:00:00:00:01:2c"


def test_many_leaves_are_refused_or_keep_distinct_dpids():
    try:
        topo = LeafSpineTopo(spines=1, leaves=4097, hosts_per_leaf=1)
    except TopologyError as err:
        assert str(err).startswith("leaves: ")
        return
    assert len(set(dpids(topo).values())) == len(topo.switches())


# -- fat-tree ---------------------------------------------------------------------------------
def test_fat_tree_k4():
    topo = FatTreeTopo(k=4, bw=40)
    check_common(topo, 16)
    assert len(topo.switches()) == 20 and len(topo.hosts()) == 16 and len(topo.links()) == 48
    names = set(topo.switches())
    assert names == ({f"core{c}" for c in range(1, 5)} | {f"agg{a}" for a in range(1, 9)}
                     | {f"edge{e}" for e in range(1, 9)})
    ids = dpids(topo)
    ports = ports_of(topo)
    for c in range(1, 5):
        assert ids[f"core{c}"] == 0x2000 + c
        # core port pod+1 faces an aggregation switch of that pod: agg (c-1)//2+1 of it.
        assert ports[f"core{c}"] == {pod + 1: f"agg{pod * 2 + (c - 1) // 2 + 1}" for pod in range(4)}
    for i in range(1, 9):
        first = (i - 1) // 2 * 2 + 1  # the first edge/agg of its pod
        assert ids[f"agg{i}"] == 0x3000 + i and ids[f"edge{i}"] == 0x1000 + i
        assert ports[f"edge{i}"] == {1: f"h{2 * i - 1}", 2: f"h{2 * i}",
                                     3: f"agg{first}", 4: f"agg{first + 1}"}
        a = i - first  # 0 or 1 within its pod
        assert ports[f"agg{i}"] == {1: f"edge{first}", 2: f"edge{first + 1}",
                                    3: f"core{2 * a + 1}", 4: f"core{2 * a + 2}"}
    assert {info["bw"] for _, _, info in topo.links(withInfo=True)} == {40.0}


@pytest.mark.parametrize("k", [2, 6])
def test_fat_tree_sizes(k):
    topo = FatTreeTopo(k=k)
    check_common(topo, k ** 3 // 4)
    assert len(topo.switches()) == 5 * k * k // 4
    assert len(topo.links()) == 3 * k ** 3 // 4
    assert all(sorted(p) == list(range(1, k + 1))
               for node, p in ports_of(topo).items() if not node.startswith("h"))


# -- bad parameters ---------------------------------------------------------------------------
@pytest.mark.parametrize("cls, params, name", [
    (LeafSpineTopo, {"spines": 0}, "spines"),
    (LeafSpineTopo, {"spines": True}, "spines"),
    (LeafSpineTopo, {"spines": 2.0}, "spines"),
    (LeafSpineTopo, {"leaves": -1}, "leaves"),
    (LeafSpineTopo, {"leaves": "2"}, "leaves"),
    (LeafSpineTopo, {"hosts_per_leaf": -1}, "hosts_per_leaf"),
    (LeafSpineTopo, {"hosts_per_leaf": False}, "hosts_per_leaf"),
    (LeafSpineTopo, {"hosts_per_leaf": 1 << 23, "leaves": 3}, "hosts_per_leaf"),
    (LeafSpineTopo, {"host_bw": -5}, "host_bw"),
    (LeafSpineTopo, {"host_bw": True}, "host_bw"),
    (LeafSpineTopo, {"host_bw": float("nan")}, "host_bw"),
    (LeafSpineTopo, {"fabric_bw": 0}, "fabric_bw"),
    (LeafSpineTopo, {"fabric_bw": "100"}, "fabric_bw"),
    (LeafSpineTopo, {"queue_bytes": 1513}, "queue_bytes"),
    (FatTreeTopo, {"k": 3}, "k"),
    (FatTreeTopo, {"k": 0}, "k"),
    (FatTreeTopo, {"k": True}, "k"),
    (FatTreeTopo, {"k": 4.0}, "k"),
    (FatTreeTopo, {"bw": 0}, "bw"),
    (FatTreeTopo, {"bw": -1.5}, "bw"),
    (FatTreeTopo, {"queue_bytes": 0}, "queue_bytes"),
    (LeafSpineTopo, {"mtu": 1279}, "mtu"),
    (LeafSpineTopo, {"mtu": 9001}, "mtu"),
    (LeafSpineTopo, {"mtu": 1500, "queue_bytes": 1513}, "queue_bytes"),
    (LeafSpineTopo, {"queue_bytes": 9013}, "queue_bytes"),
    (FatTreeTopo, {"mtu": "9000"}, "mtu"),
    (LeafSpineTopo, {"tcp_cc": "vegas"}, "tcp_cc"),
    (FatTreeTopo, {"tcp_cc": 1}, "tcp_cc"),
])
def test_bad_parameters_name_themselves(cls, params, name):
    with pytest.raises(TopologyError) as err:
        cls(**params)
    assert str(err.value).startswith(f"{name}: "), str(err.value)
    assert isinstance(err.value, ValueError)


# -- shaping ----------------------------------------------------------------------------------
def test_htb_priority_tree():
    lines = htb_priority_tree("leaf1-eth3", 100, 262144, 9000)
    assert len(lines) == 2 + 8 * 3
    assert lines[0] == "qdisc replace dev leaf1-eth3 root handle 1: htb default 17"
    assert lines[1].startswith("class replace dev leaf1-eth3 parent 1: classid 1:1 htb ")
    assert "rate 100mbit ceil 100mbit" in lines[1]
    for line in lines:
        assert " dev leaf1-eth3 " in line
        if " htb " in line and line.startswith("class"):
            assert "burst 64k cburst 64k" in line and "quantum 9014" in line, "a quantum of one full frame"
    classes = [line for line in lines if line.startswith("class ") and "parent 1:1 " in line]
    queues = [line for line in lines if line.startswith("qdisc ") and "pfifo_head_drop" in line]
    filters = [line for line in lines if line.startswith("filter ")]
    assert len(classes) == len(queues) == len(filters) == 8
    for cs in range(8):
        cid = class_id(cs)
        assert cid == f"1:{0x10 + cs:x}"
        (cls,) = [line for line in classes if f"classid {cid} " in line]
        prio = {7: 0, 6: 1, 5: 2, 4: 3, 3: 4, 2: 5, 0: 6, 1: 7}[cs]
        assert f"prio {prio} " in cls, "CS7 first (prio 0), CS2, CS0, the droppable CS1 last"
        assert "rate 1000kbit ceil 100mbit" in cls, "a 1% floor, the link as ceiling"
        (queue,) = [line for line in queues if f"parent {cid} " in line]
        # 262144 bytes are 29 frames of 9014 bytes; CS1's queue is short
        assert queue.endswith(f"pfifo_head_drop limit {10 if cs == 1 else 29}"), queue
        (flt,) = [line for line in filters if line.endswith(f"flowid {cid}")]
        assert f"u32 match ip tos 0x{cs << 5:02x} 0xe0 " in flt
        assert "protocol ip" in flt
    tos = sorted(re.search(r"tos (0x[0-9a-f]{2}) 0xe0", f).group(1) for f in filters)
    assert tos == ["0x00", "0x20", "0x40", "0x60", "0x80", "0xa0", "0xc0", "0xe0"]
    assert len({line.split(" handle ")[1].split()[0] for line in filters}) == 8, "distinct filter handles"


def test_rate_cut_lines_are_the_trees_classes():
    tree = htb_priority_tree("h1-eth0", 20, 65536, 1500)
    classes = htb_classes("h1-eth0", 20, 1500)
    assert classes == [line for line in tree if line.startswith("class ")]
    assert all("quantum 1514" in line for line in classes)


@pytest.mark.parametrize("rate, ceil, floor", [(2.5, "2.5mbit", "25kbit"), (0.5, "0.5mbit", "8kbit"),
                                              (1000, "1000mbit", "10000kbit")])
def test_htb_rates(rate, ceil, floor):
    lines = htb_priority_tree("h1-eth0", rate, 1514, 1500)
    assert f"rate {ceil} ceil {ceil}" in lines[1]
    assert all(f"rate {floor} ceil {ceil}" in line for line in lines if "parent 1:1 " in line)


@pytest.mark.parametrize("rate, queue, mtu, name", [
    (0, 65536, 1500, "rate_mbit"), (-1, 65536, 1500, "rate_mbit"), (math.nan, 65536, 1500, "rate_mbit"),
    (100, 1513, 1500, "queue_bytes"), (100, 9013, 9000, "queue_bytes"), (100, 0, 1500, "queue_bytes"),
    (100, 65536, 1279, "mtu"), (100, 65536, 9001, "mtu"), (100, 65536, 1500.0, "mtu"), (100, 65536, True, "mtu"),
])
def test_htb_bad_inputs(rate, queue, mtu, name):
    with pytest.raises(ValueError) as err:
        htb_priority_tree("h1-eth0", rate, queue, mtu)
    assert str(err.value).startswith(f"{name}: ")


def test_class_queue_packets_follow_the_mtu():
    assert DROPPABLE_QUEUE_PACKETS == 10
    assert class_queue_packets(262144, 1500) == [173, 10] + [173] * 6
    assert class_queue_packets(262144, 9000) == [29, 10] + [29] * 6
    assert class_queue_packets(9014, 9000) == [4] * 8, "never fewer than 4 packets, CS1 never longer"


def test_switch_shutdown_waits_for_ovs_a_bounded_time():
    """Unbounded, Mininet's ovs-vsctl waits forever for an ovs-vswitchd that stopped."""
    ran = []

    class Switch:
        pid = 4242

        def isOldOVS(self):
            return False

        def terminate(self):
            ran.append("terminated")

        def __str__(self):
            return "leaf1"

    OVSUserSwitch.batchShutdown([Switch()], run=lambda command, **_: ran.append(command))
    assert ran == ["ovs-vsctl --timeout=5 --if-exists del-br leaf1", "kill -HUP 4242", "terminated"]

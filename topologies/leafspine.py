"""Leaf-spine and fat-tree datacenter fabrics of userspace Open vSwitch switches, as Mininet Topos
built from their layout (topologies/layout.py: names, DPIDs, ports, addresses).

From the repo root:
    mn --custom topologies/leafspine.py --topo leafspine,spines=2,leaves=2,hosts_per_leaf=2,mtu=9000 \
       --controller remote,ip=127.0.0.1,port=6653 --test pingall
    mn --custom topologies/leafspine.py --topo file,path=experiments/topologies/clos3.yaml,host_bw=100 \
       --controller remote,ip=127.0.0.1,port=6653 --test pingall
"""
from __future__ import annotations

import inspect
import os
import sys

from mininet.topo import Topo

# `mn --custom` execs this file without __file__; the code object still knows its path.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(inspect.currentframe().f_code.co_filename)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from topologies.files import FabricFileError, read_fabric  # noqa: E402
from topologies.layout import MAX_HOSTS, MAX_PER_TIER, Layout, fat_tree, leaf_spine  # noqa: E402
from topologies.tcp import DEFAULT_TCP_CC, check_tcp_cc  # noqa: E402
from topologies.nodes import (DEFAULT_QUEUE_BYTES, FabricController, FabricHost, FabricLink,  # noqa: E402
                              OVSUserSwitch)
from common.frames import DEFAULT_MTU, check_mtu, frame_bytes  # noqa: E402


class TopologyError(ValueError):
    """An impossible topology parameter; the message names it and what is allowed."""


def _positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TopologyError(f"{name}: {value!r} is not allowed (an integer >= {minimum})")
    return value


def _positive_rate(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise TopologyError(f"{name}: {value!r} is not allowed (a rate in Mbit/s > 0)")
    return float(value)


def _checked(check, value):
    """value through a shaping/nodes check, its ValueError as a TopologyError."""
    try:
        return check(value)
    except ValueError as error:
        raise TopologyError(str(error)) from None


class FabricTopo(Topo):
    """A fabric's layout as Mininet nodes and links, with our classes, rates and MTU."""

    def _fabric_options(self, queue_bytes: int, mtu: int, tcp_cc: str) -> None:
        """Validate and keep the options every link and host of the fabric shares."""
        self.mtu = _checked(check_mtu, mtu)
        self.tcp_cc = _checked(check_tcp_cc, tcp_cc)
        self.queue_bytes = _positive_int("queue_bytes", queue_bytes, minimum=frame_bytes(self.mtu))

    def _add_layout(self, layout: Layout, host_bw: float, fabric_bw: float) -> None:
        self.layout = layout
        for node in layout.nodes:
            if node.is_switch:
                self.addSwitch(node.name, dpid=f"{node.dpid:016x}", cls=OVSUserSwitch)
            else:
                self.addHost(node.name, ip=f"{node.ip}/8", mac=node.mac, cls=FabricHost, tcp_cc=self.tcp_cc)
        for link in layout.links:
            self.addLink(link.a.name, link.b.name, port1=link.port_a, port2=link.port_b, cls=FabricLink,
                         bw=(host_bw if link.tier == "host" else fabric_bw) * link.speed, queue_bytes=self.queue_bytes,
                         mtu=self.mtu)

    def claim(self, owner: str) -> None:
        """Mark every switch and link this Topo builds as `owner`'s (topologies/marks.py); unclaimed,
        they are marked hand-run, as `mn` builds them."""
        for switch in self.switches():
            self.nodeInfo(switch)["owner"] = owner
        for _, _, info in self.links(withInfo=True):
            info["owner"] = owner


class LeafSpineTopo(FabricTopo):
    """`spines` x `leaves` leaf-spine with `hosts_per_leaf` hosts on each leaf; rates in Mbit/s, MTU in bytes (every
    interface), queues in bytes per class, `tcp_cc` the hosts' TCP congestion control.

    Oversubscription at a leaf = hosts_per_leaf*host_bw / (spines*fabric_bw)."""

    def build(self, spines: int = 2, leaves: int = 2, hosts_per_leaf: int = 2, host_bw: float = 100,
              fabric_bw: float = 100, queue_bytes: int = DEFAULT_QUEUE_BYTES,
              mtu: int = DEFAULT_MTU, tcp_cc: str = DEFAULT_TCP_CC) -> None:
        spines = _positive_int("spines", spines)
        leaves = _positive_int("leaves", leaves)
        for name, count in (("spines", spines), ("leaves", leaves)):
            if count > MAX_PER_TIER:
                raise TopologyError(f"{name}: {count} is not allowed (at most {MAX_PER_TIER})")
        hosts = _positive_int("hosts_per_leaf", hosts_per_leaf)
        host_bw = _positive_rate("host_bw", host_bw)
        fabric_bw = _positive_rate("fabric_bw", fabric_bw)
        self._fabric_options(queue_bytes, mtu, tcp_cc)
        if leaves * hosts > MAX_HOSTS:
            raise TopologyError(f"hosts_per_leaf: {leaves * hosts} hosts in all is not allowed "
                                f"(at most {MAX_HOSTS} addresses in 10.0.0.0/8)")
        self._add_layout(leaf_spine(spines, leaves, hosts), host_bw, fabric_bw)


class FatTreeTopo(FabricTopo):
    """k-ary fat-tree (Al-Fares et al.): k pods of k/2 edge and k/2 aggregation switches,
    (k/2)^2 cores, k/2 hosts per edge switch; every link at `bw` Mbit/s (MTU, queues and TCP
    congestion control as in LeafSpineTopo)."""

    def build(self, k: int = 4, bw: float = 100, queue_bytes: int = DEFAULT_QUEUE_BYTES,
              mtu: int = DEFAULT_MTU, tcp_cc: str = DEFAULT_TCP_CC) -> None:
        k = _positive_int("k", k, minimum=2)
        if k % 2:
            raise TopologyError(f"k: {k} is not allowed (an even integer >= 2)")
        bw = _positive_rate("bw", bw)
        self._fabric_options(queue_bytes, mtu, tcp_cc)
        if k * (k // 2) > MAX_PER_TIER:
            raise TopologyError(f"k: {k} is not allowed (at most 90: k*k/2 edge switches "
                                f"must fit in {MAX_PER_TIER} DPIDs)")
        self._add_layout(fat_tree(k), bw, bw)


class FileTopo(FabricTopo):
    """The fabric a file describes (topologies/files.py: switches by tier, hosts per leaf, links and their
    speeds), `path` from the repository root or absolute; host links at `host_bw`, switch links at
    `fabric_bw` times their speed (MTU, queues and TCP congestion control as in LeafSpineTopo)."""

    def build(self, path: str = "", host_bw: float = 100, fabric_bw: float = 100,
              queue_bytes: int = DEFAULT_QUEUE_BYTES, mtu: int = DEFAULT_MTU, tcp_cc: str = DEFAULT_TCP_CC) -> None:
        if not isinstance(path, str) or not path:
            raise TopologyError(f"path: {path!r} is not allowed (a fabric file, topologies/files.py)")
        host_bw = _positive_rate("host_bw", host_bw)
        fabric_bw = _positive_rate("fabric_bw", fabric_bw)
        self._fabric_options(queue_bytes, mtu, tcp_cc)
        try:
            layout = read_fabric(path)
        except FabricFileError as error:
            raise TopologyError(f"path: {path}: {error}") from None
        self._add_layout(layout, host_bw, fabric_bw)


topos = {"leafspine": LeafSpineTopo, "fattree": FatTreeTopo, "file": FileTopo}
switches = {"ovsuser": OVSUserSwitch}
# `mn --controller remote,...` gets the same remote controller with a check that cannot crash.
controllers = {"remote": FabricController}

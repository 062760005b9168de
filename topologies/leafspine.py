"""Leaf-spine and fat-tree datacenter fabrics of userspace Open vSwitch switches.

From the repo root:
    mn --custom topologies/leafspine.py --topo leafspine,spines=2,leaves=2,hosts=2,mtu=9000 \
       --controller remote,ip=127.0.0.1,port=6653 --test pingall

Conventions (deterministic, so runs and logs compare across builds):
  * names spine1.., leaf1.. (fat-tree: core1.., agg1.., edge1..), hosts h1..hN in leaf-major order;
  * DPIDs 0x1000+i for leaves/edges, 0x2000+i for spines/cores, 0x3000+i for aggregation;
  * a leaf's ports 1..hosts face its hosts and the next ones its uplinks, spine/core port j
    faces leaf/pod j; host n has IP 10.x.y.z = 10.0.0.0 + n (/8) and MAC 00:00:..:n.
"""
from __future__ import annotations

import inspect
import os
import sys

from mininet.topo import Topo
from mininet.util import ipAdd, macColonHex

# `mn --custom` execs this file without __file__; the code object still knows its path.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(inspect.currentframe().f_code.co_filename)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from topologies.machine import DEFAULT_TCP_CC, check_tcp_cc  # noqa: E402
from topologies.nodes import DEFAULT_QUEUE_BYTES, FabricHost, FabricLink, OVSUserSwitch  # noqa: E402
from topologies.shaping import DEFAULT_MTU, check_mtu, frame_bytes  # noqa: E402

MAX_HOSTS = (1 << 24) - 2  # host addresses in 10.0.0.0/8
LEAF_DPID, SPINE_DPID, AGG_DPID = 0x1000, 0x2000, 0x3000
MAX_PER_TIER = 0xFFF  # switches of one tier, so the DPID ranges never meet


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


def dpid_str(dpid: int) -> str:
    return f"{dpid:016x}"


def host_ip(n: int) -> str:
    return ipAdd(n, prefixLen=8, ipBaseNum=0x0A000000)


def _checked(check, value):
    """value through a shaping/nodes check, its ValueError as a TopologyError."""
    try:
        return check(value)
    except ValueError as error:
        raise TopologyError(str(error)) from None


class FabricTopo(Topo):
    """Common helpers: hosts and links with the fabric's addressing, classes, rates and MTU."""

    def _fabric_options(self, queue_bytes: int, mtu: int, tcp_cc: str) -> None:
        """Validate and keep the options every link and host of the fabric shares."""
        self.mtu = _checked(check_mtu, mtu)
        self.tcp_cc = _checked(check_tcp_cc, tcp_cc)
        self.queue_bytes = _positive_int("queue_bytes", queue_bytes, minimum=frame_bytes(self.mtu))

    def _fabric_switch(self, name: str, dpid: int) -> str:
        return self.addSwitch(name, dpid=dpid_str(dpid), cls=OVSUserSwitch)

    def _fabric_host(self, n: int) -> str:
        return self.addHost(f"h{n}", ip=f"{host_ip(n)}/8", mac=macColonHex(n), cls=FabricHost,
                            tcp_cc=self.tcp_cc)

    def _fabric_link(self, a: str, b: str, port_a: int, port_b: int, bw: float) -> None:
        self.addLink(a, b, port1=port_a, port2=port_b, cls=FabricLink, bw=bw,
                     queue_bytes=self.queue_bytes, mtu=self.mtu)


class LeafSpineTopo(FabricTopo):
    """`spines` x `leaves` leaf-spine with `hosts` per leaf; rates in Mbit/s, MTU in bytes (every
    interface), queues in bytes per class, `tcp_cc` the hosts' TCP congestion control.

    Oversubscription at a leaf = hosts*host_bw / (spines*fabric_bw)."""

    def build(self, spines: int = 2, leaves: int = 2, hosts: int = 2, host_bw: float = 100,
              fabric_bw: float = 100, queue_bytes: int = DEFAULT_QUEUE_BYTES,
              mtu: int = DEFAULT_MTU, tcp_cc: str = DEFAULT_TCP_CC) -> None:
        spines = _positive_int("spines", spines)
        leaves = _positive_int("leaves", leaves)
        for name, count in (("spines", spines), ("leaves", leaves)):
            if count > MAX_PER_TIER:
                raise TopologyError(f"{name}: {count} is not allowed (at most {MAX_PER_TIER})")
        hosts = _positive_int("hosts", hosts)
        host_bw = _positive_rate("host_bw", host_bw)
        fabric_bw = _positive_rate("fabric_bw", fabric_bw)
        self._fabric_options(queue_bytes, mtu, tcp_cc)
        if leaves * hosts > MAX_HOSTS:
            raise TopologyError(f"hosts: {leaves * hosts} hosts in all is not allowed "
                                f"(at most {MAX_HOSTS} addresses in 10.0.0.0/8)")
        spine_names = [self._fabric_switch(f"spine{s}", SPINE_DPID + s) for s in range(1, spines + 1)]
        for leaf in range(1, leaves + 1):
            leaf_name = self._fabric_switch(f"leaf{leaf}", LEAF_DPID + leaf)
            for port in range(1, hosts + 1):
                host = self._fabric_host((leaf - 1) * hosts + port)
                self._fabric_link(leaf_name, host, port, 0, host_bw)
            for s, spine_name in enumerate(spine_names, start=1):
                self._fabric_link(leaf_name, spine_name, hosts + s, leaf, fabric_bw)


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
        half = k // 2
        if k * half > MAX_PER_TIER:
            raise TopologyError(f"k: {k} is not allowed (at most 90: k*k/2 edge switches "
                                f"must fit in {MAX_PER_TIER} DPIDs)")
        cores = [self._fabric_switch(f"core{c}", SPINE_DPID + c) for c in range(1, half * half + 1)]
        host_n = 0
        for pod in range(k):
            aggs = [self._fabric_switch(f"agg{pod * half + a}", AGG_DPID + pod * half + a)
                    for a in range(1, half + 1)]
            for e in range(1, half + 1):
                edge = self._fabric_switch(f"edge{pod * half + e}", LEAF_DPID + pod * half + e)
                for port in range(1, half + 1):
                    host_n += 1
                    self._fabric_link(edge, self._fabric_host(host_n), port, 0, bw)
                for a, agg in enumerate(aggs, start=1):
                    self._fabric_link(edge, agg, half + a, e, bw)
            # Aggregation switch a of every pod connects to cores (a-1)*half+1 .. a*half.
            for a, agg in enumerate(aggs, start=1):
                for c in range(half):
                    core = cores[(a - 1) * half + c]
                    self._fabric_link(agg, core, half + 1 + c, pod + 1, bw)


topos = {"leafspine": LeafSpineTopo, "fattree": FatTreeTopo}
switches = {"ovsuser": OVSUserSwitch}

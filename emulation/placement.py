"""Where per-flow ECMP put each flow of a run: measured on the running fabric, before the run.

A select group hashes a flow's 5-tuple (OVS `dp_hash`) onto one of its buckets, a function no
OpenFlow message tells. So each flow is probed: packets with exactly its 5-tuple leave its source
host (TCP connection attempts from its source port, refused at once by the destination's kernel;
UDP datagrams from its source port), and the buckets' packet counters of its first switch tell
which uplink took them. The flows of one first switch are probed at once, flow i with 2^i packets,
so one reading of the counters before and one after tell every flow's bucket (the counts add up
to a sum whose bits name the flows); group counters see neither LLDP probes nor the answers, which
leave through the destinations' switches. OVS adds a datapath flow's packets to the group's
counters only when its revalidators next run: each reading waits for them (`revalidator/wait`,
about a second), so a switch's flows take about two seconds to place.
"""
from __future__ import annotations

import re
import subprocess
from typing import Iterable, NamedTuple, Protocol

MAX_FLOWS_AT_ONCE = 8  # per first switch: flow i sends 2^i packets, at most 255 in all
PROBE = r"""
import socket, sys
proto, dst, sport, dport, count = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
if proto == "udp":
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("", sport))
        for _ in range(count):
            s.sendto(b"placement probe", (dst, dport))
else:
    for _ in range(count):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("", sport))
            s.settimeout(0.5)
            try:
                s.connect((dst, dport))
            except OSError:
                pass
"""
GROUP = re.compile(r"group_id=(\d+)")
BUCKET = re.compile(r"bucket=bucket_id:(\d+)[^b]*?actions=output:(\d+)")
BUCKET_COUNT = re.compile(r"bucket(\d+):packet_count=(\d+)")


class Flow(Protocol):
    """A 5-tuple between hosts (experiments/runplan.py DataFlow)."""
    what: str
    src: str
    dst: str
    proto: str
    sport: int
    dport: int


class Placed(NamedTuple):
    what: str
    switch: str   # the flow's first switch
    uplink: str   # the switch its bucket leads to; '' when it stays on its first switch


def bucket_ports(groups_text: str) -> dict[tuple[int, int], int]:
    """(group id, bucket id) -> output port, from `ovs-ofctl -O OpenFlow15 dump-groups`."""
    ports = {}
    for line in groups_text.splitlines():
        group = GROUP.search(line)
        if group:
            for bucket, port in BUCKET.findall(line):
                ports[(int(group[1]), int(bucket))] = int(port)
    return ports


def bucket_counts(stats_text: str) -> dict[tuple[int, int], int]:
    """(group id, bucket id) -> packets, from `ovs-ofctl -O OpenFlow15 dump-group-stats`."""
    counts = {}
    for line in stats_text.splitlines():
        group = GROUP.search(line)
        if group:
            for bucket, packets in BUCKET_COUNT.findall(line):
                counts[(int(group[1]), int(bucket))] = int(packets)
    return counts


def decode(port_deltas: dict[int, int], flows: int) -> dict[int, int | None]:
    """Flow i (sent 2^i packets) -> the port whose delta has bit i set; None where no port has it
    (the flow stayed on its switch). A delta beyond the sum of all counts means other traffic
    passed: ValueError, the probe must be repeated."""
    if any(delta < 0 or delta >= 1 << flows for delta in port_deltas.values()):
        raise ValueError(f"bucket counters moved by more than the probes sent ({port_deltas})")
    found: dict[int, int | None] = {}
    for index in range(flows):
        ports = [port for port, delta in port_deltas.items() if delta >> index & 1]
        if len(ports) > 1:
            raise ValueError(f"flow {index} counted on ports {ports}")
        found[index] = ports[0] if ports else None
    return found


def _ofctl(command: str, switch: str) -> str:
    return subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", "--no-names", command, switch], capture_output=True,
                          text=True, check=True).stdout


def _counts(switch: str, rounds: int = 1) -> dict[tuple[int, int], int]:
    """The switch's bucket counters once the datapath's packets so far are in them."""
    for _ in range(rounds):
        subprocess.run(["ovs-appctl", "revalidator/wait"], capture_output=True, check=True)
    return bucket_counts(_ofctl("dump-group-stats", switch))


def _port_deltas(switch: str, before: dict[tuple[int, int], int], ports: dict[tuple[int, int], int]
                 ) -> dict[int, int]:
    after = _counts(switch, rounds=2)
    deltas: dict[int, int] = {}
    for key, port in ports.items():
        deltas[port] = deltas.get(port, 0) + after.get(key, 0) - before.get(key, 0)
    return deltas


def measure(fab, flows: Iterable[Flow], attempts: int = 3) -> list[Placed]:
    """Each flow's first switch and the switch its bucket sends it to, probed on the fabric `fab`
    (emulation/fabric.py) while nothing else crosses it (between runs); in the order of `flows`."""
    first_switch = {}
    for host in fab.hosts:
        intf = host.defaultIntf()
        first_switch[host.name] = intf.link.intf2.node if intf.link.intf1 is intf else intf.link.intf1.node
    ip = {host.name: host.IP() for host in fab.hosts}
    flows = list(flows)
    by_switch: dict[str, list[Flow]] = {}
    for flow in flows:
        by_switch.setdefault(first_switch[flow.src].name, []).append(flow)
    placed: dict[int, Placed] = {}
    for name, switch_flows in by_switch.items():
        switch = fab.net.get(name)
        neighbours = {switch.ports[intf]: (link.intf2 if link.intf1 is intf else link.intf1).node.name
                      for intf in switch.intfList() if (link := intf.link) is not None}
        ports = bucket_ports(_ofctl("dump-groups", name))
        for start in range(0, len(switch_flows), MAX_FLOWS_AT_ONCE):
            batch = switch_flows[start:start + MAX_FLOWS_AT_ONCE]
            for attempt in range(attempts):
                before = _counts(name)
                probes = [fab.popen(flow.src, ["python3", "-c", PROBE, flow.proto, ip[flow.dst], str(flow.sport),
                                               str(flow.dport), str(1 << index)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                          for index, flow in enumerate(batch)]
                for probe in probes:
                    probe.wait(timeout=30)
                try:
                    found = decode(_port_deltas(name, before, ports), len(batch))
                    break
                except ValueError:
                    if attempt == attempts - 1:
                        raise
            for index, flow in enumerate(batch):
                placed[id(flow)] = Placed(flow.what, name, neighbours.get(found[index], "") if found[index] else "")
    return [placed[id(flow)] for flow in flows]


def summary(placed: list[Placed]) -> dict:
    """What run.json keeps: per first switch and uplink, the flows it carries, and the most flows
    that share one uplink (the collision a seed decided)."""
    uplinks: dict[str, dict[str, list[str]]] = {}
    for flow in placed:
        if flow.uplink:
            uplinks.setdefault(flow.switch, {}).setdefault(flow.uplink, []).append(flow.what)
    shares = [len(whats) for by_uplink in uplinks.values() for whats in by_uplink.values()]
    return {"uplinks": uplinks, "max_flows_per_uplink": max(shares, default=0)}

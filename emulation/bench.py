"""Fabric capacity benchmark (`make bench-fabric`): how close the emulation gets to its links.

A 2x2x4 leaf-spine (100 Mbit/s host links, 400 Mbit/s uplinks, the 8-class priority tree on every
port), iperf3 TCP flows from leaf1's hosts to leaf2's hosts crossing the spines: 4 flows one way,
then 8 flows both ways, at each MTU asked for (default 1500 and 9000). Per case: aggregate goodput,
the slowest and fastest flow, ovs-vswitchd's CPU (all threads, and its busiest thread, which
forwards every packet), the machine's CPU and the hypervisor's steal, and what the switches dropped
outside their class queues (transmit errors in each server's OVS log, port-socket receive drops).
Across servers (`--servers`), also what the crossing links' VXLAN devices sent through the tunnels
against the flows' bytes (each flow crosses one). Then strict priority at each MTU: a CS5 and an
unmarked TCP flow from two hosts into one host's 20 Mbit/s port.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

from mininet.log import setLogLevel

from emulation.emulated_server import vswitchd_pid_at
from emulation.fabric import Fabric
from emulation.machine import (busiest_thread_share, machine_jiffies, port_socket_drops, process_cpu_s,
                               thread_jiffies, vswitchd_pid)
from emulation.ovslog import OVS_LOG, OvsLog, parse_transmit_errors
from topologies.cluster import LOCAL

HOSTS_PER_LEAF = 4


@dataclass(frozen=True)
class Case:
    mtu: int
    both_ways: bool

    @property
    def name(self) -> str:
        return f"MTU {self.mtu}, {'8 flows both ways' if self.both_ways else '4 flows one way'}"


def measure(fab: Fabric, case: Case, seconds: float) -> dict:
    pairs = [(f"h{i}", f"h{i + HOSTS_PER_LEAF}") for i in range(1, HOSTS_PER_LEAF + 1)]
    if case.both_ways:
        pairs += [(dst, src) for src, dst in pairs]
    servers = [fab.popen(dst, ["iperf3", "-s", "-1", "-p", str(5201 + i)])
               for i, (_, dst) in enumerate(pairs)]
    for i, (_, dst) in enumerate(pairs):
        wait_listening(fab.host(dst), 5201 + i)
    pid = vswitchd_pid()
    others = [other for server in fab.servers or [] if (other := vswitchd_pid_at(server)) is not None]
    log = OvsLog()
    remote_logs = {switch.server: log_size(switch) for switch in remote_switches(fab)}
    tunnels0 = tunnel_bytes(fab)
    drops0 = sum(port_socket_drops().values())
    cpu0, threads0, t0 = process_cpu_s(pid), thread_jiffies(pid), time.monotonic()
    busy0, total0, steal0 = machine_jiffies()
    others0 = {other: (process_cpu_s(other), thread_jiffies(other)) for other in others}
    clients = [fab.popen(src, ["iperf3", "-c", fab.host(dst).IP(), "-p", str(5201 + i),
                               "-t", str(seconds), "-J"])
               for i, (src, dst) in enumerate(pairs)]
    results = [json.loads(c.communicate(timeout=seconds + 30)[0]) for c in clients]
    elapsed = time.monotonic() - t0
    cpu1, threads1, (busy1, total1, steal1) = process_cpu_s(pid), thread_jiffies(pid), machine_jiffies()
    tunnels1 = tunnel_bytes(fab)
    others1 = {other: (process_cpu_s(other), thread_jiffies(other)) for other in others}
    for server in servers:
        server.wait(10)
    goodputs = [r["end"]["sum_received"]["bits_per_second"] / 1e6 for r in results]
    received = sum(r["end"]["sum_received"]["bytes"] for r in results)
    # full TCP segments (MSS: the MTU less IP, TCP and timestamp headers) a second, over iperf3's own intervals
    packets = sum(goodputs) * 1e6 / 8 / (case.mtu - 52)
    return {"case": case.name, "flows": len(pairs), "aggregate_mbps": sum(goodputs),
            "min_flow_mbps": min(goodputs), "max_flow_mbps": max(goodputs),
            "segments_per_s": packets,
            "vswitchd_cores": (cpu1 - cpu0) / elapsed,
            "vswitchd_busiest_thread": busiest_thread_share(threads0, threads1, elapsed),
            # an emulated server's ovs-vswitchd runs on this machine too (emulation/emulated_server.py)
            "other_vswitchd_cores": [(others1[o][0] - others0[o][0]) / elapsed for o in others],
            "other_vswitchd_busiest_thread": [busiest_thread_share(others0[o][1], others1[o][1], elapsed)
                                              for o in others],
            "machine_util": (busy1 - busy0) / (total1 - total0),
            "steal": (steal1 - steal0) / (total1 - total0),
            "ovs_tx_errors": log.transmit_errors().total,
            "other_ovs_tx_errors": {switch.server: transmit_errors_since(switch, remote_logs[switch.server])
                                    for switch in remote_switches(fab)},
            "port_socket_drops": sum(port_socket_drops().values()) - drops0,
            "received_bytes": received,
            "tunnel_bytes": sum(tunnels1.values()) - sum(tunnels0.values()) if tunnels0 else None}


def remote_switches(fab: Fabric) -> list:
    """One switch on each server but this machine (its shell runs there: the way to read that server)."""
    firsts = {}
    for switch in fab.net.switches if fab.servers else []:
        if switch.server != LOCAL:
            firsts.setdefault(switch.server, switch)
    return list(firsts.values())


def log_size(switch) -> int:
    said = switch.cmd(f"stat -c %s {OVS_LOG} 2>/dev/null").strip()
    return int(said) if said.isdigit() else 0


def transmit_errors_since(switch, offset: int) -> int:
    """Transmit errors logged by the ovs-vswitchd of the switch's server since its log was `offset` long."""
    return parse_transmit_errors(switch.cmd(f"tail -c +{offset + 1} {OVS_LOG} 2>/dev/null")).total


def crossing_ends(fab: Fabric) -> list:
    """Every interface that ends a crossing link (a VXLAN device: what it sends goes through the tunnel)."""
    return [intf for link in (fab.net.links if fab.servers else [])
            if link.intf1.node.server != link.intf2.node.server for intf in (link.intf1, link.intf2)]


def tunnel_bytes(fab: Fabric) -> dict[str, int]:
    """Bytes each crossing link's end has sent into its tunnel (inner frames), by interface."""
    return {f"{intf.node.name}:{intf.name}": int(intf.node.cmd(f"cat /sys/class/net/{intf.name}/statistics/tx_bytes"))
            for intf in crossing_ends(fab)}


def wait_listening(host, port: int, timeout: float = 15.0) -> None:
    """Until an iperf3 server listens in `host` (one on another server starts over SSH: a second or so)."""
    deadline = time.monotonic() + timeout
    while not host.cmd(f"ss -Hltn 'sport = :{port}'").strip():
        if time.monotonic() > deadline:
            raise RuntimeError(f"iperf3 -s on {host.name} port {port} did not listen in {timeout:.0f} s")
        time.sleep(0.1)


PRIORITY_PORT_MBPS = 20


def priority(mtu: int, seconds: float) -> dict:
    """CS5 (h1) and unmarked (h2) TCP into h3's PRIORITY_PORT_MBPS port, started together."""
    params = {"spines": 2, "leaves": 2, "hosts_per_leaf": 2, "host_bw": PRIORITY_PORT_MBPS, "fabric_bw": 100,
              "mtu": mtu}
    with Fabric("leafspine", params, lb="ecmp") as fab:
        fab.wait_reachable()
        for port in (5301, 5302):
            fab.popen("h3", ["iperf3", "-s", "-1", "-p", str(port)])
        time.sleep(0.5)
        clients = [fab.popen(src, ["iperf3", "-c", "10.0.0.3", "-p", str(port), "-t", str(seconds), "-J",
                                   "--dscp", str(dscp)])
                   for src, port, dscp in (("h1", 5301, 40), ("h2", 5302, 0))]
        cs5, unmarked = (json.loads(c.communicate(timeout=seconds + 30)[0])["end"]["sum_received"]
                         ["bits_per_second"] / 1e6 for c in clients)
    return {"case": f"MTU {mtu}, priority", "cs5_mbps": cs5, "unmarked_mbps": unmarked}


def run(mtus: list[int], seconds: float, host_bw: float, fabric_bw: float, servers: list[str] | None = None,
        priority_too: bool = True) -> list[dict]:
    rows = []
    for mtu in mtus:
        params = {"spines": 2, "leaves": 2, "hosts_per_leaf": HOSTS_PER_LEAF, "host_bw": host_bw,
                  "fabric_bw": fabric_bw, "mtu": mtu}
        with Fabric("leafspine", params, lb="ecmp", servers=servers) as fab:
            fab.wait_reachable()
            for both_ways in (False, True):
                rows.append(measure(fab, Case(mtu, both_ways), seconds))
                print(format_row(rows[-1], host_bw), flush=True)
    for mtu in mtus if priority_too else []:
        rows.append(priority(mtu, seconds))
        print(f"{rows[-1]['case']:<32} CS5 TCP {rows[-1]['cs5_mbps']:5.1f} Mbit/s, unmarked TCP "
              f"{rows[-1]['unmarked_mbps']:5.1f} Mbit/s into one {PRIORITY_PORT_MBPS} Mbit/s port", flush=True)
    return rows


def format_row(row: dict, host_bw: float) -> str:
    return (f"{row['case']:<32} aggregate {row['aggregate_mbps']:6.1f} Mbit/s "
            f"({row['aggregate_mbps'] / (row['flows'] * host_bw):4.0%} of line rate), flows "
            f"{row['min_flow_mbps']:5.1f}-{row['max_flow_mbps']:5.1f}; ovs-vswitchd "
            f"{row['vswitchd_cores']:.2f} cores (busiest thread {row['vswitchd_busiest_thread']:.2f}"
            + "".join(f", another {cores:.2f} ({thread:.2f})" for cores, thread in
                      zip(row['other_vswitchd_cores'], row['other_vswitchd_busiest_thread']))
            + f"); {row['segments_per_s'] / 1000:.1f}k segments/s; "
            f"machine {row['machine_util']:.0%} (steal {row['steal']:.1%}); OVS transmit errors {row['ovs_tx_errors']}"
            + "".join(f", on {server} {errors}" for server, errors in row["other_ovs_tx_errors"].items())
            + f", port-socket drops {row['port_socket_drops']}"
            + ("" if row["tunnel_bytes"] is None else
               f"; tunnels sent {row['tunnel_bytes'] / 1e6:.1f} MB for the flows' "
               f"{row['received_bytes'] / 1e6:.1f} MB"))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m emulation.bench", description=__doc__)
    parser.add_argument("--seconds", type=float, default=6)
    parser.add_argument("--mtu", type=int, action="append", help="repeatable (default: 1500 and 9000)")
    parser.add_argument("--host-bw", type=float, default=100)
    parser.add_argument("--fabric-bw", type=float, default=400)
    parser.add_argument("--servers", help="run the fabric across these servers, comma-separated, the first "
                        "localhost (docs/cluster.md; e.g. localhost,10.251.0.2 for `make emulated-server`)")
    parser.add_argument("--no-priority", action="store_true", help="leave out the strict-priority check")
    parser.add_argument("--json", action="store_true", help="also print the rows as JSON")
    args = parser.parse_args()
    setLogLevel("warning")
    print(f"2x2x{HOSTS_PER_LEAF} leaf-spine, host links {args.host_bw:g} Mbit/s, uplinks "
          f"{args.fabric_bw:g} Mbit/s, iperf3 TCP {args.seconds:g} s per case")
    servers = args.servers.split(",") if args.servers else None
    rows = run(args.mtu or [1500, 9000], args.seconds, args.host_bw, args.fabric_bw, servers, not args.no_priority)
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()

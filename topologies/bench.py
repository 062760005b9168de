"""Fabric capacity benchmark (`make bench-fabric`): how much of the machine the emulation wastes.

A 2x2x4 leaf-spine (100 Mbit/s host links, 400 Mbit/s uplinks, the 8-class priority tree on every
port), TCP flows from leaf1's hosts to leaf2's hosts crossing the spines (and, with --both-ways,
as many back). Prints aggregate and per-flow goodput, each flow against its fair share, and the
CPU that ovs-vswitchd and the whole machine spent.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from topologies.fabric import Fabric

CLK_TCK = os.sysconf("SC_CLK_TCK")


def vswitchd_cpu_s() -> float:
    pid = int(Path("/var/run/openvswitch/ovs-vswitchd.pid").read_text())
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def run(seconds: float, both_ways: bool, host_bw: float, fabric_bw: float) -> dict:
    hosts = 4
    params = {"spines": 2, "leaves": 2, "hosts": hosts, "host_bw": host_bw, "fabric_bw": fabric_bw}
    pairs = [(f"h{i}", f"h{i + hosts}") for i in range(1, hosts + 1)]
    if both_ways:
        pairs += [(dst, src) for src, dst in pairs]
    with Fabric("leafspine", params, lb="ecmp") as fab:
        fab.wait_reachable()
        servers = [fab.popen(dst, ["iperf3", "-s", "-1", "-p", str(5201 + i)])
                   for i, (_, dst) in enumerate(pairs)]
        time.sleep(0.5)
        cpu0, (busy0, total0) = vswitchd_cpu_s(), machine_busy()
        clients = [fab.popen(src, ["iperf3", "-c", fab.host(dst).IP(), "-p", str(5201 + i),
                                   "-t", str(seconds), "-J"])
                   for i, (src, dst) in enumerate(pairs)]
        results = [json.loads(c.communicate(timeout=seconds + 30)[0]) for c in clients]
        cpu1, (busy1, total1) = vswitchd_cpu_s(), machine_busy()
        for s in servers:
            s.wait(10)
    flows = [{"flow": f"{src}->{dst}",
              "goodput_mbps": r["end"]["sum_received"]["bits_per_second"] / 1e6}
             for (src, dst), r in zip(pairs, results)]
    return {"flows": flows, "aggregate_mbps": sum(f["goodput_mbps"] for f in flows),
            "vswitchd_cores": (cpu1 - cpu0) / seconds,
            "machine_util": (busy1 - busy0) / (total1 - total0)}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m topologies.bench", description=__doc__)
    parser.add_argument("--seconds", type=float, default=6)
    parser.add_argument("--both-ways", action="store_true",
                        help="also send from leaf2's hosts to leaf1's (8 flows)")
    parser.add_argument("--host-bw", type=float, default=100)
    parser.add_argument("--fabric-bw", type=float, default=400)
    args = parser.parse_args()
    result = run(args.seconds, args.both_ways, args.host_bw, args.fabric_bw)
    # Fair share: every flow has its own host link at each end; the uplinks are not the limit.
    fair = args.host_bw
    print(f"{len(result['flows'])} TCP flows across the spines, {args.seconds:g} s, host links "
          f"{args.host_bw:g} Mbit/s, uplinks {args.fabric_bw:g} Mbit/s")
    for flow in result["flows"]:
        print(f"  {flow['flow']:<8} {flow['goodput_mbps']:7.1f} Mbit/s "
              f"({flow['goodput_mbps'] / fair:6.1%} of the {fair:g} Mbit/s link)")
    print(f"aggregate goodput {result['aggregate_mbps']:.1f} Mbit/s; "
          f"ovs-vswitchd {result['vswitchd_cores']:.2f} cores; "
          f"machine {result['machine_util']:.0%} busy")


if __name__ == "__main__":
    main()

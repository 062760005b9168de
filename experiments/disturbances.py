"""What a run does to the fabric besides training: iperf3 background flows and link faults
(down, random loss, rate cut), each switched on and off at offsets from the job's start.

All Mininet shell commands (`node.cmd`) of a run happen on the schedule's one thread, or after
it has stopped: a node's shell serves one command at a time.
"""
from __future__ import annotations

import math
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from experiments.runplan import IPERF_PORT
from experiments.source_ports import run_source_ports
from experiments.spec import FLOW_PORTS, Fault, Flow, RunConfig
from common.owner import OWNER_KEY
from emulation.fabric import Fabric, kill_group
from topologies.shaping import htb_classes

NFT_TABLE = "dnntb"  # + the interface name: one nftables table per interface with loss
# A link has one such table, one HTB rate and one carrier: the spec refuses two faults of one kind on
# one link at once (experiments/spec/checks.py), the end of one would end the other's condition.


@dataclass
class Disturbance:
    """Something switched on at at_s and off at at_s + duration_s (seconds after the job start)."""
    name: str
    at_s: float
    duration_s: float
    start: Callable[[], None]
    stop: Callable[[], None]


class Schedule:
    """Runs the disturbances' start and stop actions on time, on one thread.

    stop() cancels what has not started and switches off what is on, so the fabric is as it was
    (it is reused by the next run). Errors of actions are collected in .errors, they fail the run.
    """

    def __init__(self, disturbances: list[Disturbance]) -> None:
        self.disturbances = disturbances
        self.errors: list[str] = []
        self._active: list[Disturbance] = []
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, name="schedule", daemon=True)
        self._started_at = 0.0

    def start(self) -> None:
        self._started_at = time.monotonic()
        self._thread.start()

    def _run(self) -> None:
        events = sorted([(d.at_s, 1, d) for d in self.disturbances] +
                        [(d.at_s + d.duration_s, 0, d) for d in self.disturbances],
                        key=lambda event: event[:2])  # at equal times, switch off first
        for at_s, switch_on, disturbance in events:
            if self._cancel.wait(max(0.0, self._started_at + at_s - time.monotonic())):
                return
            if switch_on:
                self._apply(disturbance, disturbance.start, "start")
                self._active.append(disturbance)
            elif disturbance in self._active:
                self._active.remove(disturbance)
                self._apply(disturbance, disturbance.stop, "stop")

    def _apply(self, disturbance: Disturbance, action: Callable[[], None], verb: str) -> None:
        try:
            action()
        except Exception as error:  # recorded as the run's error; the run goes on
            self.errors.append(f"{disturbance.name}: {verb} failed: {error}")

    def stop(self) -> None:
        self._cancel.set()
        if self._thread.is_alive():
            self._thread.join()
        for disturbance in reversed(self._active):
            self._apply(disturbance, disturbance.stop, "stop")
        self._active.clear()


def _checked(node_or_intf, command: str) -> None:
    """Run a shell command in a node's namespace; raise with its output when it fails."""
    output = node_or_intf.cmd(f"{command} 2>&1; echo exit=$?")
    status = re.search(r"exit=(\d+)\s*$", output)
    if not status or status.group(1) != "0":
        raise RuntimeError(f"`{command}`: {output.strip()}")


# ------------------------------------------------------------------------------------ background

def background_flows(fab: Fabric, flows: list[Flow], log_dir: Path, client_ports: list[int]) -> list[Disturbance]:
    """iperf3 flows; an incast (several sources) is one client per source into one server each.
    client_ports: per client, in order, the port its data stream leaves from (0: ephemeral)."""
    disturbances = []
    clients = iter(client_ports)
    for index, flow in enumerate(flows):
        sources = [flow.src] if isinstance(flow.src, str) else flow.src
        for source_index, source in enumerate(sources):
            port = IPERF_PORT + FLOW_PORTS * index + source_index
            name = f"flow{index}-{source}-{flow.dst}"
            disturbances.append(Disturbance(name, flow.start_s, flow.duration_s,
                                            *_iperf_actions(fab, flow, source, port, next(clients),
                                                            log_dir / f"{name}.log")))
    return disturbances


# iperf3 ends a test by a message over its control connection, which queues behind the bulk data
# on the flow's path: signalled mid-flow, a server or client took the whole default grace (3 s) to
# go, twice per flow per run. Its per-second lines are in its log already; the final report is lost
# either way.
IPERF_GRACE_S = 0.3


def _iperf_actions(fab: Fabric, flow: Flow, source: str, port: int, client_port: int,
                   log: Path) -> tuple[Callable[[], None], Callable[[], None]]:
    processes: list[subprocess.Popen] = []

    def start() -> None:
        with open(log, "w") as output:
            processes.append(fab.popen(flow.dst, ["iperf3", "-s", "-1", "-p", str(port)],
                                       stdout=output, stderr=subprocess.STDOUT))
            time.sleep(0.1)  # the server's listening socket, before the client connects
            client = ["iperf3", "-c", fab.host(flow.dst).IP(), "-p", str(port),
                      "-t", str(math.ceil(flow.duration_s))]  # iperf3 takes whole seconds; stop() cuts
            if client_port:  # the data stream's; the control connection's stays ephemeral
                client += ["--cport", str(client_port)]
            if flow.proto == "udp":
                client += ["-u", "-b", f"{flow.rate_mbps:g}M"]  # 0: unlimited
            elif flow.rate_mbps:
                client += ["-b", f"{flow.rate_mbps:g}M"]
            processes.append(fab.popen(source, client, stdout=output, stderr=subprocess.STDOUT))

    def stop() -> None:
        for process in processes:
            kill_group(process, grace=IPERF_GRACE_S)
        processes.clear()

    return start, stop


# ---------------------------------------------------------------------------------------- faults

def link_faults(fab: Fabric, faults: list[Fault]) -> list[Disturbance]:
    actions = {"link_down": _link_down, "loss": _loss, "rate": _rate_cut}
    return [Disturbance(f"fault{index} {fault.kind} {fault.link}", fault.at_s, fault.duration_s,
                        *actions[fault.kind](fab, fault))
            for index, fault in enumerate(faults)]


def _link_ends(fab: Fabric, link: str) -> list:
    """The two interfaces of link `a-b`."""
    a, b = link.split("-", 1)
    (found, *_) = fab.net.linksBetween(fab.net.get(a), fab.net.get(b))
    return [found.intf1, found.intf2]


def _link_down(fab: Fabric, fault: Fault) -> tuple[Callable[[], None], Callable[[], None]]:
    a, b = fault.link.split("-", 1)
    return lambda: fab.set_link(a, b, False), lambda: fab.set_link(a, b, True)


def _loss(fab: Fabric, fault: Fault) -> tuple[Callable[[], None], Callable[[], None]]:
    """Random loss on both directions: nftables drops at each end of the link what it sends. A
    switch sends through its veth's egress (netdev hook); a host's own packets are dropped at
    the IP output hook, as a netdev egress hook there counted them but let them pass (kernel 6.18).
    In 1/10000ths, as numgen draws integers."""
    ends = _link_ends(fab, fault.link)
    threshold = round(fault.loss_percent * 100)

    def start() -> None:
        for intf in ends:
            family, hook = ("inet", "output") if intf.node.inNamespace else (
                "netdev", f'egress device "{intf.name}"')
            table = _nft_table(intf)
            # marked ours, so that clean-up can tell it from anyone else's
            _checked(intf, f"nft add table {family} {table} '{{ comment \"{OWNER_KEY}\"; }}'")
            _checked(intf, f"nft 'add chain {family} {table} loss {{ type filter hook {hook} priority 0 ; }}'")
            _checked(intf, f"nft add rule {family} {table} loss oifname {intf.name} "
                           f"numgen random mod 10000 '<' {threshold} drop")

    def stop() -> None:
        for intf in ends:
            family = "inet" if intf.node.inNamespace else "netdev"
            intf.cmd(f"nft delete table {family} {_nft_table(intf)} 2>/dev/null")

    return start, stop


def _nft_table(intf) -> str:
    return f"{NFT_TABLE}_{intf.name.replace('-', '_')}"


def _rate_cut(fab: Fabric, fault: Fault) -> tuple[Callable[[], None], Callable[[], None]]:
    """The link's HTB classes (root class 1:1 and every class's ceiling, see
    topologies/shaping.py) re-rated on both ends, and back to the link's rate after."""
    ends = _link_ends(fab, fault.link)

    def set_rate(rate_mbit: float | None) -> None:
        for intf in ends:
            for line in htb_classes(intf.name, rate_mbit or intf.bw, intf.mtu):
                _checked(intf, f"tc {line}")

    return lambda: set_rate(fault.rate_mbps), lambda: set_rate(None)


def disturbances_of(fab: Fabric, config: RunConfig, log_dir: Path) -> list[Disturbance]:
    _, client_ports = run_source_ports(config)
    return background_flows(fab, config.background, log_dir, client_ports) + link_faults(fab, config.faults)

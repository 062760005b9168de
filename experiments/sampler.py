"""What the runner watches on the machine while a run trains, for the fidelity guard
(experiments/fidelity.py): CPU of the machine and of ovs-vswitchd's busiest thread, every switch
port's class queues (tc: bytes and packets sent, drops, backlog), the switches' port-socket
drops, and, over the whole run, the transmit errors OVS logged and its datapath drop counters.

Files in the run's directory (CSV columns below; counters are cumulative, as sampled):
    cpu.csv      time_s, cpu_util (machine, 0..1, steal included), vswitchd_thread_util (cores,
                 busiest thread of the server's ovs-vswitchd), mem_used_mb (machine), steal_util
                 (0..1 of the machine's CPUs: time the hypervisor gave other guests)
    queues.csv   time_s, switch, port, cs, sent_bytes, sent_pkts, dropped_pkts, backlog_bytes
    drain.csv    time_s, switch, port, probe_s, backlog_bytes, sent_bytes: for each port that had a
                 backlog, what it sent in the next probe_s (a second tc dump DRAIN_PROBE_S later)
    sockets.csv  time_s, switch, port, socket_drops
    ovs.json     {"tx_errors_by_port": {port: n}, "tx_errors_suppressed": n, "datapath_drops": n}
A switch port is named by its switch and OpenFlow port number, as in ports.csv.

On a fabric across servers each server has its own sampler, since its switches, queues and
ovs-vswitchd are its own: this machine's in the runner, every other one started over SSH as
`python -m experiments.sampler DIR --ports JSON` (RemoteSamplers), sampling until its stdin ends
(the runner closes it, or its SSH connection is gone), its files in DIR/servers/<server>/ copied
back and put on this machine's clock. The guard judges each server (experiments/fidelity.py).
"""
from __future__ import annotations

import argparse
import csv
import json
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

from common.files import atomic_open, write_text
from emulation.machine import (busiest_thread_share, machine_jiffies, machine_used_mb, port_socket_drops,
                               thread_jiffies, vswitchd_pid)
from emulation.ovslog import OvsLog

SAMPLE_S = 0.5
LAST_SAMPLE_WAIT_S = 0.03  # three jiffies (/proc/stat counts in 1/100 s): a sampler stopped at once has a row
# A port that holds B bytes must send min(B, rate x t) in the next t seconds: probing right after a
# sample tests that whatever the traffic's burstiness; 20 ms is 250 KB at 100 Mbit/s, a full queue.
DRAIN_PROBE_S = 0.02
CPU_COLUMNS = ["time_s", "cpu_util", "vswitchd_thread_util", "mem_used_mb", "steal_util"]
QUEUE_COLUMNS = ["time_s", "switch", "port", "cs", "sent_bytes", "sent_pkts", "dropped_pkts",
                 "backlog_bytes"]
SOCKET_COLUMNS = ["time_s", "switch", "port", "socket_drops"]
DRAIN_COLUMNS = ["time_s", "switch", "port", "probe_s", "backlog_bytes", "sent_bytes"]
LEAF_PARENT = re.compile(r"^1:1([0-7])$")  # the class of a leaf queue (topologies/shaping.py)
DATAPATH_DROP = re.compile(r"^(datapath_drop_\S+)\s.*total: (\d+)$", re.M)
# Counted by OVS when the upcall of a controller action fails: those packets were on their way to
# the controller (probes, ARP), not being forwarded, and our pipeline has no other userspace action.
CONTROLLER_UPCALL_DROP = "datapath_drop_userspace_action_error"


def class_queue_stats(qdiscs: list[dict], ports: dict[str, tuple[str, int]]) -> list[list]:
    """Rows (switch, port, cs, sent_bytes, sent_pkts, dropped_pkts, backlog_bytes) of the class
    queues in `tc -s -j qdisc show` output, for the interfaces in `ports` (name -> (switch, port))."""
    rows = []
    for qdisc in qdiscs:
        where = ports.get(qdisc.get("dev", ""))
        match = LEAF_PARENT.match(qdisc.get("parent", ""))
        if where and match:
            rows.append([*where, int(match[1]), qdisc["bytes"], qdisc["packets"], qdisc["drops"],
                         qdisc["backlog"]])
    return rows


def drain_rows(first: list[list], second: list[list], probe_s: float) -> list[list]:
    """Rows (switch, port, probe_s, backlog_bytes, sent_bytes) of the ports that had a backlog in
    `first`, with what they sent by `second` (class_queue_stats rows of two dumps)."""
    def per_port(rows: list[list]) -> dict[tuple, list[int]]:
        totals: dict[tuple, list[int]] = {}
        for switch, port, _, sent_bytes, _, _, backlog in rows:
            total = totals.setdefault((switch, port), [0, 0])
            total[0] += sent_bytes
            total[1] += backlog
        return totals

    before, after = per_port(first), per_port(second)
    return [[*key, round(probe_s, 4), backlog, after[key][0] - sent]
            for key, (sent, backlog) in before.items() if backlog and key in after]


def datapath_drops(coverage: str) -> int:
    """Forwarded packets the userspace datapath dropped for its own reasons (`datapath_drop_*`
    coverage counters: failed upcalls of misses, invalid ports, ...), from `ovs-appctl coverage/show`."""
    return sum(int(total) for name, total in DATAPATH_DROP.findall(coverage) if name != CONTROLLER_UPCALL_DROP)


def _coverage() -> str:
    return subprocess.run(["ovs-appctl", "coverage/show"], capture_output=True, text=True).stdout


class FabricSampler:
    """Samples every SAMPLE_S while it is entered; `ports` maps each switch port's interface name
    to (switch, OpenFlow port)."""

    def __init__(self, run_dir: Path, ports: dict[str, tuple[str, int]]) -> None:
        self.run_dir, self.ports = run_dir, ports
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fabric-sampler", daemon=True)
        self._log = OvsLog()
        self._drops_before = 0
        # The last samples, for the live view: cpu (machine, busiest ovs-vswitchd thread), queues (rows
        # of class_queue_stats).
        self.latest: dict[str, object] = {}

    def __enter__(self) -> FabricSampler:
        self._drops_before = datapath_drops(_coverage())
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        errors = self._log.transmit_errors()
        ours = {name: count for name, count in errors.by_port.items() if name in self.ports}
        record = {"tx_errors_by_port": ours, "tx_errors_suppressed": errors.suppressed,
                  "datapath_drops": datapath_drops(_coverage()) - self._drops_before}
        write_text(self.run_dir / "ovs.json", json.dumps(record, indent=2) + "\n")

    def _sample_sockets(self, writer: csv.writer, now: float) -> None:
        for name, drops in sorted(port_socket_drops(set(self.ports)).items()):
            writer.writerow([f"{now:.3f}", *self.ports[name], drops])

    def _queue_stats(self) -> list[list]:
        out = subprocess.run(["tc", "-s", "-j", "qdisc", "show"], capture_output=True, text=True).stdout
        try:
            return class_queue_stats(json.loads(out or "[]"), self.ports)
        except ValueError:
            return []  # an interface vanished mid-dump; the next sample will do

    def _sample_queues(self, queues: csv.writer, drains: csv.writer, now: float) -> None:
        start = time.monotonic()
        rows = self._queue_stats()
        self.latest = {**self.latest, "queues": rows}
        for row in rows:
            queues.writerow([f"{now:.3f}", *row])
        if any(row[-1] for row in rows):
            time.sleep(max(0.0, start + DRAIN_PROBE_S - time.monotonic()))
            probe_s = time.monotonic() - start
            for row in drain_rows(rows, self._queue_stats(), probe_s):
                drains.writerow([f"{now:.3f}", *row])

    def _run(self) -> None:
        # Written whole at the end: an interrupted run's folder lacks them, and --resume re-runs it.
        with atomic_open(self.run_dir / "cpu.csv", newline="") as cpu_file, \
                atomic_open(self.run_dir / "queues.csv", newline="") as queue_file, \
                atomic_open(self.run_dir / "drain.csv", newline="") as drain_file, \
                atomic_open(self.run_dir / "sockets.csv", newline="") as socket_file:
            cpu, sockets = csv.writer(cpu_file), csv.writer(socket_file)
            queues, drains = csv.writer(queue_file), csv.writer(drain_file)
            for writer, columns in ((cpu, CPU_COLUMNS), (queues, QUEUE_COLUMNS), (drains, DRAIN_COLUMNS),
                                    (sockets, SOCKET_COLUMNS)):
                writer.writerow(columns)
            files = (queue_file, drain_file, socket_file)
            pids = [vswitchd_pid()]
            jiffies = machine_jiffies()
            threads, then = _threads(pids), time.monotonic()
            self._sample(queues, drains, sockets, files)
            while True:
                stopped = self._stop.wait(SAMPLE_S)
                now_jiffies = machine_jiffies()
                if stopped and now_jiffies.total == jiffies.total:  # stopped within a jiffy of the last sample:
                    time.sleep(LAST_SAMPLE_WAIT_S)                 # the last one still needs its deltas
                    now_jiffies = machine_jiffies()
                now_threads, now_mono = _threads(pids), time.monotonic()
                if (total := now_jiffies.total - jiffies.total) > 0:
                    thread_util = busiest_thread_share(threads, now_threads, now_mono - then)
                    machine = (now_jiffies.busy - jiffies.busy) / total
                    self.latest = {**self.latest, "cpu": (machine, thread_util)}
                    cpu.writerow([f"{time.time():.3f}", f"{machine:.4f}", f"{thread_util:.4f}",
                                  f"{machine_used_mb():.1f}", f"{(now_jiffies.steal - jiffies.steal) / total:.4f}"])
                    cpu_file.flush()
                jiffies, threads, then = now_jiffies, now_threads, now_mono
                self._sample(queues, drains, sockets, files)
                if stopped:  # the last sample is at the end, so every run has its deltas
                    return

    def _sample(self, queues: csv.writer, drains: csv.writer, sockets: csv.writer, files: tuple) -> None:
        now = time.time()
        self._sample_queues(queues, drains, now)
        self._sample_sockets(sockets, now)
        for file in files:
            file.flush()


def _threads(pids: list[int | None]) -> dict[int, int]:
    """Every thread of these daemons (thread ids are unique on the machine): the busiest is judged."""
    threads = {}
    for pid in filter(None, pids):
        try:
            threads |= thread_jiffies(pid)
        except OSError:  # ovs-vswitchd went away: its CPU is no longer ours to judge
            pass
    return threads


SERVERS_DIR = "servers"  # a run's folder of the other servers' samples, one folder per server
SAMPLED_FILES = {"cpu.csv": ("time_s",), "queues.csv": ("time_s",), "drain.csv": ("time_s",),
                 "sockets.csv": ("time_s",)}  # their timestamps, on the sampling server's clock
REMOTE_STOP_S = 30.0  # a remote sampler's last sample and files, after its stdin ends


def sampler_command(python: str, repo: str, out: Path, ports: dict[str, tuple[str, int]]) -> str:
    """The command a server's shell runs for its sampler: in the repository, every word quoted."""
    argv = [python, "-m", "experiments.sampler", str(out), "--ports", json.dumps(ports, sort_keys=True)]
    return f"cd {shlex.quote(repo)} && exec {shlex.join(argv)}"


class RemoteSamplers:
    """A sampler on each other server of a fabric, over SSH, while entered: `ports` maps each server
    to its switch ports; its files go to run_dir/servers/<server>/ there. `errors` says which failed."""

    def __init__(self, run_dir: Path, ports: dict[str, dict[str, tuple[str, int]]], python: str, repo: str,
                 popen=subprocess.Popen) -> None:
        self.run_dir, self.ports, self.python, self.repo, self._popen = run_dir, ports, python, repo, popen
        self.processes: dict[str, subprocess.Popen] = {}
        self.errors: list[str] = []

    def folder(self, server: str) -> Path:
        return self.run_dir / SERVERS_DIR / server

    def __enter__(self) -> "RemoteSamplers":
        for server, ports in self.ports.items():
            command = sampler_command(self.python, self.repo, self.folder(server), ports)
            self.processes[server] = self._popen(
                ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", f"root@{server}", command],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for server, process in self.processes.items():
            try:
                process.stdin.close()  # its end of sampling: it takes a last sample and writes its files
            except OSError:
                pass
            process.stdin = None  # closed: communicate() must not flush it
        for server, process in self.processes.items():
            try:
                _, said = process.communicate(timeout=REMOTE_STOP_S)
            except subprocess.TimeoutExpired:
                process.kill()
                _, said = process.communicate()
                self.errors.append(f"the sampler on {server} did not stop within {REMOTE_STOP_S:.0f} s")
                continue
            if process.returncode:
                lines = (said or "").strip().splitlines()
                self.errors.append(f"the sampler on {server} failed: {lines[-1] if lines else process.returncode}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.sampler",
                                     description="Sample this server's switches, queues and ovs-vswitchd for the "
                                                 "fidelity guard until stdin ends.")
    parser.add_argument("out", type=Path, help="the folder its CSVs and ovs.json go to")
    parser.add_argument("--ports", required=True,
                        help='this server\'s switch ports, JSON: {"interface": ["switch", port], ...}')
    args = parser.parse_args(argv)
    try:
        ports = {name: (switch, int(port)) for name, (switch, port) in json.loads(args.ports).items()}
    except (ValueError, TypeError, AttributeError):
        sys.exit("sampler: --ports: not a JSON object of interface: [switch, port]")
    args.out.mkdir(parents=True, exist_ok=True)
    with FabricSampler(args.out, ports):
        sys.stdin.read()


if __name__ == "__main__":
    main()

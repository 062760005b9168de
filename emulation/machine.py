"""The machine under the emulation: the socket buffers the switches need, Open vSwitch running with
them, and the counters that tell whether a run measured the network or the machine (CPU of the
machine and of ovs-vswitchd's threads, packets dropped by the switches' port sockets).

One ovs-vswitchd serves every userspace bridge of the machine and forwards every packet on one
thread. Each port reads through its own AF_PACKET socket (buffer: net.core.rmem_default when the
port is added); every port transmits through ONE process-wide AF_PACKET socket whose buffer is
net.core.wmem_default when ovs-vswitchd first sends. Frames waiting in the ports' qdiscs count
against that buffer; when it is full, sendmmsg fails with EAGAIN and OVS drops the rest of the
batch whatever its class (logged as "error sending Ethernet packet ... Resource temporarily
unavailable", never counted). Raising the sysctls is machine-wide and only ever upwards.

`python -m emulation.machine` (make setup) raises the buffers and starts Open vSwitch, restarting
it once if it runs with a smaller transmit buffer.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from common.sysctl import SYSCTL_DIR, read_sysctl

OVS_CTL = "/usr/share/openvswitch/scripts/ovs-ctl"
VSWITCHD_PIDFILE = Path("/var/run/openvswitch/ovs-vswitchd.pid")
CLK_TCK = os.sysconf("SC_CLK_TCK")

# At the kernel's 208 KB, bursts overflowed the ports' receive sockets while ovs-vswitchd was
# busy: each switch lost 0.2-1.4% of what it received, unseen by any counter; 2 MB fixed it.
PORT_RECEIVE_BUFFER_BYTES = 2 << 20
# The shared transmit socket holds every frame queued in every port's qdisc (a 9 KB frame costs
# about 16 KB of buffer): at 208 KB a headline run logged ~350k transmit errors, at 16 MB none.
TRANSMIT_BUFFER_BYTES = 16 << 20
# sysctl -> the least value the fabric needs.
SOCKET_BUFFERS = {"net/core/rmem_default": PORT_RECEIVE_BUFFER_BYTES,
                  "net/core/wmem_default": TRANSMIT_BUFFER_BYTES}


class MachineError(RuntimeError):
    """Open vSwitch could not be started or given the buffers the fabric needs."""


def raise_sysctls(minimums: dict[str, int], root: Path = SYSCTL_DIR) -> dict[str, tuple[int, int]]:
    """Raise each sysctl to its minimum; never lower one (another user may have raised it).
    Returns what changed: name -> (before, after)."""
    changed = {}
    for name, minimum in minimums.items():
        before = int(read_sysctl(name, root))
        if before < minimum:
            (root / name).write_text(str(minimum))
            changed[name] = (before, minimum)
    return changed


ALLOWED_TCP_CC = "net/ipv4/tcp_allowed_congestion_control"


def allow_tcp_cc(name: str, root: Path = SYSCTL_DIR) -> tuple[str, str] | None:
    """Let network namespaces choose congestion control `name`: a namespace other than the
    machine's may only pick one on the root's allowed list (else EPERM). Adds, never removes.
    Returns (before, after) when the list changed."""
    before = read_sysctl(ALLOWED_TCP_CC, root)
    if name in before.split():
        return None
    after = f"{before} {name}".strip()
    (root / ALLOWED_TCP_CC).write_text(after)
    return before, after


def vswitchd_pid() -> int | None:
    try:
        pid = int(VSWITCHD_PIDFILE.read_text())
    except (OSError, ValueError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None


def ovs_running() -> bool:
    """Both daemons: ovsdb-server answers and ovs-vswitchd runs (`ovs-ctl start` starts what is missing)."""
    answers = subprocess.run(["ovs-vsctl", "--timeout=3", "show"], capture_output=True).returncode == 0
    return answers and vswitchd_pid() is not None


@dataclass(frozen=True)
class PacketSocket:
    """An AF_PACKET socket of ovs-vswitchd, from `ss -0`: the interface it reads (None for the
    unbound, process-wide transmit socket), its buffers and the packets it dropped on receive."""
    interface: str | None
    rcvbuf: int
    sndbuf: int
    drops: int


SS_LINE = re.compile(r"^p_raw\s+\S+\s+\d+\s+\d+\s+(?P<local>\S+)\s.*\bino:(?P<inode>\d+)\s.*"
                     r"skmem:\((?P<skmem>[^)]*)\)")


def parse_packet_sockets(text: str, inodes: set[int]) -> list[PacketSocket]:
    """The packet sockets in `ss -0 -a -m -e -O` output (one line per socket) whose inode is in `inodes`."""
    sockets = []
    for line in text.splitlines():
        match = SS_LINE.match(line)
        if not match or int(match["inode"]) not in inodes:
            continue
        mem = dict(re.findall(r"([a-z]+)(\d+)", match["skmem"]))
        local = match["local"]  # "*:leaf1-eth1" bound to a port, "[0]:*" unbound
        interface = local.split(":", 1)[1] if local.startswith("*:") else None
        sockets.append(PacketSocket(interface, int(mem.get("rb", 0)), int(mem.get("tb", 0)),
                                    int(mem.get("d", 0))))
    return sockets


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process `pid` holds open."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed since the listing
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def vswitchd_packet_sockets() -> list[PacketSocket]:
    """ovs-vswitchd's packet sockets, told apart by inode: `ss -p` would walk every fd of every
    process, 80 ms a call beside host apps holding a thousand sockets each."""
    pid = vswitchd_pid()
    if pid is None:
        return []
    out = subprocess.run(["ss", "-0", "-a", "-m", "-e", "-O"], capture_output=True, text=True).stdout
    try:
        return parse_packet_sockets(out, socket_inodes(pid))
    except OSError:  # ovs-vswitchd went away
        return []


def transmit_buffer_bytes() -> int | None:
    """The buffer of ovs-vswitchd's transmit socket (None: it has not sent since it started, so
    its socket will take today's net.core.wmem_default)."""
    unbound = [s.sndbuf for s in vswitchd_packet_sockets() if s.interface is None]
    return max(unbound) if unbound else None


def port_socket_drops(interfaces: set[str] | None = None) -> dict[str, int]:
    """Packets each port's receive socket dropped since it opened (buffer full), by interface."""
    return {s.interface: s.drops for s in vswitchd_packet_sockets()
            if s.interface is not None and (interfaces is None or s.interface in interfaces)}


# ovs-vswitchd runs with --mlockall. With glibc's defaults it hands the top of its heap back to the
# kernel whenever 128 KB lie free there and faults and locks every page again as it regrows, which
# nearly doubles its forwarding thread's work in the first minute of traffic after a start. With this
# threshold it keeps what it grew, and its resident memory stays as small (docs/results.md).
OVS_MALLOC_ENV = {"MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


def _ovs_ctl(action: str) -> None:
    result = subprocess.run([OVS_CTL, action, "--system-id=random"], capture_output=True, text=True,
                            env={**os.environ, **OVS_MALLOC_ENV})
    if result.returncode != 0:
        raise MachineError(f"ovs-ctl {action} failed: {result.stderr.strip()[-300:]}")


def prepare(tcp_cc: str | None = None,
            say=lambda line: print(line, file=sys.stderr)) -> dict[str, tuple]:
    """Raise the socket buffers, allow the hosts' TCP congestion control, then make sure Open
    vSwitch runs with the buffers: start it when it is not running, restart it (once, saying so)
    when its transmit socket predates the raise. Returns the sysctls changed: name ->
    (before, after)."""
    changed: dict[str, tuple] = dict(raise_sysctls(SOCKET_BUFFERS))
    if tcp_cc and (allowed := allow_tcp_cc(tcp_cc)):
        changed[ALLOWED_TCP_CC] = allowed
    for name, (before, after) in changed.items():
        say(f"machine: {name.replace('/', '.')}: {before} -> {after}")
    if not ovs_running():
        say("machine: starting Open vSwitch")
        _ovs_ctl("start")
    elif (buffer := transmit_buffer_bytes()) is not None and buffer < TRANSMIT_BUFFER_BYTES:
        say(f"machine: restarting Open vSwitch: its transmit socket has a {buffer // 1024} KB "
            f"buffer, the fabric needs {TRANSMIT_BUFFER_BYTES >> 20} MB (bridges are kept)")
        _ovs_ctl("restart")
    return changed


# -- CPU ----------------------------------------------------------------------------------------
class Jiffies(NamedTuple):
    """All CPUs' jiffies since boot: busy (steal included: time this machine's CPUs did not run it), all,
    and stolen by the hypervisor for other guests."""
    busy: int
    total: int
    steal: int


def machine_jiffies(stat: str | None = None) -> Jiffies:
    """All CPUs' jiffies since boot, from /proc/stat's first line."""
    fields = [int(v) for v in (stat or Path("/proc/stat").read_text()).split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # user..steal; guest time is already in user
    return Jiffies(total - idle, total, fields[7])


def thread_jiffies(pid: int) -> dict[int, int]:
    """utime + stime of each thread of a process, by thread id."""
    times = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        times[int(task.name)] = int(fields[11]) + int(fields[12])
    return times


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def process_rss_mb(pid: int) -> float | None:
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


def machine_used_mb() -> float:
    """Memory in use (total minus available), from /proc/meminfo."""
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    kib = int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])
    return round(kib / 1024, 1)


def busiest_thread_share(before: dict[int, int], after: dict[int, int], seconds: float) -> float:
    """The largest share of one core a single thread used between two thread_jiffies samples."""
    if seconds <= 0:
        return 0.0
    spent = [after[tid] - before[tid] for tid in after if tid in before]  # a new thread: next time
    return max(spent, default=0) / CLK_TCK / seconds


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("machine: needs root (sysctls, Open vSwitch): run with sudo")
    try:
        prepare()
    except MachineError as error:
        sys.exit(f"machine: {error}")


if __name__ == "__main__":
    main()

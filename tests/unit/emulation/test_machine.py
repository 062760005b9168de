"""The machine under the emulation, from captured command output and a fake /proc/sys: buffers
are only raised, packet sockets parsed, OVS transmit errors counted, CPU shares computed."""
import os
import socket
from pathlib import Path

import pytest

from emulation import machine
from topologies import tcp
from emulation.ovslog import OvsLog, parse_transmit_errors

SS_OUTPUT = """\
Netid State  Recv-Q Send-Q Local Address:Port        Peer Address:PortProcess
p_raw UNCONN 0      0                [0]:*                       *     ino:139821700 sk:191b ver:0 cpy_thresh:0 flags( 0 ) skmem:(r0,rb2097152,t0,tb212992,f0,w0,o0,bl0,d0)
p_raw UNCONN 0      0                  *:leaf2-eth1              *     ino:139821731 sk:19a2 ver:0 cpy_thresh:0 flags( 0 ) skmem:(r0,rb2097152,t0,tb212992,f0,w0,o176,bl0,d17)
p_raw UNCONN 0      0                  *:leaf2-eth1              *     ino:150000001 sk:2001 ver:0 cpy_thresh:0 flags( 0 ) skmem:(r0,rb212992,t0,tb212992,f0,w0,o0,bl0,d99)
p_raw UNCONN 0      0                  *:spine1-eth2             *     ino:139821745 sk:19b0 ver:0 cpy_thresh:0 flags( 0 ) skmem:(r4608,rb2097152,t0,tb212992,f0,w0,o176,bl0,d0)
"""


def test_packet_sockets_are_parsed_only_those_of_the_process():
    sockets = machine.parse_packet_sockets(SS_OUTPUT, {139821700, 139821731, 139821745})
    assert sockets == [  # the third line's socket is another process's capture of leaf2-eth1
        machine.PacketSocket(None, 2097152, 212992, 0),
        machine.PacketSocket("leaf2-eth1", 2097152, 212992, 17),
        machine.PacketSocket("spine1-eth2", 2097152, 212992, 0),
    ]


def test_socket_inodes_are_those_the_process_holds():
    sock = socket.socket()
    inode = os.fstat(sock.fileno()).st_ino
    assert inode in machine.socket_inodes(os.getpid())
    sock.close()
    assert inode not in machine.socket_inodes(os.getpid())


@pytest.fixture
def proc_sys(tmp_path) -> Path:
    for name, value in {"net/core/rmem_default": "212992", "net/core/wmem_default": "33554432",
                        "net/ipv4/tcp_allowed_congestion_control": "reno bbr",
                        "net/ipv4/tcp_available_congestion_control": "reno bbr cubic"}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(value + "\n")
    return tmp_path


def test_buffers_are_raised_never_lowered(proc_sys):
    changed = machine.raise_sysctls(machine.SOCKET_BUFFERS, proc_sys)
    assert changed == {"net/core/rmem_default": (212992, 2 << 20)}
    assert machine.read_sysctl("net/core/rmem_default", proc_sys) == str(2 << 20)
    assert machine.read_sysctl("net/core/wmem_default", proc_sys) == "33554432", "another user raised it"
    assert machine.raise_sysctls(machine.SOCKET_BUFFERS, proc_sys) == {}, "idempotent"


def test_congestion_control_is_added_to_the_allowed_list(proc_sys):
    assert machine.allow_tcp_cc("cubic", proc_sys) == ("reno bbr", "reno bbr cubic")
    assert machine.allow_tcp_cc("bbr", proc_sys) is None
    assert machine.read_sysctl(machine.ALLOWED_TCP_CC, proc_sys) == "reno bbr cubic"
    assert tcp.available_tcp_cc(proc_sys) == ["reno", "bbr", "cubic"]


def test_unknown_congestion_control_is_refused():
    with pytest.raises(ValueError, match=r"^tcp_cc: 'vegas' is not allowed \(one of .*cubic"):
        tcp.check_tcp_cc("vegas")


def test_busiest_thread_share():
    before, after = {1: 100, 2: 50}, {1: 190, 2: 60, 3: 500}  # thread 3 is new: not judged yet
    assert machine.busiest_thread_share(before, after, 1.0) == pytest.approx(90 / machine.CLK_TCK)
    assert machine.busiest_thread_share(before, after, 0.0) == 0.0


def test_machine_jiffies():
    stat = "cpu  100 5 50 800 20 3 2 10 7 0\ncpu0 1 2 3 4 5 6 7 8 9 0\n"
    assert machine.machine_jiffies(stat) == (100 + 5 + 50 + 3 + 2 + 10, 990, 10)


LOG = """\
2026-11-30T20:35:28.154Z|02765|netdev_linux|WARN|Dropped 1211 log messages in last 9 seconds (most recently, 0 seconds ago) due to excessive rate
2026-11-30T20:35:28.154Z|02766|netdev_linux|WARN|error sending Ethernet packet on leaf2-eth2: Resource temporarily unavailable
2026-11-30T20:35:29.001Z|02767|netdev_linux|WARN|error sending Ethernet packet on leaf1-eth5: Resource temporarily unavailable
2026-11-30T20:35:29.002Z|02768|netdev_linux|WARN|error sending Ethernet packet on leaf2-eth2: Resource temporarily unavailable
2026-11-30T20:37:58.170Z|02909|poll_loop|INFO|Dropped 19083 log messages in last 114 seconds due to excessive rate
"""


def test_transmit_errors_count_logged_and_suppressed_lines():
    errors = parse_transmit_errors(LOG)
    assert dict(errors.by_port) == {"leaf2-eth2": 2, "leaf1-eth5": 1}
    assert errors.suppressed == 1211, "another module's suppressed lines do not count"
    assert errors.total == 1214


def test_ovs_log_reads_what_was_added_since(tmp_path):
    log = tmp_path / "ovs-vswitchd.log"
    log.write_text(LOG)
    since = OvsLog(log)
    assert since.transmit_errors().total == 0
    with open(log, "a") as file:
        file.write(LOG.splitlines()[1] + "\n")
    assert since.transmit_errors().total == 1
    log.write_text("")  # rotated
    assert since.transmit_errors().total == 0


def test_open_vswitch_starts_keeping_the_heap_it_grows(monkeypatch):
    """Its daemons inherit ovs-ctl's environment: glibc's trim threshold, raised."""
    seen = []
    monkeypatch.setattr(machine.subprocess, "run",
                        lambda argv, **options: seen.append((argv, options["env"])) or
                        machine.subprocess.CompletedProcess(argv, 0, "", ""))
    machine._ovs_ctl("start")
    (argv, env), = seen
    assert argv[:2] == [machine.OVS_CTL, "start"]
    assert int(env["MALLOC_TRIM_THRESHOLD_"]) >= 64 << 20
    assert env["PATH"] == machine.os.environ["PATH"], "the rest of the environment is passed on"

"""A host app started on another server: its argv and folder as the server's root shell sees them."""
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

import pytest

from emulation.cluster import clock_offset, fetch, offset_from_samples, remote_argv, to_local_clock

PRINTER = "import json, os, sys; print(json.dumps([os.getcwd(), *sys.argv[1:]]))"
WORDS = st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=12),
                 max_size=4)


def as_the_server_runs_it(argv: list[str]) -> list[str]:
    """ssh joins its words with spaces and the server's shell parses the line again."""
    line = " ".join(remote_argv([sys.executable, "-c", PRINTER, *argv[1:]], argv[0]))
    done = subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


@settings(max_examples=25, deadline=None)
@given(words=WORDS)
def test_every_word_reaches_the_remote_process_as_it_was(tmp_path_factory, words):
    folder = tmp_path_factory.mktemp("a repo with spaces $(touch pwned) 'quoted'")
    assert as_the_server_runs_it([str(folder), *words]) == [str(folder), *words]
    assert not (folder / "pwned").exists()


def test_without_a_folder_the_command_runs_where_the_shell_starts(tmp_path):
    line = " ".join(remote_argv(["pwd"], None))
    done = subprocess.run(["sh", "-c", line], cwd=tmp_path, capture_output=True, text=True)
    assert done.stdout.strip() == str(tmp_path)


def test_a_servers_clock_is_read_from_its_shortest_round_trip():
    # its clock is 2.5 s ahead; the second sample's round trip is the shortest (2 ms)
    samples = [(10.0, 12.53, 10.06), (20.0, 22.501, 20.002), (30.0, 32.52, 30.03)]
    offset, error = offset_from_samples(samples)
    assert offset == pytest.approx(2.5) and error == pytest.approx(0.001)


class Server:
    """A node on another server as clock_offset and fetch ask it: its shell answers `date`, its
    server answers commands in its root namespace (rcmd)."""
    server = "rack2"

    def __init__(self, boot_id: str = "another kernel", stat: str = "") -> None:
        self.replies = iter(["1000.5\n"] * 5)
        self.boot_id, self.stat = boot_id, stat

    def cmd(self, command):
        assert command == "date +%s.%N"
        return next(self.replies)

    def rcmd(self, command):
        return "\n".join([self.boot_id, self.stat][:2 if "stat" in command else 1]) + "\n"


def test_clock_offset_asks_the_server_and_is_zero_here():
    ticks = iter([998.0, 998.2] * 5)
    assert clock_offset(Server(), clock=lambda: next(ticks)) == (pytest.approx(2.4), pytest.approx(0.1))

    class Here:
        server = "localhost"
    assert clock_offset(Here()) == (0.0, 0.0)


def test_a_server_on_this_kernel_shares_its_clock_and_its_folders(tmp_path):
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert clock_offset(Server(boot_id), clock=lambda: pytest.fail("no round trip needed")) == (0.0, 0.0)
    here = os.stat(tmp_path)
    assert fetch(Server(boot_id, f"{here.st_dev} {here.st_ino}"), str(tmp_path)) == ""  # no scp onto itself


def test_a_cwd_given_as_a_path_reaches_the_server_as_its_text(tmp_path):
    line = " ".join(remote_argv(["pwd"], tmp_path))
    done = subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == str(tmp_path)


def test_a_remote_processs_records_are_restamped_on_this_machines_clock(tmp_path):
    (tmp_path / "iterations.csv").write_text("job,iteration,start_s,end_s,compute_s\n1,0,102.5,103.0,0.4\n")
    (tmp_path / "tensors.csv").write_text("tensor,start_s,end_s\nfc1,102.75,102.875\n")
    to_local_clock(tmp_path, 2.5)
    assert (tmp_path / "iterations.csv").read_text().splitlines()[1] == "1,0,100.000000,100.500000,0.4"
    assert (tmp_path / "tensors.csv").read_text().splitlines()[1] == "fc1,100.250000,100.375000"


class Switch:
    """A switch as Mininet's batch start-up reads it: its queued ovs-vsctl commands and its server."""

    def __init__(self, name: str, server: str) -> None:
        self.name, self.server, self.intfs, self.started_once = name, server, {}, False
        self.commands = [f"-- add-br {name} " + " ".join(f"-- add-port {name} {name}-eth{i} -- set Interface "
                                                         f"{name}-eth{i} mtu_request=9000" for i in range(40))]
        self.rcmds: list[list[str]] = []

    def isOldOVS(self):
        return False

    def cmd(self, command):
        raise AssertionError("a node's shell reads from a terminal, which cuts lines at 4095 bytes")

    def rcmd(self, argv):
        self.rcmds.append(argv)
        return ""

    def started(self):
        self.started_once = True


def test_each_servers_switches_start_in_one_uncut_ovs_vsctl_there():
    from emulation.cluster import remote
    from topologies.nodes import OVSUserSwitch

    here, there = [Switch("leaf1", "localhost"), Switch("spine1", "localhost")], [Switch("leaf2", "rack2"),
                                                                                    Switch("spine2", "rack2")]
    ran_here: list[str] = []
    remote(OVSUserSwitch).batchStartup([*here, *there], run=lambda command, **_: ran_here.append(command))
    assert ran_here == [" ".join(["ovs-vsctl", *here[0].commands, *here[1].commands])]
    (argv,) = there[0].rcmds
    assert argv[:2] == ["sh", "-c"] and not there[1].rcmds
    (line,) = shlex.split(argv[2])
    assert line == " ".join(["ovs-vsctl", *there[0].commands, *there[1].commands]) and len(line) > 4095
    assert all(switch.started_once for switch in [*here, *there])

"""Clean-up signals a recorded process only while it is provably the one recorded (same PID and
start time), and finds our nftables tables by their mark, from captured output; a fabric's teardown
holds Ctrl-C until it is done."""
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulation import cleanup
from helpers.fabric import repo_processes
from helpers.session import SESSION_ENV
from common.signals import signals_deferred


def sleeper() -> subprocess.Popen:
    """A child that has run its program (until then /proc shows the forked parent's empty command line)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE)
    child.stdout.readline()
    return child


def test_a_recorded_process_is_stopped():
    child = sleeper()
    record = cleanup.process_record(child.pid)
    assert record.pid == child.pid and record.argv0 == sys.executable and cleanup.is_alive(record)
    assert cleanup.kill_recorded([record]) == [child.pid]
    assert child.wait(5) != 0 and not cleanup.is_alive(record)


def test_a_recycled_pid_is_left_alone():
    """The PID of a recorded process that ended now belongs to another one: another start time."""
    child = sleeper()
    stale = dataclasses.replace(cleanup.process_record(child.pid), start=cleanup.process_record(child.pid).start - 1)
    try:
        assert not cleanup.is_alive(stale)
        assert cleanup.kill_recorded([stale], grace=0.2) == []
        assert child.poll() is None, "a stranger's process was signalled"
    finally:
        child.kill()
        child.wait()


def test_gone_processes_are_not_signalled():
    child = sleeper()
    record = cleanup.process_record(child.pid)
    child.kill()
    child.wait()
    assert cleanup.process_record(child.pid) is None
    assert cleanup.kill_recorded([record], grace=0.2) == []


def test_our_nft_tables_are_those_with_our_comment(monkeypatch):
    ruleset = ('table netdev dnntb_leaf1_eth1 {\n\tcomment "dnn-testbed"\n\tchain loss {\n\t}\n}\n'
               'table inet dnntb_theirs {\n\tchain c {\n\t}\n}\n'
               'table netdev filter {\n\tcomment "someone else"\n}\n')
    monkeypatch.setattr(cleanup.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=ruleset, stderr=""))
    assert cleanup.our_nft_tables() == [("netdev", "dnntb_leaf1_eth1")]


def test_teardown_holds_ctrl_c_whichever_thread_the_kernel_hands_it_to():
    """A process-wide signal goes to any thread that does not block it: with a progress bar's thread
    beside it, a teardown that only masked the main thread was cut short and left processes behind."""
    stop = threading.Event()
    beside = threading.Thread(target=stop.wait)  # does not block SIGINT
    beside.start()
    finished = False
    try:
        with pytest.raises(KeyboardInterrupt):
            with signals_deferred():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)
                finished = True
    finally:
        stop.set()
        beside.join()
    assert finished
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


# -- marks: what clean-up removes --------------------------------------------------------------
BRIDGES = json.dumps({"data": [["leaf1", ["map", [["dnn-testbed", "fabric-1a2b"]]]],
                               ["edge1", ["map", [["dnn-testbed", "hand-run"]]]],
                               ["spine1", ["map", [["dnn-testbed", "1"]]]],
                               ["br0", ["map", []]], ["core1", ["map", [["other", "fabric-1a2b"]]]]],
                      "headings": ["name", "external_ids"]})
LINKS = json.dumps([{"ifname": "lo"}, {"ifname": "leaf1-eth1", "ifalias": "dnn-testbed fabric-1a2b"},
                    {"ifname": "edge1-eth1", "ifalias": "dnn-testbed hand-run"},
                    {"ifname": "spine1-eth1", "ifalias": "dnn-testbed"},
                    {"ifname": "eth0", "ifalias": "dnn-testbed-ish"}, {"ifname": "veth9", "ifalias": "uplink"}])


def test_marks_name_their_owner_and_only_ours_are_read():
    assert cleanup.parse_bridge_marks(BRIDGES) == {"leaf1": "fabric-1a2b", "edge1": "hand-run", "spine1": "unknown"}
    assert cleanup.parse_interface_marks(LINKS) == {"leaf1-eth1": "fabric-1a2b", "edge1-eth1": "hand-run",
                                                    "spine1-eth1": "unknown"}


def test_clean_up_removes_a_fabrics_leftovers_and_hand_run_ones_only_when_asked(monkeypatch, state_file):
    ran = []
    monkeypatch.setattr(cleanup, "marked_bridges", lambda: cleanup.parse_bridge_marks(BRIDGES))
    monkeypatch.setattr(cleanup, "marked_interfaces", lambda: cleanup.parse_interface_marks(LINKS))
    monkeypatch.setattr(cleanup, "our_nft_tables", lambda: [])
    monkeypatch.setattr(cleanup.subprocess, "run", lambda argv, **_: ran.append(argv[-1]))
    done = cleanup.clean_stale()
    assert ran == ["leaf1", "leaf1-eth1"]
    assert done == ["deleted bridge leaf1 (fabric-1a2b)", "deleted interface leaf1-eth1 (fabric-1a2b)"]
    ran.clear()
    cleanup.clean_stale(hand_run=True)
    assert ran == ["leaf1", "edge1", "spine1", "leaf1-eth1", "edge1-eth1", "spine1-eth1"]


# -- the state file ----------------------------------------------------------------------------
@pytest.fixture
def state_file(tmp_path, monkeypatch):
    path = tmp_path / "fabric.json"
    monkeypatch.setattr(cleanup, "STATE_FILE", path)
    return path


def test_a_fabric_record_reads_back(state_file):
    me = cleanup.process_record(os.getpid())
    record = cleanup.FabricRecord("1a2b", me, [me], ["leaf1", "spine1"])
    cleanup.write_state(record)
    assert cleanup.read_state() == record


def test_a_record_of_a_testbed_without_fabric_ids_is_read():
    """What fabrics wrote before they had ids: its processes are still stopped."""
    record = cleanup.build(cleanup.FabricRecord, {"owner": {"pid": 10, "start": 5, "argv0": "python"},
                                                  "processes": [{"pid": 11, "start": 6, "argv0": "bash"}],
                                                  "switches": ["leaf1"]}, "state")
    assert record.fabric == "" and record.processes == [cleanup.ProcessRecord(11, 6, "bash")]


@pytest.mark.parametrize("text, why", [
    ("", "not JSON"),
    ('{"processes": [', "not JSON"),
    ("[" * 100_000, "not JSON"),
    ("[1, 2]", "state: [1, 2] is not allowed (a mapping"),
    ('{"processes": {"pid": 1}}', "state.processes: "),
    ('{"processes": [{"pid": "12", "start": 1}]}', "state.processes.0.pid: '12' is not allowed"),
    ('{"processes": [{"pid": 12}]}', "state.processes.0.start: missing"),
    ('{"processes": [{"pid": -1, "start": 1}]}', "state.processes.0.pid: -1 is not allowed (a PID > 0)"),
    ('{"fabric": "1a2b", "hosts": []}', "state.hosts: unknown field"),
])
def test_a_state_file_of_another_shape_is_no_record_said_in_one_line(state_file, text, why):
    state_file.write_text(text)
    said = []
    assert cleanup.read_state(said.append) is None
    assert len(said) == 1 and "\n" not in said[0] and why in said[0], said
    assert said[0].startswith(f"clean-up: {state_file} is not a fabric record (") and \
        said[0].endswith("); taken as no record")


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                        st.sampled_from(["fabric", "owner", "processes", "switches", "pid", "start", "argv0", "x"]),
                        inner, max_size=4), max_leaves=20)


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(document=JSON)
def test_any_json_in_the_state_file_is_a_record_or_none(state_file, document):
    state_file.write_text(json.dumps(document))
    said = []
    record = cleanup.read_state(said.append)
    assert (record is None) == (len(said) == 1)
    if record is not None:
        assert all(process.pid > 0 and isinstance(process.start, int) for process in record.processes)


def test_clean_up_after_a_state_file_of_another_shape_stops_nothing_and_forgets_it(monkeypatch, state_file, capsys):
    monkeypatch.setattr(cleanup, "marked_bridges", dict)
    monkeypatch.setattr(cleanup, "marked_interfaces", dict)
    monkeypatch.setattr(cleanup, "our_nft_tables", list)
    monkeypatch.setattr(cleanup, "kill_recorded", lambda records: pytest.fail("nothing is recorded"))
    state_file.write_text('["a list, not a record"]')
    assert cleanup.clean_stale() == []
    assert not state_file.exists()
    assert capsys.readouterr().err.count("\n") == 1


def test_leftover_checks_count_only_what_this_test_session_started():
    """A host app, controller or runner someone else runs from this checkout beside the suite (a
    bench, a spec validation) is not a leftover of the tests."""
    argv = [sys.executable, "-c", "import time; time.sleep(60)", "-m", "hostapps"]
    theirs_env = {key: value for key, value in os.environ.items() if key != SESSION_ENV}
    ours, theirs = subprocess.Popen(argv), subprocess.Popen(argv, env=theirs_env)
    try:
        found = repo_processes(exclude={os.getpid()})
        assert ours.pid in found and theirs.pid not in found
    finally:
        for child in (ours, theirs):
            child.kill()
            child.wait()

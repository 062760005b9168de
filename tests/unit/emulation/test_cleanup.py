"""Clean-up signals a recorded process only while it is provably the one recorded (same PID and
start time), and finds our nftables tables by their mark, from captured output; a fabric's teardown
holds Ctrl-C until it is done."""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from emulation import cleanup
from common.signals import signals_deferred


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_recorded_process_is_stopped():
    child = sleeper()
    record = cleanup.process_record(child.pid)
    assert record["pid"] == child.pid and record["argv0"] == sys.executable and cleanup.is_alive(record)
    assert cleanup.kill_recorded([record]) == [child.pid]
    assert child.wait(5) != 0 and not cleanup.is_alive(record)


def test_a_recycled_pid_is_left_alone():
    """The PID of a recorded process that ended now belongs to another one: another start time."""
    child = sleeper()
    stale = {**cleanup.process_record(child.pid), "start": cleanup.process_record(child.pid)["start"] - 1}
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

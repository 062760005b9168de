"""The controller as a fabric's process (emulation/controller.py), on loopback ports without switches:
started until its REST answers and recorded the moment it exists, a dead or silent one said in one
line and replaced with its jobs, a failed start said in one line; one started by someone else is
queried, never restarted."""
import json
import os
import signal
import socket

import pytest

from emulation.controller import ControllerProcess
from emulation.errors import FabricError
from helpers.loopback import free_port
from topologies.nodes import FabricController

pytestmark = pytest.mark.slow
HOSTS = [{"ip": "10.0.0.1", "mac": "00:00:00:00:00:01", "dpid": 0x1001, "port": 1}]
JOB = {"job": "j1", "policy": "layer", "hosts": ["10.0.0.1"],
       "layers": [{"index": 0, "name": "l0", "bytes": 100, "fwd_ms": 1.0}], "flows": []}


def unstarted(workdir) -> ControllerProcess:
    started: list[int] = []
    process = ControllerProcess("ecmp", workdir, ofp_port=free_port(), rest_port=free_port(), hosts=HOSTS,
                                on_started=lambda: started.append(process.pid))
    process.started = started
    return process


@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    """One controller for the module (a start takes seconds); each test leaves it running."""
    process = unstarted(tmp_path_factory.mktemp("controller"))
    process.start()
    yield process
    process.stop()
    assert process.pid is None and process.down() == ""


def test_started_once_its_rest_answers_and_recorded_the_moment_it_exists(controller):
    assert controller.started[0] == controller.pid
    assert controller.down() == "" and controller.rest("/fabric")["switches"] == []
    assert json.loads((controller.workdir / "hosts.json").read_text()) == HOSTS
    command = controller.command()
    assert command[command.index("--hosts-file") + 1] == str(controller.workdir / "hosts.json")
    assert command[command.index("--rest-port") + 1] == str(controller.rest_port)


def test_a_killed_controller_is_said_and_replaced_with_its_jobs(controller):
    first = controller.pid
    os.kill(first, signal.SIGKILL)
    assert controller.down() == "controller exited with status -9"
    controller.restart([JOB])
    assert controller.pid != first and controller.started[-2:] == [first, controller.pid]
    assert controller.down() == ""
    assert [job["job"] for job in controller.rest("/jobs")] == ["j1"]
    assert controller.problems() == []


def test_a_silent_controller_is_said(controller):
    os.kill(controller.pid, signal.SIGSTOP)
    try:
        assert controller.down() == "controller REST did not answer (timed out)"
    finally:
        os.kill(controller.pid, signal.SIGCONT)


def test_a_taken_port_fails_the_start_in_one_line(tmp_path):
    controller = unstarted(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", controller.rest_port))
        taken.listen()
        with pytest.raises(FabricError, match=r"^controller exited: .*") as failed:
            controller.start()
    assert str(controller.rest_port) in str(failed.value)


def test_waiting_for_switches_says_what_it_saw(controller):
    with pytest.raises(FabricError, match=r"^controller saw 0/2 switches and 0/1 links after 1 s \(log: .*\)$"):
        controller.wait_switches(2, 1, timeout=1)


def test_a_controller_started_by_someone_else_is_queried_never_restarted(tmp_path):
    theirs = ControllerProcess("ecmp", tmp_path, ofp_port=free_port(), rest_port=free_port(), own=False)
    theirs.start()
    assert theirs.pid is None and theirs.down() == ""
    with pytest.raises(OSError):
        theirs.rest("/fabric")
    with pytest.raises(FabricError, match="not this fabric's"):
        theirs.restart([])


def test_mininets_listening_check_survives_binary_greetings():
    """An OpenFlow hello's random transaction id is seldom UTF-8: Mininet's own telnet check
    crashed on it, ours only connects."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert FabricController.isListening(None, "127.0.0.1", port)
    assert not FabricController.isListening(None, "127.0.0.1", port)

"""`python -m controller` argument and port errors (nothing is started), and the stats CSV."""
import csv
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from ryu import cfg

from controller.cli import parse_args, port_in_use
from controller.options import RYU_GROUP, AppOptions, ControllerOptions, app_options, ryu_arguments, ryu_options
from controller.stats import PORT_COLUMNS, PortStatsWriter

from helpers.loopback import free_port
from helpers import REPO



@pytest.mark.parametrize("argv, flag", [
    (["--lb", "roundrobin"], "--lb"),
    (["--lb", "ECMP"], "--lb"),
    (["--ofp-port", "0"], "--ofp-port"),
    (["--ofp-port", "65536"], "--ofp-port"),
    (["--ofp-port", "-1"], "--ofp-port"),
    (["--ofp-port", "six"], "--ofp-port"),
    (["--rest-port", "0"], "--rest-port"),
    (["--rest-port", "70000"], "--rest-port"),
    (["--ofp-port", "7000", "--rest-port", "7000"], "--rest-port"),
    (["--stats-interval", "0"], "--stats-interval"),
    (["--stats-interval", "-1"], "--stats-interval"),
    (["--ofp-host", "leaf1"], "--ofp-host"),
    (["--ofp-host", "10.0.0.256"], "--ofp-host"),
    (["--probe-interval", "0"], "--probe-interval"),
    (["--stats-interval", "nan"], "--stats-interval"),
    (["--rest-port", "6653"], "--rest-port"),
])
def test_bad_arguments_exit_non_zero_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    assert exit_.value.code not in (0, None)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error:" in err and flag in err, err


def test_good_arguments():
    args = parse_args(["--lb", "spray", "--ofp-port", "1", "--rest-port", "65535",
                       "--stats-interval", "0.5"])
    assert (args.lb, args.ofp_port, args.rest_port, args.stats_interval) == ("spray", 1, 65535, 0.5)
    assert (parse_args([]).lb, parse_args([]).ofp_host) == ("ecmp", "127.0.0.1")
    assert parse_args(["--ofp-host", "192.0.2.7"]).ofp_host == "192.0.2.7"
    assert parse_args([]) == ControllerOptions()


def ryu_config(argv: list[str]) -> cfg.ConfigOpts:
    """A config of Ryu's kind with the app's options, parsed from `argv`."""
    conf = cfg.ConfigOpts()
    conf.register_cli_opts(ryu_options(cfg), group=RYU_GROUP)
    conf(args=argv)
    return conf


def test_the_options_reach_the_ryu_app_as_given():
    options = parse_args(["--lb", "single", "--stats-interval", "0.1", "--probe-interval", "2.5",
                          "--stats-csv", "/tmp/ports.csv", "--hosts-file", "h.json"])
    assert app_options(ryu_config(ryu_arguments(options))[RYU_GROUP]) == AppOptions(
        "single", 0.1, "/tmp/ports.csv", 2.5, "h.json")
    assert app_options(ryu_config([])[RYU_GROUP]) == AppOptions(), "Ryu without our flags: our defaults"


@pytest.mark.parametrize("argv, line", [
    (["--fabric-lb", "bogus"], "error: --fabric-lb: bogus is not allowed (one of ecmp, spray, single)"),
    (["--fabric-probe-interval", "-1"], "error: --fabric-probe-interval: -1 is not allowed (seconds > 0 "),
])
def test_a_bad_option_under_plain_ryu_stops_the_app_naming_its_flag(argv, line):
    with pytest.raises(SystemExit) as exit_:
        app_options(ryu_config(argv)[RYU_GROUP])
    assert str(exit_.value).startswith(line)


@pytest.fixture
def listening():
    """A port something listens on (127.0.0.1)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_port_in_use(listening):
    assert port_in_use(listening)
    assert not port_in_use(free_port())


def run_controller(*argv: str) -> subprocess.CompletedProcess:
    """Run `python -m controller` in its own process group; fail (and kill it) if it lingers."""
    proc = subprocess.Popen([sys.executable, "-m", "controller", *argv], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("python -m controller kept running although its port was taken")
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)  # nothing of it is left running
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("flag", ["--ofp-port", "--rest-port"])
def test_a_port_in_use_stops_the_controller_with_one_line(listening, flag):
    other = "--rest-port" if flag == "--ofp-port" else "--ofp-port"
    done = run_controller(flag, str(listening), other, str(free_port()))
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert flag in lines[0] and str(listening) in lines[0] and "in use" in lines[0]
    assert done.stdout == ""


def listening_addresses(port: int) -> set[str]:
    """The IPv4 addresses a socket of this machine listens on at TCP `port` (/proc/net/tcp)."""
    addresses = set()
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, local_port = local.split(":")
        if state == "0A" and int(local_port, 16) == port:  # LISTEN
            addresses.add(str(ipaddress.IPv4Address(bytes.fromhex(address)[::-1])))
    return addresses


def serve_once(argv: list[str], rest_port: int) -> tuple[str, set[str]]:
    """Start a controller (`python argv`), wait until its REST API answers, stop it (SIGTERM);
    its stderr, and the addresses its REST port listened on."""
    # eventlet keeps quiet about ungreened locks when it sees it runs under pytest.
    env = {name: value for name, value in os.environ.items() if name != "PYTEST_CURRENT_TEST"}
    proc = subprocess.Popen([sys.executable, *argv], cwd=REPO, text=True, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{rest_port}/jobs", timeout=1) as answer:
                    assert answer.status == 200
                break
            except OSError:
                time.sleep(0.2)
        addresses = listening_addresses(rest_port)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    return err, addresses


def test_python_m_controller_starts_clean_on_loopback():
    rest = free_port()
    err, addresses = serve_once(["-m", "controller", "--ofp-port", str(free_port()), "--rest-port", str(rest)], rest)
    assert "were not greened" not in err and "Traceback" not in err, err
    assert addresses == {"127.0.0.1"}


def test_the_app_under_ryu_manager_serves_rest_on_loopback_unless_told_otherwise():
    """Ryu's own default for --wsapi-host is every interface (0.0.0.0)."""
    rest = free_port()
    err, addresses = serve_once(["-m", "controller.manager", "--user-flags", "controller/flags.py", "controller/app.py",
                                 "--ofp-tcp-listen-port", str(free_port()), "--wsapi-port", str(rest)], rest)
    assert "were not greened" not in err and "Traceback" not in err, err
    assert addresses == {"127.0.0.1"}


def test_unknown_lb_from_the_command_line():
    done = run_controller("--lb", "bogus")
    assert done.returncode != 0
    assert "--lb" in done.stderr.strip().splitlines()[-1]


# -- stats CSV --------------------------------------------------------------------------------
def row(t: float, port: int) -> dict:
    return {"time_s": t, "switch": "leaf1", "port": port, "tx_bytes": 10 * port,
            "rx_bytes": 20 * port, "tx_packets": port, "rx_packets": 2 * port,
            "tx_dropped": 0, "rx_dropped": 1, "extra": "ignored"}


def test_port_stats_writer_writes_the_header_once_and_appends(tmp_path):
    path = tmp_path / "ports.csv"
    writer = PortStatsWriter(str(path))
    writer.write([row(0.5, 1), row(0.5, 2)])
    # Flushed per poll: readable before close (a killed run keeps its rows).
    assert len(path.read_text().splitlines()) == 3
    writer.close()
    writer = PortStatsWriter(str(path))  # a second run appends to the same file
    writer.write([row(1.5, 1)])
    writer.write([])
    writer.close()
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == list(PORT_COLUMNS)
    assert rows.count(list(PORT_COLUMNS)) == 1
    assert rows[1:] == [["0.5", "leaf1", "1", "10", "20", "1", "2", "0", "1"],
                        ["0.5", "leaf1", "2", "20", "40", "2", "4", "0", "1"],
                        ["1.5", "leaf1", "1", "10", "20", "1", "2", "0", "1"]]


def test_port_stats_writer_header_on_an_empty_run(tmp_path):
    path = tmp_path / "ports.csv"
    PortStatsWriter(str(path)).close()
    PortStatsWriter(str(path)).close()
    assert path.read_text().splitlines() == [",".join(PORT_COLUMNS)]

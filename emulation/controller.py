"""A fabric's controller as a process: our Ryu app (`python -m controller`) started on its ports,
checked, restarted after a crash, and queried through its REST API.

    controller = ControllerProcess("spray", workdir, hosts=topo_hosts(topo), on_started=save_state)
    controller.start()                       # returns once its REST answers
    controller.wait_switches(4, 4)           # until it knows every switch and link
    why = controller.down()                  # '' while it serves
    controller.restart(jobs)                 # a new one on the same ports, the jobs registered again

The fabric (emulation/fabric.py) owns the network and one of these; `own=False` stands for a
controller someone else started on those ports, which is queried but never started, stopped or
restarted.
"""
from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Callable

from common.paths import REPO, venv_python
from common.signals import signals_deferred
from emulation.cleanup import kill_group
from emulation.errors import FabricError

START_TIMEOUT_S = 30.0  # until its REST answers; it imports Ryu first (3 s on a busy 2-core machine)
CHECK_TIMEOUT_S = 2.0
EXIT_WAIT_S = 0.5  # after its REST failed: a killed controller is reaped within this
REST_TIMEOUT_S = 5.0
POLL_S = 0.2


def rest(port: int, path: str, method: str = "GET", body: dict | None = None,
         timeout: float = REST_TIMEOUT_S) -> dict | list:
    """One call of the controller's REST API on 127.0.0.1:port, its JSON answer decoded."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


class ControllerProcess:
    def __init__(self, lb: str, workdir: Path, ofp_host: str = "127.0.0.1", ofp_port: int = 6653,
                 rest_port: int = 8080, stats_csv: str | Path | None = None, stats_interval: float = 1.0,
                 hosts: list[dict] | None = None, own: bool = True,
                 on_started: Callable[[], None] = lambda: None) -> None:
        """hosts: every host as the controller's hosts file lists them (routes exist from the start,
        and again right after a restart); None: it learns them from ARP. on_started: called the
        moment the process exists, with Ctrl-C held (the fabric records its PID there)."""
        self.lb, self.workdir = lb, Path(workdir)
        self.ofp_host, self.ofp_port, self.rest_port = ofp_host, ofp_port, rest_port
        self.stats_csv, self.stats_interval = stats_csv, stats_interval
        self.hosts, self.own, self.on_started = hosts, own, on_started
        self.process: subprocess.Popen | None = None

    @property
    def log(self) -> Path:
        return self.workdir / "controller.log"

    @property
    def stderr(self) -> Path:
        return self.workdir / "controller.stderr"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def command(self) -> list[str]:
        cmd = [venv_python(), "-m", "controller", "--lb", self.lb, "--ofp-host", self.ofp_host,
               "--ofp-port", str(self.ofp_port), "--rest-port", str(self.rest_port),
               "--log-file", str(self.log), "--stats-interval", str(self.stats_interval)]
        if self.hosts is not None:
            cmd += ["--hosts-file", str(self.workdir / "hosts.json")]
        if self.stats_csv:
            cmd += ["--stats-csv", str(self.stats_csv)]
        return cmd

    # -- life cycle ---------------------------------------------------------------------------
    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Start it and return once its REST answers (FabricError when it exits or stays silent)."""
        if not self.own:
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.hosts is not None:
            (self.workdir / "hosts.json").write_text(json.dumps(self.hosts))
        with open(self.stderr, "a") as err, signals_deferred():  # recorded before Ctrl-C can strike
            self.process = subprocess.Popen(self.command(), cwd=REPO, stdout=err, stderr=subprocess.STDOUT,
                                            start_new_session=True)
            self.on_started()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise FabricError("controller exited: " + self.stderr.read_text().strip()[-500:])
            try:
                self.rest("/fabric", timeout=CHECK_TIMEOUT_S)
                return
            except OSError:
                time.sleep(POLL_S)
        raise FabricError(f"controller REST did not answer on 127.0.0.1:{self.rest_port} in {timeout:.0f} s")

    def stop(self) -> None:
        if self.process is not None:
            kill_group(self.process)
            self.process = None

    def restart(self, jobs: list[dict]) -> None:
        """A dead or silent controller replaced by a new one on the same ports, then `jobs`
        (POST /jobs documents) registered again."""
        if not self.own:
            raise FabricError("the controller is not this fabric's (started by someone else): "
                              "it is not restarted")
        self.stop()
        self.start()
        for job in jobs:
            self.rest("/jobs", "POST", job)

    # -- health -------------------------------------------------------------------------------
    def down(self) -> str:
        """Why it is not serving ('' while it is, or when it is not ours): it exited, or its REST
        is silent."""
        if self.process is None:
            return ""
        status = self.process.poll()
        if status is None:
            try:
                self.rest("/fabric", timeout=CHECK_TIMEOUT_S)
                return ""
            except OSError as error:
                try:  # a reset or refused connection: the process may be dying, and its status says more
                    status = self.process.wait(EXIT_WAIT_S)
                except subprocess.TimeoutExpired:
                    return f"controller REST did not answer ({error})"
        return f"controller exited with status {status}"

    def problems(self) -> list[str]:
        """Exceptions and OpenFlow errors in its log (there must be none)."""
        if not self.log.exists():
            return []
        return [line for line in self.log.read_text().splitlines()
                if "Traceback" in line or "OpenFlow error" in line or "Exception" in line]

    # -- queries ------------------------------------------------------------------------------
    def rest(self, path: str, method: str = "GET", body: dict | None = None,
             timeout: float = REST_TIMEOUT_S) -> dict | list:
        return rest(self.rest_port, path, method, body, timeout)

    def wait_switches(self, switches: int, links: int, timeout: float = 30.0) -> None:
        """Until it knows `switches` switches and `links` switch-to-switch links."""
        deadline = time.monotonic() + timeout
        seen: dict = {}
        while time.monotonic() < deadline:
            seen = self.rest("/fabric")
            if len(seen["switches"]) == switches and len(seen["links"]) == links:
                return
            time.sleep(POLL_S)
        raise FabricError(f"controller saw {len(seen.get('switches', []))}/{switches} "
                          f"switches and {len(seen.get('links', []))}/{links} links "
                          f"after {timeout:.0f} s (log: {self.log})")

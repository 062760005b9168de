"""Integration: the live view of a running experiment, rendered by a real headless browser (Debian's
chromium): the page loads, shows the current run's iterations as they arrive, and the links'
colours change while traffic flows. A screenshot is kept in results/test-artifacts/."""
from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from pathlib import Path


from helpers import FIXTURES, REPO
from helpers.fabric import experiments_cli, finish, leftovers


FAULTS = FIXTURES / "experiments" / "faults.yaml"
ARTIFACTS = REPO / "results" / "test-artifacts"
CHROMIUM = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--virtual-time-budget=4000"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def render(url: str, tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"chromium-{time.monotonic_ns()}"
    result = subprocess.run([*CHROMIUM, f"--user-data-dir={profile}", *flags, url], capture_output=True,
                            text=True, timeout=90)
    shutil.rmtree(profile, ignore_errors=True)
    return result


def screenshot(url: str, tmp_path: Path, path: Path) -> None:
    """A screenshot of the page; chromium on a loaded machine can exit without writing one, so up to
    three tries, and chromium's own words if none wrote it."""
    path.unlink(missing_ok=True)
    for _ in range(3):
        result = render(url, tmp_path, "--window-size=1100,1000", f"--screenshot={path}")
        if path.exists() and path.stat().st_size > 10_000:
            return
        time.sleep(1)
    raise AssertionError(f"no screenshot in three tries (exit {result.returncode}): {result.stderr[-1500:]}")


def link_utilizations(dom: str) -> dict[str, float]:
    return {link: float(util) for link, util in re.findall(r'data-link="([^"]+)" data-util="([0-9.]+)"', dom)}


def rendered_count(url: str, tmp_path) -> tuple[str, int]:
    """The page's DOM and its iteration count; a render on a loaded machine can dump the DOM before
    the page's first update drew the count, so up to three renders."""
    for _ in range(3):
        dom = render(url, tmp_path, "--dump-dom").stdout
        found = re.search(r'class="iterations"[^>]*? data-count="(\d+)"', dom)
        if found:
            return dom, int(found.group(1))
        time.sleep(1)
    raise AssertionError(f"no iteration count in three renders: {dom[-1000:]}")


def test_live_view_in_a_headless_browser(tmp_path):
    port = free_port()
    out = tmp_path / "out"
    runner = experiments_cli(str(FAULTS), "--out", str(out), "--set", "repetitions=1", "--set", "job.iterations=25",
                             "--live", str(port), cwd=tmp_path)
    url = f"http://127.0.0.1:{port}/"
    log = out / "runs" / "rep=1" / "h1-worker0" / "stdout.log"
    deadline = time.monotonic() + 120
    while not (log.exists() and log.read_text().count("iteration ") >= 5):
        assert runner.poll() is None and time.monotonic() < deadline, runner.communicate()[1][-2000:]
        time.sleep(0.2)
    first, first_count = rendered_count(url, tmp_path)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshot(url, tmp_path, ARTIFACTS / "live_view.png")
    second, second_count = rendered_count(url, tmp_path)
    status, _, stderr = finish(runner, timeout=240)
    assert status == 0, stderr[-2000:]
    assert "Experiment faults" in first and "running" in first
    counts = [first_count, second_count]
    assert counts[1] > counts[0] >= 3, counts
    before, after = link_utilizations(first), link_utilizations(second)
    assert len(before) == 8, "a 2x2x2 fabric has 8 links"
    assert any(util > 0.05 for util in after.values()), "traffic flows"
    assert before != after, "the colours follow the traffic"
    assert leftovers() == []


def test_a_taken_live_port_is_refused_before_any_network(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status, _, stderr = finish(experiments_cli(str(FAULTS), "--out", str(tmp_path / "out"), "--live", str(port),
                                                   cwd=tmp_path), timeout=60)
    assert status != 0
    assert stderr.strip().splitlines() == [f"run: --live: port {port} on 127.0.0.1 cannot be used (Address already "
                                           "in use); pick another one"]
    assert not (tmp_path / "out").exists() and leftovers() == []

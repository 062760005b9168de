"""Which processes this test session started: each inherits SESSION_ENV from the pytest process
(conftest.py sets it first thing), through the runner, the controller, Mininet's node shells and
the host apps. A check for leftovers counts only those: a `make bench-rest` or `python -m
experiments validate` someone runs from the same checkout beside the suite is not a leftover (it
was counted as one, and failed whichever test was finishing then)."""
from __future__ import annotations

import os
import secrets
from pathlib import Path

SESSION_ENV = "DNN_TESTBED_TEST_SESSION"


def mark_session() -> None:
    os.environ[SESSION_ENV] = secrets.token_hex(8)


def started_here(pid: int) -> bool:
    """Process `pid` was started by this session (False when it is gone or unreadable)."""
    mark = f"{SESSION_ENV}={os.environ.get(SESSION_ENV, '')}".encode()
    try:
        return mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False

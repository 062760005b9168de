import os
from pathlib import Path

import pytest

from helpers.session import mark_session
from hostapps.transport import free_loopback_addresses


def pytest_configure(config):
    mark_session()  # before any test starts a process (helpers/session.py)
    config.addinivalue_line("markers", "slow: multi-process host-app tests (seconds each)")
    config.addinivalue_line("markers", "integration: builds a real fabric (root, Mininet, OVS)")


@pytest.fixture
def loopback_addresses():
    """A function n -> n distinct free 127.0.0.1 (host, port) pairs, for host-app tests."""
    return free_loopback_addresses


INTEGRATION = Path(__file__).resolve().parent / "integration"


def pytest_collection_modifyitems(config, items):
    """Every test under tests/integration builds real networks: it is marked so, and needs root
    (CI runs as root); tests/unit needs neither."""
    skip = pytest.mark.skip(reason="integration test: needs root (Mininet, Open vSwitch)")
    for item in items:
        if INTEGRATION in Path(item.fspath).parents:
            item.add_marker(pytest.mark.integration)
            if os.geteuid() != 0:
                item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def nothing_of_ours_left(request):
    """After the suite no bridge, veth, Mininet host, controller or host app of ours remains.
    Before it, what a fabric that no longer runs left on this machine (a run killed with its
    machine, an earlier suite cut off) is removed as `make clean-net` would, so that the tests
    that look for leftovers judge only what they started."""
    if os.geteuid() == 0 and any("integration" in item.keywords for item in request.session.items):
        clean_before_suite()
    yield
    if os.geteuid() != 0 or not any("integration" in item.keywords
                                    for item in request.session.items):
        return
    from helpers.fabric import leftovers

    assert leftovers(exclude={os.getppid()}) == [], "left behind after the suite"


def clean_before_suite() -> None:
    import fcntl

    from emulation.cleanup import LOCK_FILE, STATE_DIR, clean_stale

    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(LOCK_FILE, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a fabric running meanwhile is not stale: wait for it
        for line in clean_stale():
            print(f"before the suite, of a fabric that no longer runs: {line}")

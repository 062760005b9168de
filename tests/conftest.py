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
    """After the suite no bridge, veth, Mininet host, controller or host app of ours remains."""
    yield
    if os.geteuid() != 0 or not any("integration" in item.keywords
                                    for item in request.session.items):
        return
    from helpers.fabric import leftovers

    assert leftovers(exclude={os.getppid()}) == [], "left behind after the suite"

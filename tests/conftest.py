import pytest

from hostapps.transport import free_loopback_addresses


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: multi-process host-app tests (seconds each)")
    config.addinivalue_line("markers", "integration: builds a real fabric (root, Mininet, OVS)")


@pytest.fixture
def loopback_addresses():
    """A function n -> n distinct free 127.0.0.1 (host, port) pairs, for host-app tests."""
    return free_loopback_addresses


def pytest_collection_modifyitems(config, items):
    """Integration tests build real networks: they need root (CI runs as root)."""
    import os
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="integration test: needs root (Mininet, Open vSwitch)")
    for item in items:
        if "integration" in item.keywords:
            item.add_marker(skip)

import pytest

from hostapps.transport import free_loopback_addresses


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: multi-process host-app tests (seconds each)")


@pytest.fixture
def loopback_addresses():
    """A function n -> n distinct free 127.0.0.1 (host, port) pairs, for host-app tests."""
    return free_loopback_addresses

"""Machine settings, read from /proc/sys (the names are sysctl's, with slashes)."""
from pathlib import Path

SYSCTL_DIR = Path("/proc/sys")


def read_sysctl(name: str, root: Path = SYSCTL_DIR) -> str:
    return (root / name).read_text().strip()

"""TCP congestion control in the fabric's hosts: each host namespace is set to the fabric's choice
(`tcp_cc`), since new namespaces inherit the machine's default (`bbr` here) and a comparison of
schemes must not depend on it. The choice must be one this kernel offers."""
from __future__ import annotations

from pathlib import Path

from common.sysctl import SYSCTL_DIR, read_sysctl

AVAILABLE_TCP_CC = "net/ipv4/tcp_available_congestion_control"
DEFAULT_TCP_CC = "cubic"  # Linux's long-time default; this machine's own default (bbr) is an accident


def available_tcp_cc(root: Path = SYSCTL_DIR) -> list[str]:
    """The TCP congestion controls this kernel offers (network namespaces share the modules)."""
    return read_sysctl(AVAILABLE_TCP_CC, root).split()


def check_tcp_cc(name: object) -> str:
    choices = available_tcp_cc()
    if name not in choices:
        raise ValueError(f"tcp_cc: {name!r} is not allowed (one of {', '.join(choices)}: what "
                         "this kernel offers)")
    return name  # type: ignore[return-value]

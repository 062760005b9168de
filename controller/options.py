"""The controller's options."""
from __future__ import annotations

import json
from pathlib import Path

from controller.priority import parse_int, parse_ipv4
from controller.topology import Host


def load_hosts(path: str) -> list[Host]:
    """The hosts file: a JSON list of {ip, mac, dpid, port}; a bad one stops the controller."""
    try:
        entries = json.loads(Path(path).read_text())
        return [Host(parse_ipv4("ip", e["ip"]), str(e["mac"]), parse_int("dpid", e["dpid"], 1, (1 << 64) - 1),
                     parse_int("port", e["port"], 1, 0xFFFFFF00)) for e in entries]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SystemExit(f"error: --hosts-file {path}: {error}") from None

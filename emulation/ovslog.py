"""Transmit errors that ovs-vswitchd logged since a point in time: frames the switches dropped
before any queue saw them (emulation/machine.py says why that happens). OVS counts them nowhere
else. Its log is rate-limited: after a burst it logs "Dropped N log messages ... due to excessive
rate", so the total is the lines seen plus the suppressed ones of the same module (netdev_linux).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

OVS_LOG = Path("/var/log/openvswitch/ovs-vswitchd.log")
SEND_ERROR = re.compile(r"\|netdev_linux\|WARN\|error sending Ethernet packet on (\S+):")
SUPPRESSED = re.compile(r"\|netdev_linux\|WARN\|Dropped (\d+) log messages")


@dataclass
class TransmitErrors:
    by_port: Counter = field(default_factory=Counter)  # logged lines, by interface
    suppressed: int = 0  # rate-limited netdev_linux warnings (almost all of them these errors)

    @property
    def total(self) -> int:
        return sum(self.by_port.values()) + self.suppressed


def parse_transmit_errors(text: str) -> TransmitErrors:
    errors = TransmitErrors()
    for line in text.splitlines():
        if match := SEND_ERROR.search(line):
            errors.by_port[match[1]] += 1
        elif match := SUPPRESSED.search(line):
            errors.suppressed += int(match[1])
    return errors


class OvsLog:
    """The OVS log from where it ended when this was made (a rotated log is read from its start)."""

    def __init__(self, path: Path = OVS_LOG) -> None:
        self.path = path
        self.offset = self._size()

    def _size(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def new_text(self) -> str:
        if self._size() < self.offset:
            self.offset = 0
        try:
            with open(self.path, "rb") as log:
                log.seek(self.offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def transmit_errors(self) -> TransmitErrors:
        return parse_transmit_errors(self.new_text())

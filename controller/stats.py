"""Port statistics as tidy CSV rows (one row per switch port per poll) for link-utilization plots."""
from __future__ import annotations

import csv
from typing import IO

PORT_COLUMNS = ("time_s", "switch", "port", "tx_bytes", "rx_bytes", "tx_packets", "rx_packets",
                "tx_dropped", "rx_dropped")


class PortStatsWriter:
    """Appends rows to a CSV file, flushing after each poll so a killed run keeps its data."""

    def __init__(self, path: str) -> None:
        self._file: IO[str] = open(path, "a", newline="")
        self._csv = csv.writer(self._file)
        if self._file.tell() == 0:
            self._csv.writerow(PORT_COLUMNS)
            self._file.flush()

    def write(self, rows: list[dict]) -> None:
        self._csv.writerows([[row[c] for c in PORT_COLUMNS] for row in rows])
        self._file.flush()

    def close(self) -> None:
        self._file.close()

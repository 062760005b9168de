"""How late this process's timed sleeps woke up: the host apps' own timing lag.

Emulated compute (layer profiles) and mlt's pacer sleep to deadlines; on a loaded machine they wake
late, and then a run measures the scheduler rather than the network. Every such sleep goes through
`sleep_for`, which records how far past its deadline it woke; summary.json carries the summary and
the runner's fidelity guard judges it.
"""
import threading
import time

import numpy as np

_lags: list[float] = []  # seconds past the deadline, one per sleep
_lock = threading.Lock()


def sleep_for(seconds: float) -> None:
    """time.sleep(seconds), recording the oversleep."""
    deadline = time.monotonic() + seconds
    time.sleep(seconds)
    lag = time.monotonic() - deadline
    with _lock:
        _lags.append(lag)


def summary() -> dict[str, float | int]:
    """sleeps, and the 50th/99th percentile and maximum oversleep in milliseconds."""
    with _lock:
        lags = np.array(_lags) * 1000
    if not lags.size:
        return {"sleeps": 0, "lag_ms_p50": 0.0, "lag_ms_p99": 0.0, "lag_ms_max": 0.0}
    return {"sleeps": int(lags.size), "lag_ms_p50": round(float(np.percentile(lags, 50)), 3),
            "lag_ms_p99": round(float(np.percentile(lags, 99)), 3), "lag_ms_max": round(float(lags.max()), 3)}

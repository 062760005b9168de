"""Command line: `python -m hostapps worker|server --rank R --workers ... [--servers ...] ...`.

Exit status: 0 on success, 2 on bad input, 1 when the run fails (a peer died,
never connected, sent garbage or timed out); errors are one 'error: ...' line.
"""
import os
import sys
import time

from hostapps.codec import FrameError
from hostapps.config import ConfigError, config_from_args
from hostapps.model import limit_blas_threads
from hostapps.server import run_server
from hostapps.transport import TransportError
from hostapps.worker import run_worker


def main(argv: list[str]) -> int:
    limit_blas_threads()
    try:
        cfg = config_from_args(argv)
        if cfg.role == "worker":
            # One line per iteration, with its end (epoch seconds): the experiment runner follows a job's
            # progress, and its live view the iteration times, in this log.
            summary = run_worker(cfg, lambda done: print(f"iteration {done}/{cfg.iterations} {time.time():.3f}",
                                                         flush=True))
        else:
            summary = run_server(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    except (TransportError, FrameError, TimeoutError, OSError) as e:
        print(f"error: {cfg.role}{cfg.rank}: {e}", file=sys.stderr, flush=True)
        return 1
    accuracy = summary["final_accuracy"]
    tested = "" if accuracy is None else f", test accuracy {accuracy:.4f}"
    print(f"{cfg.role}{cfg.rank}: done, {cfg.iterations} iterations in {summary['wall_time_s']:.2f} s{tested}",
          flush=True)
    return 0


if __name__ == "__main__":
    status = main(sys.argv[1:])
    sys.stdout.flush()
    # Daemon threads may still sit in blocking calls after a failure: leave without waiting for them.
    os._exit(status)

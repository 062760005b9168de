"""SIGINT and SIGTERM held over a critical block (writing a record, importing what a signal
must not interrupt), and delivered after it."""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM are held while the block runs, and delivered after it.

    Python runs signal handlers in the main thread whichever thread the kernel picked, so a signal
    mask on the main thread alone does not hold them while other threads (progress bars, samplers)
    run: the main thread's handlers only note the signal until the block ends.  Elsewhere than in
    the main thread, which cannot set handlers, the calling thread's mask holds them."""
    held = (signal.SIGINT, signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread():
        previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, held)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
        return
    received: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, frame: received.append(signum)) for signum in held}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        for signum in received:
            signal.raise_signal(signum)  # to the handler restored: Ctrl-C raises KeyboardInterrupt now

"""`ryu-manager` for Python 3.11: Ryu 4.34 imports eventlet.wsgi.ALREADY_HANDLED, which current
eventlet no longer has (docs/platform.md). Same arguments as ryu-manager, e.g.
    .venv/bin/python -m controller.manager --user-flags controller/flags.py controller/app.py
Importing this module only installs the shim (tests do, before importing ryu.app.wsgi); the
process's entry points (this module run, `python -m controller`) call `monkey_patch` first.
"""
import warnings

warnings.filterwarnings("ignore", message="\nEventlet is deprecated")
import eventlet  # noqa: E402
import eventlet.wsgi  # noqa: E402

eventlet.wsgi.ALREADY_HANDLED = getattr(eventlet.wsgi, "ALREADY_HANDLED", object())


def monkey_patch() -> None:
    """Green the process's threads, sockets and clocks as ryu-manager does, but before anything
    holds a lock: ryu-manager greens threads only after setting up its logging, whose handlers'
    RLocks then stay native (eventlet: "5 RLock(s) were not greened"). Only an entry point calls
    it: the tests import this module and keep native threads."""
    eventlet.monkey_patch()


if __name__ == "__main__":
    monkey_patch()
    from ryu.cmd.manager import main

    main()

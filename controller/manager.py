"""`ryu-manager` for Python 3.11: Ryu 4.34 imports eventlet.wsgi.ALREADY_HANDLED, which current
eventlet no longer has (docs/platform.md). Same arguments as ryu-manager, e.g.
    .venv/bin/python -m controller.manager --user-flags controller/flags.py controller/app.py
Importing this module only installs the shim (tests do, before importing ryu.app.wsgi).
"""
import warnings

warnings.filterwarnings("ignore", message="\nEventlet is deprecated")
import eventlet.wsgi  # noqa: E402

eventlet.wsgi.ALREADY_HANDLED = getattr(eventlet.wsgi, "ALREADY_HANDLED", object())

if __name__ == "__main__":
    from ryu.cmd.manager import main  # monkey-patches the process: only when run

    main()

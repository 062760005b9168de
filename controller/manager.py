"""`ryu-manager` for Python 3.11: Ryu 4.34 imports eventlet.wsgi.ALREADY_HANDLED, which current
eventlet no longer has (PLATFORM.md). Same arguments as ryu-manager, e.g.
    .venv/bin/python -m controller.manager --user-flags controller/flags.py controller/app.py
"""
import warnings

warnings.filterwarnings("ignore", message="\nEventlet is deprecated")
import eventlet.wsgi  # noqa: E402

eventlet.wsgi.ALREADY_HANDLED = getattr(eventlet.wsgi, "ALREADY_HANDLED", object())

from ryu.cmd.manager import main  # noqa: E402

if __name__ == "__main__":
    main()

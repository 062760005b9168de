"""The Ryu app's options (controller/options.py: AppOptions) registered with Ryu's config.

Plain ryu-manager loads them with `--user-flags controller/flags.py`; `python -m controller`
imports this module before Ryu parses its arguments.
"""
from ryu import cfg

from controller.options import RYU_GROUP, ryu_options

# ryu-manager loads this file by path (--user-flags) before parsing, and app.py imports it again
# as a module after parsing, when registering would fail: register once.
if RYU_GROUP not in cfg.CONF:
    cfg.CONF.register_cli_opts(ryu_options(cfg), group=RYU_GROUP)

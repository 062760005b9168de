"""The Ryu app's options (controller/options.py: AppOptions) registered with Ryu's config, and
the REST API's address made 127.0.0.1 unless `--wsapi-host` says otherwise (Ryu's default,
0.0.0.0, is every interface; ryu-manager's --help still shows it).

Plain ryu-manager loads them with `--user-flags controller/flags.py`; `python -m controller`
imports this module before Ryu parses its arguments.
"""
from ryu import cfg
from ryu.app import wsgi  # noqa: F401  (registers --wsapi-host and --wsapi-port)

from controller.options import RYU_GROUP, ryu_options

# ryu-manager loads this file by path (--user-flags) before parsing, and app.py imports it again
# as a module after parsing, when registering would fail: register once.
if RYU_GROUP not in cfg.CONF:
    cfg.CONF.register_cli_opts(ryu_options(cfg), group=RYU_GROUP)
cfg.CONF.set_default("wsapi_host", "127.0.0.1")

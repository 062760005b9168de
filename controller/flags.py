"""Command-line options of the fabric app, registered with Ryu's config.

Plain ryu-manager loads them with `--user-flags controller/flags.py`; `python -m controller`
imports this module before Ryu parses its arguments.
"""
from ryu import cfg

from controller.routing import LB_MODES

# ryu-manager loads this file by path (--user-flags) before parsing, and app.py imports it again
# as a module after parsing, when registering would fail: register once.
if "fabric" not in cfg.CONF:
    cfg.CONF.register_cli_opts([
        cfg.StrOpt("lb", default="ecmp", choices=LB_MODES,
                   help="load balancing over equal-cost paths: " + ", ".join(LB_MODES)),
        cfg.FloatOpt("stats-interval", default=1.0, help="seconds between port/group stat polls"),
        cfg.StrOpt("stats-csv", default="", help="append port statistics to this CSV file"),
        cfg.FloatOpt("probe-interval", default=1.0, help="seconds between link-discovery probes"),
        cfg.StrOpt("hosts-file", default="",
                   help="JSON list of hosts known in advance ({ip, mac, dpid, port}): routed as soon as "
                        "their switch connects, e.g. after a controller restart"),
    ], group="fabric")

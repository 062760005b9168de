"""The controller's options, declared once on the schema engine (common/schema.py).

`AppOptions` are the Ryu app's: registered with Ryu's config as the [fabric] group (flags.py:
`--fabric-lb`, ... on ryu-manager's command line) and read back through the schema, so a bad
value stops the app with one line naming its flag. `ControllerOptions` adds what
`python -m controller` sets up around the app (addresses, ports, logging); its command line is
generated from it (`--lb`, `--ofp-port`, ...) and it passes the app's options on to Ryu. The
defaults are the fields' (`ControllerOptions()`), for whoever starts a controller.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

from common.schema import SchemaError, allowed_text, flag_of, format_value, from_arguments, knob
from controller.priority import is_ipv4, parse_int, parse_ipv4
from controller.routing import LB_MODES
from controller.topology import Host

RYU_GROUP = "fabric"  # the app's options in Ryu's config: --fabric-<name>
PORT = "a port 1..65535"


def is_port(port: int) -> bool:
    return 0 < port < 65536


def is_period(seconds: float) -> bool:
    return 0 < seconds < math.inf


@dataclass(frozen=True)
class AppOptions:
    """What the Ryu app (controller/app.py) reads."""
    lb: str = knob("ecmp", choices=lambda: LB_MODES)
    stats_interval: float = knob(1.0, "seconds > 0 between port and group statistics polls", is_period)
    stats_csv: str = knob("", "a CSV file to append port statistics to")
    probe_interval: float = knob(1.0, "seconds > 0 between link-discovery probes", is_period)
    hosts_file: str = knob("", "a JSON list of the hosts known in advance ({ip, mac, dpid, port}), routed as soon "
                               "as their switch connects (the runner passes its fabric's)")


@dataclass(frozen=True)
class ControllerOptions(AppOptions):
    """The command line of `python -m controller`."""
    ofp_host: str = knob("127.0.0.1", "an IPv4 address of this machine: 127.0.0.1, or its address on the network "
                                      "of a fabric's other servers", is_ipv4)
    ofp_port: int = knob(6653, f"{PORT}, OpenFlow", is_port)
    rest_port: int = knob(8080, f"{PORT}, the REST API's on 127.0.0.1, not --ofp-port", is_port)
    log_file: str = knob("", "a file to log to instead of stderr")
    verbose: bool = knob(False, "debug logging")


def check_options(options: ControllerOptions) -> None:
    """The rules across options; SchemaError names the flag."""
    if options.rest_port == options.ofp_port:
        raise SchemaError("--rest-port", f"{options.rest_port} is not allowed (another port than --ofp-port)")


# -- Ryu's config -----------------------------------------------------------------------------------
def ryu_flag(declared: dataclasses.Field) -> str:
    return f"--{RYU_GROUP}-{flag_of(declared).removeprefix('--')}"


def ryu_options(cfg) -> list:
    """AppOptions as options of Ryu's config (`cfg`: ryu.cfg), each read as text (none: the
    field's default) for `app_options` to check."""
    opts = []
    for declared in dataclasses.fields(AppOptions):
        default = f" (default {declared.default})" if declared.default != "" else ""
        opts.append(cfg.StrOpt(flag_of(declared).removeprefix("--"), default=None,
                               help=allowed_text(declared, declared.type) + default))
    return opts


def app_options(conf) -> AppOptions:
    """The app's options from Ryu's parsed [fabric] group; SystemExit with one line naming the
    flag for a bad one."""
    given = argparse.Namespace(**{f.name: getattr(conf, f.name) for f in dataclasses.fields(AppOptions)})
    try:
        return from_arguments(AppOptions, given)
    except SchemaError as error:
        flags = {flag_of(f): ryu_flag(f) for f in dataclasses.fields(AppOptions)}
        raise SystemExit(f"error: {flags.get(error.path, error.path)}: {error.problem}") from None


def ryu_arguments(options: AppOptions) -> list[str]:
    """Ryu's command-line arguments that give the app `options`."""
    return [text for declared in dataclasses.fields(AppOptions)
            for text in (ryu_flag(declared), format_value(getattr(options, declared.name)))]


# -- the hosts file ---------------------------------------------------------------------------------
def load_hosts(path: str) -> list[Host]:
    """The hosts file: a JSON list of {ip, mac, dpid, port}; a bad one stops the controller."""
    try:
        entries = json.loads(Path(path).read_text())
        return [Host(parse_ipv4("ip", e["ip"]), str(e["mac"]), parse_int("dpid", e["dpid"], 1, (1 << 64) - 1),
                     parse_int("port", e["port"], 1, 0xFFFFFF00)) for e in entries]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SystemExit(f"error: --hosts-file {path}: {error}") from None

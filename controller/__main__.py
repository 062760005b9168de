"""Start the fabric controller: `python -m controller --lb {ecmp,spray,single} [...]`.

Listens on 127.0.0.1 only (OpenFlow on another address of this machine with --ofp-host, for the
switches of a fabric across servers: topologies/cluster.py), refuses to start when a port is taken
(two ryu-managers can share a port through SO_REUSEPORT and switches then attach to the stale one),
stops cleanly on SIGTERM.
"""
from __future__ import annotations

import argparse
import errno
import ipaddress
import os
import signal
import socket
import sys

from controller.routing import LB_MODES


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when something listens on host:port. SO_REUSEADDR lets the bind succeed over
    TIME_WAIT leftovers; without SO_REUSEPORT it still fails on a live listener."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m controller", description=__doc__.split("\n")[0])
    parser.add_argument("--lb", default="ecmp", choices=LB_MODES,
                        help="ecmp: per-flow select groups; spray: per-packet (dp_hash over the "
                             "5-tuple incl. UDP ports); single: one path per destination")
    parser.add_argument("--ofp-host", default="127.0.0.1",
                        help="OpenFlow address: 127.0.0.1, or this machine's address on the network of a "
                             "fabric's other servers")
    parser.add_argument("--ofp-port", type=int, default=6653, help="OpenFlow port")
    parser.add_argument("--rest-port", type=int, default=8080, help="REST port (127.0.0.1)")
    parser.add_argument("--stats-interval", type=float, default=1.0,
                        help="seconds between port/group statistics polls")
    parser.add_argument("--stats-csv", default="", help="append port statistics to this CSV")
    parser.add_argument("--hosts-file", default="",
                        help="JSON list of hosts known in advance ({ip, mac, dpid, port}), routed as soon "
                             "as their switch connects (the runner passes its fabric's)")
    parser.add_argument("--log-file", default="", help="log here instead of stderr")
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    args = parser.parse_args(argv)
    for name in ("ofp_port", "rest_port"):
        value = getattr(args, name)
        if not 0 < value < 65536:
            parser.error(f"--{name.replace('_', '-')}: {value} is not allowed (1..65535)")
    try:
        ipaddress.IPv4Address(args.ofp_host)
    except ValueError:
        parser.error(f"--ofp-host: {args.ofp_host!r} is not allowed (an IPv4 address of this machine)")
    if args.ofp_port == args.rest_port:
        parser.error("--rest-port: must differ from --ofp-port")
    if args.stats_interval <= 0:
        parser.error(f"--stats-interval: {args.stats_interval} is not allowed (seconds > 0)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    for flag, host, port in (("--ofp-port", args.ofp_host, args.ofp_port),
                             ("--rest-port", "127.0.0.1", args.rest_port)):
        if port_in_use(port, host):
            sys.exit(f"error: {flag}: port {port} on {host} is already in use "
                     "(another controller? stop it, run `make clean-net`, or pick another port)")
    import controller.manager  # noqa: F401  (the eventlet shim, before Ryu is imported)
    import controller.flags  # noqa: F401  (our options, before Ryu parses the arguments)
    from ryu.cmd.manager import main as ryu_main

    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # stats CSV is flushed per poll
    ryu_args = ["--ofp-listen-host", args.ofp_host, "--ofp-tcp-listen-port", str(args.ofp_port),
                "--wsapi-host", "127.0.0.1", "--wsapi-port", str(args.rest_port),
                "--fabric-lb", args.lb, "--fabric-stats-interval", str(args.stats_interval),
                "--fabric-stats-csv", args.stats_csv, "--fabric-hosts-file", args.hosts_file]
    if args.log_file:
        ryu_args += ["--log-file", args.log_file]
    if args.verbose:
        ryu_args.append("--verbose")
    ryu_main(ryu_args + ["controller.app"])


if __name__ == "__main__":
    main()

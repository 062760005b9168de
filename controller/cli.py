"""Start the fabric controller: `python -m controller --lb {ecmp,spray,single} [...]`.

Listens on 127.0.0.1 only (OpenFlow on another address of this machine with --ofp-host, for the
switches of a fabric across servers: topologies/cluster.py), refuses to start when a port is taken
(two ryu-managers can share a port through SO_REUSEPORT and switches then attach to the stale one),
stops cleanly on SIGTERM.
"""
from __future__ import annotations

import argparse
import errno
import os
import signal
import socket
import sys

from common.schema import SchemaError, add_arguments, from_arguments
from controller.options import ControllerOptions, check_options, ryu_arguments


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


def parse_args(argv: list[str] | None = None) -> ControllerOptions:
    """The options of a command line (controller/options.py); exits naming the flag of a bad one."""
    parser = argparse.ArgumentParser(prog="python -m controller", description=__doc__.split("\n")[0])
    add_arguments(parser, ControllerOptions)
    try:
        options = from_arguments(ControllerOptions, parser.parse_args(argv))
        check_options(options)
    except SchemaError as error:
        parser.error(str(error))
    return options


def main(argv: list[str] | None = None) -> None:
    options = parse_args(argv)
    for flag, host, port in (("--ofp-port", options.ofp_host, options.ofp_port),
                             ("--rest-port", "127.0.0.1", options.rest_port)):
        if port_in_use(port, host):
            sys.exit(f"error: {flag}: port {port} on {host} is already in use "
                     "(another controller? stop it, run `make clean-net`, or pick another port)")
    import controller.manager  # noqa: F401  (the eventlet shim, before Ryu is imported)
    import controller.flags  # noqa: F401  (our options, before Ryu parses the arguments)
    from ryu.cmd.manager import main as ryu_main

    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # stats CSV is flushed per poll
    ryu_args = ["--ofp-listen-host", options.ofp_host, "--ofp-tcp-listen-port", str(options.ofp_port),
                "--wsapi-host", "127.0.0.1", "--wsapi-port", str(options.rest_port), *ryu_arguments(options)]
    if options.log_file:
        ryu_args += ["--log-file", options.log_file]
    if options.verbose:
        ryu_args.append("--verbose")
    ryu_main(ryu_args + ["controller.app"])

"""Send COUNT UDP datagrams to HOST:PORT, each from a source port drawn at random from 2048
pre-bound sockets (--random-sport) or all from one socket: what `spray` turns into per-packet
load balancing. Run inside a Mininet host by the fabric tests. Many ports, because the split
over spines is a sample of OVS's hash over the ports used: 256 ports left ~3 points of noise on
top of OVS's own unevenness with 3 buckets (docs/platform.md), and the test allows 10."""
import argparse
import random
import resource
import socket
import time

parser = argparse.ArgumentParser()
parser.add_argument("host")
parser.add_argument("port", type=int)
parser.add_argument("count", type=int)
parser.add_argument("--random-sport", action="store_true")
parser.add_argument("--pps", type=float, default=3000.0)
args = parser.parse_args()

PORTS = 2048
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # room for PORTS sockets
sockets = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
           for _ in range(PORTS if args.random_sport else 1)]
payload = bytes(200)
rng = random.Random(1)
start = time.monotonic()
for i in range(args.count):
    rng.choice(sockets).sendto(payload, (args.host, args.port))
    delay = start + (i + 1) / args.pps - time.monotonic()
    if delay > 0:
        time.sleep(delay)

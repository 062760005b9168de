"""mlt: the order-free, loss-tolerant UDP transport for tensor messages (`--transport mlt`).

The name is taken from MLT, the "ML transport" of Wang et al., "Towards Domain-Specific Network
Transport for Distributed DNN Training" (NSDI'24): order-free per-packet load balancing, gradient-aware
queueing and dropping, bounded-loss tolerance.  This is our own small transport in that style, not
their code.  docs/mlt.md has the wire format and the protocol.

One concept per module; only transport.py has sockets, threads or a clock:

- wire: mlt's datagrams as hostapps.codec frames, and the message grid (fragments, loss bound);
- receiver: the receiving state machine (reassembly, completion, ACK/NACK, rate advice);
- sender: the sending state machine (kept messages, resends, probes, drop marking);
- pacing: per-peer AIMD rate control and the host-wide pacer that picks which peer sends next;
- paths: congestion-aware spraying (the receiver names the source ports that queued, the sender avoids them);
- peers: who the peers are, which datagrams count as theirs, their connection's life cycle;
- options: MltOptions (what a job sets) and MltStats (what a process counts);
- transport: MltTransport, the thin shell: sockets and the threads that carry out what the machines say.
"""
from hostapps.mlt.options import MltOptions, MltStats
from hostapps.mlt.pacing import RateControl
from hostapps.mlt.receiver import Reassembly
from hostapps.mlt.sender import fragments_to_resend, least_important_fragments
from hostapps.mlt.transport import MltTransport
from hostapps.mlt.wire import IP_UDP_HEADER_BYTES, missing_fragments, payload_for_mtu

__all__ = ["IP_UDP_HEADER_BYTES", "MltOptions", "MltStats", "MltTransport", "RateControl", "Reassembly",
           "fragments_to_resend", "least_important_fragments", "missing_fragments", "payload_for_mtu"]

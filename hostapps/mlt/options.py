"""What a job chooses for mlt (MltOptions) and what each process counts (MltStats: summary.json's
transport counters)."""
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class MltOptions:
    """mlt's knobs: each field but the last two is the ProcessConfig knob of the same name, declared (with its
    default, its check and its help) once, in hostapps/config.py; hostapps.assembly.mlt_options builds this
    from a process's config by name."""
    loss_bound: float         # fraction of a message's bytes that may stay missing
    sport_range: int          # source sockets (one file each), shared by every DSCP
    mtu_payload: int          # payload bytes per datagram (a multiple of 4): every process of a job cuts so
    quiet_ms: float
    link_mbps: float
    drop_marking: bool
    # DSCP per tensor id (a layer, unless fused) from the controller's scheduling policy;
    # tensors not in it take the peer's DSCP (set_dscp)
    layer_dscp: dict[int, int]
    # adaptive: receivers name the source ports whose datagrams queued, senders steer away (hostapps.mlt.paths);
    # blind: every datagram's port at random
    spray: str
    # with sport_range 1: the port that one socket binds, so per-flow ECMP places the datagrams to each peer
    # as one flow, alike in every run given the same port; 0 (or a busy port): an ephemeral one
    source_port: int
    # the largest message any process of the job sends (from its model): a DATA frame declaring more is dropped,
    # not allocated
    max_message_bytes: int
    # a worker's first passes of one iteration and class: to a peer slowed by its receiver first, then the lowest
    # message step (an all-reduce's: its pipeline's oldest segment, the one every rank waits for), rather than
    # to the peer it sent the most to (a parameter-server worker's shards: one's whole share before the next's)
    allreduce_precedence: bool = False

    @property
    def quiet_s(self) -> float:
        return self.quiet_ms / 1000

    @property
    def adaptive_spray(self) -> bool:
        """Whether receivers report paths: with one source port there is none to choose."""
        return self.spray == "adaptive" and self.sport_range > 1


@dataclass
class MltStats:
    datagrams_sent: int = 0
    datagrams_dropped: int = 0       # by the drop hook
    datagrams_refused: int = 0       # by the local stack (a firewall drop, a full queue)
    datagrams_marked: int = 0        # sent with LOWER_EFFORT_DSCP
    fragments_retransmitted: int = 0
    probes: int = 0
    nacks_sent: int = 0
    nack_max_delivered: float = 0.0  # highest delivered fraction of a message that was NACKed
    duplicates: int = 0              # fragments that arrived again: retransmissions that were not needed
    late_probes: int = 0             # probes of a message already complete (its ACK lost or on its way): re-ACKed
    stale: int = 0                   # DATA of a message forgotten since its sender gave up on it: dropped
    malformed: int = 0               # not a datagram of our wire format
    foreign: int = 0                 # another job's, or not from the host of the peer its header names
    oversized: int = 0               # DATA declaring a message larger than max_message_bytes
    over_budget: int = 0             # DATA of a new message while its sender's incomplete ones are at their cap
    mismatched: int = 0              # off the grid: another fragment size than the job's, another size than the
    #                                  message it names has, feedback for another grid than the message's
    late_feedback: int = 0           # ACK/NACK of a message no longer kept (a duplicate, or a forgery)
    internal_errors: int = 0         # a bug: handling one datagram (or a retransmission) raised
    datagrams_queued: int = 0        # received after queueing longer than their sender's recent ones (paths)
    paths_reports: int = 0           # PATHS frames heard: congested source ports to avoid

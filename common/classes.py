"""The DSCP class plan: which traffic rides in which of the fabric's eight strict-priority
classes. The shaping builds every port's queues from it (topologies/shaping.py), the controller
hands out the gradient classes and moves lower-effort datagrams (controller/scheduling.py), and
mlt marks its datagrams and ranks its traffic by it (hostapps/mlt).

A DSCP's class is its class selector, its top three bits. Served first to last:

    CS7 (56)           network control; non-IP frames (ARP, LLDP probes) land here too
    CS6..CS2 (48..16)  gradients, most urgent first: the five classes a scheduling policy fills
    CS0 (0)            unmarked traffic (and every layer under the `fifo` policy)
    CS1 (8)            droppable: lower-effort datagrams (LE, DSCP 1, RFC 8622) are moved here by
                       the controller; served last from a short queue, they are dropped first
"""
NUM_CLASSES = 8
MAX_DSCP = 63
# Class selectors in the order they are served (strict priority: the first always first).
SERVICE_ORDER = (7, 6, 5, 4, 3, 2, 0, 1)
NETWORK_CONTROL_CLASS = 7
DROPPABLE_CLASS = 1
GRADIENT_DSCPS = (48, 40, 32, 24, 16)  # CS6..CS2, most urgent first
UNMARKED_DSCP = 0
LOWER_EFFORT_DSCP = 1                  # what a sender marks a datagram it may lose with
DROPPABLE_DSCP = DROPPABLE_CLASS << 3  # CS1: where the controller moves lower-effort datagrams


def class_selector(dscp: int) -> int:
    """The class (0..7) a DSCP lands in."""
    return dscp >> 3


def service_rank(dscp: int) -> int:
    """Where the fabric serves a DSCP (0 first); a lower-effort datagram is served in the
    droppable class, where the controller moves it."""
    return SERVICE_ORDER.index(DROPPABLE_CLASS if dscp == LOWER_EFFORT_DSCP else class_selector(dscp))

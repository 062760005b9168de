"""The emulation on this machine: a fabric's life (`fabric.py`: a Mininet network of one of our
Topos plus our controller, built, checked and torn down as one unit), the machine under it
(`machine.py`: socket buffers, Open vSwitch, CPU counters; `ovslog.py`: OVS's transmit errors),
servers of a fabric across machines (`cluster.py`), clean-up of whatever we left (`cleanup.py`)
and the fabric's capacity benchmark (`bench.py`)."""

"""The contracts every part of the testbed shares, at the bottom of the import graph: the schema
engine (`schema.py`), files written whole (`files.py`), the DSCP class plan (`classes.py`), the
fabric's frame sizes (`frames.py`), our mark on what we create (`owner.py`), the repo's paths
(`paths.py`), machine settings read (`sysctl.py`) and signals held over a critical block
(`signals.py`). It imports nothing of the testbed; the controller, the host apps and the
topologies import it and not each other."""

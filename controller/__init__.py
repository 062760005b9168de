"""The Ryu SDN controller of the fabric: decisions in plain modules, the OpenFlow messages they
make in `pipeline.py`, the state and the answer to each event in `core.py`, Ryu's events and the
sending in `app.py`."""

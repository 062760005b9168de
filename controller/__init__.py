"""The Ryu SDN controller of the fabric: decisions in plain modules, OpenFlow in `app.py`."""

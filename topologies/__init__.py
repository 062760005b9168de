"""Emulated datacenter fabrics: Mininet Topo classes and the node/link classes they carry."""

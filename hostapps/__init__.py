"""Host apps: real mini data-parallel training over the emulated network.

Workers train a numpy model on the bundled UCI digits (or replay a real
DNN's layer profile) and exchange gradients layer by layer with ring
all-reduce or a sharded parameter server, overlapping communication with
backprop.  Run with `python -m hostapps worker|server ...`; see config.py.
"""

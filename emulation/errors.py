"""The one error of a fabric's life, shared by its parts (emulation/fabric.py, emulation/controller.py)."""


class FabricError(RuntimeError):
    """The fabric could not be built, did not come up or broke; the message says what and why."""

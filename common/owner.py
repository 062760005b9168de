"""Our mark on what the testbed creates in machine-wide places: OVS bridges (external id),
interfaces (alias) and nftables tables (comment). Clean-up removes what carries it and nothing
else; a name pattern would also match another user's `leaf1`."""
OWNER_KEY = "dnn-testbed"

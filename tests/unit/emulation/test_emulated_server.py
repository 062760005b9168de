"""The emulated server's plan and files, without starting it (tests/integration/test_cluster_two_servers.py
starts one)."""
import pytest

from emulation.emulated_server import (OVS_DIRS, UNDERLAY_MTU, ServerError, ServerState, holder_command,
                                       ssh_client_config, sshd_config)


def test_a_server_is_planned_from_its_name_and_subnet():
    state = ServerState.plan("srv2", "10.251.0.0/30")
    assert (state.namespace, state.veth, state.local_ip, state.server_ip) == ("dnnt-srv2", "dnnt-srv2", "10.251.0.1",
                                                                               "10.251.0.2")
    assert state.mtu == UNDERLAY_MTU == 9050  # the fabric's jumbo frames plus VXLAN's 50 bytes
    assert state.directory == "/run/dnn-testbed/servers/srv2"
    assert state.ssh_config == "/etc/ssh/ssh_config.d/dnn-testbed-srv2.conf"


@pytest.mark.parametrize("name, subnet, field", [("Srv2", "10.251.0.0/30", "name"), ("s" * 9, "10.251.0.0/30", "name"),
                                                 ("srv2", "10.251.0.0/31", "subnet"), ("srv2", "fd00::/64", "subnet"),
                                                 ("srv2", "rack2", "subnet")])
def test_a_bad_name_or_subnet_is_one_line_naming_it(name, subnet, field):
    with pytest.raises(ServerError, match=rf"^{field}: "):
        ServerState.plan(name, subnet)


def test_sshd_takes_root_by_key_on_the_underlay_only_with_its_own_files():
    state = ServerState.plan("srv2")
    config = sshd_config(state).splitlines()
    assert "ListenAddress 10.251.0.2" in config
    assert {"PermitRootLogin prohibit-password", "PasswordAuthentication no", "UsePAM no"} <= set(config)
    assert all(line.split()[1].startswith(state.directory) for line in config
               if line.split()[0] in ("HostKey", "AuthorizedKeysFile", "PidFile"))


def test_the_client_config_applies_to_the_servers_address_only_and_reads_nothing_of_root():
    state = ServerState.plan("srv2")
    config = [line.strip() for line in ssh_client_config(state).splitlines()]
    assert config[0].startswith("# dnn-testbed emulated server srv2")  # how stop() knows the file is ours
    assert config[1] == "Host 10.251.0.2"
    assert {f"IdentityFile {state.directory}/ssh/client_ed25519", "IdentitiesOnly yes",
            f"UserKnownHostsFile {state.directory}/ssh/known_hosts", "StrictHostKeyChecking yes"} <= set(config)


def test_sshd_runs_in_the_servers_namespace_with_its_own_openvswitch_folders():
    state = ServerState.plan("srv2")
    argv = holder_command(state)
    assert argv[:4] == ["ip", "netns", "exec", "dnnt-srv2"]
    assert argv[4:8] == ["unshare", "--mount", "--propagation", "private"]  # the bind mounts stay inside
    script = argv[-1]
    for key, path in OVS_DIRS.items():
        assert f"mount --bind {state.directory}/ovs/{key} {path}" in script
    assert script.endswith(f"-E {state.directory}/sshd.log") and "exec /usr/sbin/sshd -D" in script


def test_a_server_that_is_gone_ends_the_clients_connections():
    """Mininet waits on each remote node's ssh shell without a timeout."""
    config = [line.strip() for line in ssh_client_config(ServerState.plan("srv2")).splitlines()]
    assert {"ConnectTimeout 10", "ServerAliveInterval 10", "ServerAliveCountMax 3"} <= set(config)

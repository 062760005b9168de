"""The sampler's view of the forwarding threads: this machine's ovs-vswitchd and those of the servers
emulated on it, judged together (their thread ids are unique on the machine)."""
import os
import subprocess

from experiments.sampler import _threads


def test_the_threads_of_every_daemon_are_sampled_and_a_gone_one_is_left_out():
    other = subprocess.Popen(["sleep", "30"])
    try:
        threads = _threads([os.getpid(), None, other.pid])
        assert os.getpid() in threads and other.pid in threads
        other.kill()
        other.wait()
        assert other.pid not in _threads([os.getpid(), other.pid])
    finally:
        other.kill()
        other.wait()

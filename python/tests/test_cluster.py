"""The Python binding across emulated hosts: network namespaces with their own hostname and
/dev/shm, real sshd, TCP over veth rails (tests/cluster/README.md). Needs root; skipped
otherwise. railrun runs on the cluster's head host and starts ranks on n1 and n2 over ssh."""

import os
import subprocess

import pytest

from conftest import find_bin


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the emulated cluster needs root (network namespaces)")
    emu = find_bin("emucluster")
    state = tmp_path_factory.mktemp("cluster") / "c"
    up = subprocess.run([emu, "up", "--hosts", "2", "--rails", "2", "--state", str(state)],
                        capture_output=True, text=True, timeout=120)
    if up.returncode != 0:
        pytest.skip(f"emucluster up failed (no namespaces or sshd here?): {up.stderr.strip()[-500:]}")
    (state / "hf").write_text("n1 slots=2\nn2 slots=2\n")
    try:
        yield emu, state
    finally:
        subprocess.run([emu, "down", "--state", str(state)], capture_output=True, timeout=120)


def on_head(cluster, railrun, *args, timeout=300):
    emu, state = cluster
    cmd = [emu, "exec", "--state", str(state), "head", "--", railrun, "-np", "4", "--hostfile", str(state / "hf"),
           "--ssh", f"ssh -F {state / 'ssh_config'}", "-x", "RAILRING_SOCKET_IFNAME=rail", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_ranks_on_two_hosts(cluster, railrun, python):
    code = ("import socket, numpy as np, railring; c = railring.init(); a = np.full(1 << 20, c.rank + 1, np.int64);"
            " c.all_reduce(a); assert (a == 10).all(); print('RANK', c.rank, socket.gethostname(), c.nnodes, c.rail[1])")
    p = on_head(cluster, railrun, python, "-c", code)
    assert p.returncode == 0, p.stdout + p.stderr
    got = sorted(l.split()[1:] for l in p.stdout.splitlines() if l.startswith("RANK"))
    assert got == [["0", "n1", "2", "rail0"], ["1", "n1", "2", "rail1"], ["2", "n2", "2", "rail0"],
                   ["3", "n2", "2", "rail1"]], p.stdout


def test_rank_suite_on_two_hosts(cluster, railrun, python, repo):
    p = on_head(cluster, railrun, python, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(repo / "python/tests/ranks"))
    assert p.returncode == 0, p.stdout[-5000:] + p.stderr[-3000:]
    assert p.stdout.count(" passed") == 4 and " failed" not in p.stdout, p.stdout

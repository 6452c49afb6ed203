"""railring from Python across real processes: the rank suite under railrun (one node, and two
"nodes" over TCP), the example, every launch railring detects, and the errors users see."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

TIMEOUT = 300


def run(cmd, env=None, timeout=TIMEOUT, cwd=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(cmd, env=e, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def ok(p):
    assert p.returncode == 0, f"exit {p.returncode}\n--- stdout\n{p.stdout[-6000:]}\n--- stderr\n{p.stderr[-6000:]}"
    return p


def rank_suite(railrun, python, repo, np_, extra=()):
    return ok(run([railrun, "-np", str(np_), *extra, python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                   str(repo / "python/tests/ranks")], cwd=repo))


def test_rank_suite_4_ranks_one_node(railrun, python, repo):
    p = rank_suite(railrun, python, repo, 4)
    assert p.stdout.count(" passed") == 4, p.stdout  # every rank's summary
    assert " failed" not in p.stdout


def test_rank_suite_2_nodes_over_tcp(railrun, python, repo, tmp_path):
    """Ranks 0,1 and 2,3 as two nodes (RAILRING_HOST_ID): collectives cross TCP rails."""
    w = tmp_path / "as_two_nodes.sh"
    w.write_text('#!/bin/sh\nRAILRING_HOST_ID=node$((RAILRING_RANK / 2)) exec "$@"\n')
    w.chmod(0o755)
    p = ok(run([railrun, "-np", "4", str(w), python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                str(repo / "python/tests/ranks")], cwd=repo))
    assert p.stdout.count(" passed") == 4, p.stdout


def test_rank_suite_3_ranks(railrun, python, repo):
    """An odd world: blocks and awkward counts that do not divide evenly."""
    p = rank_suite(railrun, python, repo, 3)
    assert p.stdout.count(" passed") == 3, p.stdout


def test_example_allreduce(railrun, python, repo):
    p = ok(run([railrun, "-np", "4", python, str(repo / "examples/python/allreduce.py")], cwd=repo))
    for r in range(4):
        assert f"rank {r} of 4: all_reduce of 1048576 float32 = 10 (want 10) OK" in p.stdout, p.stdout


def test_alone_is_a_world_of_one(python):
    p = ok(run([python, "-c", "import railring, numpy as np; c = railring.init(); a = np.arange(4.);"
                " c.all_reduce(a); print(c.rank, c.size, a.tolist(), railring.init() is c)"]))
    assert p.stdout.split() == ["0", "1", "[0.0,", "1.0,", "2.0,", "3.0]", "True"], p.stdout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torchrun_style_environment(python, tmp_path):
    """RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT, as torchrun sets them: the same detection
    as the Rust Communicator::init (rank 0 serves the store)."""
    port = free_port()
    secret = os.urandom(16).hex()
    code = ("import railring, numpy as np; c = railring.init(); a = np.full(5, c.rank + 1.0);"
            " c.all_reduce(a); print(c.rank, c.size, a.tolist())")
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RAILRING_JOB_SECRET=secret,
                   RAILRING_CONNECT_TIMEOUT="30")
        env.pop("RAILRING_STORE_ADDR", None)
        procs.append(subprocess.Popen([python, "-c", code], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    assert outs[0][0].strip() == "0 2 [3.0, 3.0, 3.0, 3.0, 3.0]"
    assert outs[1][0].strip() == "1 2 [3.0, 3.0, 3.0, 3.0, 3.0]"


ERRORS = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np
    import railring
    c = railring.init()
    case = sys.argv[1]
    try:
        if case == "mismatch":
            c.all_reduce(np.zeros(10 if c.rank == 0 else 12, dtype=np.float32))
        elif case == "timeout":
            if c.rank == 1:
                time.sleep(6)  # never joins; stays alive until rank 0 has reported
                sys.exit(0)
            c.all_reduce(np.zeros(4))
        elif case == "started":
            c.all_reduce_start(np.zeros(10 if c.rank == 0 else 11, dtype=np.int32)).wait()
        print("NO ERROR", flush=True)
    except railring.Error as e:
        d = {k: v for k, v in vars(e).items()}
        print("CAUGHT " + json.dumps({"class": type(e).__name__, "msg": str(e), **d}), flush=True)
        # the communicator refuses further calls, naming the first failure
        try:
            c.barrier()
        except railring.PoisonedError as p:
            print("POISONED " + str(p), flush=True)
""")


def caught(p):
    rows = [json.loads(l.split("CAUGHT ", 1)[1]) for l in p.stdout.splitlines() if "CAUGHT " in l]
    return {r["rank"]: r for r in rows if "rank" in r} or rows


@pytest.fixture
def errors_script(tmp_path):
    s = tmp_path / "errors.py"
    s.write_text(ERRORS)
    return str(s)


def test_mismatch_names_both_calls_and_ranks(railrun, python, errors_script):
    p = run([railrun, "-np", "2", python, errors_script, "mismatch"])
    got = caught(p)
    assert set(got) == {0, 1}, p.stdout + p.stderr
    for r, e in got.items():
        assert e["class"] == "MismatchError"
        assert e["peer"] == 1 - r
        assert "10" in e["mine" if r == 0 else "theirs"] and "12" in e["theirs" if r == 0 else "mine"], e
        assert f"rank {r}: collective mismatch: this rank called" in e["msg"], e
        assert f"rank {1 - r} called" in e["msg"], e
    assert "POISONED communicator is unusable" in p.stdout


def test_started_mismatch_raises_at_wait(railrun, python, errors_script):
    p = run([railrun, "-np", "2", python, errors_script, "started"])
    got = caught(p)
    assert {e["class"] for e in got.values()} == {"MismatchError"}, p.stdout + p.stderr


def test_timeout_names_the_missing_rank(railrun, python, errors_script):
    p = run([railrun, "-np", "2", "-x", "RAILRING_TIMEOUT=2", python, errors_script, "timeout"])
    got = caught(p)
    assert 0 in got, p.stdout + p.stderr
    e = got[0]
    assert e["class"] == "TimeoutError" and e["waiting"] == [1] and e["seconds"] == 2, e
    assert "waiting for rank(s) [1]" in e["msg"], e
    # also Python's own TimeoutError
    assert ok(run([python, "-c", "import railring, builtins; assert issubclass(railring.TimeoutError, builtins.TimeoutError)"]))


def test_torch_interop(railrun, python, repo):
    """The torch tests of the rank suite (tensors zero-copy, the DDP backend) on 2 ranks; a
    SKIPPED line says so when torch is not installed (CI does not install it: 2.5 GB)."""
    pytest.importorskip("torch", reason="torch is not installed: the torch interop tests "
                                        "(python/tests/ranks/test_torch.py) did not run")
    p = ok(run([railrun, "-np", "2", python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                str(repo / "python/tests/ranks/test_torch.py")], cwd=repo))
    assert p.stdout.count("5 passed") == 2, p.stdout

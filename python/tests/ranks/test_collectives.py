"""Every collective of the Python binding, checked element by element on every rank against an
exact reference (integer-valued data), for every dtype and op railring supports."""

import gc
import threading
import time
import weakref

import numpy as np
import pytest

import railring

try:
    import ml_dtypes
except ImportError:  # bfloat16 needs ml_dtypes
    ml_dtypes = None

NUMPY_DTYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64"]
OPS = ["sum", "prod", "min", "max", "avg"]
SIZES = [0, 1, 7, 1000, (1 << 18) + 3]


def dtype_of(name):
    if name == "bfloat16":
        if ml_dtypes is None:
            pytest.skip("bfloat16 needs the ml_dtypes package (pip install ml_dtypes)")
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def values(rank, n, op):
    """Rank `rank`'s contribution: small integers so every result is exact in every dtype
    (products stay within int8/bf16 range: factors 1 or 2 on at most 4 ranks)."""
    i = np.arange(n)
    if op == "prod":
        return 1 + (i + rank) % 2
    return 1 + (i % 7) + rank


def reference(size, n, op, dtype):
    per_rank = np.stack([values(r, n, op) for r in range(size)]).astype(np.float64)
    if op in ("sum", "avg"):
        want = per_rank.sum(0)
    elif op == "prod":
        want = per_rank.prod(0)
    elif op == "min":
        want = per_rank.min(0)
    else:
        want = per_rank.max(0)
    if op == "avg":
        if np.dtype(dtype).kind in "iu":
            return (want // size).astype(dtype)
        return (want / size).astype(dtype)
    return want.astype(dtype)


def check(got, want, what):
    got = np.asarray(got).reshape(-1)
    want = np.asarray(want).reshape(-1)
    assert got.shape == want.shape, what
    bad = np.nonzero(got.astype(np.float64) != want.astype(np.float64))[0]
    assert bad.size == 0, f"{what}: {bad.size} wrong elements, first at {bad[0]}: got {got[bad[0]]}, want {want[bad[0]]}"


@pytest.mark.parametrize("dtype", NUMPY_DTYPES + ["bfloat16"])
@pytest.mark.parametrize("op", OPS)
def test_all_reduce_every_dtype_and_op(comm, dtype, op):
    dt = dtype_of(dtype)
    if op == "avg" and comm.size & (comm.size - 1) and dt.kind == "f":
        pytest.skip("avg of floats is exact only over a power-of-two number of ranks")
    for n in [0, 1, 1000, 70001]:
        a = values(comm.rank, n, op).astype(dt)
        before = a.ctypes.data
        out = comm.all_reduce(a, op=op)
        assert out is a and a.ctypes.data == before  # in place, same memory
        check(a, reference(comm.size, n, op, dt), f"all_reduce {dtype} {op} n={n}")


@pytest.mark.parametrize("n", SIZES)
def test_all_reduce_sizes_and_shapes(comm, n):
    a = values(comm.rank, n, "sum").astype(np.float32)
    comm.all_reduce(a)
    check(a, reference(comm.size, n, "sum", np.float32), f"n={n}")
    m = values(comm.rank, 6 * 5, "max").astype(np.int64).reshape(6, 5)
    comm.all_reduce(m, op="max")
    assert m.shape == (6, 5)
    check(m, reference(comm.size, 30, "max", np.int64), "2-d")


def test_all_reduce_into_out_of_place(comm):
    x = values(comm.rank, 5000, "sum").astype(np.float64)
    keep = x.copy()
    out = np.empty_like(x)
    got = comm.all_reduce_into(x, out)
    assert got is out
    check(out, reference(comm.size, 5000, "sum", np.float64), "into")
    check(x, keep, "input untouched")
    got = comm.all_reduce_into(x, op="min")  # allocated output
    assert got.shape == x.shape and got.dtype == x.dtype
    check(got, reference(comm.size, 5000, "min", np.float64), "allocated")


def test_reduce_scatter(comm):
    n, r = comm.size, comm.rank
    k = 1001
    x = values(r, n * k, "sum").astype(np.int32)
    want = reference(n, n * k, "sum", np.int32)[r * k:(r + 1) * k]
    out = comm.reduce_scatter(x)
    check(out, want, "reduce_scatter (allocated)")
    out2 = np.zeros(k, dtype=np.int32)
    comm.reduce_scatter(x, out2, op="sum")
    check(out2, want, "reduce_scatter (given)")
    comm.reduce_scatter_in_place(x)
    check(x[r * k:(r + 1) * k], want, "reduce_scatter_in_place")
    m = values(r, n * 3 * 4, "max").astype(np.float32).reshape(n * 3, 4)
    out = comm.reduce_scatter(m, op="max")
    assert out.shape == (3, 4)
    check(out, reference(n, n * 12, "max", np.float32)[r * 12:(r + 1) * 12], "2-d")


def test_all_gather(comm):
    n, r = comm.size, comm.rank
    x = np.arange(10, dtype=np.uint64) + 100 * r
    out = comm.all_gather(x)
    assert out.shape == (n, 10)
    for j in range(n):
        check(out[j], np.arange(10) + 100 * j, f"block {j}")
    buf = np.zeros(n * 10, dtype=np.uint64)
    buf[r * 10:(r + 1) * 10] = x
    comm.all_gather_in_place(buf)
    check(buf, out, "in place")


def test_broadcast(comm):
    root = comm.size - 1
    a = np.full(3333, comm.rank, dtype=np.int8)
    comm.broadcast(a, root=root)
    check(a, np.full(3333, root), "broadcast")


def test_reduce(comm):
    n, r = comm.size, comm.rank
    root = 1 % n
    x = values(r, 777, "sum").astype(np.float32)
    out = comm.reduce(x, op="sum", root=root)
    if r == root:
        check(out, reference(n, 777, "sum", np.float32), "reduce at root")
    y = values(r, 777, "max").astype(np.int64)
    keep = y.copy()
    comm.reduce_in_place(y, op="max", root=root)
    if r == root:
        check(y, reference(n, 777, "max", np.int64), "reduce_in_place at root")
    else:
        check(y, keep, "non-root buffer unchanged")


def test_all_to_all(comm):
    n, r = comm.size, comm.rank
    k = 5
    x = np.repeat(np.arange(n) + 10 * r, k).astype(np.int32)  # block j -> rank j
    out = comm.all_to_all(x)
    check(out, np.repeat(10 * np.arange(n) + r, k), "all_to_all")


def test_send_recv_ring(comm):
    n, r = comm.size, comm.rank
    if n < 2:
        pytest.skip("needs two ranks")
    right, left = (r + 1) % n, (r - 1) % n
    got = comm.send_recv(np.full(100, r, dtype=np.float64), right, np.zeros(100), left)
    check(got, np.full(100, left), "send_recv")
    buf = np.zeros(50, dtype=np.uint8)
    if r == 0:
        comm.send(np.arange(50, dtype=np.uint8), 1)
        comm.recv(buf, 1)
        check(buf, np.arange(50)[::-1], "echo")
    elif r == 1:
        comm.recv(buf, 0)
        comm.send(np.ascontiguousarray(buf[::-1]), 0)


def test_barrier_and_split(comm):
    comm.barrier()
    n, r = comm.size, comm.rank
    sub = comm.split(r % 2, key=-r)  # reversed order inside each half
    members = [q for q in range(n) if q % 2 == r % 2]
    assert sub.size == len(members)
    assert sub.rank == sorted(members, reverse=True).index(r)
    a = np.array([r], dtype=np.int64)
    sub.all_reduce(a)
    assert a[0] == sum(members)
    none = comm.split(None if r == 0 else 7)
    if r == 0:
        assert none is None
    else:
        assert none.size == n - 1


def test_started_calls_in_program_order(comm):
    n, r = comm.size, comm.rank
    a = values(r, 4096, "sum").astype(np.float32)
    b = values(r, 4096, "max").astype(np.int32)
    ha = comm.all_reduce_start(a)
    hb = comm.all_reduce_start(b, op="max")
    c = values(r, 100, "sum").astype(np.float64)
    comm.all_reduce(c)  # a blocking call after two started ones runs after them
    assert hb.wait() is b and ha.wait() is a
    assert ha.test() and ha.wait() is a  # waiting twice returns the same
    check(a, reference(n, 4096, "sum", np.float32), "started a")
    check(b, reference(n, 4096, "max", np.int32), "started b")
    check(c, reference(n, 100, "sum", np.float64), "blocking c")
    out = comm.all_reduce_into_start(a, op="min").wait()
    check(out, reference(n, 4096, "sum", np.float32), "into_start")
    k = 64
    rs = values(r, n * k, "sum").astype(np.int64)
    comm.reduce_scatter_start(rs).wait()
    check(rs[r * k:(r + 1) * k], reference(n, n * k, "sum", np.int64)[r * k:(r + 1) * k], "rs start")
    ag = np.zeros(n * 3, dtype=np.uint32)
    ag[r * 3:(r + 1) * 3] = r + 1
    comm.all_gather_start(ag).wait()
    check(ag, np.repeat(np.arange(n) + 1, 3), "ag start")
    bc = np.full(9, r, dtype=np.float16)
    comm.broadcast_start(bc, root=0).wait()
    check(bc, np.zeros(9), "bcast start")
    rd = values(r, 33, "sum").astype(np.int32)
    comm.reduce_start(rd, root=0).wait()
    if r == 0:
        check(rd, reference(n, 33, "sum", np.int32), "reduce start")
    x = np.repeat(np.arange(n) + 10 * r, 2).astype(np.int64)
    check(comm.all_to_all_start(x).wait(), np.repeat(10 * np.arange(n) + r, 2), "a2a start")
    assert comm.barrier_start().wait() is None


def test_a_dropped_handle_keeps_its_array_alive(comm):
    """railring holds the array until the collective is done, even without wait()."""
    r = comm.rank
    if r == 0:
        time.sleep(0.3)  # the others' calls are still running when they drop everything
    a = values(r, 1 << 16, "sum").astype(np.float64)
    w = weakref.ref(a)
    h = comm.all_reduce_start(a)
    del a, h
    gc.collect()
    if r != 0:
        assert w() is not None, "the array was freed while the collective ran"
    comm.barrier()  # runs after the started call (program order)
    for _ in range(100):  # the reference drops through PyO3's pool at the next call
        comm.barrier()
        gc.collect()
        if w() is None:
            break
    assert w() is None, "the array was never released"


def test_waits_release_the_gil(comm):
    """A Python thread keeps running while a blocking call and wait() wait for a late rank."""
    if comm.size < 2:
        pytest.skip("needs two ranks")
    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)

    t = threading.Thread(target=tick)
    t.start()
    try:
        for started in (False, True):
            if comm.rank == 0:
                time.sleep(0.5)
            before = len(ticks)
            a = np.ones(10, dtype=np.float32)
            if started:
                comm.all_reduce_start(a).wait()
            else:
                comm.all_reduce(a)
            check(a, np.full(10, comm.size), "sum of ones")
            if comm.rank != 0:
                assert len(ticks) - before > 50, f"the other thread ran {len(ticks) - before} times in 0.5 s"
    finally:
        stop.set()
        t.join()


def test_bad_arguments_are_clear_errors(comm):
    a = np.zeros((4, 4), dtype=np.float32)
    with pytest.raises(railring.InvalidArgumentError, match="not C-contiguous.*ascontiguousarray"):
        comm.all_reduce(a[:, 1])
    with pytest.raises(ValueError, match="not C-contiguous"):  # also a ValueError
        comm.all_reduce(a.T)
    ro = np.zeros(4)
    ro.flags.writeable = False
    with pytest.raises(railring.InvalidArgumentError, match="read-only"):
        comm.all_reduce(ro)
    comm.all_reduce_into(ro, np.zeros(4))  # a read-only input is fine
    for bad in ("int16", "complex64", "bool", "longdouble"):
        with pytest.raises(railring.InvalidArgumentError, match="does not reduce dtype"):
            comm.all_reduce(np.zeros(3, dtype=bad))
    with pytest.raises(railring.InvalidArgumentError, match="byte order"):
        comm.all_reduce(np.zeros(3, dtype=">f4" if np.little_endian else "<f4"))
    with pytest.raises(railring.InvalidArgumentError, match="unknown reduction op"):
        comm.all_reduce(np.zeros(3), op="mean")
    with pytest.raises(railring.InvalidArgumentError, match="same dtype"):
        comm.all_reduce_into(np.zeros(3), np.zeros(3, dtype=np.float32))
    with pytest.raises(railring.InvalidArgumentError, match="expected 3"):
        comm.all_reduce_into(np.zeros(3), np.zeros(4))
    x = np.zeros(8)
    with pytest.raises(railring.InvalidArgumentError, match="share memory"):
        comm.all_reduce_into(x[:4], x[2:6])
    with pytest.raises(TypeError, match="numpy.ndarray or a CPU torch.Tensor, not list"):
        comm.all_reduce([1.0, 2.0])
    with pytest.raises(railring.InvalidArgumentError, match="root 99 is not a rank"):
        comm.broadcast(np.zeros(2), root=99)
    # rejected arguments do not spoil the communicator
    b = np.ones(5)
    comm.all_reduce(b)
    check(b, np.full(5, comm.size), "after errors")

"""All-reduce busbw from Python, in railperf's format, to compare the binding's cost with railperf:

    railrun -np 4 python3 examples/python/perf.py -b 8 -e 128M -f 4 -n 20 -w 5
    railrun -np 4 railperf allreduce -b 8 -e 128M -f 4 -n 20 -w 5 -z 1 -c 0

Same timing as railperf -z 1 (blocking calls, in place): warm-up, barrier, `-n` timed calls,
time averaged over ranks; busbw = size / time * 2(n-1)/n. Float32, sum.
"""

import argparse
import sys
import time

import numpy as np

import railring


def size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper()
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-b", "--minbytes", type=size, default=8)
    p.add_argument("-e", "--maxbytes", type=size, default=128 << 20)
    p.add_argument("-f", "--stepfactor", type=int, default=4)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup_iters", type=int, default=5)
    p.add_argument("--started", action="store_true", help="all_reduce_start + wait instead of blocking calls")
    p.add_argument("--paired", type=int, metavar="BLOCKS", default=0,
                   help="measure the binding's own cost: BLOCKS pairs of (-n calls from Python, -n calls "
                        "looped in Rust behind one crossing), interleaved in this job; medians and the ratio")
    o = p.parse_args()
    comm = railring.init()
    n = comm.size
    if o.paired:
        return paired(comm, o)
    if comm.rank == 0:
        print(f"# railring Python binding all_reduce over {n} ranks ({'started' if o.started else 'blocking'} calls, in place, float32 sum)")
        print("#       size         count     time   algbw   busbw")
        print("#        (B)    (elements)     (us)  (GB/s)  (GB/s)")
    s = o.minbytes
    while s <= o.maxbytes:
        count = max(s // 4, 1)
        a = np.ones(count, dtype=np.float32)
        call = (lambda: comm.all_reduce_start(a).wait()) if o.started else (lambda: comm.all_reduce(a))
        for _ in range(o.warmup_iters):
            call()
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(o.iters):
            call()
        us = (time.perf_counter() - t0) * 1e6 / o.iters
        t = np.array([us], dtype=np.float64)
        comm.all_reduce(t, op="avg")
        us = float(t[0])
        algbw = count * 4 / us / 1e3
        if comm.rank == 0:
            print(f"{count * 4:>12}  {count:>12}  {us:>7.2f}  {algbw:>6.2f}  {algbw * 2 * (n - 1) / n:>6.2f}")
            sys.stdout.flush()
        s *= o.stepfactor
    return 0


def paired(comm, o):
    """Per size: median time per call from Python vs from a Rust loop, blocks interleaved (ABAB),
    each block's time averaged over ranks. The difference is what the binding costs per call."""
    import statistics

    n = comm.size
    if comm.rank == 0:
        print(f"# binding cost: all_reduce over {n} ranks, {o.paired} interleaved blocks of {o.iters} calls (float32 sum, in place)")
        print("#       size    python (us)    rust loop (us)    binding cost (us)   (% of the call)")
    s = o.minbytes
    while s <= o.maxbytes:
        count = max(s // 4, 1)
        a = np.ones(count, dtype=np.float32)
        for _ in range(o.warmup_iters):
            comm.all_reduce(a)
        py, rs = [], []
        for _ in range(o.paired):
            for which, out in (("py", py), ("rs", rs)):
                comm.barrier()
                t0 = time.perf_counter()
                if which == "py":
                    for _ in range(o.iters):
                        comm.all_reduce(a)
                else:
                    comm._repeat_all_reduce(a, o.iters)
                t = np.array([(time.perf_counter() - t0) * 1e6 / o.iters])
                comm.all_reduce(t, op="avg")
                out.append(float(t[0]))
        mp, mr = statistics.median(py), statistics.median(rs)
        if comm.rank == 0:
            print(f"{count * 4:>12}  {mp:>12.2f}  {mr:>16.2f}  {mp - mr:>18.2f}  {100 * (mp - mr) / mr:>14.1f} %")
            sys.stdout.flush()
        s *= o.stepfactor
    return 0


if __name__ == "__main__":
    sys.exit(main())

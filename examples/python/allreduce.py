"""All-reduce from Python: `railrun -np 4 python3 examples/python/allreduce.py`.

Every rank contributes rank+1 in every element; afterwards every rank holds the sum, checked
element by element. Then the same with a started (non-blocking) call.
"""

import numpy as np

import railring

comm = railring.init()  # railrun, srun, torchrun-style env, or alone (a world of one)
n, rank = comm.size, comm.rank

a = np.full(1 << 20, rank + 1, dtype=np.float32)
comm.all_reduce(a, op="sum")  # in place: railring works on a's own memory
want = n * (n + 1) / 2
assert (a == want).all(), f"rank {rank}: wrong sum"

h = comm.all_reduce_start(a, op="max")  # non-blocking: don't touch `a` until wait()
# ... compute something else here ...
h.wait()
assert (a == want).all()

print(f"rank {rank} of {n}: all_reduce of {a.size} float32 = {a[0]:g} (want {want:g}) OK")

"""mpi4py_check: mpi4py (built against MPICH) under railrun, for tests/tests/mpich.rs.

Prints "rank R size S vendor V allreduce N ok" after an Allreduce of N integer-valued doubles
checked element by element (exact), or "... WRONG ..." and exits 1.
"""
import socket
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
send = [float((rank * 7 + i) % 1000) for i in range(n)]
import array
a = array.array("d", send)
b = array.array("d", [0.0] * n)
comm.Allreduce(a, b, op=MPI.SUM)
vendor = MPI.get_vendor()[0]
for i in range(n):
    want = float(sum((r * 7 + i) % 1000 for r in range(size)))
    if b[i] != want:
        print(f"rank {rank} size {size} vendor {vendor} allreduce {n} WRONG at {i}: got {b[i]} want {want}", flush=True)
        sys.exit(1)
print(f"rank {rank} size {size} vendor {vendor} host {socket.gethostname()} allreduce {n} ok", flush=True)

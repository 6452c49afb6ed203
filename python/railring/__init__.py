"""railring: collective communication for every machine, from Python.

    import numpy as np, railring
    comm = railring.init()                  # railrun, srun, torchrun-style env, or alone
    a = np.full(1024, comm.rank + 1, dtype=np.float32)
    comm.all_reduce(a, op="sum")            # in place, no copy
    h = comm.all_reduce_start(a)            # non-blocking; do not touch `a` until wait()
    a = h.wait()

Arrays are C-contiguous numpy arrays (or CPU torch tensors) of a type in ``railring.DTYPES``;
railring reads and writes their memory directly. Errors are ``railring.Error`` subclasses
carrying railring's own messages. The study runner is ``python -m railring.study``.
See docs/python.md in the railring repository.
"""

from ._errors import (
    BootstrapError,
    Error,
    InvalidArgumentError,
    MismatchError,
    PeerDeadError,
    PoisonedError,
    TimeoutError,
)
from ._railring import DTYPES, OPS, Communicator, Handle, init, version

__version__ = version()

__all__ = [
    "init",
    "Communicator",
    "Handle",
    "DTYPES",
    "OPS",
    "Error",
    "MismatchError",
    "TimeoutError",
    "PeerDeadError",
    "InvalidArgumentError",
    "PoisonedError",
    "BootstrapError",
]

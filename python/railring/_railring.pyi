"""Type stubs of railring's native module (re-exported by the `railring` package)."""

from typing import Any, List, Literal, Optional, Tuple, TypeVar, Union

import numpy as np

# A C-contiguous numpy array (or CPU torch.Tensor) of a dtype in DTYPES.
Array = Any
A = TypeVar("A")
Op = Literal["sum", "prod", "min", "max", "avg"]

DTYPES: List[str]
OPS: List[str]

def init() -> "Communicator":
    """Join the job this process was started in (railrun, srun, torchrun-style env, or alone)
    and return its world communicator; the same object on every later call."""

def version() -> str: ...

class Handle:
    """A started (non-blocking) collective. Do not touch its arrays before wait() returns."""

    def wait(self) -> Optional[Array]:
        """Block (GIL released) until done; return the result array (None for a barrier)."""
    def test(self) -> bool:
        """True when done; raises the collective's error if it failed. Never blocks."""

class Communicator:
    """A group of ranks running collectives together; every rank makes the same calls in the
    same order. Arrays are used in place, never copied."""

    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def local_rank(self) -> int: ...
    @property
    def local_size(self) -> int: ...
    @property
    def node(self) -> int: ...
    @property
    def nnodes(self) -> int: ...
    @property
    def rail(self) -> Tuple[int, Optional[str]]: ...

    def all_reduce(self, buf: A, op: Op = "sum") -> A:
        """In place: every rank's buf becomes the reduction of all ranks' buf."""
    def all_reduce_into(self, input: Array, output: Optional[A] = None, op: Op = "sum") -> A:
        """Out of place; output is allocated (like input) when None."""
    def reduce_scatter(self, input: Array, output: Optional[A] = None, op: Op = "sum") -> A:
        """input holds size equal blocks; output receives the reduction of block rank."""
    def reduce_scatter_in_place(self, buf: A, op: Op = "sum") -> A:
        """buf holds size blocks; block rank receives the reduction (others are scratch)."""
    def all_gather(self, input: Array, output: Optional[A] = None) -> A:
        """output (shaped (size, *input.shape) when allocated) receives every rank's input."""
    def all_gather_in_place(self, buf: A) -> A:
        """buf holds size blocks; block rank is this rank's contribution."""
    def broadcast(self, buf: A, root: int = 0) -> A:
        """root's buf to every rank, in place."""
    def reduce(self, input: Array, output: Optional[A] = None, op: Op = "sum", root: int = 0) -> A:
        """On root, output receives the reduction; elsewhere output is scratch."""
    def reduce_in_place(self, buf: A, op: Op = "sum", root: int = 0) -> A:
        """root's buf receives the reduction; other ranks' buf is unchanged."""
    def all_to_all(self, input: Array, output: Optional[A] = None) -> A:
        """Block j of input goes to rank j; block j of output comes from rank j."""
    def send(self, buf: Array, peer: int) -> None: ...
    def recv(self, buf: A, peer: int) -> A: ...
    def send_recv(self, send: Array, dest: int, recv: A, src: int) -> A: ...
    def barrier(self) -> None: ...
    def split(self, color: Optional[int], key: int = 0) -> Optional["Communicator"]:
        """Like MPI_Comm_split; color None takes part but gets None."""

    def all_reduce_start(self, buf: Array, op: Op = "sum") -> Handle: ...
    def all_reduce_into_start(self, input: Array, output: Optional[Array] = None, op: Op = "sum") -> Handle: ...
    def reduce_scatter_start(self, buf: Array, op: Op = "sum") -> Handle: ...
    def all_gather_start(self, buf: Array) -> Handle: ...
    def broadcast_start(self, buf: Array, root: int = 0) -> Handle: ...
    def reduce_start(self, buf: Array, op: Op = "sum", root: int = 0) -> Handle: ...
    def all_to_all_start(self, input: Array, output: Optional[Array] = None) -> Handle: ...
    def barrier_start(self) -> Handle: ...

"""A torch.distributed backend on railring, in pure Python (no C++ extension):

    import railring.torch_backend            # registers the "railring" backend (CPU tensors)
    torch.distributed.init_process_group("railring")      # under railrun or torchrun
    model = torch.nn.parallel.DistributedDataParallel(model)

It subclasses ``torch.distributed.ProcessGroup`` from Python (torch's C++ side calls back into
Python for each collective, as torch's own threaded test backend does) and runs every call on a
railring communicator through the zero-copy tensor path of this package. Calls complete before
they return (the returned Work is already done): DDP works, but its gradient buckets do not
overlap with the backward pass. Works on CPU tensors only.

The rendezvous is railring's own (``railring.init()``: railrun's environment, srun or
torchrun-style variables); torch's store is used only to check that both agree on rank and size.
Under torchrun, give railring a store port of its own: ``RAILRING_STORE_PORT`` (torch's store
already listens on MASTER_PORT).
"""

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

import railring

_OPS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.PRODUCT: "prod",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.AVG: "avg",
}


def _done(result):
    f = Future()
    f.set_result(result)
    return _create_work_from_future(f)


def _op(opts):
    op = opts.reduceOp
    for k, v in _OPS.items():
        if op == k:
            return v
    raise railring.InvalidArgumentError(f"railring backend: reduce op {op} is not supported "
                                        f"(sum, product, min, max, avg are)")


class RailringProcessGroup(dist.ProcessGroup):
    """torch.distributed's view of a railring communicator."""

    def __init__(self, comm, rank, size):
        super().__init__(rank, size)
        self._comm = comm

    def getBackendName(self):
        return "railring"

    def size(self):
        return self._comm.size

    def rank(self):
        return self._comm.rank

    def allreduce(self, tensors, opts=None):
        op = _op(opts) if opts is not None else "sum"
        for t in tensors:
            self._comm.all_reduce(t, op=op)
        return _done(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        for t in tensors:
            self._comm.broadcast(t, root=root)
        return _done(tensors)

    def reduce(self, tensors, opts=None):
        for t in tensors:
            self._comm.reduce_in_place(t, op=_op(opts), root=opts.rootRank)
        return _done(tensors)

    def allgather(self, output_lists, inputs, opts=None):
        for outs, inp in zip(output_lists, inputs):
            gathered = self._comm.all_gather(inp)
            for j, o in enumerate(outs):
                o.copy_(gathered[j])
        return _done(output_lists)

    def _allgather_base(self, output, inp, opts=None):
        self._comm.all_gather(inp.reshape(-1), output.reshape(-1))
        return _done([output])

    def reduce_scatter(self, outputs, input_lists, opts=None):
        for out, ins in zip(outputs, input_lists):
            flat = torch.cat([i.reshape(-1) for i in ins])
            self._comm.reduce_scatter(flat, out.reshape(-1), op=_op(opts))
        return _done(outputs)

    def _reduce_scatter_base(self, output, inp, opts=None):
        self._comm.reduce_scatter(inp.reshape(-1), output.reshape(-1), op=_op(opts))
        return _done([output])

    def alltoall_base(self, output, inp, output_split_sizes, input_split_sizes, opts=None):
        if output_split_sizes or input_split_sizes:
            raise railring.InvalidArgumentError("railring backend: all_to_all with uneven splits is not supported")
        self._comm.all_to_all(inp.reshape(-1), output.reshape(-1))
        return _done([output])

    def barrier(self, opts=None):
        self._comm.barrier()
        return _done(None)

    def send(self, tensors, dst, tag=0):
        for t in tensors:
            self._comm.send(t, dst)
        return _done(tensors)

    def recv(self, tensors, src, tag=0):
        for t in tensors:
            self._comm.recv(t, src)
        return _done(tensors)


def _create(store, rank, size, timeout):
    comm = railring.init()
    if (comm.rank, comm.size) != (rank, size):
        raise railring.BootstrapError(
            f"railring backend: torch says rank {rank} of {size}, railring's own launch detection "
            f"says rank {comm.rank} of {comm.size}; start the job with railrun or torchrun so both agree")
    return RailringProcessGroup(comm, rank, size)


dist.Backend.register_backend("railring", _create, devices=["cpu"])

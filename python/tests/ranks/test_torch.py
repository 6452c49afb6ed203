"""CPU torch.Tensors through the binding, zero-copy (a numpy view of the tensor's memory).
Optional: skipped with a message when torch is not installed (CI does not install it)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the torch interop tests are optional")


def test_all_reduce_tensor_in_place(comm):
    n, r = comm.size, comm.rank
    for dt in (torch.float32, torch.float64, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.uint8):
        t = (torch.arange(1000) % 7 + r + 1).to(dt)
        ptr = t.data_ptr()
        out = comm.all_reduce(t)
        assert out is t and t.data_ptr() == ptr  # in place, no copy
        want = sum((torch.arange(1000) % 7 + q + 1).to(torch.float64) for q in range(n))
        assert torch.equal(t.to(torch.float64), want), dt


def test_gradients_and_parameters(comm):
    n = comm.size
    w = torch.nn.Parameter(torch.full((4, 3), float(comm.rank)))  # requires_grad
    comm.all_reduce(w, op="max")
    assert torch.equal(w.detach(), torch.full((4, 3), float(n - 1)))
    loss = (w * (comm.rank + 1)).sum()
    loss.backward()
    comm.all_reduce(w.grad, op="avg")  # data-parallel gradient averaging
    assert torch.equal(w.grad, torch.full((4, 3), (n + 1) / 2))


def test_out_of_place_and_started(comm):
    n, r = comm.size, comm.rank
    x = torch.full((n, 5), float(r))
    out = comm.all_gather(torch.tensor([r, r * 10], dtype=torch.int64))
    assert isinstance(out, torch.Tensor) and out.shape == (n, 2)
    assert torch.equal(out, torch.tensor([[q, q * 10] for q in range(n)]))
    y = comm.all_reduce_into(x)
    assert isinstance(y, torch.Tensor) and torch.equal(y, torch.full((n, 5), float(sum(range(n)))))
    h = comm.all_reduce_start(x, op="min")
    assert h.wait() is x and torch.equal(x, torch.zeros(n, 5))


def test_unusable_tensors_are_clear_errors(comm):
    t = torch.zeros(4, 4)
    with pytest.raises(ValueError, match="not contiguous.*contiguous\\(\\)"):
        comm.all_reduce(t.t())
    with pytest.raises(ValueError, match="does not reduce dtype|unsupported|bool"):
        comm.all_reduce(torch.zeros(3, dtype=torch.bool))


def test_torch_distributed_backend_ddp_step(comm):
    """dist.init_process_group("railring") and one DistributedDataParallel step: every rank's
    gradient is the average of all ranks' gradients, element by element."""
    import torch.distributed as dist

    import railring.torch_backend  # noqa: F401  registers the backend

    n, r = comm.size, comm.rank
    dist.init_process_group("railring")
    try:
        assert dist.get_rank() == r and dist.get_world_size() == n
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        ddp(torch.full((2, 4), float(r + 1))).sum().backward()
        want = sum(2.0 * (q + 1) for q in range(n)) / n  # d/dW of sum(W x) = column sums of x
        assert torch.equal(model.weight.grad, torch.full((3, 4), want))
        assert torch.equal(model.bias.grad, torch.full((3,), 2.0))
        t = torch.tensor([float(r)])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        assert t.item() == n - 1
        b = torch.full((5,), float(r))
        dist.broadcast(b, src=n - 1)
        assert torch.equal(b, torch.full((5,), float(n - 1)))
        outs = [torch.zeros(2) for _ in range(n)]
        dist.all_gather(outs, torch.tensor([r, 10.0 * r]))
        assert all(torch.equal(outs[q], torch.tensor([q, 10.0 * q])) for q in range(n))
        dist.barrier()
    finally:
        dist.destroy_process_group()

"""Arrays that are not numpy arrays: CPU torch tensors as zero-copy numpy views.

Called by the native module only for arguments that are not ``numpy.ndarray`` (the numpy path
never comes here). torch is never imported by railring: a tensor can only exist if the caller
imported torch already.
"""

import sys

import numpy as np


def _torch():
    return sys.modules.get("torch")


def as_numpy(obj, call, arg):
    """(numpy view sharing obj's memory, railring dtype name or None), or None if obj is not an
    array railring knows. Raises ValueError for tensors railring cannot use in place."""
    torch = _torch()
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.device.type != "cpu":
            raise ValueError(
                f"{call}: argument '{arg}' is on {obj.device}; the Python binding works on CPU "
                f"tensors (move it with .cpu(), or use the Rust device API)"
            )
        if not obj.is_contiguous():
            raise ValueError(
                f"{call}: argument '{arg}' is not contiguous (strides {tuple(obj.stride())}); "
                f"railring works in place and never copies: pass {arg}.contiguous() and use that tensor"
            )
        t = obj.detach()
        if t.dtype == torch.bfloat16:
            # numpy has no bfloat16 of its own: the same bytes as int16, typed bf16 for railring
            return t.view(torch.int16).numpy(), "bf16"
        try:
            return t.numpy(), None
        except TypeError as e:
            raise ValueError(f"{call}: argument '{arg}': {e}") from None
    return None


def empty_like(like, shape):
    """A new uninitialised array shaped `shape`, of `like`'s kind (numpy or torch) and dtype."""
    torch = _torch()
    if torch is not None and isinstance(like, torch.Tensor):
        return torch.empty(tuple(shape), dtype=like.dtype)
    return np.empty(tuple(shape), dtype=np.asarray(like).dtype)

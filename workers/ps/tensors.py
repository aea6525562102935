"""Tensors on the wire: raw bytes plus dtype and shape (the ``Tensor`` message), never pickle.

Decoding copies the bytes once into a writable buffer: gRPC hands out immutable ``bytes``, and a
tensor over read-only memory would make every in-place update on the receiving side undefined.
"""

from __future__ import annotations

import torch

from workers.ps import ps_pb2

# Only these cross the wire: anything else is refused (a malformed or hostile message must not
# make a PS allocate or interpret memory it was not meant to).
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}


class TensorError(ValueError):
    """A ``Tensor`` message that does not describe a valid tensor."""


def encode(tensor: torch.Tensor) -> ps_pb2.Tensor:
    name = _NAMES.get(tensor.dtype)
    if name is None:
        raise TensorError(f"dtype {tensor.dtype} cannot be sent; use one of {', '.join(DTYPES)}")
    flat = tensor.detach().to("cpu").contiguous()
    # bfloat16 has no numpy dtype: view its bytes as int16 of the same width.
    raw = flat.view(torch.int16) if flat.dtype == torch.bfloat16 else flat
    return ps_pb2.Tensor(dtype=name, shape=list(flat.shape), data=raw.numpy().tobytes())


def decode(message: ps_pb2.Tensor) -> torch.Tensor:
    dtype = DTYPES.get(message.dtype)
    if dtype is None:
        raise TensorError(f"unknown dtype {message.dtype!r}")
    shape = list(message.shape)
    if any(size < 0 for size in shape):
        raise TensorError(f"negative size in shape {shape}")
    count = 1
    for size in shape:
        count *= size
    itemsize = torch.empty((), dtype=dtype).element_size()
    if len(message.data) != count * itemsize:
        raise TensorError(
            f"{len(message.data)} bytes do not hold a {message.dtype} tensor of shape {shape} "
            f"({count * itemsize} bytes)"
        )
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(message.data), dtype=dtype).view(shape)

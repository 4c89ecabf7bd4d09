"""numpy <-> MAX host buffers for the activation dtypes (numpy has no bfloat16 of its own)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from max.driver import CPU, Buffer
from max.dtype import DType


def numpy_dtype(dtype: DType) -> np.dtype:
    """The numpy dtype holding `dtype` values (ml_dtypes.bfloat16 for bfloat16)."""
    if dtype == DType.bfloat16:
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype.to_numpy())


def to_buffer(array: np.ndarray, dtype: DType) -> Buffer:
    """A host `Buffer` of `dtype` holding `array` (rounded to nearest), any shape."""
    values = np.ascontiguousarray(np.asarray(array).astype(numpy_dtype(dtype)))
    if dtype == DType.bfloat16:
        return Buffer.from_numpy(values.view(np.uint16)).view(DType.bfloat16)
    return Buffer.from_numpy(values)


def to_numpy(buffer: Buffer) -> np.ndarray:
    """Copies `buffer` to the host as numpy; bfloat16 comes back as float32 (exact)."""
    host = buffer.to(CPU())
    if host.dtype == DType.bfloat16:
        bits = host.view(DType.uint16).to_numpy()
        return (bits.astype(np.uint32) << 16).view(np.float32)
    return host.to_numpy()

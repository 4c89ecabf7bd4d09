"""FP8 (float8_e4m3fn) block quantization on the host (numpy), DeepSeek-V3 style.

A tensor x [R, C] is cut into blocks of `block = (br, bc)` elements; each block gets one float32
scale s = amax(|block|) / 448 (1.0 for an all-zero block) and stores q = round_e4m3(x / s), so
that x ≈ q · s. Scales are laid out [ceil(R/br), ceil(C/bc)], block (i, j) at [i, j]: for a
weight W [N, K] with block (gn, gk) that is exactly the op's `weight_scale` and a DeepSeek
checkpoint's `weight_scale_inv` (which, despite its name, is multiplied too).

Activations use the op's transposed, padded layout: `quantize_fp8_input` returns
input_scale [ceil(K/gk), pad(ceil(T/gm))] (tokens contiguous, padded like MAX's quantizer).

On a MAX CPU graph fp8 tensors cannot exist: hand the CPU graph `Fp8Blockwise.bits` (uint8), a
GPU graph `Fp8Blockwise.data` (ml_dtypes.float8_e4m3fn) or `fp8_buffer(...)`, which picks.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from ..core.rules import ARRAY, INT, INT_SEQ, check_types, instance_of, optional

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
"""numpy dtype of float8_e4m3fn values."""
E4M3_MAX = 448.0
"""Largest finite float8_e4m3fn magnitude."""
E4M3_NAN_BITS = np.uint8(0x7F)
"""The float8_e4m3fn NaN a block holding inf or NaN is quantized to (`quantize_fp8_input`)."""
SCALE_ROW_ALIGN = 4
"""MAX's dynamic quantizer pads the token dimension of input_scale to 16 bytes of float32."""


def _block(fn: str, block: object) -> tuple[int, int]:
    check_types(fn, {"block": block}, {"block": INT_SEQ})
    if len(block) != 2:  # type: ignore[arg-type]
        raise ValueError(f"{fn}: block must be a pair (rows, cols), got {block!r}")
    br, bc = int(block[0]), int(block[1])  # type: ignore[index]
    if br < 1 or bc < 1:
        raise ValueError(f"block: expected positive sizes, got {(br, bc)}")
    return br, bc


def _as_e4m3(data: np.ndarray, name: str) -> np.ndarray:
    """float8_e4m3fn values from e4m3 data or uint8 bit patterns."""
    arr = np.asarray(data)
    if arr.dtype == E4M3:
        return arr
    if arr.dtype == np.uint8:
        return arr.view(E4M3)
    raise TypeError(f"{name}: expected float8_e4m3fn values or uint8 bits, got dtype {arr.dtype}")


def block_amax(x: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """max |x| over each (br, bc) block of a 2-D array: shape [ceil(R/br), ceil(C/bc)]."""
    br, bc = block
    r, c = x.shape
    rb, cb = -(-r // br), -(-c // bc)
    padded = np.zeros((rb * br, cb * bc), np.float64)
    padded[:r, :c] = np.abs(x)
    return padded.reshape(rb, br, cb, bc).max(axis=(1, 3))


def expand_scales(scales: np.ndarray, block: tuple[int, int], shape: tuple[int, int]) -> np.ndarray:
    """The per-element scale of a [R, C] tensor from its [ceil(R/br), ceil(C/bc)] block scales."""
    br, bc = block
    r, c = shape
    return np.repeat(np.repeat(scales, br, axis=0)[:r], bc, axis=1)[:, :c]


@dataclass(frozen=True)
class Fp8Blockwise:
    """A block-quantized 2-D tensor: x ≈ data · expand(scales).

    data: float8_e4m3fn [R, C]; scales: float32 [ceil(R/br), ceil(C/bc)]; block: (br, bc).
    """

    data: np.ndarray
    scales: np.ndarray
    block: tuple[int, int]

    def __post_init__(self) -> None:
        check_types("Fp8Blockwise", self.__dict__, {"data": ARRAY, "scales": ARRAY})
        br, bc = _block("Fp8Blockwise", self.block)
        data = _as_e4m3(self.data, "data")
        if data.ndim != 2:
            raise ValueError(f"data: expected a 2-D array, got shape {data.shape}")
        want = (-(-data.shape[0] // br), -(-data.shape[1] // bc))
        scales = np.asarray(self.scales)
        if scales.shape != want:
            raise ValueError(
                f"scales: expected shape {want} for data {data.shape} and block {(br, bc)}, "
                f"got {scales.shape}"
            )
        if not np.issubdtype(scales.dtype, np.floating):
            raise TypeError(f"scales: expected a float dtype, got {scales.dtype}")
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "scales", np.ascontiguousarray(scales, dtype=np.float32))
        object.__setattr__(self, "block", (br, bc))

    @property
    def bits(self) -> np.ndarray:
        """The e4m3fn bit patterns as uint8 (what a MAX CPU graph takes)."""
        return np.ascontiguousarray(self.data).view(np.uint8)

    def dequantize(self) -> np.ndarray:
        """data · scales as float64 (the reference value of the quantized tensor)."""
        full = expand_scales(self.scales.astype(np.float64), self.block, self.data.shape)
        return self.data.astype(np.float64) * full


def to_e4m3(x: np.ndarray) -> np.ndarray:
    """Rounds to float8_e4m3fn (nearest even), saturating to ±448 instead of NaN."""
    return np.clip(np.asarray(x, np.float32), -E4M3_MAX, E4M3_MAX).astype(E4M3)


def quantize_fp8_blockwise(
    x: np.ndarray,
    block: tuple[int, int] = (128, 128),
    *,
    weight_scale_inv: np.ndarray | None = None,
) -> Fp8Blockwise:
    """Block-quantizes a 2-D float array to float8_e4m3fn with one float32 scale per block.

    scale = amax(|block|) / 448 (1.0 for an all-zero block), data = round_e4m3(x / scale).
    Subnormal inputs quantize by the same formula (in float64: a block of float32 subnormals
    gets a subnormal float32 scale and non-zero codes); inf or NaN raise ValueError (a weight
    holding them is broken; activations go through `quantize_fp8_input`).
    With `weight_scale_inv` (a DeepSeek-V3 FP8 checkpoint: `weight` float8_e4m3fn [N, K] and
    `weight_scale_inv` float32 [ceil(N/128), ceil(K/128)]), `x` must already be the e4m3 data
    (or its uint8 bits); nothing is re-quantized, the pair is checked and wrapped (the
    checkpoint's scale multiplies, as the op's weight_scale does).
    Raises TypeError / ValueError naming the argument.
    """
    check_types("quantize_fp8_blockwise", {"x": x, "weight_scale_inv": weight_scale_inv},
                {"x": ARRAY, "weight_scale_inv": optional(ARRAY)})
    br, bc = _block("quantize_fp8_blockwise", block)
    if weight_scale_inv is not None:
        return Fp8Blockwise(_as_e4m3(x, "x"), np.asarray(weight_scale_inv), (br, bc))
    arr = np.asarray(x)
    if arr.ndim != 2:
        raise ValueError(f"x: expected a 2-D array, got shape {arr.shape}")
    if not (np.issubdtype(arr.dtype, np.floating) or arr.dtype == np.dtype(ml_dtypes.bfloat16)):
        raise TypeError(f"x: expected a float array, got dtype {arr.dtype}")
    values = arr.astype(np.float64)
    if not np.isfinite(values).all():
        raise ValueError("quantize_fp8_blockwise: x must be finite, got inf or NaN values")
    return _quantize(values, (br, bc))


def _quantize(values: np.ndarray, block: tuple[int, int]) -> Fp8Blockwise:
    """The block quantization of float64 values [R, C]; a block holding inf or NaN gets scale
    NaN and NaN codes (0x7F), as the graph op `quantize_fp8_rows` gives it."""
    with np.errstate(invalid="ignore"):
        amax = block_amax(values, block)
    bad = ~np.isfinite(amax)
    scales = np.where(bad, np.nan, np.where(amax > 0, amax / E4M3_MAX, 1.0)).astype(np.float32)
    full = expand_scales(scales.astype(np.float64), block, values.shape)
    with np.errstate(invalid="ignore"):
        data = to_e4m3(values / full)
    if bad.any():
        poisoned = expand_scales(bad, block, values.shape)
        data = np.where(poisoned, E4M3_NAN_BITS, data.view(np.uint8)).astype(np.uint8).view(E4M3)
    return Fp8Blockwise(data, scales, block)


def quantize_fp8_input(
    x: np.ndarray, gm: int = 1, gk: int = 128, *, row_align: int = SCALE_ROW_ALIGN
) -> tuple[np.ndarray, np.ndarray]:
    """Quantizes activations x [T, K] for the op: (data e4m3 [T, K], input_scale float32).

    input_scale is [ceil(K/gk), Tp] with Tp = ceil(T/gm) rounded up to `row_align` (MAX's
    quantizer pads to 16 bytes); entry [kb, i] scales tokens [i·gm, (i+1)·gm) x columns
    [kb·gk, (kb+1)·gk). Padding entries are 1.0. Bit-identical to the graph op
    `quantize_fp8_rows` (gm = 1) on bfloat16/float16/float32 values, subnormals included; a
    block holding inf or NaN gets scale NaN and all its codes NaN (0x7F) in both.
    """
    check_types("quantize_fp8_input", {"x": x, "gm": gm, "gk": gk, "row_align": row_align},
                {"x": ARRAY, "gm": INT, "gk": INT, "row_align": INT})
    arr = np.asarray(x)
    if arr.ndim != 2:
        raise ValueError(f"quantize_fp8_input: x must be a 2-D array [T, K], got shape {arr.shape}")
    if not (np.issubdtype(arr.dtype, np.floating) or arr.dtype == np.dtype(ml_dtypes.bfloat16)):
        raise TypeError(f"quantize_fp8_input: x must be a float array, got dtype {arr.dtype}")
    q = _quantize(arr.astype(np.float64), _block("quantize_fp8_input", (gm, gk)))
    rows = q.scales.shape[0]
    padded = -(-rows // row_align) * row_align if row_align > 1 else rows
    scale_t = np.ones((q.scales.shape[1], padded), np.float32)
    scale_t[:, :rows] = q.scales.T
    return q.data, scale_t


def fp8_buffer(array: np.ndarray, device: object | None = None) -> object:
    """A MAX `Buffer` of e4m3fn data for a graph on `device` (a max.driver Device; None = CPU).

    CPU: uint8 bits (CPU graphs cannot hold float8); accelerator: float8_e4m3fn, copied there.
    `array` holds float8_e4m3fn values or their uint8 bits.
    """
    from max.driver import CPU, Buffer, Device
    from max.dtype import DType

    check_types("fp8_buffer", {"array": array, "device": device},
                {"array": ARRAY, "device": optional(instance_of("a max.driver Device", Device))})

    bits = np.ascontiguousarray(_as_e4m3(array, "array")).view(np.uint8)
    host = Buffer.from_numpy(bits)
    if device is None or isinstance(device, CPU):
        return host
    return host.view(DType.float8_e4m3fn).to(device)

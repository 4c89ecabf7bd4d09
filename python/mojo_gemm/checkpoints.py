"""Checkpoint loader: safetensors tensors of GPTQ, AWQ, FP8 and dense linears → our layers' state.

Formats of one linear at name prefix `p` (W [N, K] is the logical weight, y = x · Wᵀ):

- GPTQ (AutoGPTQ, 4 bit): `p.qweight` I32/U32 [K/8, N], `p.qzeros` I32/U32 [G, N/8],
  `p.scales` F16/BF16/F32 [G, N], optional `p.g_idx` I32/I64 [K] (act-order). The zero-point
  convention comes from the quantization config's `checkpoint_format` ("gptq" = v1, stores
  zero − 1, the default; "gptq_v2" stores the zero).
- AWQ (AutoAWQ GEMM, 4 bit): `p.qweight` I32/U32 [K, N/8], `p.qzeros` I32/U32 [G, N/8],
  `p.scales` F16/BF16/F32 [G, N]. GPTQ and AWQ are told apart by the shapes (GPTQ's qweight
  has N columns, AWQ's N/8); a config's `quant_method` must agree.
- FP8 (DeepSeek-V3 block-scaled): `p.weight` F8_E4M3 [N, K] and `p.weight_scale_inv` F32
  (F16/BF16 accepted) [ceil(N/bn), ceil(K/bk)], (bn, bk) = the config's `weight_block_size`
  (default 128 × 128); W = weight · weight_scale_inv (the "inverse" scale multiplies).
- Dense: `p.weight` BF16/F16/F32 [N, K].
- Any of them may have `p.bias` BF16/F16/F32 [N].

The group size of a 4-bit linear comes from the config (`group_size`, AutoAWQ's
`q_group_size`) or, without one, from the shapes: G = 1 means per channel (-1), else K / G.
`bits` (or `w_bit`) must be 4. A config is the `quantization_config` dict of a model's
config.json (or the whole config.json, or AutoGPTQ's quantize_config.json / AutoAWQ's
quant_config.json); it applies to the prefixes it is passed with.

Outputs (host `max.driver.Buffer`s, names local to the layer, optionally prefixed):
- `int4_linear_state`: `Int4Linear`'s `qweight`, `scales`, `zeros`, `perm`, `bias`.
- `kv_projection_state`: `PagedKVProjection`'s `k_weight` / `v_weight` (fp8 [N, hidden]; on a
  CPU layer uint8 e4m3 bits) and `k_weight_scale` / `v_weight_scale` f32
  [ceil(N/block), ceil(hidden/block)]; FP8 checkpoints are taken bit for bit, other formats
  are dequantized and block-quantized (`quantize_fp8_blockwise`).
- `grouped_linear_state`: `GroupedLinear`'s `weight` [E, N, K] from per-expert tensors
  `p.experts.<e>.<proj>.*` in any of the formats above, dequantized and rounded to the layer's
  dtype; a SwiGLU layer takes (gate, up) projections and interleaves them
  (`interleave_gate_up`).
- `moe_block_state`: `MoEBlock`'s `router_weight`, `gate_up.weight`, `down.weight` from a
  checkpoint's MoE layer (router `p.gate` and the per-expert projections).

Every problem with the checkpoint's contents raises `CheckpointError` (a ValueError) naming
the tensor, the expected and the actual shape or dtype; TypeError for wrong Python arguments.

Reading needs the `safetensors` package (imported when the first tensor is read). Its numpy
reader has no float8 dtype: F8_E4M3 tensors are read as raw bytes (from the
file's header offsets) and viewed as `ml_dtypes.float8_e4m3fn`; BF16 comes back as
`ml_dtypes.bfloat16`.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
from max.driver import Buffer

from .core.host import to_buffer
from .fp8.quant import Fp8Blockwise, quantize_fp8_blockwise
from .grouped.layer import GroupedLinear
from .grouped.moe import MoEBlock
from .int4.layer import Int4Linear
from .int4.quant import Int4Weight
from .k_cache.layer import PagedKVProjection

FORMATS = ("gptq", "awq", "fp8", "dense")
"""What `detect_format` returns."""
INT4_WORD_DTYPES = ("I32", "U32")
FLOAT_DTYPES = ("BF16", "F16", "F32")
INDEX_DTYPES = ("I32", "I64")
FP8_DTYPE = "F8_E4M3"
DEFAULT_FP8_BLOCK = (128, 128)
"""DeepSeek-V3's weight_block_size (a config's `weight_block_size` overrides it)."""

_RAW_DTYPES = {FP8_DTYPE: np.dtype(ml_dtypes.float8_e4m3fn)}
"""safetensors dtypes its numpy reader cannot return, read from the raw bytes instead."""
_HEADER_LEN = struct.Struct("<Q")


class CheckpointError(ValueError):
    """A tensor is missing from the checkpoint or has an unexpected shape or dtype."""


# --------------------------------------------------------------------------------------------
# safetensors files


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: its file, safetensors dtype string, shape and byte range."""

    path: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def _read_header(path: Path) -> tuple[int, dict[str, dict]]:
    """(byte offset of the data section, the JSON header) of one safetensors file."""
    with path.open("rb") as f:
        raw = f.read(_HEADER_LEN.size)
        if len(raw) != _HEADER_LEN.size:
            raise CheckpointError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (length,) = _HEADER_LEN.unpack(raw)
        header = json.loads(f.read(length))
    return _HEADER_LEN.size + length, header


class Checkpoint:
    """The tensors of one or more safetensors files, read lazily by name.

    paths: a .safetensors file, a directory (every *.safetensors in it) or a list of files.
    A name stored in two files raises CheckpointError.
    """

    def __init__(self, paths: str | Path | Sequence[str | Path]) -> None:
        if isinstance(paths, (str, Path)):
            root = Path(paths)
            files = sorted(root.glob("*.safetensors")) if root.is_dir() else [root]
        else:
            files = [Path(p) for p in paths]
        if not files:
            raise CheckpointError(f"paths: no .safetensors files in {paths!s}")
        self._tensors: dict[str, TensorInfo] = {}
        self._data_start: dict[Path, int] = {}
        for path in files:
            start, header = _read_header(path)
            self._data_start[path] = start
            for name, entry in header.items():
                if name == "__metadata__":
                    continue
                if name in self._tensors:
                    raise CheckpointError(
                        f"{name}: stored twice, in {self._tensors[name].path} and {path}"
                    )
                begin, end = entry["data_offsets"]
                self._tensors[name] = TensorInfo(
                    path, entry["dtype"], tuple(entry["shape"]), begin, end
                )

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._tensors))

    def info(self, name: str) -> TensorInfo:
        """The `TensorInfo` of `name`; CheckpointError if it is not in the checkpoint."""
        try:
            return self._tensors[name]
        except KeyError:
            raise CheckpointError(f"{name}: tensor missing from the checkpoint") from None

    def get(self, name: str) -> np.ndarray:
        """The tensor `name` as numpy (BF16 → ml_dtypes.bfloat16, F8_E4M3 → float8_e4m3fn)."""
        info = self.info(name)
        if info.dtype in _RAW_DTYPES:
            dtype = _RAW_DTYPES[info.dtype]
            count = (info.end - info.begin) // dtype.itemsize
            offset = self._data_start[info.path] + info.begin
            data = np.fromfile(info.path, dtype=np.uint8, count=count * dtype.itemsize,
                               offset=offset)
            return data.view(dtype).reshape(info.shape)
        # Imported here: only reading tensor data needs the package (headers are parsed above).
        from safetensors import safe_open

        with safe_open(str(info.path), framework="numpy") as f:
            return f.get_tensor(name)

    def expect(
        self, name: str, dtypes: Sequence[str], shape: Sequence[int] | None = None
    ) -> np.ndarray:
        """get(name) after checking its dtype is one of `dtypes` and its shape is `shape`."""
        info = self.info(name)
        if info.dtype not in dtypes:
            raise CheckpointError(
                f"{name}: expected dtype {' or '.join(dtypes)}, got {info.dtype}"
            )
        if shape is not None and info.shape != tuple(shape):
            raise CheckpointError(
                f"{name}: expected shape {list(shape)}, got {list(info.shape)}"
            )
        return self.get(name)


# --------------------------------------------------------------------------------------------
# quantization config


@dataclass(frozen=True)
class QuantConfig:
    """The parts of a quantization config the loader uses (None: not stated)."""

    quant_method: str | None = None
    group_size: int | None = None
    checkpoint_format: str = "gptq"
    fp8_block: tuple[int, int] = DEFAULT_FP8_BLOCK

    @classmethod
    def parse(cls, config: Mapping[str, object] | None) -> QuantConfig:
        """From a config dict (see the module docstring); ValueError for unsupported ones."""
        if config is None:
            return cls()
        if not isinstance(config, Mapping):
            raise TypeError(f"quant_config: expected a mapping, got {type(config).__name__}")
        inner = config.get("quantization_config")
        if isinstance(inner, Mapping):
            config = inner
        bits = config.get("bits", config.get("w_bit", 4))
        if bits != 4 and config.get("quant_method") != "fp8":
            raise ValueError(f"quant_config: expected bits 4, got {bits!r}")
        version = str(config.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(f"quant_config: expected AWQ version 'gemm', got {version!r}")
        method = config.get("quant_method")
        group = config.get("group_size", config.get("q_group_size"))
        block = config.get("weight_block_size", DEFAULT_FP8_BLOCK)
        if not (isinstance(block, (list, tuple)) and len(block) == 2):
            raise ValueError(f"quant_config: weight_block_size must be [bn, bk], got {block!r}")
        return cls(
            quant_method=None if method is None else str(method).lower(),
            group_size=None if group is None else int(group),
            checkpoint_format=str(config.get("checkpoint_format", "gptq")),
            fp8_block=(int(block[0]), int(block[1])),
        )


# --------------------------------------------------------------------------------------------
# one linear


def detect_format(
    ckpt: Checkpoint, prefix: str, quant_config: Mapping[str, object] | None = None
) -> str:
    """"gptq", "awq", "fp8" or "dense": the format of the linear at `prefix` (see FORMATS).

    Raises CheckpointError when the prefix has none of the formats' tensors, a format's
    companion tensor is missing, or the shapes fit neither GPTQ nor AWQ (or not the config's
    `quant_method`).
    """
    cfg = QuantConfig.parse(quant_config)
    if f"{prefix}.qweight" in ckpt:
        qweight = ckpt.info(f"{prefix}.qweight")
        scales = ckpt.info(f"{prefix}.scales")
        ckpt.info(f"{prefix}.qzeros")
        for info, name in ((qweight, "qweight"), (scales, "scales")):
            if len(info.shape) != 2:
                raise CheckpointError(
                    f"{prefix}.{name}: expected a 2-D tensor, got shape {list(info.shape)}"
                )
        n = scales.shape[1]
        if qweight.shape[1] == n:
            fmt = "gptq"
        elif qweight.shape[1] * 8 == n:
            fmt = "awq"
        else:
            raise CheckpointError(
                f"{prefix}.qweight: expected [K/8, {n}] (GPTQ) or [K, {n // 8}] (AWQ) for "
                f"scales [G, {n}], got {list(qweight.shape)}"
            )
        if fmt == "awq" and f"{prefix}.g_idx" in ckpt:
            raise CheckpointError(
                f"{prefix}.g_idx: present, but qweight {list(qweight.shape)} is AWQ-packed"
            )
        if cfg.quant_method in ("gptq", "awq") and cfg.quant_method != fmt:
            raise CheckpointError(
                f"{prefix}.qweight: quant_method {cfg.quant_method!r} expects the "
                f"{cfg.quant_method.upper()} layout, got shape {list(qweight.shape)} "
                f"({fmt.upper()}) for scales {list(scales.shape)}"
            )
        return fmt
    if f"{prefix}.weight" in ckpt:
        dtype = ckpt.info(f"{prefix}.weight").dtype
        if dtype == FP8_DTYPE:
            ckpt.info(f"{prefix}.weight_scale_inv")
            return "fp8"
        if dtype in FLOAT_DTYPES:
            return "dense"
        raise CheckpointError(
            f"{prefix}.weight: expected dtype {FP8_DTYPE} or {' or '.join(FLOAT_DTYPES)}, "
            f"got {dtype}"
        )
    raise CheckpointError(
        f"{prefix}: no linear weight in the checkpoint (looked for {prefix}.qweight and "
        f"{prefix}.weight)"
    )


def _group_size(prefix: str, k: int, groups: int, cfg: QuantConfig) -> int:
    """The group size of a 4-bit linear with K inputs and G scale rows (config first)."""
    if cfg.group_size is None:
        if groups == 1:
            return -1
        if k % groups:
            raise CheckpointError(
                f"{prefix}.scales: expected a row count dividing K = {k}, got {groups}"
            )
        return k // groups
    g = cfg.group_size
    if g != -1 and (g <= 0 or k % g):
        raise CheckpointError(
            f"{prefix}.qweight: expected K a multiple of the config's group_size {g}, got K = {k}"
        )
    want = 1 if g == -1 else k // g
    if want != groups:
        raise CheckpointError(
            f"{prefix}.scales: expected {want} rows (K = {k}, group_size {g}), got {groups}"
        )
    return cfg.group_size


def read_int4(
    ckpt: Checkpoint, prefix: str, quant_config: Mapping[str, object] | None = None
) -> Int4Weight:
    """The GPTQ or AWQ linear at `prefix` repacked as an `Int4Weight` (see the module doc).

    Raises CheckpointError when the prefix is not a 4-bit linear or its tensors do not fit
    together (the message names the tensor).
    """
    cfg = QuantConfig.parse(quant_config)
    fmt = detect_format(ckpt, prefix, quant_config)
    if fmt not in ("gptq", "awq"):
        raise CheckpointError(
            f"{prefix}: expected a GPTQ or AWQ linear (qweight, qzeros, scales), got {fmt}"
        )
    qw_info = ckpt.info(f"{prefix}.qweight")
    n = ckpt.info(f"{prefix}.scales").shape[1]
    k = qw_info.shape[0] * 8 if fmt == "gptq" else qw_info.shape[0]
    if n % 8:
        raise CheckpointError(f"{prefix}.scales: expected N a multiple of 8, got N = {n}")
    groups = ckpt.info(f"{prefix}.scales").shape[0]
    group_size = _group_size(prefix, k, groups, cfg)
    qweight = ckpt.expect(f"{prefix}.qweight", INT4_WORD_DTYPES)
    qzeros = ckpt.expect(f"{prefix}.qzeros", INT4_WORD_DTYPES, (groups, n // 8))
    scales = ckpt.expect(f"{prefix}.scales", FLOAT_DTYPES, (groups, n))
    try:
        if fmt == "awq":
            return Int4Weight.from_awq(qweight, qzeros, scales, group_size=group_size)
        g_idx = None
        if f"{prefix}.g_idx" in ckpt:
            g_idx = ckpt.expect(f"{prefix}.g_idx", INDEX_DTYPES, (k,))
        return Int4Weight.from_gptq(
            qweight, qzeros, scales, g_idx,
            group_size=group_size, checkpoint_format=cfg.checkpoint_format,
        )
    except (TypeError, ValueError) as err:
        # Int4Weight names its argument (qweight, qzeros, g_idx, ...): add the tensor prefix.
        raise CheckpointError(f"{prefix}: {err}") from err


def read_fp8(
    ckpt: Checkpoint, prefix: str, quant_config: Mapping[str, object] | None = None
) -> Fp8Blockwise:
    """The FP8 linear at `prefix`: weight e4m3 [N, K] with its weight_scale_inv (as is).

    Raises CheckpointError unless `p.weight` is F8_E4M3 [N, K] and `p.weight_scale_inv` a
    float [ceil(N/bn), ceil(K/bk)] for the config's block (default 128 × 128).
    """
    cfg = QuantConfig.parse(quant_config)
    info = ckpt.info(f"{prefix}.weight")
    if info.dtype != FP8_DTYPE or len(info.shape) != 2:
        raise CheckpointError(
            f"{prefix}.weight: expected {FP8_DTYPE} [N, K], got {info.dtype} {list(info.shape)}"
        )
    n, k = info.shape
    bn, bk = cfg.fp8_block
    scale = ckpt.expect(f"{prefix}.weight_scale_inv", FLOAT_DTYPES, (-(-n // bn), -(-k // bk)))
    return quantize_fp8_blockwise(
        ckpt.get(f"{prefix}.weight"), (bn, bk), weight_scale_inv=scale.astype(np.float32)
    )


def read_dense(ckpt: Checkpoint, prefix: str) -> np.ndarray:
    """The dense BF16/F16/F32 weight [N, K] at `prefix`.weight as float32."""
    info = ckpt.info(f"{prefix}.weight")
    if len(info.shape) != 2:
        raise CheckpointError(
            f"{prefix}.weight: expected a 2-D [N, K] tensor, got shape {list(info.shape)}"
        )
    return ckpt.expect(f"{prefix}.weight", FLOAT_DTYPES).astype(np.float32)


def read_float_weight(
    ckpt: Checkpoint, prefix: str, quant_config: Mapping[str, object] | None = None
) -> np.ndarray:
    """The linear at `prefix` in any format, dequantized: float32 [N, K]."""
    fmt = detect_format(ckpt, prefix, quant_config)
    if fmt in ("gptq", "awq"):
        return read_int4(ckpt, prefix, quant_config).dequantize()
    if fmt == "fp8":
        return read_fp8(ckpt, prefix, quant_config).dequantize().astype(np.float32)
    return read_dense(ckpt, prefix)


def read_bias(ckpt: Checkpoint, prefix: str, n: int) -> np.ndarray | None:
    """`prefix`.bias as float32 [n], or None when the checkpoint has none."""
    if f"{prefix}.bias" not in ckpt:
        return None
    return ckpt.expect(f"{prefix}.bias", FLOAT_DTYPES, (n,)).astype(np.float32)


# --------------------------------------------------------------------------------------------
# layer state dicts


def _prefixed(state: dict[str, Buffer], state_prefix: str) -> dict[str, Buffer]:
    return {f"{state_prefix}{name}": value for name, value in state.items()}


def int4_linear_kwargs(weight: Int4Weight, has_bias: bool = False) -> dict[str, object]:
    """The `Int4Linear` constructor arguments (besides dtype/device) that fit `weight`."""
    return {
        "in_features": weight.k,
        "out_features": weight.n,
        "group_size": weight.group_size,
        "symmetric": weight.symmetric,
        "act_order": weight.perm is not None,
        "has_bias": has_bias,
    }


def int4_linear_state(
    ckpt: Checkpoint,
    prefix: str,
    layer: Int4Linear,
    *,
    quant_config: Mapping[str, object] | None = None,
    state_prefix: str = "",
) -> dict[str, Buffer]:
    """`layer`'s weights (names `state_prefix` + qweight/scales/zeros/perm/bias) from the
    GPTQ or AWQ linear at `prefix`; `prefix`.bias is read when the layer has a bias.

    Raises CheckpointError for missing or mismatched tensors, including a checkpoint whose
    configuration (N, K, group size, symmetric, act-order, bias) differs from the layer's.
    """
    weight = read_int4(ckpt, prefix, quant_config)
    bias = read_bias(ckpt, prefix, weight.n)
    has_bias = layer.bias is not None
    if bias is None and has_bias:
        raise CheckpointError(f"{prefix}.bias: tensor missing, but the layer has a bias")
    if bias is not None and not has_bias:
        raise CheckpointError(f"{prefix}.bias: present, but the layer has no bias")
    try:
        state = layer.int4_state(weight, bias)
    except ValueError as err:
        raise CheckpointError(f"{prefix}: {err}") from err
    return _prefixed(state, state_prefix)


def fp8_weight(
    ckpt: Checkpoint,
    prefix: str,
    quant_config: Mapping[str, object] | None = None,
    *,
    block: tuple[int, int] = DEFAULT_FP8_BLOCK,
) -> Fp8Blockwise:
    """The linear at `prefix` as block-scaled FP8: an FP8 checkpoint as is (its block must be
    `block`), any other format dequantized and block-quantized with `block`."""
    if detect_format(ckpt, prefix, quant_config) != "fp8":
        return quantize_fp8_blockwise(read_float_weight(ckpt, prefix, quant_config), block)
    q = read_fp8(ckpt, prefix, quant_config)
    if q.block != tuple(block):
        raise CheckpointError(
            f"{prefix}.weight_scale_inv: expected {tuple(block)} blocks, got {q.block} (the "
            f"config's weight_block_size)"
        )
    return q


def kv_projection_state(
    ckpt: Checkpoint,
    k_prefix: str,
    v_prefix: str,
    layer: PagedKVProjection,
    *,
    quant_config: Mapping[str, object] | None = None,
    state_prefix: str = "",
) -> dict[str, Buffer]:
    """`layer`'s weights from the K and V projections at `k_prefix` and `v_prefix`.

    Names (after `state_prefix`): k_weight, v_weight e4m3 [N, hidden] (uint8 bits on a CPU
    layer, float8_e4m3fn otherwise), k_weight_scale, v_weight_scale float32
    [ceil(N/block), ceil(hidden/block)] (`PagedKVProjection.fp8_state`). FP8 checkpoints are
    taken bit for bit and must use the layer's block (block × block); other formats are
    block-quantized here. Raises CheckpointError for missing or mismatched tensors.
    """
    block = (layer.block, layer.block)
    k = fp8_weight(ckpt, k_prefix, quant_config, block=block)
    v = fp8_weight(ckpt, v_prefix, quant_config, block=block)
    want = [layer.n, layer.hidden_size]
    for prefix, q in ((k_prefix, k), (v_prefix, v)):
        if list(q.data.shape) != want:
            raise CheckpointError(
                f"{prefix}.weight: expected {want} (N = n_kv_heads · head_dim, hidden) for "
                f"the layer, got {list(q.data.shape)}"
            )
    return _prefixed(layer.fp8_state(k, v), state_prefix)


_EXPERT = re.compile(r"\.experts\.(\d+)\.")


def expert_ids(ckpt: Checkpoint, prefix: str) -> list[int]:
    """The expert numbers e of tensors named `prefix`.experts.<e>.*, sorted."""
    ids = set()
    for name in ckpt:
        if name.startswith(f"{prefix}.experts."):
            match = _EXPERT.match(name[len(prefix):])
            if match:
                ids.add(int(match.group(1)))
    return sorted(ids)


def read_expert_bank(
    ckpt: Checkpoint,
    prefix: str,
    proj: str,
    num_experts: int,
    quant_config: Mapping[str, object] | None = None,
) -> np.ndarray:
    """float32 [E, N, K]: `prefix`.experts.<e>.`proj` for e < num_experts, dequantized.

    Raises CheckpointError when an expert is missing or its shape differs from expert 0's.
    """
    bank = []
    for e in range(num_experts):
        w = read_float_weight(ckpt, f"{prefix}.experts.{e}.{proj}", quant_config)
        if bank and w.shape != bank[0].shape:
            raise CheckpointError(
                f"{prefix}.experts.{e}.{proj}: expected the shape of expert 0 "
                f"{list(bank[0].shape)}, got {list(w.shape)}"
            )
        bank.append(w)
    return np.stack(bank)


def grouped_linear_state(
    ckpt: Checkpoint,
    prefix: str,
    layer: GroupedLinear,
    *,
    projections: Sequence[str] | None = None,
    quant_config: Mapping[str, object] | None = None,
    state_prefix: str = "",
) -> dict[str, Buffer]:
    """`layer`'s expert bank (name `state_prefix` + "weight") from per-expert linears.

    Reads `prefix`.experts.<e>.<proj> for e < layer.num_experts in any supported format.
    projections: (gate, up) for a SwiGLU layer, default ("gate_proj", "up_proj"), stacked
    [E, out_features, in_features] each and interleaved; (down,) otherwise, default
    ("down_proj",), [E, out_features, in_features]. Raises CheckpointError for missing experts
    or tensors whose shape differs from the layer's.
    """
    if projections is None:
        projections = ("gate_proj", "up_proj") if layer.swiglu else ("down_proj",)
    want = 2 if layer.swiglu else 1
    if len(projections) != want:
        raise ValueError(
            f"projections: expected {want} name(s) for a {'SwiGLU' if layer.swiglu else 'plain'}"
            f" GroupedLinear, got {tuple(projections)}"
        )
    found = expert_ids(ckpt, prefix)
    missing = sorted(set(range(layer.num_experts)) - set(found))
    if missing:
        raise CheckpointError(
            f"{prefix}.experts.{missing[0]}: expert missing (the layer has "
            f"{layer.num_experts} experts, the checkpoint {len(found)})"
        )
    banks = [read_expert_bank(ckpt, prefix, p, layer.num_experts, quant_config)
             for p in projections]
    shape = [layer.out_features, layer.in_features]
    for proj, bank in zip(projections, banks, strict=True):
        if list(bank.shape[1:]) != shape:
            raise CheckpointError(
                f"{prefix}.experts.0.{proj}: expected a [{shape[0]}, {shape[1]}] weight for "
                f"the layer, got {list(bank.shape[1:])}"
            )
    if layer.swiglu:
        state = layer.expert_state(gate=banks[0], up=banks[1])
    else:
        state = layer.expert_state(banks[0])
    return _prefixed(state, state_prefix)


def moe_block_state(
    ckpt: Checkpoint,
    prefix: str,
    block: MoEBlock,
    *,
    router: str = "gate",
    projections: Sequence[str] = ("gate_proj", "up_proj", "down_proj"),
    quant_config: Mapping[str, object] | None = None,
    state_prefix: str = "",
) -> dict[str, Buffer]:
    """`block`'s weights (router_weight, gate_up.weight, down.weight after `state_prefix`)
    from a checkpoint's MoE layer at `prefix` (e.g. "model.layers.3.mlp").

    router: the router linear's name, read as `prefix`.`router` (any format; float [E, hidden],
    DeepSeek/Qwen "gate", Mixtral "gate" under "block_sparse_moe"); projections: the experts'
    (gate, up, down) names under `prefix`.experts.<e> (Mixtral: ("w1", "w3", "w2")). Raises
    CheckpointError for missing or mismatched tensors.
    """
    if len(projections) != 3:
        raise ValueError(f"projections: expected (gate, up, down) names, got {tuple(projections)}")
    weight = read_float_weight(ckpt, f"{prefix}.{router}", quant_config)
    want = [block.num_experts, block.hidden_size]
    if list(weight.shape) != want:
        raise CheckpointError(
            f"{prefix}.{router}: expected a {want} router weight (num_experts, hidden_size), "
            f"got {list(weight.shape)}"
        )
    state = {"router_weight": to_buffer(weight, block.dtype)}
    state |= grouped_linear_state(ckpt, prefix, block.gate_up, projections=projections[:2],
                                  quant_config=quant_config, state_prefix="gate_up.")
    state |= grouped_linear_state(ckpt, prefix, block.down, projections=projections[2:],
                                  quant_config=quant_config, state_prefix="down.")
    return _prefixed(state, state_prefix)

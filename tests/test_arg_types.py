"""Every public function and layer rejects an argument of the wrong Python type with a TypeError
naming the argument (`core.rules.check_types`), before any shape rule, MAX or a compile.

Each case is a callable of the public API with a valid argument set; each argument in turn gets
wrong-typed values (a float or string for an int, a bool for an int, a TensorValue for a buffer,
a tuple for the KV collection, an array for a graph value, ...). Everything raises while the
graph is built, so nothing here compiles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from max.dtype import DType
from max.graph import BufferType, DeviceRef, Graph, TensorType, TensorValue
from max.nn.kv_cache import MHAKVCacheParams, PagedCacheValues

import mojo_gemm as mg
from mojo_gemm.int4.quant import Int4Weight

CPU = DeviceRef.CPU()
BF16, U32 = DType.bfloat16, DType.uint32
KV_PARAMS = MHAKVCacheParams(dtype=BF16, n_kv_heads=2, head_dim=64, num_layers=3, page_size=16,
                             devices=[CPU])

TENSOR, BUFFER, COLL = "<tensor>", "<buffer>", "<coll>"
"""Placeholders replaced inside the graph by a TensorValue, a BufferValue, a PagedCacheValues
(and "<w4>" by an Int4WeightValues)."""


class Vals:
    """Graph values of one test graph: any TensorValue passes a type check."""

    def __init__(self, g: Graph) -> None:
        self.t = g.inputs[0].tensor
        self.buf = g.inputs[1].buffer
        self.coll = PagedCacheValues(
            kv_blocks=g.inputs[1].buffer, cache_lengths=self.t, lookup_table=self.t,
            max_prompt_length=self.t, max_cache_length=self.t, page_stride=self.t,
        )

    def resolve(self, v: object) -> object:
        if not isinstance(v, str):
            return v
        if v == "<w4>":
            return mg.Int4WeightValues(self.t, self.t, None, None, 16, 128, 128)
        return {TENSOR: self.t, BUFFER: self.buf, COLL: self.coll}.get(v, v)


@dataclass(frozen=True)
class Api:
    """One public callable: `call(vals, args)` with valid `args`; `bad[arg]` wrong values."""

    name: str
    call: Callable[[Vals, dict[str, Any]], object]
    args: dict[str, Any]
    bad: dict[str, tuple[object, ...]]


NOT_INT = (200.0, "200", True)
NOT_BOOL = (1, "yes")
NOT_TENSOR = (np.zeros((2, 2), np.float32), BUFFER)
NOT_ARRAY = ("w", 3.5)
W = np.zeros((16, 128), np.float32)


def _weight_values(v: Vals, a: dict[str, Any]) -> mg.Int4WeightValues:
    return mg.Int4WeightValues(qweight=a["qweight"], scales=a["scales"], zeros=a["zeros"],
                               perm=a["perm"], n=a["n"], k=a["k"], group_size=a["group_size"])


def _kv_call(fn: Callable[..., None]) -> Callable[[Vals, dict[str, Any]], object]:
    def call(v: Vals, a: dict[str, Any]) -> object:
        return fn(a["kv_params"], a["hidden_state"], a["input_row_offsets"], a["weight"],
                  a["input_scale"], a["weight_scale"], a["kv_collection"],
                  a["scales_granularity_mnk"],
                  a["layer_idx"], a["kv_scale"])

    return call


KV_ARGS: dict[str, Any] = {
    "kv_params": KV_PARAMS, "hidden_state": TENSOR, "input_row_offsets": TENSOR,
    "weight": TENSOR, "input_scale": TENSOR, "weight_scale": TENSOR, "kv_collection": COLL,
    "scales_granularity_mnk": (1, 128, 128), "layer_idx": 0, "kv_scale": None,
}
KV_BAD: dict[str, tuple[object, ...]] = {
    "kv_params": ("bf16",), **{n: NOT_TENSOR for n in ("hidden_state", "input_row_offsets",
                                                       "weight", "input_scale", "weight_scale")},
    "kv_collection": ((TENSOR, TENSOR), None), "scales_granularity_mnk": (128, (1.0, 128, 128)),
    "layer_idx": (0.0, "0", False), "kv_scale": (1.0, np.ones(1, np.float32)),
}

FUSED_KV_ARGS: dict[str, Any] = {
    **{k: v for k, v in KV_ARGS.items() if k not in ("weight", "weight_scale")},
    **{n: TENSOR for n in ("k_weight", "v_weight", "k_weight_scale", "v_weight_scale")},
}
FUSED_KV_BAD: dict[str, tuple[object, ...]] = {
    **{k: v for k, v in KV_BAD.items() if k not in ("weight", "weight_scale")},
    **{n: NOT_TENSOR for n in ("k_weight", "v_weight", "k_weight_scale", "v_weight_scale")},
}

GROUPED_ARGS: dict[str, Any] = {
    "a": TENSOR, "b": TENSOR, "a_offsets": TENSOR, "expert_ids": TENSOR,
    "expert_usage_stats": TENSOR, "a_plane_splits": (0, 0), "swiglu": False,
    "row_scale": None, "out": None, "routing_settled": False,
}
GROUPED_BAD: dict[str, tuple[object, ...]] = {
    **{n: NOT_TENSOR for n in ("a", "b", "a_offsets", "expert_ids", "expert_usage_stats")},
    "a_plane_splits": (0, (0.0, 0)), "swiglu": NOT_BOOL, "row_scale": NOT_TENSOR,
    "out": (TENSOR, np.zeros((2, 2))), "routing_settled": NOT_BOOL,
}


def _layer(make: Callable[[], Any], method: str) -> Callable[[Vals, dict[str, Any]], object]:
    return lambda v, a: getattr(make(), method)(**a)


def _int4_linear() -> mg.Int4Linear:
    return mg.Int4Linear(128, 16, has_bias=True)


def _grouped_linear() -> mg.GroupedLinear:
    return mg.GroupedLinear(2, 128, 16)


def _moe() -> mg.MoEBlock:
    return mg.MoEBlock(64, 16, 4, 2)


def _fp8_linear() -> mg.Fp8Linear:
    return mg.Fp8Linear(256, 128)


def _kv_projection() -> mg.PagedKVProjection:
    return mg.PagedKVProjection(KV_PARAMS, 128, 0)


def _kv_projection_call(v: Vals, a: dict[str, Any]) -> object:
    return _kv_projection()(a["x"], a["input_row_offsets"], a["kv_collection"])


APIS = (
    Api("int4_matmul", lambda v, a: mg.int4_matmul(a["x"], a["weight"], a["bias"]),
        {"x": TENSOR, "weight": "<w4>", "bias": None},
        {"x": NOT_TENSOR, "weight": ((TENSOR, TENSOR),), "bias": NOT_TENSOR}),
    Api("Int4WeightValues", _weight_values,
        {"qweight": TENSOR, "scales": TENSOR, "zeros": None, "perm": None, "n": 16, "k": 128,
         "group_size": 128},
        {"qweight": NOT_TENSOR, "scales": NOT_TENSOR, "zeros": NOT_TENSOR, "perm": NOT_TENSOR,
         "n": NOT_INT, "k": NOT_INT, "group_size": NOT_INT}),
    Api("Int4Linear", lambda v, a: mg.Int4Linear(**a),
        {"in_features": 128, "out_features": 16, "group_size": 128, "symmetric": True,
         "act_order": False, "has_bias": False, "dtype": BF16, "device": CPU},
        {"in_features": NOT_INT, "out_features": NOT_INT, "group_size": NOT_INT,
         "symmetric": NOT_BOOL, "act_order": NOT_BOOL, "has_bias": NOT_BOOL,
         "dtype": ("bfloat16", np.float16), "device": ("cpu", 0)}),
    Api("Int4Linear.__call__", _layer(_int4_linear, "__call__"), {"x": TENSOR},
        {"x": NOT_TENSOR}),
    Api("Int4Linear.int4_state", _layer(_int4_linear, "int4_state"),
        {"weight": Int4Weight.from_float(W), "bias": np.zeros(16)},
        {"weight": (W, "w"), "bias": NOT_ARRAY}),
    Api("Int4Weight.from_float", lambda v, a: Int4Weight.from_float(**a),
        {"w": W, "group_size": 128, "symmetric": True},
        {"w": ([[0.0] * 128] * 16, "w"), "group_size": NOT_INT, "symmetric": NOT_BOOL}),
    Api("Int4Weight.from_codes", lambda v, a: Int4Weight.from_codes(**a),
        {"codes": np.zeros((16, 128), np.uint8), "scales": np.ones((1, 16), np.float32),
         "zeros": None, "group_size": 128, "perm": None},
        {"codes": ("c", [[0] * 128] * 16), "scales": ("s",), "zeros": ("z",),
         "group_size": NOT_INT, "perm": ("p",)}),
    Api("Int4Weight.from_max_gptq", lambda v, a: Int4Weight.from_max_gptq(**a),
        {"buffer": np.zeros((66, 16), np.uint8), "n": 16, "k": 128, "group_size": 128,
         "perm_idx": None},
        {"buffer": ("b",), "n": NOT_INT, "k": NOT_INT, "group_size": NOT_INT,
         "perm_idx": ("p",)}),
    Api("int4_gpu_plan", lambda v, a: mg.int4_gpu_plan(**a),
        {"m": 1, "n": 16, "k": 128, "group_size": 128, "has_zeros": False},
        {"m": NOT_INT, "n": NOT_INT, "k": NOT_INT, "group_size": NOT_INT,
         "has_zeros": NOT_BOOL}),
    Api("grouped_matmul", lambda v, a: mg.grouped_matmul(**a), GROUPED_ARGS, GROUPED_BAD),
    Api("GroupedLinear", lambda v, a: mg.GroupedLinear(**a),
        {"num_experts": 2, "in_features": 128, "out_features": 16, "swiglu": False,
         "dtype": BF16, "device": None},
        {"num_experts": NOT_INT, "in_features": NOT_INT, "out_features": NOT_INT,
         "swiglu": NOT_BOOL, "dtype": ("bf16",), "device": ("gpu",)}),
    Api("GroupedLinear.__call__", _layer(_grouped_linear, "__call__"),
        {"x": TENSOR, "a_offsets": TENSOR, "expert_ids": TENSOR, "expert_usage_stats": TENSOR,
         "row_scale": None, "out": None},
        {"x": NOT_TENSOR, "a_offsets": NOT_TENSOR, "expert_ids": NOT_TENSOR,
         "expert_usage_stats": NOT_TENSOR, "row_scale": NOT_TENSOR, "out": (TENSOR,)}),
    Api("GroupedLinear.expert_state", _layer(_grouped_linear, "expert_state"),
        {"weights": np.zeros((2, 16, 128)), "gate": None, "up": None},
        {"weights": NOT_ARRAY, "gate": NOT_ARRAY, "up": NOT_ARRAY}),
    Api("group_tokens_by_expert", lambda v, a: mg.group_tokens_by_expert(**a),
        {"topk_ids": np.zeros((3, 2), np.int64), "num_experts": 4},
        {"topk_ids": (None, "ids"), "num_experts": NOT_INT}),
    Api("interleave_gate_up", lambda v, a: mg.interleave_gate_up(**a),
        {"w_gate": np.zeros((8, 4)), "w_up": np.zeros((8, 4))},
        {"w_gate": NOT_ARRAY, "w_up": NOT_ARRAY}),
    Api("MoEBlock", lambda v, a: mg.MoEBlock(**a),
        {"hidden_size": 64, "intermediate_size": 16, "num_experts": 4, "top_k": 2,
         "dtype": BF16, "device": None},
        {"hidden_size": NOT_INT, "intermediate_size": NOT_INT, "num_experts": NOT_INT,
         "top_k": NOT_INT, "dtype": ("bf16",), "device": ("cpu",)}),
    Api("MoEBlock.__call__", _layer(_moe, "__call__"), {"x": TENSOR}, {"x": NOT_TENSOR}),
    Api("MoEBlock.route", _layer(_moe, "route"), {"x": TENSOR}, {"x": NOT_TENSOR}),
    Api("MoEBlock.moe_state", _layer(_moe, "moe_state"),
        {"router": np.zeros((4, 64)), "gate": np.zeros((4, 16, 64)),
         "up": np.zeros((4, 16, 64)), "down": np.zeros((4, 64, 16))},
        {"router": NOT_ARRAY, "gate": NOT_ARRAY, "up": NOT_ARRAY, "down": NOT_ARRAY}),
    Api("k_matmul_ragged_paged_scale", _kv_call(mg.k_matmul_ragged_paged_scale), KV_ARGS,
        KV_BAD),
    Api("v_matmul_ragged_paged_scale", _kv_call(mg.v_matmul_ragged_paged_scale), KV_ARGS,
        KV_BAD),
    Api("kv_matmul_ragged_paged_scale", lambda v, a: mg.kv_matmul_ragged_paged_scale(**a),
        FUSED_KV_ARGS, FUSED_KV_BAD),
    Api("k_cache_gpu_plan", lambda v, a: mg.k_cache_gpu_plan(**a),
        {"t": 1, "n": 128, "k": 128, "granularity": (1, 128, 128), "a_stride": None,
         "w_stride": None},
        {"t": NOT_INT, "n": NOT_INT, "k": NOT_INT, "granularity": (128, ("1", 2, 3)),
         "a_stride": NOT_INT, "w_stride": NOT_INT}),
    Api("moe_route", lambda v, a: mg.moe_route(**a),
        {"x": TENSOR, "router_weight": TENSOR, "top_k": 2},
        {"x": NOT_TENSOR, "router_weight": NOT_TENSOR, "top_k": NOT_INT}),
    Api("moe_combine", lambda v, a: mg.moe_combine(**a),
        {"y": TENSOR, "inverse": TENSOR, "top_k": 2},
        {"y": NOT_TENSOR, "inverse": NOT_TENSOR, "top_k": NOT_INT}),
    Api("add_rms_norm", lambda v, a: mg.add_rms_norm(**a),
        {"h": TENSOR, "y": None, "weight": TENSOR, "eps": 1e-5, "out_dtype": BF16,
         "keep_sum": True},
        {"h": NOT_TENSOR, "y": NOT_TENSOR, "weight": NOT_TENSOR, "eps": ("1e-5", None),
         "out_dtype": ("bf16",), "keep_sum": NOT_BOOL}),
    Api("add_rms_norm_fp8", lambda v, a: mg.add_rms_norm_fp8(**a),
        {"h": TENSOR, "y": None, "weight": TENSOR, "eps": 1e-5, "block": 128,
         "out_dtype": BF16, "keep_sum": True},
        {"h": NOT_TENSOR, "y": NOT_TENSOR, "weight": NOT_TENSOR, "eps": ("1e-5",),
         "block": NOT_INT, "out_dtype": ("bf16",), "keep_sum": NOT_BOOL}),
    Api("fp8_blockwise_matmul", lambda v, a: mg.fp8_blockwise_matmul(**a),
        {"a": TENSOR, "a_scale": TENSOR, "w": TENSOR, "w_scale": TENSOR,
         "scales_granularity_mnk": (1, 128, 128)},
        {"a": NOT_TENSOR, "a_scale": NOT_TENSOR, "w": NOT_TENSOR, "w_scale": NOT_TENSOR,
         "scales_granularity_mnk": (128, ("1", 2, 3))}),
    Api("Fp8Linear", lambda v, a: mg.Fp8Linear(**a),
        {"in_features": 256, "out_features": 128, "dtype": BF16, "device": CPU, "block": 128},
        {"in_features": NOT_INT, "out_features": NOT_INT, "dtype": ("bf16",),
         "device": ("cpu",), "block": NOT_INT}),
    Api("Fp8Linear.__call__", _layer(_fp8_linear, "__call__"), {"x": TENSOR},
        {"x": NOT_TENSOR}),
    Api("Fp8Linear.fp8_state", _layer(_fp8_linear, "fp8_state"),
        {"weight": mg.quantize_fp8_blockwise(np.zeros((128, 256)), (128, 128))},
        {"weight": (np.zeros((128, 256)),)}),
    Api("Fp8Linear.state_from_float", _layer(_fp8_linear, "state_from_float"),
        {"weight": np.zeros((128, 256))}, {"weight": NOT_ARRAY}),
    Api("quantize_fp8_rows", lambda v, a: mg.quantize_fp8_rows(**a),
        {"x": TENSOR, "block": 128}, {"x": NOT_TENSOR, "block": NOT_INT}),
    Api("PagedKVProjection", lambda v, a: mg.PagedKVProjection(**a),
        {"kv_params": KV_PARAMS, "hidden_size": 128, "layer_idx": 0, "dtype": BF16,
         "device": CPU, "block": 128},
        {"kv_params": ("bf16", None), "hidden_size": NOT_INT, "layer_idx": NOT_INT,
         "dtype": ("bf16",), "device": ("cpu",), "block": NOT_INT}),
    Api("PagedKVProjection.__call__", _kv_projection_call,
        {"x": TENSOR, "input_row_offsets": TENSOR, "kv_collection": COLL},
        {"x": NOT_TENSOR, "input_row_offsets": NOT_TENSOR,
         "kv_collection": ((TENSOR, TENSOR), {"kv_blocks": BUFFER})}),
    Api("PagedKVProjection.write_quantized", _layer(_kv_projection, "write_quantized"),
        {"data": TENSOR, "scales": TENSOR, "input_row_offsets": TENSOR, "kv_collection": COLL},
        {"data": NOT_TENSOR, "scales": NOT_TENSOR, "input_row_offsets": NOT_TENSOR,
         "kv_collection": ((TENSOR, TENSOR),)}),
    Api("PagedKVProjection.fp8_state", _layer(_kv_projection, "fp8_state"),
        {"k": mg.quantize_fp8_blockwise(np.zeros((128, 128))),
         "v": mg.quantize_fp8_blockwise(np.zeros((128, 128)))},
        {"k": (np.zeros((128, 128)),), "v": ("v",)}),
    Api("PagedKVProjection.state_from_float", _layer(_kv_projection, "state_from_float"),
        {"k_weight": np.zeros((128, 128)), "v_weight": np.zeros((128, 128))},
        {"k_weight": NOT_ARRAY, "v_weight": NOT_ARRAY}),
    Api("quantize_fp8_blockwise", lambda v, a: mg.quantize_fp8_blockwise(**a),
        {"x": np.zeros((4, 4)), "block": (2, 2), "weight_scale_inv": None},
        {"x": NOT_ARRAY, "block": (2, (2.0, 2)), "weight_scale_inv": NOT_ARRAY}),
    Api("quantize_fp8_input", lambda v, a: mg.quantize_fp8_input(**a),
        {"x": np.zeros((4, 4)), "gm": 1, "gk": 128, "row_align": 4},
        {"x": NOT_ARRAY, "gm": NOT_INT, "gk": NOT_INT, "row_align": NOT_INT}),
    Api("Fp8Blockwise", lambda v, a: mg.Fp8Blockwise(**a),
        {"data": np.zeros((2, 2), ml_dtypes.float8_e4m3fn), "scales": np.ones((1, 1)),
         "block": (2, 2)},
        {"data": ("d",), "scales": (1.0,), "block": (2, [2.0, 2])}),
    Api("fp8_buffer", lambda v, a: mg.fp8_buffer(**a),
        {"array": np.zeros(4, np.uint8), "device": None},
        {"array": NOT_ARRAY, "device": ("gpu", CPU)}),
    Api("fp8_dtype_for", lambda v, a: mg.fp8_dtype_for(**a), {"device": CPU},
        {"device": ("cpu", None)}),
    Api("gpu_path", lambda v, a: mg.gpu_path(**a), {"arch": "sm_90a", "force": None},
        {"arch": (90, None), "force": (1,)}),
)

CASES = [
    pytest.param(api, arg, bad, id=f"{api.name}-{arg}-{type(bad).__name__}{i}")
    for api in APIS
    for arg, bads in api.bad.items()
    for i, bad in enumerate(bads)
]


def test_every_argument_is_covered() -> None:
    """Each case feeds a wrong value to every argument of its callable."""
    for api in APIS:
        assert set(api.bad) == set(api.args), api.name


def test_every_public_callable_is_covered() -> None:
    """Every public function and layer of `mojo_gemm.__all__` has a case."""
    covered = {api.name.split(".")[0] for api in APIS}
    callables = {n for n in mg.__all__ if callable(getattr(mg, n))} - {
        "kernels_package", "kernels_path", "ExpertGrouping", "MoERouting"}
    assert callables <= covered, callables - covered


@pytest.mark.parametrize(("api", "arg", "bad"), CASES)
def test_wrong_type_raises_type_error_naming_it(api: Api, arg: str, bad: object) -> None:
    """A wrong-typed `arg` raises TypeError naming it, the expected type and the value."""
    types = [TensorType(U32, [1], CPU), BufferType(BF16, ["pages", *KV_PARAMS.shape_per_block],
                                                   CPU)]
    with Graph("arg_types", input_types=types) as g:
        v = Vals(g)
        args = {k: v.resolve(x) for k, x in api.args.items()}
        args[arg] = v.resolve(bad)
        with pytest.raises(TypeError, match=rf": {arg} must be .*, got {type(args[arg]).__name__}"):
            api.call(v, args)


def test_message_names_function_argument_expected_and_value() -> None:
    """The message format: `{fn}: {arg} must be {expected}, got {type} {value}`."""
    with pytest.raises(TypeError) as err:
        mg.Int4WeightValues(None, None, None, None, 200.0, 128, 128)  # type: ignore[arg-type]
    assert str(err.value) == "Int4WeightValues: qweight must be a TensorValue, got NoneType None"
    with Graph("msg", input_types=[TensorType(U32, [1], CPU)]) as g:
        t: TensorValue = g.inputs[0].tensor
        with pytest.raises(TypeError) as err:
            mg.Int4WeightValues(t, t, None, None, "200", 128, 128)  # type: ignore[arg-type]
    assert str(err.value) == "Int4WeightValues: n must be an int, got str '200'"

"""Runs a launch-plan op (a CPU custom op that writes NUL-padded ASCII) and returns its text.

The int4 and K-cache ops each register a `*_plan` op computing, on the host, the kernel and tile
their GPU dispatch picks (the dispatch's own Mojo function). This module holds the one way to
call such an op from Python: a tiny CPU graph per (op, parameters), compiled once per process,
or one graph holding the op once per parameter set (`compile_plans`), which costs about as much
to compile as a graph of one: the compile's fixed cost dominates, not each specialization.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

import numpy as np

Parameters = tuple[tuple[str, int | bool | str], ...]
_PlanKey = tuple[str, int, int, Parameters]

_BATCHED: dict[_PlanKey, tuple[Any, int]] = {}
"""(op, n_sizes, plan_bytes, parameters) -> (model of `compile_plans`, its output index)."""


def _compile(op: str, n_sizes: int, plan_bytes: int, parameter_sets: Sequence[Parameters]) -> Any:
    """One CPU graph: int64 sizes [n_sizes] in, one uint8 [plan_bytes] plan per parameter set."""
    from max.driver import CPU
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType, ops

    from .extension import kernels_package

    cpu = DeviceRef.CPU()
    parts = [op] if len(parameter_sets) == 1 else [op, f"x{len(parameter_sets)}"]
    parts += [f"{k}{v if isinstance(v, str) else int(v)}" for k, v in parameter_sets[0]]
    name = "".join(c if c.isalnum() else "_" for c in "_".join(parts))
    with Graph(name, input_types=[TensorType(DType.int64, [n_sizes], cpu)],
               custom_extensions=[kernels_package()]) as graph:
        plans = [
            ops.custom(op, cpu, [graph.inputs[0].tensor],
                       [TensorType(DType.uint8, [plan_bytes], cpu)],
                       parameters=dict(parameters))[0].tensor
            for parameters in parameter_sets
        ]
        graph.output(*plans)
    return InferenceSession(devices=[CPU()]).load(graph)


@cache
def _plan_model(op: str, n_sizes: int, plan_bytes: int, parameters: Parameters) -> Any:
    return _compile(op, n_sizes, plan_bytes, [parameters])


def compile_plans(op: str, n_sizes: int, plan_bytes: int,
                  parameter_sets: Sequence[Mapping[str, int | bool | str]]) -> None:
    """Compiles ONE graph holding the plan op `op` once per compile-time parameter set (int64
    sizes [n_sizes] in, uint8 [plan_bytes] out), so later `plan_text` calls with any of these
    sets need no compile of their own. Sets already compiled this way are left out."""
    keys = list(dict.fromkeys(tuple(sorted(p.items())) for p in parameter_sets))
    keys = [p for p in keys if (op, n_sizes, plan_bytes, p) not in _BATCHED]
    if not keys:
        return
    model = _compile(op, n_sizes, plan_bytes, keys)
    for index, parameters in enumerate(keys):
        _BATCHED[(op, n_sizes, plan_bytes, parameters)] = (model, index)


def plan_text(op: str, sizes: Sequence[int], plan_bytes: int,
              parameters: Mapping[str, int | bool | str]) -> str:
    """The text the plan op `op` writes for int64 `sizes` (its input [len(sizes)]) into a uint8
    [plan_bytes] output, with the op's compile-time `parameters`."""
    from max.driver import Buffer

    key = (op, len(sizes), plan_bytes, tuple(sorted(parameters.items())))
    sizes_buffer = Buffer.from_numpy(np.array(sizes, dtype=np.int64))
    raw = None
    if key in _BATCHED:
        model, index = _BATCHED[key]
        try:
            raw = model.execute(sizes_buffer)[index].to_numpy()
        except Exception:  # another set's plan rejected these sizes: run this set alone
            raw = None
    if raw is None:
        raw = _plan_model(*key).execute(sizes_buffer)[0].to_numpy()
    return bytes(raw).split(b"\0", 1)[0].decode("ascii")

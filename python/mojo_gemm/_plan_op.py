"""Runs a launch-plan op (a CPU custom op that writes NUL-padded ASCII) and returns its text.

The int4 and K-cache ops each register a `*_plan` op computing, on the host, the kernel and tile
their GPU dispatch picks (the dispatch's own Mojo function). This module holds the one way to
call such an op from Python: a tiny CPU graph per (op, parameters), compiled once per process.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np


@cache
def _plan_model(op: str, n_sizes: int, plan_bytes: int,
                parameters: tuple[tuple[str, int | bool | str], ...]) -> Any:
    from max.driver import CPU
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType, ops

    from ._extension import kernels_package

    cpu = DeviceRef.CPU()
    name = "_".join([op, *(f"{k}{v if isinstance(v, str) else int(v)}" for k, v in parameters)])
    name = "".join(c if c.isalnum() else "_" for c in name)
    with Graph(name, input_types=[TensorType(DType.int64, [n_sizes], cpu)],
               custom_extensions=[kernels_package()]) as graph:
        plan = ops.custom(
            op, cpu, [graph.inputs[0].tensor],
            [TensorType(DType.uint8, [plan_bytes], cpu)],
            parameters=dict(parameters),
        )[0].tensor
        graph.output(plan)
    return InferenceSession(devices=[CPU()]).load(graph)


def plan_text(op: str, sizes: Sequence[int], plan_bytes: int,
              parameters: dict[str, int | bool | str]) -> str:
    """The text the plan op `op` writes for int64 `sizes` (its input [len(sizes)]) into a uint8
    [plan_bytes] output, with the op's compile-time `parameters`."""
    from max.driver import Buffer

    model = _plan_model(op, len(sizes), plan_bytes, tuple(sorted(parameters.items())))
    raw = model.execute(Buffer.from_numpy(np.array(sizes, dtype=np.int64)))[0].to_numpy()
    return bytes(raw).split(b"\0", 1)[0].decode("ascii")

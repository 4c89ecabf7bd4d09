"""Runs a launch-plan op (a CPU custom op that writes NUL-padded ASCII) and returns its text.

The int4 and K-cache ops each register a `*_plan` op computing, on the host, the kernel and tile
their GPU dispatch picks (the dispatch's own Mojo function). This module holds the one way to
call such an op from Python: a tiny CPU graph per (op, parameters), compiled once per process,
or one graph holding several ops once per parameter set each (`plan_graph`), which costs
about as much to compile as a graph of one: the compile's fixed cost dominates, not each
specialization; the caller compiles it (alone or beside other graphs of one
`max.graph.Module`) and hands the model back (`PlanGraph.adopt`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

Parameters = tuple[tuple[str, int | bool | str], ...]
_PlanKey = tuple[str, int, int, Parameters]


@dataclass(frozen=True)
class PlanBatch:
    """One plan op with the compile-time parameter sets `plan_graph` builds it for.

    idle_sizes: int64 sizes [n_sizes] that every set accepts; the batched graph feeds them to
    this op's input while a plan of another op is asked for.
    """

    op: str
    n_sizes: int
    plan_bytes: int
    parameter_sets: tuple[Mapping[str, int | bool | str], ...]
    idle_sizes: tuple[int, ...]


@dataclass(frozen=True)
class _Batched:
    model: Any
    input_index: int
    output_index: int
    idle_sizes: tuple[tuple[int, ...], ...]
    """Every input's idle sizes, in input order."""


_BATCHED: dict[_PlanKey, _Batched] = {}
"""(op, n_sizes, plan_bytes, parameters) -> where an adopted `plan_graph` put that plan."""


def _build(name: str, inputs: Sequence[tuple[str, int, int, Sequence[Parameters]]],
           module: Any = None) -> Any:
    """One CPU graph (in `module`, a `max.graph.Module`, if given): per entry (op, n_sizes,
    plan_bytes, parameter sets) an int64 sizes [n_sizes] input and one uint8 [plan_bytes]
    output per parameter set, in entry order."""
    from max.dtype import DType
    from max.graph import DeviceRef, Graph, TensorType, ops

    from .extension import kernels_package

    cpu = DeviceRef.CPU()
    types = [TensorType(DType.int64, [n_sizes], cpu) for _, n_sizes, _, _ in inputs]
    with Graph(name, input_types=types, module=module,
               custom_extensions=[kernels_package()]) as graph:
        plans = [
            ops.custom(op, cpu, [graph.inputs[i].tensor],
                       [TensorType(DType.uint8, [plan_bytes], cpu)],
                       parameters=dict(parameters))[0].tensor
            for i, (op, _, plan_bytes, parameter_sets) in enumerate(inputs)
            for parameters in parameter_sets
        ]
        graph.output(*plans)
    return graph


def _load(graph: Any) -> Any:
    from max.driver import CPU
    from max.engine import InferenceSession

    return InferenceSession(devices=[CPU()]).load(graph)


def _graph_name(op: str, parameters: Parameters) -> str:
    parts = [op] + [f"{k}{v if isinstance(v, str) else int(v)}" for k, v in parameters]
    return "".join(c if c.isalnum() else "_" for c in "_".join(parts))


@cache
def _plan_model(op: str, n_sizes: int, plan_bytes: int, parameters: Parameters) -> Any:
    return _load(_build(_graph_name(op, parameters), [(op, n_sizes, plan_bytes, [parameters])]))


@dataclass(frozen=True)
class PlanGraph:
    """ONE CPU graph holding several plan ops once per parameter set (`plan_graph`)."""

    graph: Any
    """The `max.graph.Graph`; compile it, then `adopt` its model."""
    entries: tuple[tuple[PlanBatch, tuple[Parameters, ...]], ...]

    def adopt(self, model: Any) -> None:
        """Takes the graph's compiled model: later `plan_text` calls with any of its (op,
        parameters) run it and need no compile of their own."""
        idle = tuple(b.idle_sizes for b, _ in self.entries)
        output = 0
        for index, (b, keys) in enumerate(self.entries):
            for parameters in keys:
                _BATCHED[(b.op, b.n_sizes, b.plan_bytes, parameters)] = _Batched(
                    model, index, output, idle)
                output += 1


def plan_graph(*batches: PlanBatch, module: Any = None) -> PlanGraph | None:
    """ONE graph (built into `module`, a `max.graph.Module`, if given) holding every batch's
    op once per parameter set not adopted yet; None when there is none."""
    entries = []
    for b in batches:
        keys = list(dict.fromkeys(tuple(sorted(p.items())) for p in b.parameter_sets))
        keys = [p for p in keys if (b.op, b.n_sizes, b.plan_bytes, p) not in _BATCHED]
        if keys:
            entries.append((b, tuple(keys)))
    if not entries:
        return None
    name = _graph_name("_".join(b.op for b, _ in entries), entries[0][1][0])
    graph = _build(f"{name}_x{sum(len(k) for _, k in entries)}",
                   [(b.op, b.n_sizes, b.plan_bytes, keys) for b, keys in entries], module)
    return PlanGraph(graph, tuple(entries))


def plan_text(op: str, sizes: Sequence[int], plan_bytes: int,
              parameters: Mapping[str, int | bool | str]) -> str:
    """The text the plan op `op` writes for int64 `sizes` (its input [len(sizes)]) into a uint8
    [plan_bytes] output, with the op's compile-time `parameters`."""
    from max.driver import Buffer

    key = (op, len(sizes), plan_bytes, tuple(sorted(parameters.items())))
    sizes_buffer = Buffer.from_numpy(np.array(sizes, dtype=np.int64))
    raw = None
    if key in _BATCHED:
        b = _BATCHED[key]
        feeds = [Buffer.from_numpy(np.array(s, dtype=np.int64)) for s in b.idle_sizes]
        feeds[b.input_index] = sizes_buffer
        try:
            raw = b.model.execute(*feeds)[b.output_index].to_numpy()
        except Exception:  # another set's plan rejected these sizes: run this set alone
            raw = None
    if raw is None:
        raw = _plan_model(*key).execute(sizes_buffer)[0].to_numpy()
    return bytes(raw).split(b"\0", 1)[0].decode("ascii")

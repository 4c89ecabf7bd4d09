"""Every CPU test graph of the suite in one compile.

A MAX compile has a large fixed cost (about 8-12 CPU-s for any graph, more with custom ops)
that a multi-graph `max.graph.Module` pays once for all its graphs. Test modules register a
builder per CPU graph at import time (`register`); the first `model(name)` call builds every
graph registered so far into one Module and compiles it with one `load_all`; later calls return
the compiled models. Pytest imports every test module before the first test runs, so a run of
the whole suite compiles its CPU graphs once; a run of one file compiles only that file's.

A builder adds exactly one graph, named by its registration name, to the Module it is given and
returns (weights, extra): the graph's weights keyed by their names (unique across the suite:
`prefixed_state` renames a layer's weights under the graph's name) and whatever the test needs
besides the model (references, layers).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from max.driver import CPU
from max.engine import InferenceSession, Model
from max.graph import Module as GraphModule
from max.nn import Module

from mojo_gemm.core.extension import kernels_package

Builder = Callable[[GraphModule], tuple[Mapping[str, Any], Any]]

_BUILDERS: dict[str, Builder] = {}
_COMPILED: dict[str, tuple[Model, Any]] = {}


def register(name: str) -> Callable[[Builder], Builder]:
    """Decorator: `builder(module)` adds the CPU graph `name` to `module`."""
    def add(builder: Builder) -> Builder:
        if name in _BUILDERS:
            raise ValueError(f"cpu_graphs: graph {name!r} registered twice")
        _BUILDERS[name] = builder
        return builder
    return add


def model(name: str) -> tuple[Model, Any]:
    """The compiled CPU graph `name` and its builder's extra value."""
    if name not in _COMPILED:
        _compile_pending()
    return _COMPILED[name]


def _compile_pending() -> None:
    """Builds every registered graph not compiled yet into one Module and compiles it."""
    module = GraphModule()
    weights: dict[str, Any] = {}
    extras: dict[str, Any] = {}
    for name, builder in _BUILDERS.items():
        if name in _COMPILED:
            continue
        graph_weights, extras[name] = builder(module)
        clash = weights.keys() & graph_weights.keys()
        if clash:
            raise ValueError(f"cpu_graphs: graph {name!r} reuses weight names {sorted(clash)[:3]}")
        weights.update(graph_weights)
    models = InferenceSession(devices=[CPU()]).load_all(
        module, custom_extensions=[kernels_package()], weights_registry=weights)
    for name, extra in extras.items():
        _COMPILED[name] = (models[name], extra)


def prefixed_state(layers: Module, prefix: str) -> dict[str, Any]:
    """`layers.state_dict()` with every weight renamed `prefix.<its name>` (call before tracing:
    the graph takes the names the weights have then), so graphs of one Module cannot clash."""
    state = layers.state_dict()
    for name, weight in layers.raw_state_dict().items():
        weight.name = f"{prefix}.{name}"
    return {f"{prefix}.{name}": value for name, value in state.items()}

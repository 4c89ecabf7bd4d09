"""Every CPU test graph of a pytest session in ONE compile.

MAX 26.7 pays a large fixed cost per compile (its kernel library and this package's are loaded,
and the kernels the graphs share are specialized again, for each compile), so the suite's CPU
graphs compiled one by one cost several times what one compile of all of them costs. A test
module registers its CPU graph here when it is imported (collection, before any test runs),
and the first `model(key)` call builds every registered graph into one `max.graph.Module`,
compiles it once and initializes every graph. GPU graphs are compiled by their tests as before
(on a GPU machine the per-graph cost is small next to the runs).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from max.driver import CPU
from max.engine import CompiledModel, InferenceSession, Model
from max.graph import Graph, Module
from max.nn import Module as Layer

from mojo_gemm import kernels_package

Built = tuple[Graph, Mapping[str, Any]]
"""A registered builder's result: its graph (built into the module it was given) and the
graph's weights by name (names unique across the pool: prefix them, e.g. with the key)."""

_BUILDERS: dict[str, Callable[[Module], Built]] = {}
_FAILED: list[Exception] = []
"""The pooled compile's error, once it failed: later calls raise at once instead of compiling
again."""


def register(key: str, build: Callable[[Module], Built]) -> None:
    """Queues a CPU graph: `build(module)` builds it with `Graph(..., module=module)` and
    returns it with its weights. Registering a key again replaces its builder (a module that
    is imported twice)."""
    if _pool.cache_info().currsize:
        raise RuntimeError(f"graph_pool: {key!r} registered after the pool was compiled")
    _BUILDERS[key] = build


class _Holder(Layer):
    """A parent whose attribute `key` is the layer, so its weights are named `key.*`."""

    def __call__(self) -> None:
        raise TypeError("graph_pool: a weight-naming holder is not called")


def prefixed_weights(key: str, layer: Layer) -> dict[str, Any]:
    """Names `layer`'s weights `<key>.<attribute path>` (call it before the graph is built: a
    traced weight keeps the name it has then) and returns its state dict under those names."""
    values = layer.state_dict()  # loaded values live on the module they were loaded into
    holder = _Holder()
    setattr(holder, key, layer)
    holder.state_dict()  # renames the weights
    return {f"{key}.{name}": value for name, value in values.items()}


def register_traced(key: str, layer: Callable[[], Layer], input_types: Sequence[Any]) -> None:
    """Queues `layer()` (weights loaded) traced on `input_types` as the graph `key`, its weights
    prefixed with `key`."""
    def build(module: Module) -> Built:
        traced = layer()
        weights = prefixed_weights(key, traced)
        return traced.trace(*input_types, name=key, module=module), weights

    register(key, build)


@dataclass
class _Pool:
    session: InferenceSession
    compiled: CompiledModel
    names: dict[str, str]
    """Registered key -> its graph's name."""
    weights: dict[str, Any]
    """Every graph's weights as its builder returned them."""
    models: dict[str, Model]
    """Registered key -> its graph initialized with `weights`."""


@cache
def _pool() -> _Pool:
    module, names, weights = Module(), {}, {}
    # a builder may import a test module that registers another graph (a lazy import of
    # shared helpers): build until every registered key has its graph
    while pending := [key for key in _BUILDERS if key not in names]:
        for key in pending:
            graph, registry = _BUILDERS[key](module)
            clash = sorted(weights.keys() & registry.keys())
            if clash:
                raise ValueError(f"graph_pool: {key!r} reuses weight names {clash[:5]} of an "
                                 "earlier graph; prefix its weights")
            weights.update(registry)
            names[key] = graph.name
    session = InferenceSession(devices=[CPU()])
    compiled = session.compile(module, custom_extensions=[kernels_package()])
    models = session.init_all(compiled, weights_registry=weights)
    return _Pool(session, compiled, names, weights,
                 {key: models[name] for key, name in names.items()})


def _compiled_pool() -> _Pool:
    if _FAILED:
        raise RuntimeError("graph_pool: the pooled CPU compile failed (see the first test that "
                           "asked for a graph)") from _FAILED[0]
    try:
        return _pool()
    except Exception as err:
        _FAILED.append(err)
        raise


def model(key: str, layer: Layer | None = None) -> Model:
    """The initialized CPU model of the graph registered as `key` (the first call compiles
    every registered graph). `layer`: a module like the one the builder traced, whose loaded
    weights replace the builder's in a fresh initialization (cheap: the compile is reused)."""
    if key not in _BUILDERS:
        raise KeyError(f"graph_pool: no graph registered as {key!r}")
    pool = _compiled_pool()
    if layer is None:
        return pool.models[key]
    weights = prefixed_weights(key, layer)
    unknown = sorted(weights.keys() - pool.weights.keys())
    if unknown:
        raise KeyError(f"graph_pool: {key!r} has no weights named {unknown[:5]}")
    fresh = pool.session.init_all(pool.compiled, weights_registry={**pool.weights, **weights})
    return fresh[pool.names[key]]

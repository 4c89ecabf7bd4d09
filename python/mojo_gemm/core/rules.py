"""Rule and Contract, and the small check builders every op's contract is made of.

Each op has a `Contract`: a list of `Rule`s. A rule has the sentence that documents it and a
check that, given the op's arguments, returns None or the (expected, actual) pair that broke
it. `Contract.validate` raises the rule's error type (`TypeError` for dtypes, `ValueError` for
the rest) with a message naming the op, the argument, the rule, the expected and the actual
value; `Contract.markdown` renders the same sentences for the README, so the documentation
and the errors cannot drift apart (tests/test_contracts.py checks the README).

Checks run while the graph is built, on static shapes: a symbolic dimension is accepted where
the rule allows it (M, leading dims) and rejected where the kernel needs a number (K, N).

Before any rule, every public function and layer checks the Python type of each argument with
`check_types` (a `Contract` with `types` does it first in `validate`): `TypeError(f"{fn}: {arg}
must be {expected}, got {type} {value}")`, so a float where an int belongs, a TensorValue where
a buffer belongs or a tuple where the KV collection belongs never reaches MAX or a rule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from max.dtype import DType
from max.graph import BufferValue, DeviceRef, Dim, ShardingStrategy, StaticDim, TensorValue
from max.nn.kv_cache import KVCacheParams
from max.nn.kv_cache.input_types import KVCacheInputsPerDevice

Args = Mapping[str, Any]
Violation = tuple[object, object] | None
"""None when a rule holds, else (expected, actual)."""


# ---------------------------------------------------------------- Python types of arguments
@dataclass(frozen=True)
class Expect:
    """What Python type an argument must have: `label` for messages, `test` decides."""

    label: str
    test: Callable[[object], bool]

    def __or__(self, other: Expect) -> Expect:
        return Expect(f"{self.label} or {other.label}", lambda v: self.test(v) or other.test(v))


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def instance_of(label: str, *types: type) -> Expect:
    """An argument that must be an instance of one of `types`."""
    return Expect(label, lambda v: isinstance(v, types))


INT = Expect("an int", _is_int)
INT_SEQ = Expect(
    "a tuple of ints",
    lambda v: isinstance(v, (tuple, list)) and all(map(_is_int, v)),
)
"""A tuple or list of ints (its length is a value rule of the op)."""
BOOL = instance_of("a bool", bool, np.bool_)
STR = instance_of("a str", str)
NONE = Expect("None", lambda v: v is None)
TENSOR = instance_of("a TensorValue", TensorValue)
BUFFER = instance_of("a BufferValue", BufferValue)
DTYPE = instance_of("a max.dtype.DType", DType)
DEVICE = instance_of("a DeviceRef", DeviceRef)
STRATEGY = instance_of("a max.graph.ShardingStrategy", ShardingStrategy)
KV_PARAMS = instance_of("a max.nn.kv_cache.KVCacheParams", KVCacheParams)
KV_COLLECTION = instance_of("a max.nn.kv_cache.PagedCacheValues", KVCacheInputsPerDevice)
"""(PagedCacheValues is a subscripted generic: isinstance needs its origin class.)"""
ARRAY = Expect(
    "a numpy array (or list / array-like)",
    lambda v: isinstance(v, (np.ndarray, list, tuple)) or hasattr(v, "__array__"),
)
NDARRAY = instance_of("a numpy.ndarray", np.ndarray)


def optional(expect: Expect) -> Expect:
    """`expect` or None."""
    return expect | NONE


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_types(fn: str, args: Args, types: Mapping[str, Expect]) -> None:
    """Raises TypeError naming `fn`, the first argument whose value fails its `Expect`, the
    expected type and the actual type and value; `args` maps argument names to values."""
    for name, expect in types.items():
        value = args[name]
        if not expect.test(value):
            raise TypeError(
                f"{fn}: {name} must be {expect.label}, got {type(value).__name__} "
                f"{_shown(value)}"
            )


@dataclass(frozen=True)
class Rule:
    """One documented requirement on one argument."""

    arg: str
    text: str
    check: Callable[[Args], Violation]
    error: type[Exception] = ValueError


@dataclass(frozen=True)
class Contract:
    """The rules of one public entry point, checked in order."""

    op: str
    summary: str
    rules: tuple[Rule, ...]
    types: Mapping[str, Expect] = field(default_factory=dict)
    """The Python type of each argument, checked (`check_types`) before any rule."""

    def validate(self, args: Args) -> None:
        """Raises TypeError for an argument of the wrong Python type (`types`), else the first
        broken rule's error; `args` maps argument names to values."""
        check_types(self.op, args, self.types)
        for rule in self.rules:
            broken = rule.check(args)
            if broken is not None:
                expected, actual = broken
                raise rule.error(
                    f"{self.op}: argument '{rule.arg}': {rule.text} "
                    f"(expected {expected}, got {actual})"
                )

    def markdown(self) -> str:
        """The rules as a markdown list (the README's contract section)."""
        lines = [f"**`{self.op}`**: {self.summary}", ""]
        if self.types:
            typed = ", ".join(f"`{n}` {e.label}" for n, e in self.types.items())
            lines += [f"- Python types (TypeError naming the argument): {typed}"]
        lines += [f"- `{rule.arg}`: {rule.text}" for rule in self.rules]
        return "\n".join(lines)


# ---------------------------------------------------------------- check builders
def static(dim: Dim) -> int | None:
    return int(dim) if isinstance(dim, StaticDim) else None


def shape_of(value: TensorValue) -> list[object]:
    return [static(d) if static(d) is not None else str(d) for d in value.shape]


def dtype_in(name: str, allowed: tuple[DType, ...]) -> Callable[[Args], Violation]:
    def check(a: Args) -> Violation:
        v = a[name]
        if v is None or v.dtype in allowed:
            return None
        return " or ".join(map(str, allowed)), v.dtype

    return check


def dtype_like(name: str, ref: str) -> Callable[[Args], Violation]:
    def check(a: Args) -> Violation:
        v = a[name]
        if v is None or v.dtype == a[ref].dtype:
            return None
        return f"{a[ref].dtype} (the dtype of {ref})", v.dtype

    return check


def shape_is(name: str, expected: Callable[[Args], list[int]]) -> Callable[[Args], Violation]:
    def check(a: Args) -> Violation:
        v = a[name]
        if v is None:
            return None
        want = expected(a)
        got = shape_of(v)
        return None if got == want else (want, got)

    return check


def same_device(name: str, ref: str) -> Callable[[Args], Violation]:
    def check(a: Args) -> Violation:
        v = a[name]
        if v is None or v.device == a[ref].device:
            return None
        return f"{a[ref].device} (the device of {ref})", v.device

    return check


def layer_attr(name: str, attr: str) -> Callable[[Args], Violation]:
    """A layer call's argument `name` has the layer's `attr` ("dtype" or "device"), passed to
    the check under the key `attr`."""

    def check(a: Args) -> Violation:
        got = getattr(a[name], attr)
        return None if got == a[attr] else (f"{a[attr]} (the layer's {attr})", got)

    return check


def rank_is(name: str, rank: int) -> Callable[[Args], Violation]:
    def check(a: Args) -> Violation:
        v = a.get(name)
        if v is None or v.rank == rank:
            return None
        return f"rank {rank}", f"rank {v.rank}"

    return check


def positive_int(name: str) -> Callable[[Args], Violation]:
    def check(a: Args) -> Violation:
        return None if a[name] > 0 else ("a positive int", a[name])

    return check

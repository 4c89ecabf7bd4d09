"""Rule and Contract, and the small check builders every op's contract is made of.

Each op has a `Contract`: a list of `Rule`s. A rule has the sentence that documents it and a
check that, given the op's arguments, returns None or the (expected, actual) pair that broke
it. `Contract.validate` raises the rule's error type (`TypeError` for dtypes, `ValueError` for
the rest) with a message naming the op, the argument, the rule, the expected and the actual
value; `Contract.markdown` renders the same sentences for the README, so the documentation
and the errors cannot drift apart (tests/test_contracts.py checks the README).

Checks run while the graph is built, on static shapes: a symbolic dimension is accepted where
the rule allows it (M, leading dims) and rejected where the kernel needs a number (K, N).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from max.dtype import DType
from max.graph import Dim, StaticDim, TensorValue

Args = Mapping[str, Any]
Violation = tuple[object, object] | None
"""None when a rule holds, else (expected, actual)."""


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

    def validate(self, args: Args) -> None:
        """Raises the first broken rule's error; `args` maps argument names to values."""
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

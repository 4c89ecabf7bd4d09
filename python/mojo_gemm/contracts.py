"""The shape, dtype and layout rules of every op, in one place.

Each op has a `Contract` (core/rules.py): a list of `Rule`s. A rule has the sentence that
documents it and a check that, given the op's arguments, returns None or the (expected, actual)
pair that broke it. `Contract.validate` raises the rule's error type (`TypeError` for dtypes,
`ValueError` for the rest) with a message naming the op, the argument, the rule, the expected
and the actual value; `Contract.markdown` renders the same sentences for the README, so the
documentation and the errors cannot drift apart (tests/test_contracts.py checks the README).

Checks run while the graph is built, on static shapes: a symbolic dimension is accepted where
the rule allows it (M, leading dims) and rejected where the kernel needs a number (K, N).
Each op's sub-package holds its contract (`<op>/contract.py`); this module lists them all.
"""

from .core.rules import Contract, Rule
from .fp8.contract import (
    FP8_BLOCKWISE_MATMUL,
    FP8_LINEAR,
    FP8_LINEAR_CALL,
    QUANTIZE_FP8_ROWS,
)
from .grouped.contract import GROUPED_DTYPES, GROUPED_MATMUL
from .int4.contract import (
    INT4_ACTIVATION_DTYPES,
    INT4_GROUP_SIZES,
    INT4_MATMUL,
    int4_num_groups,
    int4_padded,
)
from .k_cache.contract import (
    K_CACHE_DTYPES,
    K_MATMUL_RAGGED_PAGED_SCALE,
    KV_MATMUL_RAGGED_PAGED_SCALE,
    PAGED_KV_PROJECTION,
    PAGED_KV_PROJECTION_CALL,
    V_MATMUL_RAGGED_PAGED_SCALE,
)
from .norm.contract import ADD_RMS_NORM
from .router.contract import MOE_COMBINE, MOE_ROUTE

ALL_CONTRACTS: tuple[Contract, ...] = (
    INT4_MATMUL,
    GROUPED_MATMUL,
    K_MATMUL_RAGGED_PAGED_SCALE,
    V_MATMUL_RAGGED_PAGED_SCALE,
    KV_MATMUL_RAGGED_PAGED_SCALE,
    QUANTIZE_FP8_ROWS,
    FP8_BLOCKWISE_MATMUL,
    FP8_LINEAR,
    FP8_LINEAR_CALL,
    PAGED_KV_PROJECTION,
    PAGED_KV_PROJECTION_CALL,
    MOE_ROUTE,
    MOE_COMBINE,
    ADD_RMS_NORM,
)
"""Every public op's contract, in README order."""

__all__ = [
    "ADD_RMS_NORM",
    "ALL_CONTRACTS",
    "FP8_BLOCKWISE_MATMUL",
    "FP8_LINEAR",
    "FP8_LINEAR_CALL",
    "GROUPED_DTYPES",
    "GROUPED_MATMUL",
    "INT4_ACTIVATION_DTYPES",
    "INT4_GROUP_SIZES",
    "INT4_MATMUL",
    "KV_MATMUL_RAGGED_PAGED_SCALE",
    "K_CACHE_DTYPES",
    "K_MATMUL_RAGGED_PAGED_SCALE",
    "MOE_COMBINE",
    "MOE_ROUTE",
    "PAGED_KV_PROJECTION",
    "PAGED_KV_PROJECTION_CALL",
    "QUANTIZE_FP8_ROWS",
    "V_MATMUL_RAGGED_PAGED_SCALE",
    "Contract",
    "Rule",
    "int4_num_groups",
    "int4_padded",
]

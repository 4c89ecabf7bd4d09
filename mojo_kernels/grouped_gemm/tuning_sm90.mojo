"""Measured launch choices of `grouped_matmul_sm100_persistent` on the H200 (sm_90a; sm_100a
uses the same token tiles): the token tile per regime (`use_decode_tiles` in dispatch.mojo)."""


comptime DECODE_BN = 32
"""Token tile of the fast GPU kernels when groups are small (decode)."""
comptime PREFILL_BN = 256
"""Token tile when groups are large (prefill): measured on the H200 (SM90, bf16, 8 groups x
1024 tokens, N = 4096, K = 7168): BN = 64 372, 128 521, 256 754 TFLOP/s."""

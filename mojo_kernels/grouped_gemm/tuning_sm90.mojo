"""Measured launch choices of `grouped_matmul_sm100_persistent` on the H200 (sm_90a; sm_100a
uses DECODE_BN / PREFILL_BN): the token tile per regime of average rows per group
(`sm90_token_regime` and `use_decode_tiles` in dispatch.mojo) and the wgmma widths per tile."""


comptime DECODE_BN = 32
"""Token tile of the fast GPU kernels when groups are small (decode)."""
comptime DECODE_WIDTHS = 1
"""Decode tiles stream weights (memory-bound): one wgmma width."""
comptime DECODE_KSUB = 2
"""BK-column blocks per ring stage of the decode tiles: each weight row is read 256 bytes at a
time (two TMA boxes back to back) instead of one 128-byte swizzle row."""
comptime MID_BN = 128
"""Token tile on SM90 for groups of a few dozen rows (dispatch.sm90_token_regime): one tile
covers such a group, so its weights are read once (BN = 32 tiles read them per 32 rows), with a
deeper ring than BN = 256 (7 stages against 4)."""
comptime PREFILL_BN = 256
"""Token tile when groups are large (prefill): measured on the H200 (SM90, bf16, 8 groups x
1024 tokens, N = 4096, K = 7168): BN = 64 372, 128 521, 256 754 TFLOP/s."""
comptime PREFILL_STAGED = True
"""PREFILL_BN tiles store through shared memory (kernels/sm90.mojo, `STAGED`): 8x fewer store
instructions, at the cost of 18 KB of round buffers (the ring keeps its 4 stages); 1-18 %
faster on every prefill shape measured (docs/design/grouped_matmul_sm100_persistent.md)."""
comptime MID_STAGED = False
"""MID_BN tiles keep fragment-order stores: the round buffers cost them a ring stage (7 -> 6),
and at 64 rows per group the staged epilogue was 1.4 % slower on OLMoE gate_up (K = 2048) and
2-3 % faster on its down projection (K = 1024)."""
comptime TILE_WIDTHS = 4
"""MID_BN / PREFILL_BN tiles run wgmma N = BN / 4, BN / 2, 3 BN / 4 or BN, the narrowest that
covers the tile's rows: a group's last token tile usually holds a few rows."""
comptime GROUP_SPREAD = 2.0
"""Standard deviations above the mean a typical group reaches: under uniform top-k routing a
group's rows are about Poisson, so its standard deviation is sqrt(mean rows)."""

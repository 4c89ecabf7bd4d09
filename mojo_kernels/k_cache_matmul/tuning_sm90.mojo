"""Measured launch choices of `k_matmul_ragged_paged_scale` on the H200 (sm_90a): the mma.sync
configs `k_cache_gpu_plan` (dispatch.mojo) picks by token count
and N (T tokens, N weight rows; LARGE_N and WGMMA_MIN_TOKENS are dispatch.mojo's)."""

from .kernels.mma import MmaConfig


comptime MMA_DECODE = MmaConfig(mt=1, nb=1, u=4, late_rows=False, rotate=False)
"""T <= 16."""
comptime MMA_DECODE_LARGE_N = MmaConfig(mt=1, nb=2, u=2, late_rows=True, rotate=False)
"""T <= 16, N >= LARGE_N."""
comptime MMA_MID = MmaConfig(mt=2, nb=2, u=2, late_rows=False, rotate=True)
"""16 < T <= WGMMA_MIN_TOKENS. Rotated K walks: ~5 % faster at N = 1024, K = 8192, T = 64,
~8 % slower at K = 4096 (kept for the larger K, where the op is furthest from its target)."""
comptime MMA_MID_LARGE_N = MmaConfig(mt=4, nb=4, u=1, late_rows=False, rotate=False)
"""16 < T <= WGMMA_MIN_TOKENS, N >= LARGE_N."""
comptime MMA_PREFILL = MmaConfig(mt=2, nb=4, u=1, late_rows=False, rotate=False)
"""T > WGMMA_MIN_TOKENS where the wgmma kernel does not apply (any N)."""

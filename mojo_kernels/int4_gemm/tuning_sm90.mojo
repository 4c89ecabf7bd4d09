"""Measured launch choices of `multistage_gemm_q` on the H200 (sm_90a), as one table: the named
tile configs of both kernels, the wgmma variant codes, and the (M range, N, K)-keyed pins
(`tuned_choice` for the mma.sync kernels, `tuned_wgmma` for the wgmma kernel) that dispatch.mojo
consults before its rules. Shapes: M tokens, N output columns, kp = K inputs.
"""

from .config import Int4GemmConfig, Int4WgmmaConfig, PIPE_WARP


# Tile table, by tokens per call and output bands (64 columns each); every warp owns one band.
# Chosen from H200 sweeps over 8 Llama-3 layers (docs/design/multistage_gemm_q.md).
comptime CFG_M8 = Int4GemmConfig(bm=8, bn=128, bk=128, wm=8, wn=64, stages=4, warp_k=2, split_k=1, pipeline=PIPE_WARP)
"""M <= 8 (decode): barrier-free per-warp streams, 2 bands x 2 K parts = 4 warps, 3 chunks of
8 packed tiles in flight per warp; ~106 KB smem, 2 CTAs per SM."""
comptime CFG_M8_NARROW = Int4GemmConfig(bm=8, bn=64, bk=64, wm=8, wn=64, stages=6, warp_k=4, split_k=1, pipeline=PIPE_WARP)
"""M <= 8 and at most 64 bands (N <= 4096): 1 band x 4 K parts, more CTAs per band."""
comptime CFG_M16 = Int4GemmConfig(bm=16, bn=128, bk=128, wm=16, wn=64, stages=4, warp_k=2, split_k=1, pipeline=PIPE_WARP)
"""9 <= M <= 16: as CFG_M8 with two n8 token tiles per warp."""
comptime CFG_M16_NARROW = Int4GemmConfig(bm=16, bn=64, bk=64, wm=16, wn=64, stages=5, warp_k=4, split_k=1, pipeline=PIPE_WARP)
"""9 <= M <= 16 and at most 64 bands."""
comptime CFG_M32 = Int4GemmConfig(bm=32, bn=256, bk=128, wm=32, wn=64, stages=4, warp_k=2, split_k=1)
"""17 <= M <= 32: CTA-wide ring, 4 bands x 2 warp-k partitions."""
comptime CFG_M64 = Int4GemmConfig(bm=64, bn=256, bk=64, wm=64, wn=64, stages=4, warp_k=2, split_k=1)
"""33 <= M <= 64: 4 bands x 2 partitions; 128 fp32 accumulators per thread (1 CTA per SM)."""
comptime CFG_LARGE = Int4GemmConfig(bm=128, bn=256, bk=64, wm=64, wn=64, stages=4, warp_k=1, split_k=1)
"""M > 64: 128 x 256 CTA tile, 2 x 4 warps of 64 tokens x 64 columns."""
comptime CFG_M16_K8 = Int4GemmConfig(bm=16, bn=64, bk=64, wm=16, wn=64, stages=4, warp_k=8, split_k=1, pipeline=PIPE_WARP)
"""9 <= M <= 16 (tuned_choice variant 2): CFG_M16_NARROW with 8 K parts: twice the warps
per CTA, half the chunks per warp. Pinned on 8B.qkv, 8B.o, 8B.down, 70B.o."""

# wgmma kernel (kernels/wgmma.mojo, sm_90a): weights = register-A operand, tokens = wgmma N.
comptime WG_CFG_64 = Int4WgmmaConfig(nt=64, fpw=2, nwg=2, stages=8, kg=4)
"""64 tokens x 256 columns per CTA (2 consumer warpgroups x 2 bands), 64 accumulators/thread."""
comptime WG_CFG_64W = Int4WgmmaConfig(nt=64, fpw=4, nwg=2, stages=7, kg=2)
"""64 tokens x 512 columns per CTA (2 consumer warpgroups x 4 bands), 128 accumulators/thread."""
comptime WG_CFG_128 = Int4WgmmaConfig(nt=128, fpw=2, nwg=2, stages=8, kg=4)
"""128 tokens x 256 columns per CTA, 128 accumulators/thread (large M)."""
comptime WG_CFG_64N = Int4WgmmaConfig(nt=64, fpw=2, nwg=1, stages=8, kg=4, ctas=2)
"""33 <= M <= 64 (pinned through `tuned_wgmma`): 64 tokens x 128 columns, one consumer
warpgroup, built for 2 CTAs per SM (128 registers at launch, setmaxnreg 24 / 232; ~99 KB
smem): twice the CTAs of WG_CFG_64 per tile count, so the small layers (64 CTAs on 132 SMs with
WG_CFG_64 split 4) can fill every SM. (WG_CFG_64 itself at 2 CTAs per SM needs 104-register consumers: ptxas
spills and serializes the wgmma, C7512.)"""
comptime WG_CFG_128K = Int4WgmmaConfig(nt=128, fpw=2, nwg=1, wk=2, stages=11, kg=4)
"""65 <= M <= 128 on 70B.o (via `tuned_wgmma`): 128 tokens x 128 columns, two warp-k consumer
warpgroups (one overlaps its dequant with the other's wgmma), one CTA per SM, 11 stages (~223 KB:
as many as the smem budget holds)."""
comptime WGMMA_MIN_M = 33
"""From this many tokens on, `int4_gemm_gpu` uses the wgmma kernel."""
comptime WG_VAR_64 = 0
comptime WG_VAR_64W = 1
comptime WG_VAR_128 = 2
comptime WG_VAR_64N = 3
"""WG_CFG_64N: chosen only through `tuned_wgmma`."""
comptime WG_VAR_128K = 4
"""WG_CFG_128K: chosen only through `tuned_wgmma`."""


def tuned_wgmma(m: Int, n: Int, kp: Int) -> Tuple[Int, Int]:
    """(wgmma variant, split_k) pinned per (M range, N, K) ahead of `wgmma_rule`, or (-1, 0).
    Each pin is the fastest (config, split) of an H200 sweep of the benchmark layers
    (docs/design/multistage_gemm_q.md). 33 <= M <= 64 (the wgmma part of `tuned_choice`'s
    17..64 range):
    - WG_CFG_64N (64 x 128, 2 CTAs per SM) on the small layers (8B.qkv split 4, 8B.o and
      8B.down split 6): twice the CTAs, so every SM gets work; clusters of 6 still pack into
      one wave at 2 CTAs per SM.
    - WG_CFG_64W (64 x 512) on the large ones (8B.gate_up split 2, 70B.qkv split 4, 70B.o and
      70B.down split 6); 70B.gate_up takes it through the rule.
    65 <= M <= 128: WG_CFG_128K split 2 on 70B.o; the other layers take the rule."""
    if m > 64 and m <= 128 and n == 8192 and kp == 8192:
        return (WG_VAR_128K, 2)
    if m >= WGMMA_MIN_M and m <= 64:
        if kp == 4096:
            if n == 6144:
                return (WG_VAR_64N, 4)
            if n == 4096:
                return (WG_VAR_64N, 6)
            if n == 28672:
                return (WG_VAR_64W, 2)
        elif kp == 14336 and n == 4096:
            return (WG_VAR_64N, 6)
        elif kp == 8192:
            if n == 10240:
                return (WG_VAR_64W, 4)
            if n == 8192:
                return (WG_VAR_64W, 6)
        elif kp == 28672 and n == 8192:
            return (WG_VAR_64W, 6)
    return (-1, 0)


def tuned_choice(m: Int, n: Int, kp: Int) -> Tuple[Int, Int]:
    """(variant, split_k) measured best on the H200 for the Llama-3 layer shapes of
    docs/design/multistage_gemm_q.md (MAX's own qint4 dispatch is keyed on (K, N) the same way);
    (-1, 0) elsewhere: then the band-count rule and `choose_split_k` decide.
    variant: M <= 16: 0 = CFG_M8 / CFG_M16, 1 = the *_NARROW config, 2 = CFG_M16_K8 (9..16
    only); 17..64: 0 = CFG_M64, 1 = CFG_M32 (two 32-token M-blocks; for 33..64 only
    `int4_gemm_gpu_mma` reads these rows: the dispatch takes `tuned_wgmma` there).
    9..16: CFG_M16_K8 (variant 2) on 8B.qkv, 8B.o, 8B.down and 70B.o, where more warps per
    band keep more bytes in flight than the 4-part config."""
    if m <= 8:
        if kp == 4096:
            if n == 6144:
                return (0, 4)
            if n == 4096:
                return (1, 2)
            if n == 28672:
                return (0, 1)
        elif kp == 14336 and n == 4096:
            return (1, 2)
        elif kp == 8192:
            if n == 10240:
                return (0, 4)
            if n == 8192:
                return (0, 2)
            if n == 57344:
                return (0, 2)
        elif kp == 28672 and n == 8192:
            return (1, 2)
    elif m <= 16:
        if kp == 4096:
            if n == 6144:
                return (2, 1)
            if n == 4096:
                return (2, 2)
            if n == 28672:
                return (0, 1)
        elif kp == 14336 and n == 4096:
            return (2, 2)
        elif kp == 8192:
            if n == 10240:
                return (0, 1)
            if n == 8192:
                return (2, 1)
            if n == 57344:
                return (1, 1)
        elif kp == 28672 and n == 8192:
            return (0, 2)
    elif m > 32 and m <= 64:
        if (kp == 8192 and n == 8192) or (kp == 28672 and n == 8192):
            return (1, 2)
    return (-1, 0)

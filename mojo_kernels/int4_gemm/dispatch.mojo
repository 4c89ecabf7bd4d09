"""Host side of the W4A16 tensor-core path: picks a kernel and tile config by M (and N, K),
resolves it against the shared-memory budget, chooses the cluster split-K, launches it:
the register-A wgmma kernel (kernels/wgmma.mojo) from WGMMA_MIN_M tokens on (`wgmma_variant`),
below that the mma.sync kernels (kernels/mma.mojo, `int4_gemm_gpu_mma`). The measured configs and
the sweep-generated exceptions to the rules (keyed by M range, bands and K steps) are
tuning_sm90.mojo's.

Entry point: `int4_gemm_gpu` (shapes and dtypes in its docstring). `int4_gemm_gpu_config`
describes the launch it would make, for benchmark records.
"""

from max.gpu.host import DeviceContext, FuncAttribute, Dim
from std.math import ceildiv

from ..common.target import SM90_SMS

from .config import (
    Int4GemmConfig,
    Int4WgmmaConfig,
    INT4_MAX_SPLIT,
    INT4_SMEM_BUDGET,
    smem_usage,
    try_resolve_config,
    try_resolve_wgmma_config,
    wgmma_smem_usage,
    wgmma_smem_budget,
    cluster_wave_cap,
    PIPE_WARP,
)
from ..common.pdl import pdl_attributes
from .kernels.mma import int4_gemm_mma_kernel, int4_gemv_kernel
from .kernels.wgmma import (
    launch_int4_gemm_wgmma, launch_int4_gemm_wgmma_gsplit, launch_int4_gemm_wgmma_streamk, streamk_ctas,
    streamk_units,
)
from .tuning_sm90 import (
    CFG_LARGE,
    CFG_M8,
    CFG_M8_NARROW,
    CFG_M16,
    CFG_M16_K8,
    CFG_M8_K8,
    CFG_M16_NARROW,
    CFG_M32,
    CFG_M64,
    WG_CFG_64,
    WG_CFG_64N,
    WG_CFG_64W,
    WG_CFG_128,
    WG_CFG_128K,
    WG_CFG_256,
    WG_VAR_64,
    WG_VAR_64N,
    WG_VAR_64W,
    WG_VAR_128,
    WG_VAR_128K,
    WG_VAR_256,
    WG_VAR_64_SK,
    WG_VAR_128_SK,
    WG_VAR_256_SK,
    WG_VAR_64_GS,
    WG_VAR_128_GS,
    WGMMA_MIN_M,
    tuned_choice,
    tuned_wgmma,
)

comptime K8_MIN_K_PER_WARP = 512
"""The 8-K-part configs split K over a cluster only while every warp keeps at least this much
K: below it, ring fill and reductions cost more than the extra CTAs stream."""


def small_m_rule(n: Int, kp: Int) -> Int:
    """The mma.sync variant (`tuned_choice`'s codes) for M <= 16 without a measured exception,
    by how many waves the layer's 64-column bands make of one-band CTAs: 2 (CFG_M8_K8 /
    CFG_M16_K8, one band x 8 K parts per CTA, one CTA per SM) up to two waves, where each of
    the 8 warps gets at least one 128-element unit of K; 0 (CFG_M8 / CFG_M16, two bands per
    CTA, two CTAs per SM) for wider layers. The *_NARROW configs are measured candidates only:
    with few bands the 8-K-part config at a cluster split fills the SMs as well."""
    if ceildiv(n, 64) <= 2 * SM90_SMS and kp >= 8 * 128:
        return 2
    return 0


def small_m_variant(m: Int, n: Int, kp: Int) -> Int:
    """The variant used for M <= 16: the measured exception (`tuned_choice`), else the rule."""
    var t = tuned_choice(m, n, kp)
    return t[0] if t[0] >= 0 else small_m_rule(n, kp)


def wgmma_plan(m: Int, n: Int, kp: Int) -> Tuple[Int, Int]:
    """(variant, split_k) of the wgmma kernel, or (-1, 0) for the mma.sync kernels.

    The kernel runs one ~200 KB CTA per SM; the measured exceptions of `tuned_wgmma` come
    first, then `wgmma_rule` (a waves x work-per-CTA cost model, `wgmma_tile_rule`).
    """
    if m < WGMMA_MIN_M:
        return (-1, 0)
    var tw = tuned_wgmma(m, n, kp)
    if tw[0] >= 0:
        return tw
    return wgmma_rule(m, n, kp)


def wgmma_rule(m: Int, n: Int, kp: Int) -> Tuple[Int, Int]:
    """`wgmma_plan` without `tuned_wgmma`'s exceptions (the sweep also times it where an
    exception applies). M <= 64 where `tuned_choice` sends the problem to two 32-token M-blocks
    (variant 1) stays on mma.sync."""
    if m < WGMMA_MIN_M:
        return (-1, 0)
    if m <= 64 and tuned_choice(m, n, kp)[0] == 1:
        return (-1, 0)
    return wgmma_tile_rule(m, n, kp)


comptime CTA_FIXED_COST = 40
"""Fixed cost of one wgmma CTA in the rule's units (a 128-token stage = 20): ring fill and
epilogue, about two stages."""
comptime SPLIT_FIXED_COST = 20
"""Extra fixed cost of a split-K CTA: the cluster barrier and the DSMEM reduction."""
comptime WG256_MIN_M = 257
"""From this many tokens on, the rule also weighs the 256-token tiles (measured from M = 1024;
below, a 256-token tile is at least half empty or the 128-token tiles were measured best)."""


comptime SK_UNIT_COST = 21
"""Cost of one 64-K stage of a stream-K CTA (128 x 256 or 256 x 128 tiles), in the units above.
The stream-K constants here and `SMALL_M_SK_*` were fitted (least squares, time = fixed + a x
stages of the busiest CTA + b x parts) to H100 times of 12 public layers at M = 64-1024
(kernels/wgmma.launch_int4_gemm_wgmma_streamk against the dispatch's tiled launches, same
binary), the µs mapped to these units by the same fit of the tiled model (8.9 µs + 0.038 µs
per unit, within 10 % on those layers)."""
comptime SK_PART_COST = 24
"""Cost of each later part the owner of a split tile waits for and adds (a 64-128 KB fp32 tile
read from L2, after its helper wrote it there)."""


comptime GS_FIXED_COST = 120
"""Fixed cost of a WG_CFG_128 CTA split along K without a cluster (ring fill, epilogue, its
fp32 tile's round trip through L2 and the wait for the tile's other CTAs), in the units above
(the cluster split's is CTA_FIXED_COST + SPLIT_FIXED_COST = 60); its stages cost 20 like the
tiled ones. Fitted to H100 times of 12 public layers at M = 128, s = 2-8 (within 10 %, mean
4 %)."""


def _gsplit_splits(tiles: Int, stages: Int) -> List[Int]:
    """The splits 2..8 of a global split-K launch whose CTAs are all resident at once (at most
    one per SM) and keep >= 8 stages each."""
    var out = List[Int]()
    for sp in range(2, 9):
        if tiles * sp <= SM90_SMS and stages // sp >= 8:
            out.append(sp)
    return out^


def _sk_fixed_cost(v: Int) -> Int:
    """Fixed cost of a stream-K launch beyond a tiled launch's (the parts' stores and flags, the
    owner's wait; WG_VAR_128_SK / WG_VAR_256_SK), in the units above."""
    return 30 if v == WG_VAR_256_SK else 100


def streamk_shape(m: Int, n: Int, kp: Int, v: Int) -> Tuple[Int, Int]:
    """(64-K stages per CTA, parts a split tile has at most) of the stream-K launch of `v` over
    SM90_SMS SMs: the units (tile x stage) are dealt out evenly, so a tile of T stages spreads
    over up to ceil((T - 1) / floor(units per CTA)) CTAs after its owner."""
    var cfg = wgmma_config_for(v)
    var stages = kp // 64
    var units = ceildiv(ceildiv(n, 64), cfg.bands()) * ceildiv(m, cfg.nt) * stages
    var ctas = streamk_ctas(cfg, m, n, kp, SM90_SMS)
    var per = units // ctas
    return (ceildiv(units, ctas), min(ctas - 1, ceildiv(stages - 1, per)))


def streamk_ok(m: Int, n: Int, kp: Int, v: Int) -> Bool:
    """Whether the stream-K launch of `v` fits its kernel's 32-bit unit arithmetic."""
    var cfg = wgmma_config_for(v)
    return streamk_units(cfg, m, n, kp) * streamk_ctas(cfg, m, n, kp, SM90_SMS) < 1 << 32


def _streamk_pays(sk_cost: Int, cost: Int) -> Bool:
    """A stream-K or global split launch replaces the tiled plan of cost `cost` only where the
    model expects it at least 2 % faster: the models' own error is about that (fitted H100 times, within a
    few % on the 12 layers they were fitted on), and a near tie is a coin toss."""
    return sk_cost * 50 < cost * 49


def _streamk_cost(m: Int, n: Int, kp: Int, v: Int) -> Int:
    var sh = streamk_shape(m, n, kp, v)
    return _sk_fixed_cost(v) + sh[0] * SK_UNIT_COST + sh[1] * SK_PART_COST


def _wgmma_stage_cost(v: Int) -> Int:
    """The rule's cost of one 64-K stage of a 1-CTA-per-SM tile variant: a 64 x 256 stage costs
    3/4 of a 128 x 256 one (it dequantizes the same weights for half the tokens), a 256 x 128
    stage (the same MMA work with half the dequant) 19/20, as measured."""
    if v == WG_VAR_256:
        return 19
    if v == WG_VAR_64:
        return 15
    return 20


def _wgmma_cta_cost(stages: Int, cost: Int, split: Int) -> Int:
    """The rule's cost of one CTA: its stages at `cost` each plus the fixed costs."""
    var c = ceildiv(stages, split) * cost + CTA_FIXED_COST
    return c + SPLIT_FIXED_COST if split > 1 else c


def _wgmma_costs(m: Int, n: Int, kp: Int, v: Int, split: Int) -> Tuple[Int, Int, Int]:
    """(uniform cost, data-parallel + tail cost or -1, data-parallel tiles) of `v` with `split`:
    uniform = waves x CTA cost; the data-parallel + tail schedule (M > 64, split > 1) runs the
    full waves of the tiles split 1 and the remaining tiles split `split` in one more wave,
    where they fit one."""
    var cfg = wgmma_config_for(v)
    var cost = _wgmma_stage_cost(v)
    var stages = kp // 64
    var tiles = ceildiv(ceildiv(n, 64), cfg.bands()) * ceildiv(m, cfg.nt)
    var uniform = ceildiv(tiles * split, cluster_wave_cap(split, 1)) * _wgmma_cta_cost(stages, cost, split)
    var wave = cluster_wave_cap(1, 1)
    var full = tiles // wave
    var rest = tiles - full * wave
    if m <= 64 or split == 1 or full == 0 or rest == 0 or rest * split > cluster_wave_cap(split, 1):
        return (uniform, -1, 0)
    var hybrid = full * _wgmma_cta_cost(stages, cost, 1) + _wgmma_cta_cost(stages, cost, split)
    return (uniform, hybrid, full * wave)


def wgmma_dp_tiles(m: Int, n: Int, kp: Int, v: Int, split: Int) -> Int:
    """Tiles the launch of (`v`, `split`) runs split 1 ahead of a split-`split` tail (0: one
    uniform launch): the data-parallel + tail schedule, where the rule's cost model finds it
    cheaper than the uniform grid (`_wgmma_costs`)."""
    if v != WG_VAR_128 and v != WG_VAR_64 and v != WG_VAR_256:
        return 0
    var c = _wgmma_costs(m, n, kp, v, split)
    return c[2] if c[1] >= 0 and c[1] < c[0] else 0


def _small_m_stream_cost(v: Int) -> Int:
    """`small_m_tile_rule`: time (1e-4 µs) per 64-column band x 64-K step that an SM streams,
    for WG_CFG_64 / WG_CFG_64N (its CTAs two to an SM) / WG_CFG_64W, fitted to the sweep at
    M = 20, 32, 64 (as the two below)."""
    if v == WG_VAR_64N:
        return 1363
    if v == WG_VAR_64W:
        return 1284
    return 1530


comptime SMALL_M_SK_FIXED = 108100
comptime SMALL_M_SK_UNIT = 6560
comptime SMALL_M_SK_PART = 5300
"""`small_m_tile_rule`'s cost (1e-4 µs) of WG_CFG_64 as a stream-K launch: fixed + per 64-K
stage of the busiest CTA + per later part of a split tile."""
comptime SMALL_M_GS_FIXED = 105700
comptime SMALL_M_GS_STAGE = 6150
"""`small_m_tile_rule`'s cost (1e-4 µs) of WG_CFG_64 split without a cluster (fixed + per 64-K
stage of a CTA), fitted like the stream-K constants (H100, 12 public layers, s = 2-8)."""
comptime SMALL_M_LONE_64N_COST = 2232
"""The same for a WG_CFG_64N CTA alone on its SM: one consumer warpgroup and an 8-stage ring of
64 x 128 tiles keep fewer bytes in flight than an SM can take, so it streams slower."""


def _small_m_fixed_cost(v: Int) -> Int:
    """`small_m_tile_rule`: fixed cost (1e-4 µs) of one wave of CTAs (launch, ring fill,
    epilogue, split reduction)."""
    if v == WG_VAR_64N:
        return 60500
    if v == WG_VAR_64W:
        return 89300
    return 69500


def small_m_tile_rule(m: Int, n: Int, kp: Int) -> Tuple[Int, Int]:
    """(variant, split_k) of the wgmma kernel for M <= 64 from the problem alone: the 64-token
    tile configs WG_CFG_64 (64 x 256, one CTA per SM), WG_CFG_64N (64 x 128, two per SM) and
    WG_CFG_64W (64 x 512) at splits 1, 2, 3, 4, 6 (>= 8 stages of 64 K per CTA when split),
    cost = waves x (fixed + the busiest SM's stream), waves = ceil(CTAs / `cluster_wave_cap`),
    the stream = the bands x K steps of the CTAs one SM holds at its config's rate, or of one
    CTA at the lone-CTA rate where that is slower (WG_CFG_64N with at most one CTA per SM).
    Lowest cost wins, ties to the earlier config and the smaller split. The constants were
    fitted to a sweep at M = 20, 32, 64 (H100 and H200, 1,260 records; predictions within 1.06x
    mean; fitted without a model's layers, its picks on them were 1.04-1.06x the best
    candidate). On the committed H200 sweep of the 28 public layers its picks are 1.081x /
    1.066x / 1.041x the best candidate at M = 20 / 32 / 64 (geomean), the 64 x 256 one-wave
    rule's 1.099x / 1.103x / 1.083x. Then WG_CFG_64 as a stream-K launch (`SMALL_M_SK_*`: fixed
    + the busiest CTA's stages + the parts of a split tile) and split 2-8 ways without a cluster
    (`SMALL_M_GS_*`, every CTA resident), where expected at least 2 % faster than that pick."""
    var stages = kp // 64
    var best_v = -1
    var best_s = 1
    var best_cost = 0
    for v in [WG_VAR_64, WG_VAR_64N, WG_VAR_64W]:
        var cfg = wgmma_config_for(v)
        var tiles = ceildiv(ceildiv(n, 64), cfg.bands()) * ceildiv(m, cfg.nt)
        for sp in [1, 2, 3, 4, 6]:
            if sp > 1 and stages // sp < 8:
                continue
            var cap = cluster_wave_cap(sp, cfg.ctas)
            if cap == 0:
                continue
            var ctas = tiles * sp
            var on_sm = ceildiv(min(ctas, cap), SM90_SMS) if cfg.ctas > 1 else 1
            var units = ceildiv(stages, sp) * cfg.bands()
            var lone = SMALL_M_LONE_64N_COST if cfg.ctas > 1 else 0
            var stream = max(_small_m_stream_cost(v) * on_sm, lone) * units
            var cost = ceildiv(ctas, cap) * (_small_m_fixed_cost(v) + stream)
            if best_v < 0 or cost < best_cost:
                best_v = v
                best_s = sp
                best_cost = cost
    var sk = streamk_shape(m, n, kp, WG_VAR_64_SK)
    var sk_cost = SMALL_M_SK_FIXED + sk[0] * SMALL_M_SK_UNIT + sk[1] * SMALL_M_SK_PART
    var tiled_cost = best_cost
    if streamk_ok(m, n, kp, WG_VAR_64_SK) and _streamk_pays(sk_cost, tiled_cost):
        best_v = WG_VAR_64_SK
        best_s = 1
        best_cost = sk_cost
    var tiles64 = ceildiv(ceildiv(n, 64), WG_CFG_64.bands()) * ceildiv(m, WG_CFG_64.nt)
    for sp in _gsplit_splits(tiles64, stages):
        var gs_cost = SMALL_M_GS_FIXED + ceildiv(stages, sp) * SMALL_M_GS_STAGE
        if _streamk_pays(gs_cost, tiled_cost) and gs_cost < best_cost:
            best_v = WG_VAR_64_GS
            best_s = sp
            best_cost = gs_cost
    return (best_v, best_s)


def wgmma_tile_rule(m: Int, n: Int, kp: Int) -> Tuple[Int, Int]:
    """(variant, split_k) of the wgmma kernel for M >= WGMMA_MIN_M from the problem alone (no
    entry of tuning_sm90.mojo is consulted).

    A cost model over the tile configs (256 x 128 from WG256_MIN_M tokens, 128 x 256 above 64,
    64 x 256; tokens x columns) and splits 1, 2, 3, 4, 6 (>= 8 stages of 64 K per CTA when
    split): time = waves x (stages per CTA x stage cost + fixed CTA cost), waves = ceil(CTAs /
    CTAs one wave holds) (`cluster_wave_cap`: cluster sizes pack into the GPCs unequally),
    stage costs as `_wgmma_stage_cost`; or, where cheaper, the full waves split 1 and the last
    partial wave's tiles split K (`wgmma_dp_tiles`). The lowest cost wins; ties go to the
    earlier tile of that list and the smaller split. Then the 256 x 128 (above 128 tokens) and
    128 x 256 tiles as stream-K launches (`_streamk_cost`: the busiest CTA's stages, the parts a
    split tile waits for, a fixed cost) and the 128 x 256 tile split 2-8 ways without a cluster
    (`GS_FIXED_COST`), where expected at least 2 % faster than the tiled pick. M <= 64:
    `small_m_tile_rule`. On the H200
    sweep (M = 128-256, 28 layers) the uniform model is within
    1.4 % of the best candidate (geomean), where one-wave-or-split-1 was 3.8 % off (up to 45 %
    on layers whose split-1 grid needs two or more waves)."""
    if m <= 64:
        return small_m_tile_rule(m, n, kp)
    var stages = kp // 64
    var best_v = -1
    var best_s = 1
    var best_cost = 0
    for v in [WG_VAR_256, WG_VAR_128, WG_VAR_64]:
        if v == WG_VAR_256 and m < WG256_MIN_M:
            continue
        for sp in [1, 2, 3, 4, 6]:
            if sp > 1 and stages // sp < 8:
                continue
            var c = _wgmma_costs(m, n, kp, v, sp)
            var cost = c[0]
            if c[1] >= 0 and c[1] < cost:
                cost = c[1]
            if best_v < 0 or cost < best_cost:
                best_v = v
                best_s = sp
                best_cost = cost
    var tiled_cost = best_cost
    for v in [WG_VAR_256_SK, WG_VAR_128_SK]:
        if (v == WG_VAR_256_SK and m <= 128) or not streamk_ok(m, n, kp, v):
            continue
        var cost = _streamk_cost(m, n, kp, v)
        if _streamk_pays(cost, tiled_cost) and cost < best_cost:
            best_v = v
            best_s = 1
            best_cost = cost
    var tiles128 = ceildiv(ceildiv(n, 64), WG_CFG_128.bands()) * ceildiv(m, WG_CFG_128.nt)
    for sp in _gsplit_splits(tiles128, stages):
        var cost = ceildiv(stages, sp) * _wgmma_stage_cost(WG_VAR_128) + CTA_FIXED_COST + GS_FIXED_COST
        if _streamk_pays(cost, tiled_cost) and cost < best_cost:
            best_v = WG_VAR_128_GS
            best_s = sp
            best_cost = cost
    return (best_v, best_s)


def is_streamk(v: Int) -> Bool:
    """Whether wgmma variant `v` is a stream-K launch."""
    return v == WG_VAR_64_SK or v == WG_VAR_128_SK or v == WG_VAR_256_SK


def is_gsplit(v: Int) -> Bool:
    """Whether wgmma variant `v` splits K without a cluster."""
    return v == WG_VAR_64_GS or v == WG_VAR_128_GS


def tiled_variant(v: Int) -> Int:
    """The tiled (grid of tiles x split-K clusters) variant of the same tile as `v`."""
    if v == WG_VAR_64_SK or v == WG_VAR_64_GS:
        return WG_VAR_64
    if v == WG_VAR_128_SK or v == WG_VAR_128_GS:
        return WG_VAR_128
    if v == WG_VAR_256_SK:
        return WG_VAR_256
    return v


def wgmma_variant(m: Int, n: Int, kp: Int) -> Int:
    """-1: the mma.sync kernels; else a WG_VAR_* of tuning_sm90.mojo (see `wgmma_plan`)."""
    return wgmma_plan(m, n, kp)[0]


def wgmma_config_for(v: Int) -> Int4WgmmaConfig:
    if v == WG_VAR_64_SK or v == WG_VAR_64_GS:
        return WG_CFG_64
    if v == WG_VAR_128_GS:
        return WG_CFG_128
    if v == WG_VAR_128_SK:
        return WG_CFG_128
    if v == WG_VAR_256_SK:
        return WG_CFG_256
    if v == WG_VAR_64W:
        return WG_CFG_64W
    if v == WG_VAR_64N:
        return WG_CFG_64N
    if v == WG_VAR_128K:
        return WG_CFG_128K
    if v == WG_VAR_256:
        return WG_CFG_256
    return WG_CFG_64 if v == WG_VAR_64 else WG_CFG_128


def tile_config_for(m: Int, n: Int, kp: Int) -> Int4GemmConfig:
    """The (unresolved) tile config used for `m` tokens, `n` output columns, `kp` inputs."""
    var t = tuned_choice(m, n, kp)
    if m <= 16:
        var v = small_m_variant(m, n, kp)
        if m <= 8:
            return CFG_M8_K8 if v == 2 else (CFG_M8_NARROW if v == 1 else CFG_M8)
        return CFG_M16_K8 if v == 2 else (CFG_M16_NARROW if v == 1 else CFG_M16)
    if m <= 32 or (m <= 64 and t[0] == 1):
        return CFG_M32
    if m <= 64:
        return CFG_M64
    return CFG_LARGE


def choose_split_k(cfg: Int4GemmConfig, m: Int, n: Int, kp: Int) -> Int:
    """CTAs per cluster along K.

    A CTA has a fixed cost (cluster launch, pipeline fill, reductions),
    so fewer, longer CTAs win as long as every SM gets about one; a second partial wave costs
    far more than it saves, and clusters of 8 pack badly into the GPCs. So:
    PIPE_WARP with 8 warp-k parts (one CTA per SM): the largest power of two whose grid still
    fits one CTA per SM, each warp keeping >= K8_MIN_K_PER_WARP of K;
    other PIPE_WARP (2 CTAs/SM): the smallest power of two giving >= 96 CTAs (<= 8);
    PIPE_CTA (1 CTA/SM): the largest of 1, 2, 3, 4, 6 keeping the grid <= 100 CTAs.
    Either way each CTA keeps at least 4 stages of K."""
    var ctas = ceildiv(ceildiv(n, 64), cfg.bn // 64) * ceildiv(m, cfg.bm)
    var stages_total = kp // cfg.bk
    if cfg.pipeline == PIPE_WARP and cfg.warp_k == 8:
        var s = 1
        while s < 8 and ctas * 2 * s <= cluster_wave_cap(2 * s, 1) and kp // (8 * 2 * s) >= K8_MIN_K_PER_WARP:
            s *= 2
        return s
    if cfg.pipeline == PIPE_WARP:
        var s = 1
        while s < 8 and ctas * s < 96 and stages_total // (2 * s) >= 4:
            s *= 2
        return s
    var best = 1
    for s in [2, 3, 4, 6]:
        if ctas * s <= 100 and stages_total // s >= 4:
            best = s
    return best


def launch_int4_gemm_mma[
    dtype: DType, group_size: Int, has_zeros: Bool, has_bias: Bool, cfg: Int4GemmConfig,
    clusters: Bool = True, budget: Int = INT4_SMEM_BUDGET,
](
    output: Pointer[Scalar[dtype], MutAnyOrigin],
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    qweight: Pointer[UInt32, MutAnyOrigin],
    scales: Pointer[Scalar[dtype], MutAnyOrigin],
    zeros: Pointer[Scalar[dtype], MutAnyOrigin],
    bias: Pointer[Scalar[dtype], MutAnyOrigin],
    m: Int, n: Int, kp: Int, np_: Int, split_k: Int,
    ctx: DeviceContext,
) raises:
    """Launch the kernel with tile config `cfg` (resolved against `budget` bytes of shared
    memory at compile time) and `split_k` CTAs per cluster. clusters = False (targets without
    thread-block clusters) builds the kernels without the cluster reduction and needs
    split_k == 1. No checks beyond the config's own."""
    comptime r = try_resolve_config(cfg, group_size, has_zeros, budget, clusters)
    comptime if r.stages == 0:
        raise Error(
            "multistage_gemm_q: tile config ", cfg, " does not fit ", budget,
            " bytes of shared memory with >= 3 stages and any warp-k partitioning",
        )
    else:
        comptime smem = smem_usage(r, group_size, has_zeros, clusters)
        if split_k < 1 or split_k > 8:
            raise Error("multistage_gemm_q: split_k must be in 1..8, got ", split_k)
        comptime if not clusters:
            if split_k != 1:
                raise Error("multistage_gemm_q: split_k must be 1 without thread-block clusters, got ", split_k)
        var split = split_k
        comptime if INT4_MAX_SPLIT < 8:
            # racecheck build (config.INT4_MAX_SPLIT): the same kernel, smaller clusters; at 1
            # the cluster reduction runs on one CTA without a cluster launch
            split = min(split, INT4_MAX_SPLIT)
        var grid = (ceildiv(ceildiv(n, 64), r.bn // 64) * split, ceildiv(m, r.bm))
        var cluster = Dim(split, 1, 1)
        var attr = FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(UInt32(smem))
        comptime if r.pipeline == PIPE_WARP:
            comptime kernel = int4_gemv_kernel[dtype, group_size, has_zeros, has_bias, r, clusters]
            if split == 1:
                ctx.enqueue_function[kernel](
                    output, x, qweight, scales, zeros, bias, Int32(m), Int32(n), Int32(kp), Int32(np_), Int32(1),
                    grid_dim=grid, block_dim=r.num_threads(), shared_mem_bytes=smem, func_attribute=attr,
                    attributes=pdl_attributes())
            else:
                ctx.enqueue_function[kernel](
                    output, x, qweight, scales, zeros, bias, Int32(m), Int32(n), Int32(kp), Int32(np_), Int32(split),
                    grid_dim=grid, block_dim=r.num_threads(), shared_mem_bytes=smem, cluster_dim=cluster,
                    func_attribute=attr, attributes=pdl_attributes())
        else:
            comptime kernel = int4_gemm_mma_kernel[dtype, group_size, has_zeros, has_bias, r, clusters]
            if split == 1:
                ctx.enqueue_function[kernel](
                    output, x, qweight, scales, zeros, bias, Int32(m), Int32(n), Int32(kp), Int32(np_), Int32(1),
                    grid_dim=grid, block_dim=r.num_threads(), shared_mem_bytes=smem, func_attribute=attr)
            else:
                ctx.enqueue_function[kernel](
                    output, x, qweight, scales, zeros, bias, Int32(m), Int32(n), Int32(kp), Int32(np_), Int32(split),
                    grid_dim=grid, block_dim=r.num_threads(), shared_mem_bytes=smem, cluster_dim=cluster,
                    func_attribute=attr)


def _check_shapes(m: Int, n: Int, kp: Int, np_: Int) raises:
    if m < 0 or n < 1:
        raise Error("multistage_gemm_q: M >= 0 and N >= 1 needed, got M=", m, " N=", n)
    if n % 8 != 0:
        raise Error("multistage_gemm_q: N must be a multiple of 8, got ", n)
    if kp % 128 != 0 or kp < 128:
        raise Error("multistage_gemm_q: Kp must be a positive multiple of 128, got ", kp)
    if np_ % 64 != 0 or np_ < n:
        raise Error("multistage_gemm_q: Np must be a multiple of 64 and >= N, got Np=", np_, " N=", n)


def int4_gemm_gpu[
    dtype: DType, group_size: Int, has_zeros: Bool, has_bias: Bool
](
    output: Pointer[Scalar[dtype], MutAnyOrigin],
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    qweight: Pointer[UInt32, MutAnyOrigin],
    scales: Pointer[Scalar[dtype], MutAnyOrigin],
    zeros: Pointer[Scalar[dtype], MutAnyOrigin],
    bias: Pointer[Scalar[dtype], MutAnyOrigin],
    m: Int,
    n: Int,
    kp: Int,
    ctx: DeviceContext,
    np_: Int = -1,
    split_k: Int = 0,
) raises:
    """output[M, N] = x[M, Kp] · W[N, Kp]ᵀ (+ bias) on the GPU (all pointers are device memory).

    dtype: bfloat16 or float16 (x, scales, zeros, bias, out). qweight: uint32 [Np/64, Kp*8],
    packed layout of python/mojo_gemm/int4/layout.py. scales / zeros: [Kp/g, Np] (transposed 8 x 8 inside
    64 columns); zeros are read only when has_zeros (else z = 8), bias [N] only when has_bias.
    group_size: 32, 64, 128 (any multiple of 16 dividing or divided by 128), or -1 = per
    channel. N % 8 == 0, Kp % 128 == 0; np_ = 64 * qweight.dim0 (default: N rounded up to 64).
    split_k: CTAs per cluster along K (1..8); 0 = the heuristic (`choose_split_k`, or
    `wgmma_plan` on the wgmma path).
    """
    var np_eff = np_ if np_ > 0 else ceildiv(n, 64) * 64
    _check_shapes(m, n, kp, np_eff)
    comptime if group_size > 0:
        if kp % group_size != 0:
            raise Error("multistage_gemm_q: Kp=", kp, " is not a multiple of group_size=", group_size)
    if m == 0:
        return  # an empty batch: nothing to write, and a zero grid must not be launched
    var plan = wgmma_plan(m, n, kp)
    var v = plan[0]
    if split_k > 0:
        v = tiled_variant(v)  # a caller's split: the tile of the plan as a cluster split-K grid
    var split = split_k if split_k > 0 else plan[1]
    var dp = wgmma_dp_tiles(m, n, kp, v, split)
    if v == WG_VAR_64:
        launch_int4_gemm_wgmma[dtype, group_size, has_zeros, has_bias, WG_CFG_64](
            output, x, qweight, scales, zeros, bias, m, n, kp, np_eff, split, ctx, dp)
    elif v == WG_VAR_64W:
        launch_int4_gemm_wgmma[dtype, group_size, has_zeros, has_bias, WG_CFG_64W](
            output, x, qweight, scales, zeros, bias, m, n, kp, np_eff, split, ctx)
    elif v == WG_VAR_128:
        launch_int4_gemm_wgmma[dtype, group_size, has_zeros, has_bias, WG_CFG_128](
            output, x, qweight, scales, zeros, bias, m, n, kp, np_eff, split, ctx, dp)
    elif v == WG_VAR_64N:
        launch_int4_gemm_wgmma[dtype, group_size, has_zeros, has_bias, WG_CFG_64N](
            output, x, qweight, scales, zeros, bias, m, n, kp, np_eff, split, ctx)
    elif v == WG_VAR_128K:
        launch_int4_gemm_wgmma[dtype, group_size, has_zeros, has_bias, WG_CFG_128K](
            output, x, qweight, scales, zeros, bias, m, n, kp, np_eff, split, ctx)
    elif v == WG_VAR_256:
        launch_int4_gemm_wgmma[dtype, group_size, has_zeros, has_bias, WG_CFG_256](
            output, x, qweight, scales, zeros, bias, m, n, kp, np_eff, split, ctx, dp)
    elif v == WG_VAR_64_GS:
        launch_int4_gemm_wgmma_gsplit[dtype, group_size, has_zeros, has_bias, WG_CFG_64](
            output, x, qweight, scales, zeros, bias, m, n, kp, np_eff, split, ctx)
    elif v == WG_VAR_128_GS:
        launch_int4_gemm_wgmma_gsplit[dtype, group_size, has_zeros, has_bias, WG_CFG_128](
            output, x, qweight, scales, zeros, bias, m, n, kp, np_eff, split, ctx)
    elif v == WG_VAR_64_SK:
        launch_int4_gemm_wgmma_streamk[dtype, group_size, has_zeros, has_bias, WG_CFG_64](
            output, x, qweight, scales, zeros, bias, m, n, kp, np_eff, ctx)
    elif v == WG_VAR_128_SK:
        launch_int4_gemm_wgmma_streamk[dtype, group_size, has_zeros, has_bias, WG_CFG_128](
            output, x, qweight, scales, zeros, bias, m, n, kp, np_eff, ctx)
    elif v == WG_VAR_256_SK:
        launch_int4_gemm_wgmma_streamk[dtype, group_size, has_zeros, has_bias, WG_CFG_256](
            output, x, qweight, scales, zeros, bias, m, n, kp, np_eff, ctx)
    else:
        int4_gemm_gpu_mma[dtype, group_size, has_zeros, has_bias](
            output, x, qweight, scales, zeros, bias, m, n, kp, ctx, np_eff, split_k)


def int4_gemm_gpu_mma[
    dtype: DType, group_size: Int, has_zeros: Bool, has_bias: Bool,
    clusters: Bool = True, budget: Int = INT4_SMEM_BUDGET,
](
    output: Pointer[Scalar[dtype], MutAnyOrigin],
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    qweight: Pointer[UInt32, MutAnyOrigin],
    scales: Pointer[Scalar[dtype], MutAnyOrigin],
    zeros: Pointer[Scalar[dtype], MutAnyOrigin],
    bias: Pointer[Scalar[dtype], MutAnyOrigin],
    m: Int,
    n: Int,
    kp: Int,
    ctx: DeviceContext,
    np_: Int = -1,
    split_k: Int = 0,
) raises:
    """The mma.sync kernels' selection (tile table + the tuned exceptions + split heuristic), as
    used below WGMMA_MIN_M tokens, and by the benchmark to time the mma.sync kernels at any M.
    The Ampere and Blackwell paths use it for every M: clusters = False (sm_80 / 86 / 89) runs
    split_k = 1, `budget` is the target's shared memory per CTA (target.smem_budget)."""
    var np_eff = np_ if np_ > 0 else ceildiv(n, 64) * 64
    _check_shapes(m, n, kp, np_eff)
    if m == 0:
        return  # an empty batch: nothing to write, and a zero grid must not be launched
    var tuned = tuned_choice(m, n, kp)
    var small = small_m_variant(m, n, kp) if m <= 16 else -1

    @always_inline
    @__parameter
    def go[cfg: Int4GemmConfig]() raises:
        var split = split_k
        if split <= 0:
            split = tuned[1] if tuned[1] > 0 else choose_split_k(cfg, m, n, kp)
        comptime if not clusters:
            split = 1
        launch_int4_gemm_mma[dtype, group_size, has_zeros, has_bias, cfg, clusters, budget](
            output, x, qweight, scales, zeros, bias, m, n, kp, np_eff, split, ctx)

    if m <= 8:
        if small == 2:
            go[CFG_M8_K8]()
        elif small == 1:
            go[CFG_M8_NARROW]()
        else:
            go[CFG_M8]()
    elif m <= 16:
        if small == 2:
            go[CFG_M16_K8]()
        elif small == 1:
            go[CFG_M16_NARROW]()
        else:
            go[CFG_M16]()
    elif m <= 32 or (m <= 64 and tuned[0] == 1):
        go[CFG_M32]()
    elif m <= 64:
        go[CFG_M64]()
    else:
        go[CFG_LARGE]()


def int4_gemm_gpu_config(m: Int, n: Int, kp: Int, group_size: Int, has_zeros: Bool, split_k: Int = 0) -> String:
    """The launch `int4_gemm_gpu` makes for this problem, e.g. for a benchmark JSON record."""
    var plan = wgmma_plan(m, n, kp)
    var v = plan[0]
    if v >= 0:
        var w = try_resolve_wgmma_config(wgmma_config_for(v), group_size, has_zeros, wgmma_smem_budget(wgmma_config_for(v)))
        if split_k > 0:
            v = tiled_variant(v)
        var sp = split_k if split_k > 0 else plan[1]
        w = w.with_split_k(min(sp, INT4_MAX_SPLIT))
        var dp = wgmma_dp_tiles(m, n, kp, v, sp)
        if is_streamk(v):
            return String("int4_gemm_wgmma ", w.with_split_k(1), " streamk ctas=",
                          streamk_ctas(w, m, n, kp, SM90_SMS), " smem=", wgmma_smem_usage(w, group_size, has_zeros))
        if is_gsplit(v):
            return String("int4_gemm_wgmma ", w, " gsplit smem=", wgmma_smem_usage(w, group_size, has_zeros))
        var text = String("int4_gemm_wgmma ", w, " smem=", wgmma_smem_usage(w, group_size, has_zeros))
        if dp > 0 and w.split_k > 1:
            text += String(" dp_tiles=", dp)
        return text
    return int4_gemm_gpu_mma_config(m, n, kp, group_size, has_zeros, split_k)


def int4_gemm_gpu_mma_config(
    m: Int, n: Int, kp: Int, group_size: Int, has_zeros: Bool, split_k: Int = 0,
    clusters: Bool = True, budget: Int = INT4_SMEM_BUDGET,
) -> String:
    """The launch `int4_gemm_gpu_mma` (the mma.sync selection) makes for this problem, with
    its `clusters` and `budget` parameters."""
    var cfg = tile_config_for(m, n, kp)
    var r = try_resolve_config(cfg, group_size, has_zeros, budget, clusters)
    var tuned = tuned_choice(m, n, kp)
    var split = split_k
    if split <= 0:
        split = tuned[1] if tuned[1] > 0 else choose_split_k(r, m, n, kp)
    if not clusters:
        split = 1
    r = r.with_split_k(min(split, INT4_MAX_SPLIT))
    return String("int4_gemm_mma ", r, " smem=", smem_usage(r, group_size, has_zeros, clusters))

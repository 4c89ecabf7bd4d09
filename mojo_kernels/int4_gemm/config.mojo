"""Tile configuration of the W4A16 tensor-core kernel (`kernels/mma.mojo`) and its smem budget.

The kernel computes Cᵀ tiles with the weights on the MMA's M side ("swap AB"): one warp owns
one 64-column packed band (`wn` = 64, the width of one 16-byte-per-lane load of a packed tile)
and `wm` tokens (`wm` / 8 mma.m16n8k16 n8-tiles). A CTA holds `bm / wm` x `bn / 64` such warps
times `warp_k` warp-k partitions that share each pipeline stage's `bk / 16` k-tiles. `split_k`
CTAs of one thread-block cluster split K further and reduce through distributed shared memory.

Shared memory (bytes), for activations of 2 bytes:
    ring  = stages * (bn/64 * bk/16 * 512            packed weights
                      + bm * (bk + 8) * 2            activations, rows padded by 16 B
                      + scale_rows * bn * 2 * (1 + has_zeros))   group scales (and zeros)
    usage = max(ring, max(warp_k - 1, 1) * bm * bn * 4)   fp32 partials for the reductions
with scale_rows = max(1, bk / group_size) (0 for per-channel: those are read once from
global memory). The reduction buffer always counts one tile because `split_k` is a run-time
choice of the dispatch. PIPE_WARP configs (the M <= 16 kernel) instead give every warp its
own ring: warps x stages x warp_stage_bytes (see there).
"""

from std.sys.defines import get_defined_int

from ..common.target import SM90_SMS, SMEM_BUDGET_SM90

# Build-time switches for running the int4 kernels under compute-sanitizer's racecheck
# (docs/sanitizers.md). Their defaults are the hardware values, so a build without -D compiles
# exactly the kernels and plans it always did; smaller values make the same kernel code launch
# with less shared memory (fewer stages), clusters of at most INT4_MAX_SPLIT CTAs, or no
# setmaxnreg.
comptime INT4_SMEM_BUDGET = get_defined_int["INT4_SMEM_BUDGET", SMEM_BUDGET_SM90]()
"""Dynamic shared memory (bytes) per CTA the int4 op resolves its sm_90a / sm_100a configs
against (`-D INT4_SMEM_BUDGET=N`; default SMEM_BUDGET_SM90). At 132 KiB every config still
fits (the wgmma epilogue tile of WG_CFG_128 is 130 KiB), with fewer pipeline stages."""
comptime INT4_MAX_SPLIT = get_defined_int["INT4_MAX_SPLIT", 8]()
"""Most CTAs per split-K cluster any int4 launch uses (`-D INT4_MAX_SPLIT=N`; default 8, the
largest split any launch accepts: no cap). 1: every launch runs the cluster-reduction code of
its kernel on a single CTA, without a cluster launch."""
comptime INT4_SETMAXNREG = get_defined_int["INT4_SETMAXNREG", 1]()
"""0 (`-D INT4_SETMAXNREG=0`): the wgmma kernel skips its setmaxnreg register split (consumers
keep the launch allocation: ptxas may spill, results are unchanged). Default 1."""

comptime INT4_WAIT_LIMIT_MS = get_defined_int["INT4_WAIT_LIMIT_MS", 2000]()
"""An mbarrier wait of the wgmma kernel longer than this traps, so a deadlock fails the launch
instead of hanging the device (`-D INT4_WAIT_LIMIT_MS=N`; default 2 s, far above any real wait).
Sanitizer builds raise it: under racecheck a kernel runs orders of magnitude slower."""

comptime MIN_STAGES = 3
"""The resolver never goes below this many pipeline stages."""


comptime PIPE_CTA = 0
"""Kernel `int4_gemm_mma_kernel`: CTA-wide cp.async ring, one barrier per stage."""
comptime PIPE_WARP = 1
"""Kernel `int4_gemv_kernel` (M <= 16): every lane streams its own fragments through a private
cp.async ring, no barrier in the main loop; a "stage" is bk / 16 k-tiles of one band."""


struct Int4GemmConfig(ImplicitlyCopyable, Movable, Writable):
    """Block/warp tile shapes of the W4A16 MMA kernel (a `MatmulConfig`-style record).

    bm: tokens (rows of x / C) per CTA, a multiple of wm.
    bn: output columns per CTA, a multiple of wn.
    bk: K per pipeline stage, one of 32, 64, 128 (Kp is a multiple of 128).
    wm: tokens per warp, one of 8, 16, 32, 64 (mma n8-tiles of the swapped product).
    wn: columns per warp: always 64 (one packed band).
    stages: cp.async pipeline depth (>= 2).
    warp_k: warp-k partitions per CTA (power of two, divides bk / 16).
    split_k: CTAs per cluster along K (1..8); chosen at run time by the dispatch.
    pipeline: PIPE_CTA or PIPE_WARP (then bm == wm <= 16).
    dequant_first: PIPE_WARP only: dequantize (q - z) * s in dtype x2 before the MMA (one
        accumulator set, no Σx MMA, fewer registers) instead of scaling the group sums after it.
    """

    var bm: Int
    var bn: Int
    var bk: Int
    var wm: Int
    var wn: Int
    var stages: Int
    var warp_k: Int
    var split_k: Int
    var pipeline: Int
    var dequant_first: Bool

    def __init__(
        out self, *, bm: Int, bn: Int, bk: Int, wm: Int, wn: Int, stages: Int, warp_k: Int,
        split_k: Int, pipeline: Int = PIPE_CTA, dequant_first: Bool = False,
    ):
        self.bm = bm
        self.bn = bn
        self.bk = bk
        self.wm = wm
        self.wn = wn
        self.stages = stages
        self.warp_k = warp_k
        self.split_k = split_k
        self.pipeline = pipeline
        self.dequant_first = dequant_first

    def num_threads(self) -> Int:
        """32 x (bm / wm) x (bn / wn) x warp_k."""
        return 32 * (self.bm // self.wm) * (self.bn // self.wn) * self.warp_k

    def with_stages(self, stages: Int) -> Self:
        var c = self
        c.stages = stages
        return c

    def with_warp_k(self, warp_k: Int) -> Self:
        var c = self
        c.warp_k = warp_k
        return c

    def with_split_k(self, split_k: Int) -> Self:
        var c = self
        c.split_k = split_k
        return c

    def is_valid(self) -> Bool:
        """Structural checks (independent of the smem budget)."""
        if self.wn != 64 or self.bn % self.wn != 0 or self.bn <= 0:
            return False
        if (self.wm != 8 and self.wm != 16 and self.wm != 32 and self.wm != 64) or self.bm % self.wm != 0 or self.bm <= 0:
            return False
        if self.bk != 32 and self.bk != 64 and self.bk != 128:
            return False
        var ktiles = self.bk // 16
        if self.dequant_first and self.pipeline != PIPE_WARP:
            return False
        if self.pipeline == PIPE_WARP:
            if self.bm != self.wm or self.wm > 16 or self.warp_k < 1 or self.warp_k > 8:
                return False
        elif self.warp_k < 1 or ktiles % self.warp_k != 0 or (self.warp_k & (self.warp_k - 1)) != 0:
            return False
        if self.stages < 2 or self.split_k < 1 or self.split_k > 8:
            return False
        return self.num_threads() <= 1024

    def write_to(self, mut writer: Some[Writer]):
        writer.write(
            "BMxBNxBK=", self.bm, "x", self.bn, "x", self.bk,
            " WMxWN=", self.wm, "x", self.wn,
            " stages=", self.stages, " warp_k=", self.warp_k, " split_k=", self.split_k,
            " pipe=", "warp" if self.pipeline == PIPE_WARP else "cta",
            " dequant_first" if self.dequant_first else "",
        )


def scale_rows_per_stage(bk: Int, group_size: Int) -> Int:
    """Group-parameter rows one pipeline stage needs (0: per-channel, read outside the ring)."""
    if group_size <= 0:
        return 0
    return max(1, bk // group_size)


def warp_stage_bytes(cfg: Int4GemmConfig, group_size: Int, has_zeros: Bool) -> Int:
    """PIPE_WARP: bytes of one warp's stage: per lane bk bytes of packed weights and 16 bytes
    per group row of scales (and zeros); the warp's wm activation rows of bk (+8) elements."""
    var u = cfg.bk // 16
    var gs = 0 if group_size <= 0 else max(1, cfg.bk // group_size)
    return 32 * (u * 16 + gs * 16 * (2 if has_zeros else 1)) + cfg.wm * (cfg.bk + 8) * 2


def smem_usage(cfg: Int4GemmConfig, group_size: Int, has_zeros: Bool, clusters: Bool = True) -> Int:
    """Dynamic shared memory (bytes) the kernel needs for `cfg` (formula in the module doc;
    PIPE_WARP: warps x stages x warp_stage_bytes for the ring, or every warp-k partition's
    tile for the reduction if larger). Without clusters (split_k is 1) the PIPE_CTA reduction
    buffer holds only the warp-k partitions beyond the first."""
    var red = (max(cfg.warp_k - 1, 1) if clusters else cfg.warp_k - 1) * cfg.bm * cfg.bn * 4
    if cfg.pipeline == PIPE_WARP:
        # the decode kernel's reduction writes every partition (kernels/mma._reduce_spread_and_store)
        var warps = (cfg.bn // 64) * cfg.warp_k
        return max(warps * cfg.stages * warp_stage_bytes(cfg, group_size, has_zeros), cfg.warp_k * cfg.bm * cfg.bn * 4)
    var w_stage = (cfg.bn // 64) * (cfg.bk // 16) * 512
    var x_stage = cfg.bm * (cfg.bk + 8) * 2
    var s_stage = scale_rows_per_stage(cfg.bk, group_size) * cfg.bn * 2 * (2 if has_zeros else 1)
    var ring = cfg.stages * (w_stage + x_stage + s_stage)
    return max(ring, red)


def try_resolve_config(
    cfg: Int4GemmConfig, group_size: Int, has_zeros: Bool, budget: Int, clusters: Bool = True
) -> Int4GemmConfig:
    """`cfg` shrunk until it fits `budget` bytes of shared memory, or stages == 0 if nothing fits.

    Order (as MAX's multistage_gemm_q): first fewer pipeline stages (down to MIN_STAGES, never
    more than requested), then half the warp-k partitions with the stage search restarted from
    the requested depth, and so on down to one partition. clusters: as in `smem_usage`.
    """
    var warp_k = cfg.warp_k
    while warp_k >= 1:
        var s = cfg.stages
        var lowest = min(MIN_STAGES, cfg.stages)
        while s >= lowest:
            var c = cfg.with_warp_k(warp_k).with_stages(s)
            if smem_usage(c, group_size, has_zeros, clusters) <= budget:
                return c
            s -= 1
        warp_k //= 2
    return cfg.with_stages(0)


def resolve_config(cfg: Int4GemmConfig, group_size: Int, has_zeros: Bool, budget: Int) raises -> Int4GemmConfig:
    """Like `try_resolve_config`, but raises a clear Error when no variant fits the budget."""
    if not cfg.is_valid():
        raise Error("multistage_gemm_q: invalid tile config ", cfg)
    var r = try_resolve_config(cfg, group_size, has_zeros, budget)
    if r.stages == 0:
        var smallest = cfg.with_warp_k(1).with_stages(min(MIN_STAGES, cfg.stages))
        raise Error(
            "multistage_gemm_q: tile config ", cfg, " does not fit the shared-memory budget of ",
            budget, " bytes even with ", smallest.stages, " stages and 1 warp-k partition (needs ",
            smem_usage(smallest, group_size, has_zeros), " bytes)",
        )
    return r


# ---- wgmma kernel (`kernels/wgmma.mojo`, sm_90a) --------------------------------------------

comptime WG_BK = 64
"""K per pipeline stage of the wgmma kernel: one 128-byte (128B-swizzle) row of bf16/fp16."""
comptime WG_KT = WG_BK // 16
"""Packed 16(K) x 64(N) tiles per band per stage (k16 steps per stage)."""


struct Int4WgmmaConfig(ImplicitlyCopyable, Movable, Writable):
    """Tile configuration of `int4_gemm_wgmma_kernel` (weights on wgmma's M side, tokens on N).

    nt: tokens per CTA = the wgmma N (64, 128 or 256).
    fpw: packed words per lane a warp turns into A fragments per k16 step (1, 2 or 4). A warp
         owns fpw m16 blocks of one 64-column band, so a consumer warpgroup covers 64 * fpw
         output columns (fpw wgmma m64 x nt x k16 per k16 step, fp32 accumulators
         fpw * nt / 2 per thread).
    nwg: consumer warpgroups (1 or 2), each on its own columns; plus one producer warpgroup.
    wk: warp-k partitions: consumer warpgroups per column set, each on every wk-th stage of
        the CTA's K range with its own accumulators, summed in the epilogue's shared-memory
        tile (1 or 2; 2 needs nwg = 1, ctas = 1). Two warpgroups on one tile overlap
        one's dequant with the other's wgmma where a single warpgroup is serial (see kg).
    stages: depth of the TMA / bulk-copy ring (WG_BK = 64 per stage).
    kg: k16 steps per wgmma batch (1, 2 or 4): dequant kg steps -> wgmma.fence -> kg * fpw
        wgmma -> commit -> wait_group 0. ptxas serializes register-A wgmma whenever A
        registers are written while a wgmma is in flight (C7513), so a warpgroup never
        overlaps its own dequant with its MMAs; the two consumer warpgroups overlap each other.
    split_k: CTAs per cluster along K (a run-time choice of the dispatch; 0 = heuristic).
    ctas: CTAs per SM the kernel is built for (1 or 2): `nvvm.minctasm`, the setmaxnreg split
          (1: producer 40 / consumers 232; 2: 24 / 104 with two consumer warpgroups, 24 / 232
          with one) and the smem budget per CTA
          (`wgmma_smem_budget`). 2 doubles the CTAs a small layer can run in one wave.
    """

    var nt: Int
    var fpw: Int
    var nwg: Int
    var stages: Int
    var kg: Int
    var split_k: Int
    var ctas: Int
    var wk: Int

    def __init__(
        out self, *, nt: Int, fpw: Int, nwg: Int, stages: Int, kg: Int = 4, split_k: Int = 0,
        ctas: Int = 1, wk: Int = 1,
    ):
        self.nt = nt
        self.fpw = fpw
        self.nwg = nwg
        self.stages = stages
        self.kg = kg
        self.split_k = split_k
        self.ctas = ctas
        self.wk = wk

    def bands(self) -> Int:
        """64-column bands per CTA."""
        return self.nwg * self.fpw

    def bn(self) -> Int:
        return 64 * self.bands()

    def num_threads(self) -> Int:
        return 128 * (1 + self.consumer_wgs())

    def consumer_wgs(self) -> Int:
        return self.nwg * self.wk

    def acc_regs(self) -> Int:
        """The fp32 accumulator registers per consumer thread."""
        return self.fpw * self.nt // 2

    def with_stages(self, stages: Int) -> Self:
        var c = self
        c.stages = stages
        return c

    def with_split_k(self, split_k: Int) -> Self:
        var c = self
        c.split_k = split_k
        return c

    def is_valid(self) -> Bool:
        if self.nt != 64 and self.nt != 128 and self.nt != 256:
            return False
        if self.fpw != 1 and self.fpw != 2 and self.fpw != 4:
            return False
        if self.nwg < 1 or self.nwg > 2 or self.acc_regs() > 128:
            return False
        if self.kg != 1 and self.kg != 2 and self.kg != 4:
            return False
        if self.ctas != 1 and self.ctas != 2:
            return False
        if self.wk != 1 and (self.wk != 2 or self.nwg != 1 or self.ctas != 1):
            return False
        return self.stages >= 2 and self.split_k >= 0 and self.split_k <= 8

    def write_to(self, mut writer: Some[Writer]):
        writer.write(
            "wgmma BMxBNxBK=", self.nt, "x", self.bn(), "x", WG_BK, " fpw=", self.fpw,
            " wg=", self.nwg, " kg=", self.kg, " stages=", self.stages, " split_k=", self.split_k,
        )
        if self.ctas != 1:
            writer.write(" ctas=", self.ctas)
        if self.wk != 1:
            writer.write(" wk=", self.wk)

    def uses_setmaxnreg(self) -> Bool:
        """Two consumer warpgroups, or a config built for 2 CTAs per SM (whose launch allocation
        of 65536 / (2 * threads) registers per thread is too few for the consumers)."""
        comptime if INT4_SETMAXNREG == 0:
            return False
        return self.consumer_wgs() > 1 or self.ctas > 1

    def consumer_regs(self) -> Int:
        """setmaxnreg of the consumer warpgroups (when uses_setmaxnreg): the CTA's launch allocation
        (65536 / (ctas * threads), rounded down to 8) minus the producer's, over the consumers."""
        var entry = (65536 // (self.ctas * self.num_threads())) // 8 * 8
        var prod = self.producer_regs()
        return ((entry * self.num_threads() - prod * 128) // (128 * self.consumer_wgs())) // 8 * 8

    def producer_regs(self) -> Int:
        return 40 if self.ctas == 1 else 24


def wgmma_scale_rows(group_size: Int) -> Int:
    """Group-parameter rows per stage (per-channel: the one row, re-read every stage)."""
    if group_size <= 0:
        return 1
    return max(1, WG_BK // group_size)


def wgmma_stage_bytes(cfg: Int4WgmmaConfig, group_size: Int, has_zeros: Bool) -> Int:
    """One ring stage: activations nt x 64 (TMA, 128B swizzle), packed weights bands x 4 tiles,
    scale rows (and zero rows) of the CTA's columns."""
    var x = cfg.nt * WG_BK * 2
    var w = cfg.bands() * WG_KT * 512
    var s = wgmma_scale_rows(group_size) * cfg.bn() * 2 * (2 if has_zeros else 1)
    return x + w + s


def wgmma_ring_bytes(cfg: Int4WgmmaConfig, group_size: Int, has_zeros: Bool) -> Int:
    """Ring (every region a multiple of 1 KiB) or the epilogue's fp32 output tile (nt rows of
    bn + 4 floats, kernels/wgmma._store_tile), the larger."""
    var x = cfg.stages * cfg.nt * WG_BK * 2
    var w = cfg.stages * cfg.bands() * WG_KT * 512
    var s = cfg.stages * wgmma_scale_rows(group_size) * cfg.bn() * 2
    var ring = x + w + s * (2 if has_zeros else 1)
    var red = cfg.nt * (cfg.bn() + 4) * 4
    return (max(ring, red) + 1023) // 1024 * 1024


def wgmma_smem_usage(cfg: Int4WgmmaConfig, group_size: Int, has_zeros: Bool) -> Int:
    """Dynamic shared memory of the wgmma kernel: ring (or reduction buffer) + 2 mbarriers per stage."""
    return wgmma_ring_bytes(cfg, group_size, has_zeros) + 16 * cfg.stages


def cluster_wave_cap(split: Int, ctas_per_sm: Int) -> Int:
    """Most CTAs of a split-K grid (clusters of `split` CTAs, `ctas_per_sm` of them per SM) that
    still run as one wave on the H200 (132 SMs in GPCs of unequal size; a cluster must fit in
    one GPC), or 0 for cluster sizes that never run as one wave (7, 8). Measured with the wgmma
    kernel (docs/design/multistage_gemm_q.md): clusters of 1-2 fill all 132 SMs, of 4 up to 120,
    of 3 and 6 up to 96 (120 / 144 ran as two waves), of 5 up to 80 (120 did not); configs built
    for 2 CTAs per SM hold 264, 192 (3, 4, 6; 240-256 did not) and 160 (5)."""
    if split <= 2:
        return SM90_SMS * ctas_per_sm
    if split == 4:
        return 120 if ctas_per_sm == 1 else 192  # not 2 x 120: 256 measured as two waves
    if split == 3 or split == 6:
        return 96 * ctas_per_sm
    if split == 5:
        return 80 * ctas_per_sm
    return 0


def wgmma_smem_budget(cfg: Int4WgmmaConfig) -> Int:
    """Dynamic smem one CTA of `cfg` may use: INT4_SMEM_BUDGET (SMEM_BUDGET_SM90) for 1 CTA per
    SM, else the SM's 228 KiB shared by cfg.ctas CTAs, less the 1 KiB each CTA reserves (and
    at most INT4_SMEM_BUDGET)."""
    if cfg.ctas <= 1:
        return INT4_SMEM_BUDGET
    return min((228 * 1024) // cfg.ctas - 1024, INT4_SMEM_BUDGET)


def try_resolve_wgmma_config(cfg: Int4WgmmaConfig, group_size: Int, has_zeros: Bool, budget: Int) -> Int4WgmmaConfig:
    """`cfg` with as many stages as fit `budget` (never more than requested, at least 2), or
    stages == 0 if even 2 do not fit."""
    var s = cfg.stages
    while s >= 2:
        var c = cfg.with_stages(s)
        if wgmma_smem_usage(c, group_size, has_zeros) <= budget:
            return c
        s -= 1
    return cfg.with_stages(0)

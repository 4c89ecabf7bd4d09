"""W4A16 tensor-core kernel of `multistage_gemm_q` (sm_80+; tuned for the H200, sm_90a).

    C[M, N] = x[M, Kp] · W[N, Kp]ᵀ (+ bias[N]),  W[n, k] = (q[n, k] - z) · s[k // g, n]

x, scales, zeros, bias, C: `dtype` (bfloat16 or float16), row-major; qweight: uint32
[Np / 64, Kp * 8] in the packed layout of python/mojo_gemm/int4/layout.py; scales /
zeros: [Kp / g, Np] with the 8 x 8 transpose inside every 64 columns; z = 8 without zeros.
fp32 accumulation, one rounding to `dtype` at the end. Only rows m < M and columns n < N are
written; N % 8 == 0 is not needed by the kernel itself.

Two kernels share the math (weights on the MMA's M side, "swap AB"):
- `int4_gemv_kernel` (M <= 16, config.PIPE_WARP): every warp streams one band's K part
  through its own cp.async ring; no barrier in the main loop.
- `int4_gemm_mma_kernel` (any M, config.PIPE_CTA): Marlin-like CTA-wide multistage ring.

Fragments:
- One packed 16(K) x 64(N) tile is 512 contiguous bytes; lane l's 16 bytes (words 4l..4l+3)
  are, word w, exactly the mma.m16n8k16 A fragment of the 16 x 16 weight block of columns
  16w..16w+15: nibbles (0,4) -> a0 (row l/4, k 2(l%4)+{0,1}), (2,6) -> a1 (row + 8),
  (1,5) -> a2 (k + 8), (3,7) -> a3. `(word >> s) & 0x000F000F | magic` (shift + lop3) turns
  two nibbles into a bf16x2 / f16x2 pair of (magic + q), magic = 128 (bf16) / 1024 (fp16).
- The activations are the B operand (tokens on the MMA's n8 side): b0 = x[tok, k..k+1] with
  tok = l/4, k = 2(l%4), so small M wastes only MMA slots, never weight bandwidth.
- The accumulator's rows are the lane's 8 columns l/4 + 8i: exactly the 8 scales one 16-byte
  load of the transposed scale row gives. With <= 16 tokens per warp ("scale after") the MMA
  runs on (magic + q) as is, an extra MMA with an all-ones A fragment gives Σ_k x per group,
  and per group acc += s · (Σ x (magic + q) − (magic + z) Σ x) in fp32: 7 integer ops per
  packed word, no half-precision math. Larger token tiles dequantize (magic + q) − (magic + z)
  (exact) times s in bf16x2 / f16x2 before the MMA, which halves the accumulator registers.
- Split K: warp-k partitions are reduced through shared memory; `split_k` CTAs of a
  thread-block cluster reduce through distributed shared memory (no workspace, no extra
  launch), each CTA of the cluster storing a disjoint share of the output tile.
"""

from max.gpu import thread_idx, block_idx, barrier
from max.gpu.sync import syncwarp
from max.gpu.memory import (
    AddressSpace,
    external_memory,
    async_copy,
    async_copy_commit_group,
    async_copy_wait_group,
)
from max.gpu.compute.mma import mma
from max.gpu.primitives.cluster import cluster_sync, load_cluster_smem
from std.memory import bitcast
from std.sys import inlined_assembly, _RegisterPackType
from std.math import ceildiv

from ...common.pdl import launch_dependent_grids, wait_on_dependent_grids
from ..config import Int4GemmConfig, scale_rows_per_stage

comptime F32 = DType.float32
comptime WORDS_PER_TILE = 128
"""uint32 words in one packed 16(K) x 64(N) tile."""


@always_inline
def _ldmatrix_x4(addr: UInt32) -> SIMD[DType.uint32, 4]:
    """ldmatrix.x4 (four 8 x 8 b16 matrices; lane 8i + r gives row r's 16-byte address of matrix
    i, shared-state space): register i holds, per lane l, matrix i's row l / 4, columns
    2(l % 4) and 2(l % 4) + 1 -- an mma B fragment half when the rows are tokens."""
    var r = inlined_assembly[
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0, $1, $2, $3}, [$4];",
        _RegisterPackType[UInt32, UInt32, UInt32, UInt32],
        constraints="=r,=r,=r,=r,r,~{memory}",
        has_side_effect=True,
    ](addr)
    return SIMD[DType.uint32, 4](r[0], r[1], r[2], r[3])


@always_inline
def magic_bits[dtype: DType]() -> UInt32:
    """Exponent pattern that turns a nibble OR-ed into the mantissa into (magic + q), per half."""
    comptime if dtype == DType.bfloat16:
        return 0x43004300  # bf16 128.0: mantissa step 1 in [128, 256)
    else:
        return 0x64006400  # fp16 1024.0: mantissa step 1 in [1024, 2048)


@always_inline
def magic_value[dtype: DType]() -> Float32:
    comptime if dtype == DType.bfloat16:
        return 128.0
    else:
        return 1024.0


@always_inline
def nibble_pair[dtype: DType, shift: Int](word: UInt32) -> SIMD[dtype, 2]:
    """Nibbles shift/4 (low half) and shift/4 + 4 (high half) of `word` as (magic + q)."""
    return bitcast[dtype, 2](((word >> UInt32(shift)) & 0x000F000F) | magic_bits[dtype]())


@always_inline
def _global[T: AnyType](p: Pointer[T, MutAnyOrigin]) -> Pointer[T, MutAnyOrigin, address_space=AddressSpace.GLOBAL]:
    return p.unsafe_address_space_cast[AddressSpace.GLOBAL]()


@always_inline
def _load_stage[
    dtype: DType, group_size: Int, has_zeros: Bool, cfg: Int4GemmConfig
](
    w_s: Pointer[UInt32, MutUntrackedOrigin, address_space=AddressSpace.SHARED],
    x_s: Pointer[Scalar[dtype], MutUntrackedOrigin, address_space=AddressSpace.SHARED],
    s_s: Pointer[Scalar[dtype], MutUntrackedOrigin, address_space=AddressSpace.SHARED],
    z_s: Pointer[Scalar[dtype], MutUntrackedOrigin, address_space=AddressSpace.SHARED],
    qw_ptr: Pointer[UInt32, MutAnyOrigin],
    x_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    s_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    z_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    tid: Int, st: Int, slot: Int, band0: Int, nbands: Int, m0: Int, m: Int, kp: Int, np_: Int,
):
    """cp.async of pipeline stage `st` (k in [st*BK, st*BK + BK)) into ring slot `slot`.

    Out-of-range bands / tokens are clamped to the last valid one (their results are never
    stored), so every copy is a full 16 bytes and no zero-fill is needed.
    """
    comptime NB = cfg.bn // 64
    comptime KT = cfg.bk // 16
    comptime BK = cfg.bk
    comptime BN = cfg.bn
    comptime NT = cfg.num_threads()
    comptime XS = BK + 8
    comptime W_STAGE = NB * KT * WORDS_PER_TILE
    comptime X_STAGE = cfg.bm * XS
    comptime SR = scale_rows_per_stage(BK, group_size)
    comptime S_STAGE = SR * BN

    # packed weights: per band, the stage's KT tiles are KT * 512 contiguous bytes
    comptime W_CHUNKS = NB * KT * 32
    comptime for i in range(ceildiv(W_CHUNKS, NT)):
        var c = tid + i * NT
        if W_CHUNKS % NT == 0 or c < W_CHUNKS:
            var b = c // (KT * 32)
            var r = c % (KT * 32)
            var band = min(band0 + b, nbands - 1)
            var src = qw_ptr.unsafe_offset(band * kp * 8 + st * KT * WORDS_PER_TILE + r * 4)
            async_copy[16](_global(src), w_s.unsafe_offset(slot * W_STAGE + c * 4))

    # activations: bm rows of BK elements (16-byte chunks of 8), rows padded to XS
    comptime X_CPR = BK // 8
    comptime X_CHUNKS = cfg.bm * X_CPR
    comptime for i in range(ceildiv(X_CHUNKS, NT)):
        var c = tid + i * NT
        if X_CHUNKS % NT == 0 or c < X_CHUNKS:
            var row = c // X_CPR
            var ch = c % X_CPR
            var tok = min(m0 + row, m - 1)
            var src = x_ptr.unsafe_offset(tok * kp + st * BK + ch * 8)
            async_copy[16](_global(src), x_s.unsafe_offset(slot * X_STAGE + row * XS + ch * 8))

    # group scales (and zeros): SR rows of BN columns
    comptime if SR > 0:
        comptime S_CPR = BN // 8
        comptime S_CHUNKS = SR * S_CPR
        comptime for i in range(ceildiv(S_CHUNKS, NT)):
            var c = tid + i * NT
            if S_CHUNKS % NT == 0 or c < S_CHUNKS:
                var r = c // S_CPR
                var ch = c % S_CPR
                var band = min(band0 + ch // 8, nbands - 1)
                var grp = (st * BK) // group_size + r
                var off = grp * np_ + band * 64 + (ch % 8) * 8
                var dst = slot * S_STAGE + r * BN + ch * 8
                async_copy[16](_global(s_ptr.unsafe_offset(off)), s_s.unsafe_offset(dst))
                comptime if has_zeros:
                    async_copy[16](_global(z_ptr.unsafe_offset(off)), z_s.unsafe_offset(dst))


@always_inline
def _a_fragment[
    dtype: DType, subtract: Bool, scale_before: Bool
](
    word: UInt32,
    z_lo: SIMD[dtype, 2], z_hi: SIMD[dtype, 2],
    s_lo: SIMD[dtype, 2], s_hi: SIMD[dtype, 2],
) -> SIMD[dtype, 8]:
    """mma.m16n8k16 A fragment {a0, a1, a2, a3} of one packed word.

    Without `subtract` the fragment holds (magic + q) (7 integer ops per word: the zero point
    is folded in after the MMA, see the kernel). z_lo / z_hi: (magic + zero) of the fragment's
    rows l/4 and l/4 + 8; s_lo / s_hi: their scales (used only when scale_before)."""
    var a0 = nibble_pair[dtype, 0](word)   # row l/4,     k 2(l%4) + {0, 1}
    var a1 = nibble_pair[dtype, 8](word)   # row l/4 + 8
    var a2 = nibble_pair[dtype, 4](word)   # row l/4,     k + 8
    var a3 = nibble_pair[dtype, 12](word)  # row l/4 + 8, k + 8
    comptime if subtract:
        a0 = a0 - z_lo
        a1 = a1 - z_hi
        a2 = a2 - z_lo
        a3 = a3 - z_hi
    comptime if scale_before:
        a0 = a0 * s_lo
        a1 = a1 * s_hi
        a2 = a2 * s_lo
        a3 = a3 * s_hi
    return a0.join(a1).join(a2.join(a3))


def int4_gemm_mma_kernel[
    dtype: DType, group_size: Int, has_zeros: Bool, has_bias: Bool, cfg: Int4GemmConfig,
    clusters: Bool = True,
](
    c_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    x_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    qw_ptr: Pointer[UInt32, MutAnyOrigin],
    s_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    z_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    b_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    m_dim: Int32,
    n_dim: Int32,
    kp_dim: Int32,
    np_dim: Int32,
    split_k: Int32,
):
    """One CTA: tokens [m0, m0 + bm) x columns of bands [band0, band0 + bn/64) x its K share.

    Grid: (ceil(ceil(N/64) / (bn/64)) * split_k, ceil(M / bm)); cluster (split_k, 1, 1);
    block: cfg.num_threads(); dynamic smem: config.smem_usage(cfg, group_size, has_zeros).
    group_size <= 0 means per-channel (one group of Kp).
    """
    comptime BM = cfg.bm
    comptime BN = cfg.bn
    comptime BK = cfg.bk
    comptime WM = cfg.wm
    comptime MT = WM // 8  # n8 token tiles per warp
    comptime NB = BN // 64  # warps along N (one band each)
    comptime WMS = BM // WM  # warps along M
    comptime KW = cfg.warp_k
    comptime KT = BK // 16  # k-tiles per stage
    comptime KTW = KT // KW  # k-tiles per warp per stage
    comptime STAGES = cfg.stages
    comptime WARPS_MN = NB * WMS
    comptime PER_CHANNEL = group_size <= 0
    comptime GT = KT if PER_CHANNEL else group_size // 16  # k-tiles per group
    comptime SR = scale_rows_per_stage(BK, group_size)
    comptime SCALE_AFTER = MT <= 2
    # With the scale applied after the MMA, the zero point is too: the MMA sees (magic + q) and
    # an extra MMA with an all-ones A fragment gives Σx, so dequant is 7 integer ops per word.
    comptime ZSUM = SCALE_AFTER
    comptime SUBT = KTW if PER_CHANNEL else min(KTW, GT)  # tiles between rescales
    comptime NSUB = KTW // SUBT
    comptime XS = BK + 8
    comptime W_STAGE = NB * KT * WORDS_PER_TILE
    comptime X_STAGE = BM * XS
    comptime S_STAGE = SR * BN
    comptime NQ = 4 * MT  # fp32 accumulator quads per thread
    comptime assert cfg.is_valid(), "invalid Int4GemmConfig"
    comptime assert PER_CHANNEL or group_size % 16 == 0, "group_size must be a multiple of 16"
    comptime assert PER_CHANNEL or BK % group_size == 0 or group_size % BK == 0, "BK vs group_size"
    comptime assert dtype == DType.bfloat16 or dtype == DType.float16, "bf16 / fp16 only"

    var smem = external_memory[UInt32, address_space=AddressSpace.SHARED, alignment=16]()
    var w_s = smem
    var x_s = smem.unsafe_offset(STAGES * W_STAGE).unsafe_bitcast[Scalar[dtype]]()
    var x32 = x_s.unsafe_bitcast[UInt32]()
    var s_s = x_s.unsafe_offset(STAGES * X_STAGE)
    var z_s = s_s.unsafe_offset(STAGES * S_STAGE)
    var red_s = smem.unsafe_bitcast[Float32]()  # reused once the ring is drained

    var tid = thread_idx.x
    var lane = tid % 32
    var warp = tid // 32
    var kpart = warp // WARPS_MN
    var wmn = warp % WARPS_MN
    var wm_i = wmn // NB
    var nb_i = wmn % NB
    var m = Int(m_dim)
    var n = Int(n_dim)
    var kp = Int(kp_dim)
    var np_ = Int(np_dim)
    var nsplit = Int(split_k)
    var ks = block_idx.x % nsplit  # == rank in the (nsplit, 1, 1) cluster
    var band0 = (block_idx.x // nsplit) * NB
    var nbands = ceildiv(n, 64)
    var m0 = block_idx.y * BM
    var total_st = kp // BK
    var st_begin = ks * total_st // nsplit
    var nst = (ks + 1) * total_st // nsplit - st_begin
    var my_band = min(band0 + nb_i, nbands - 1)
    var lane_row = lane // 4  # fragment row (weights) / token (activations) of this lane
    var lane_col = lane % 4

    # Per-channel scales / zeros: one row, read once.
    var magic = magic_value[dtype]()
    var z_pc = SIMD[dtype, 8]((magic + 8.0).cast[dtype]())
    var s_pc = SIMD[dtype, 8](1)
    comptime if PER_CHANNEL:
        var off = my_band * 64 + 8 * lane_row
        s_pc = s_ptr.unsafe_offset(off).unsafe_load[width=8, alignment=16]()
        comptime if has_zeros:
            z_pc = z_ptr.unsafe_offset(off).unsafe_load[width=8, alignment=16]() + magic.cast[dtype]()

    var acc = Array[SIMD[F32, 4], NQ](fill=SIMD[F32, 4](0))
    var xs_pc = Array[SIMD[F32, 4], MT](fill=SIMD[F32, 4](0))  # per-channel: Σx over the whole K share
    var ones = SIMD[dtype, 8](1)

    # ---- pipeline prologue: STAGES - 1 stages in flight ----
    comptime for s in range(STAGES - 1):
        if s < nst:
            _load_stage[dtype, group_size, has_zeros, cfg](
                w_s, x_s, s_s, z_s, qw_ptr, x_ptr, s_ptr, z_ptr,
                tid, st_begin + s, s, band0, nbands, m0, m, kp, np_,
            )
        async_copy_commit_group()

    for it in range(nst):
        async_copy_wait_group(Int32(STAGES - 2))
        barrier()  # stage `it` visible to all; slot (it - 1) % STAGES free for reuse
        var nxt = it + STAGES - 1
        if nxt < nst:
            _load_stage[dtype, group_size, has_zeros, cfg](
                w_s, x_s, s_s, z_s, qw_ptr, x_ptr, s_ptr, z_ptr,
                tid, st_begin + nxt, nxt % STAGES, band0, nbands, m0, m, kp, np_,
            )
        async_copy_commit_group()

        var slot = it % STAGES
        var wbase = slot * W_STAGE + nb_i * KT * WORDS_PER_TILE + lane * 4
        var xbase = slot * X_STAGE + (wm_i * WM + lane_row) * XS + 2 * lane_col

        comptime for j in range(NSUB):
            var t0 = kpart * KTW + j * SUBT  # first k-tile of this sub-chunk in the stage
            # group parameters of the sub-chunk: 8 values for rows lane_row + 8i
            var zv = z_pc
            var sv = s_pc
            comptime if not PER_CHANNEL:
                var srow = (t0 // GT) if SR > 1 else 0
                var soff = slot * S_STAGE + srow * BN + nb_i * 64 + 8 * lane_row
                sv = s_s.unsafe_offset(soff).unsafe_load[width=8, alignment=16]()
                comptime if has_zeros:
                    zv = z_s.unsafe_offset(soff).unsafe_load[width=8, alignment=16]() + magic.cast[dtype]()

            var accg = Array[SIMD[F32, 4], NQ](fill=SIMD[F32, 4](0))
            var xsg = Array[SIMD[F32, 4], MT](fill=SIMD[F32, 4](0))
            comptime for t in range(SUBT):
                var tl = t0 + t
                var wv = w_s.unsafe_offset(wbase + tl * WORDS_PER_TILE).unsafe_load[width=4, alignment=16]()
                var bfr = Array[SIMD[dtype, 4], MT](uninitialized=True)
                comptime for tm in range(MT):
                    var e = (xbase + tm * 8 * XS + tl * 16) // 2
                    var b0 = x32[unsafe_offset=e]
                    var b1 = x32[unsafe_offset=e + 4]
                    bfr[tm] = bitcast[dtype, 4](SIMD[DType.uint32, 2](b0, b1))
                comptime if ZSUM:
                    # Σ_k x[tok, k] over this k16 block, in every row of the fragment
                    comptime for tm in range(MT):
                        comptime if PER_CHANNEL:
                            mma(xs_pc[tm], ones, bfr[tm], xs_pc[tm])
                        else:
                            mma(xsg[tm], ones, bfr[tm], xsg[tm])
                comptime for w in range(4):
                    var a = _a_fragment[dtype, not ZSUM, not SCALE_AFTER](
                        wv[w],
                        SIMD[dtype, 2](zv[2 * w]), SIMD[dtype, 2](zv[2 * w + 1]),
                        SIMD[dtype, 2](sv[2 * w]), SIMD[dtype, 2](sv[2 * w + 1]),
                    )
                    comptime for tm in range(MT):
                        comptime q = w * MT + tm
                        comptime if SCALE_AFTER and not PER_CHANNEL:
                            mma(accg[q], a, bfr[tm], accg[q])
                        else:
                            mma(acc[q], a, bfr[tm], acc[q])
            comptime if SCALE_AFTER and not PER_CHANNEL:
                # acc += s * (Σ x (magic + q) - (magic + z) Σ x), per row (column of W)
                var sf = sv.cast[F32]()
                var zf = zv.cast[F32]()
                comptime for w in range(4):
                    var s4 = SIMD[F32, 4](sf[2 * w], sf[2 * w], sf[2 * w + 1], sf[2 * w + 1])
                    var z4 = SIMD[F32, 4](zf[2 * w], zf[2 * w], zf[2 * w + 1], zf[2 * w + 1])
                    comptime for tm in range(MT):
                        comptime q = w * MT + tm
                        acc[q] = (accg[q] - z4 * xsg[tm]).fma(s4, acc[q])

    # ---- epilogue ----
    async_copy_wait_group(Int32(0))
    barrier()  # the ring is free: reuse it for the reductions

    comptime if PER_CHANNEL and SCALE_AFTER:
        var sf = s_pc.cast[F32]()
        var zf = z_pc.cast[F32]()
        comptime for w in range(4):
            var s4 = SIMD[F32, 4](sf[2 * w], sf[2 * w], sf[2 * w + 1], sf[2 * w + 1])
            var z4 = SIMD[F32, 4](zf[2 * w], zf[2 * w], zf[2 * w + 1], zf[2 * w + 1])
            comptime for tm in range(MT):
                acc[w * MT + tm] = (acc[w * MT + tm] - z4 * xs_pc[tm]) * s4

    _reduce_and_store[dtype, has_bias, MT, KW, WARPS_MN, clusters](
        acc, red_s, c_ptr, b_ptr, kpart, wmn, lane, nsplit, ks,
        (band0 + nb_i) * 64, m0 + wm_i * WM, m, n,
    )


@always_inline
def _reduce_cluster[NQ: Int, WSTRIDE: Int, QSTRIDE: Int](
    mut acc: Array[SIMD[F32, 4], NQ],
    red_s: Pointer[Float32, MutUntrackedOrigin, address_space=AddressSpace.SHARED],
    kpart: Int, wmn: Int, lane: Int, nsplit: Int, ks: Int,
):
    """Split-K over the (nsplit, 1, 1) cluster: CTA `ks` sums the accumulator quads q with
    q % nsplit == ks through distributed shared memory (nothing when nsplit == 1). Needs
    thread-block clusters (sm_90+): kernels built with clusters = False never call it."""
    if nsplit > 1:
        var base = wmn * WSTRIDE + lane * 4
        if kpart == 0:
            comptime for q in range(NQ):
                red_s.unsafe_offset(base + q * QSTRIDE).unsafe_store[alignment=16](acc[q])
        cluster_sync()
        if kpart == 0:
            comptime for q in range(NQ):
                if q % nsplit == ks:
                    var total = SIMD[F32, 4](0)
                    for r in range(nsplit):
                        total += load_cluster_smem[F32, 4](red_s.unsafe_offset(base + q * QSTRIDE), UInt32(r))
                    acc[q] = total
        cluster_sync()  # peers' shared memory must outlive every remote read


@always_inline
def _store_quad[dtype: DType, has_bias: Bool, MT: Int, q: Int](
    v_in: SIMD[F32, 4],
    c_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    b_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    lane: Int, n0: Int, tok0: Int, m: Int, n: Int,
):
    """+ bias, cast, masked stores of accumulator quad q = w * MT + tm: the m16n8 fragment of
    columns n0 + 16w + l/4 (+8) and tokens tok0 + 8tm + 2(l%4) (+1)."""
    comptime w = q // MT
    comptime tm = q % MT
    var v = v_in
    var n_lo = n0 + 16 * w + lane // 4
    var n_hi = n_lo + 8
    var tok = tok0 + tm * 8 + 2 * (lane % 4)
    comptime if has_bias:
        if n_lo < n:
            var bl = b_ptr[unsafe_offset=n_lo].cast[F32]()
            v[0] += bl
            v[1] += bl
        if n_hi < n:
            var bh = b_ptr[unsafe_offset=n_hi].cast[F32]()
            v[2] += bh
            v[3] += bh
    if tok < m:
        if n_lo < n:
            c_ptr[unsafe_offset=tok * n + n_lo] = v[0].cast[dtype]()
        if n_hi < n:
            c_ptr[unsafe_offset=tok * n + n_hi] = v[2].cast[dtype]()
    if tok + 1 < m:
        if n_lo < n:
            c_ptr[unsafe_offset=(tok + 1) * n + n_lo] = v[1].cast[dtype]()
        if n_hi < n:
            c_ptr[unsafe_offset=(tok + 1) * n + n_hi] = v[3].cast[dtype]()


@always_inline
def _reduce_spread_and_store[
    dtype: DType, has_bias: Bool, MT: Int, KW: Int, WARPS_MN: Int, clusters: Bool
](
    mut acc: Array[SIMD[F32, 4], 4 * MT],
    red_s: Pointer[Float32, MutUntrackedOrigin, address_space=AddressSpace.SHARED],
    c_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    b_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    kpart: Int, wmn: Int, lane: Int, nsplit: Int, ks: Int, n0: Int, tok0: Int, m: Int, n: Int,
):
    """`_reduce_and_store` with the work spread over the warp-k partitions (the decode kernel,
    whose 8-partition configs would otherwise leave one warp summing 7 partials of every quad
    while 7 wait): every partition writes its quads to shared memory, warp `kpart` sums the
    quads q with q % KW == kpart over the partitions (into partition 0's slot), then, over
    the split-K cluster, CTA `ks` sums the quads with q % nsplit == ks through distributed
    shared memory, and each quad's owner stores it. Layout: [partition][warp][quad][lane][4]
    f32, KW * WARPS_MN * 4MT * 512 bytes (config.smem_usage counts every partition).
    Every thread of the CTA must call this (it contains barriers and cluster barriers)."""
    comptime NQ = 4 * MT
    comptime QSTRIDE = 32 * 4
    comptime PSTRIDE = WARPS_MN * NQ * QSTRIDE
    var base = wmn * NQ * QSTRIDE + lane * 4
    comptime if KW > 1:
        comptime for q in range(NQ):
            red_s.unsafe_offset(kpart * PSTRIDE + base + q * QSTRIDE).unsafe_store[alignment=16](acc[q])
        barrier()
        comptime for q in range(NQ):
            if q % KW == kpart:
                var tot = red_s.unsafe_offset(base + q * QSTRIDE).unsafe_load[width=4, alignment=16]()
                comptime for p in range(1, KW):
                    tot += red_s.unsafe_offset(p * PSTRIDE + base + q * QSTRIDE).unsafe_load[width=4, alignment=16]()
                acc[q] = tot
    comptime if clusters:
        if nsplit > 1:
            comptime if KW == 1:
                comptime for q in range(NQ):
                    red_s.unsafe_offset(base + q * QSTRIDE).unsafe_store[alignment=16](acc[q])
            else:
                comptime for q in range(NQ):
                    if q % KW == kpart:
                        red_s.unsafe_offset(base + q * QSTRIDE).unsafe_store[alignment=16](acc[q])
            cluster_sync()
            comptime for q in range(NQ):
                if q % KW == kpart and q % nsplit == ks:
                    var total = SIMD[F32, 4](0)
                    for r in range(nsplit):
                        total += load_cluster_smem[F32, 4](red_s.unsafe_offset(base + q * QSTRIDE), UInt32(r))
                    acc[q] = total
            cluster_sync()  # peers' shared memory must outlive every remote read
    comptime for q in range(NQ):
        if q % KW == kpart and (nsplit == 1 or q % nsplit == ks):
            _store_quad[dtype, has_bias, MT, q](acc[q], c_ptr, b_ptr, lane, n0, tok0, m, n)


@always_inline
def _reduce_and_store[
    dtype: DType, has_bias: Bool, MT: Int, KW: Int, WARPS_MN: Int, clusters: Bool
](
    mut acc: Array[SIMD[F32, 4], 4 * MT],
    red_s: Pointer[Float32, MutUntrackedOrigin, address_space=AddressSpace.SHARED],
    c_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    b_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    kpart: Int, wmn: Int, lane: Int, nsplit: Int, ks: Int, n0: Int, tok0: Int, m: Int, n: Int,
):
    """Warp-k partitions -> partition 0 through shared memory, then the cluster's split-K
    CTAs through distributed shared memory (CTA `ks` sums the accumulator quads q with
    q % nsplit == ks), then + bias, cast, masked stores of C[tok, n].

    Call after the main loop has drained and a barrier: `red_s` reuses the pipeline's smem.
    clusters = False (targets without thread-block clusters) leaves out the cluster step: the
    dispatch then runs split_k = 1.
    acc[w * MT + tm] is the m16n8 fragment of columns n0 + 16w + l/4 (+8) and tokens
    tok0 + 8tm + 2(l%4) (+1). Layout of the buffers: [partition][warp][quad][lane][4] f32.
    Every thread of the CTA must call this (it contains barriers and cluster barriers).
    """
    comptime NQ = 4 * MT
    comptime QSTRIDE = 32 * 4
    comptime WSTRIDE = NQ * QSTRIDE
    comptime if KW > 1:
        if kpart > 0:
            var base = ((kpart - 1) * WARPS_MN + wmn) * WSTRIDE + lane * 4
            comptime for q in range(NQ):
                red_s.unsafe_offset(base + q * QSTRIDE).unsafe_store[alignment=16](acc[q])
        barrier()
        if kpart == 0:
            comptime for p in range(1, KW):
                var base = ((p - 1) * WARPS_MN + wmn) * WSTRIDE + lane * 4
                comptime for q in range(NQ):
                    acc[q] += red_s.unsafe_offset(base + q * QSTRIDE).unsafe_load[width=4, alignment=16]()
        barrier()

    comptime if clusters:
        _reduce_cluster[NQ, WSTRIDE, QSTRIDE](acc, red_s, kpart, wmn, lane, nsplit, ks)

    if kpart == 0:
        comptime for q in range(NQ):
            if nsplit == 1 or q % nsplit == ks:
                _store_quad[dtype, has_bias, MT, q](acc[q], c_ptr, b_ptr, lane, n0, tok0, m, n)


def int4_gemv_kernel[
    dtype: DType, group_size: Int, has_zeros: Bool, has_bias: Bool, cfg: Int4GemmConfig,
    clusters: Bool = True,
](
    c_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    x_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    qw_ptr: Pointer[UInt32, MutAnyOrigin],
    s_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    z_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    b_ptr: Pointer[Scalar[dtype], MutAnyOrigin],
    m_dim: Int32,
    n_dim: Int32,
    kp_dim: Int32,
    np_dim: Int32,
    split_k: Int32,
):
    """Decode kernel (M <= 16, cfg.pipeline == PIPE_WARP): same math and grid as
    `int4_gemm_mma_kernel`, but without any barrier in the main loop.

    Warp w owns band band0 + w % (bn/64) and K part w / (bn/64) of the CTA's K share, and
    streams it through its own cp.async ring of cfg.stages chunks of bk/16 tiles: each lane
    copies its 16 bytes of every packed tile and of the group's scales / zeros (data only it
    reads) and a share of the chunk's activation rows (16-byte pieces, read by the whole
    warp after a __syncwarp). So warps never wait for each other until the epilogue. Scale
    and zero point are applied per group after the MMA (Σx via an all-ones MMA), or, with
    cfg.dequant_first, to the weights before it (bf16x2 / f16x2, as the larger-M kernels do).
    """
    comptime MT = cfg.wm // 8
    comptime NB = cfg.bn // 64
    comptime KW = cfg.warp_k
    comptime U = cfg.bk // 16  # k-tiles per chunk
    comptime S = cfg.stages
    comptime PER_CHANNEL = group_size <= 0
    comptime GT = U if PER_CHANNEL else group_size // 16  # k-tiles per group
    comptime GS = 0 if PER_CHANNEL else max(1, U // GT)  # group rows per chunk
    comptime ALIGN = max(U, GT)  # K parts are multiples of this many tiles
    comptime LW = U * 16 * 32  # bytes: weights of one chunk, all lanes
    comptime XRS = U * 16 + 8  # activation row stride in the stage (elements, 16 B padding)
    comptime LX = MT * 8 * XRS * 2  # activations: the warp's 8*MT token rows of the chunk
    comptime XPIECES = MT * 8 * U * 2  # 16-byte pieces of those rows
    comptime LS = GS * 16 * 32  # scales (zeros: same again)
    comptime STAGE = LW + LX + LS * (2 if has_zeros else 1)
    comptime NQ = 4 * MT
    comptime assert cfg.is_valid() and cfg.pipeline == 1, "int4_gemv_kernel needs a PIPE_WARP config"
    comptime assert PER_CHANNEL or group_size % 16 == 0, "group_size must be a multiple of 16"
    comptime assert PER_CHANNEL or U % GT == 0 or GT % U == 0, "bk vs group_size"
    comptime assert dtype == DType.bfloat16 or dtype == DType.float16, "bf16 / fp16 only"

    var smem = external_memory[UInt8, address_space=AddressSpace.SHARED, alignment=16]()
    var tid = thread_idx.x
    var lane = tid % 32
    var warp = tid // 32
    var nb_i = warp % NB
    var kpart = warp // NB
    var ring = smem.unsafe_offset(warp * S * STAGE)
    var m = Int(m_dim)
    var n = Int(n_dim)
    var kp = Int(kp_dim)
    var np_ = Int(np_dim)
    var nsplit = Int(split_k)
    var ks = block_idx.x % nsplit
    var band0 = (block_idx.x // nsplit) * NB
    var nbands = ceildiv(n, 64)
    var band = min(band0 + nb_i, nbands - 1)
    var m0 = block_idx.y * cfg.bm
    var lane_row = lane // 4
    var lane_col = lane % 4

    # this warp's tiles: part (ks, kpart) of the band's kp/16 tiles, in units of ALIGN tiles
    var units = kp // 16 // ALIGN
    var part = ks * KW + kpart
    var parts = nsplit * KW
    var t_begin = part * units // parts * ALIGN
    var nchunks = ((part + 1) * units // parts * ALIGN - t_begin) // U

    # per-lane sources; a chunk c adds c * U tiles
    var w_src = qw_ptr.unsafe_offset(band * kp * 8 + t_begin * WORDS_PER_TILE + lane * 4)
    # activations: lane copies 16-byte pieces p = i * 32 + lane (row p / 2U, column (p % 2U) * 8)
    # of the rows of real tokens; rows >= M are never copied (their garbage only reaches C
    # columns that are not stored). L1-allocating copies: the CTA's warps share these rows.
    comptime XPL = ceildiv(XPIECES, 32)
    var x_src = Array[Pointer[Scalar[dtype], MutAnyOrigin], XPL](uninitialized=True)
    var x_dst = Array[Int, XPL](uninitialized=True)
    var x_ok = Array[Bool, XPL](uninitialized=True)
    comptime for i in range(XPL):
        var p = min(i * 32 + lane, XPIECES - 1)
        var row = p // (2 * U)
        var col = (p % (2 * U)) * 8
        var tok = min(m0 + row, m - 1)
        x_src[i] = x_ptr.unsafe_offset(tok * kp + t_begin * 16 + col)
        x_dst[i] = LW + (row * XRS + col) * 2
        x_ok[i] = i * 32 + lane < XPIECES and m0 + row < m
    var s_col = band * 64 + 8 * lane_row

    var magic = magic_value[dtype]()
    var z_pc = SIMD[dtype, 8]((magic + 8.0).cast[dtype]())
    var s_pc = SIMD[dtype, 8](1)
    comptime if PER_CHANNEL:
        s_pc = s_ptr.unsafe_offset(s_col).unsafe_load[width=8, alignment=16]()
        comptime if has_zeros:
            z_pc = z_ptr.unsafe_offset(s_col).unsafe_load[width=8, alignment=16]() + magic.cast[dtype]()

    @always_inline
    @__parameter
    def issue_weights(c: Int):
        # packed weights and group scales / zeros of chunk c: graph constants, which no
        # earlier kernel writes, so they may be fetched before the PDL wait
        var st = ring.unsafe_offset((c % S) * STAGE)
        comptime for j in range(U):
            async_copy[16](
                _global(w_src.unsafe_offset((c * U + j) * WORDS_PER_TILE)),
                st.unsafe_offset((j * 32 + lane) * 16).unsafe_bitcast[UInt32](),
            )
        comptime for gi in range(GS):
            var grp = (t_begin + c * U) // GT + gi
            var off = grp * np_ + s_col
            var sd = st.unsafe_offset(LW + LX + (gi * 32 + lane) * 16).unsafe_bitcast[Scalar[dtype]]()
            async_copy[16](_global(s_ptr.unsafe_offset(off)), sd)
            comptime if has_zeros:
                async_copy[16](_global(z_ptr.unsafe_offset(off)), sd.unsafe_offset(LS // 2))

    @always_inline
    @__parameter
    def issue_activations(c: Int):
        var st = ring.unsafe_offset((c % S) * STAGE)
        comptime for i in range(XPL):
            if x_ok[i]:
                async_copy[16, bypass_L1_16B=False](
                    _global(x_src[i].unsafe_offset(c * U * 16)),
                    st.unsafe_offset(x_dst[i]).unsafe_bitcast[Scalar[dtype]](),
                )

    @always_inline
    @__parameter
    def issue(c: Int):
        issue_weights(c)
        issue_activations(c)

    # B fragments by ldmatrix.x4 (lane 8i + r addresses row r of matrix i): two token tiles,
    # matrix i = (token tile i / 2, k half i % 2) of tile j; one token tile, matrix i = k half
    # i % 2 of tile j + i / 2 (tiles j, j + 1 at even j, kept for the odd one)
    comptime assert MT != 1 or U % 2 == 0, "the one-token-tile ldmatrix covers k-tile pairs"
    var ldm_off = LW + ((((lane // 16) * 8) + lane % 8) * XRS + ((lane // 8) % 2) * 8) * 2
    comptime if MT == 1:
        ldm_off = LW + ((lane % 8) * XRS + (lane // 8) * 8) * 2
    var xpair = SIMD[DType.uint32, 4](0)

    @always_inline
    @__parameter
    def b_fragments[j: Int](
        st: Pointer[UInt8, MutUntrackedOrigin, address_space=AddressSpace.SHARED]
    ) -> Array[SIMD[dtype, 4], MT]:
        """The B fragments (activations) of k-tile j of the chunk at `st`, per token tile."""
        var bfr = Array[SIMD[dtype, 4], MT](uninitialized=True)
        comptime if MT == 2:
            var r = _ldmatrix_x4(UInt32(Int(st.unsafe_offset(ldm_off + j * 32))))
            bfr[0] = bitcast[dtype, 4](SIMD[DType.uint32, 2](r[0], r[1]))
            bfr[1] = bitcast[dtype, 4](SIMD[DType.uint32, 2](r[2], r[3]))
        else:
            comptime if j % 2 == 0:
                xpair = _ldmatrix_x4(UInt32(Int(st.unsafe_offset(ldm_off + j * 32))))
                bfr[0] = bitcast[dtype, 4](SIMD[DType.uint32, 2](xpair[0], xpair[1]))
            else:
                bfr[0] = bitcast[dtype, 4](SIMD[DType.uint32, 2](xpair[2], xpair[3]))
        return bfr^

    var acc = Array[SIMD[F32, 4], NQ](fill=SIMD[F32, 4](0))
    var accg = Array[SIMD[F32, 4], NQ](fill=SIMD[F32, 4](0))
    var xsg = Array[SIMD[F32, 4], MT](fill=SIMD[F32, 4](0))
    var ones = SIMD[dtype, 8](1)

    @always_inline
    @__parameter
    def rescale(sv: SIMD[dtype, 8], zv: SIMD[dtype, 8]):
        # acc += s * (Σ x (magic + q) - (magic + z) Σ x); then the group sums restart
        var sf = sv.cast[F32]()
        var zf = zv.cast[F32]()
        comptime for w in range(4):
            var s4 = SIMD[F32, 4](sf[2 * w], sf[2 * w], sf[2 * w + 1], sf[2 * w + 1])
            var z4 = SIMD[F32, 4](zf[2 * w], zf[2 * w], zf[2 * w + 1], zf[2 * w + 1])
            comptime for tm in range(MT):
                comptime q = w * MT + tm
                acc[q] = (accg[q] - z4 * xsg[tm]).fma(s4, acc[q])
                accg[q] = SIMD[F32, 4](0)
        comptime for tm in range(MT):
            xsg[tm] = SIMD[F32, 4](0)

    # Programmatic dependent launch: the weights of the first S - 1 chunks are requested
    # while the previous kernel may still run; the activations (its output) only after
    # wait_on_dependent_grids, which returns once that kernel has completed and its stores
    # are visible. The first commit group holds those weights, so the ring's accounting
    # (chunk c complete once group c is) is unchanged. Releasing the dependents at entry only
    # lets the next kernel's CTAs become resident: they wait the same way before reading this
    # kernel's output. Both are no-ops on targets without PDL.
    launch_dependent_grids()
    comptime for s in range(S - 1):
        if s < nchunks:
            issue_weights(s)
    wait_on_dependent_grids()
    comptime for s in range(S - 1):
        if s < nchunks:
            issue_activations(s)
        async_copy_commit_group()

    for c in range(nchunks):
        async_copy_wait_group(Int32(S - 2))  # this lane's copies of chunk c have landed
        syncwarp()  # ... and every lane's (activation rows are shared by the warp)
        var st = ring.unsafe_offset((c % S) * STAGE)
        comptime if cfg.dequant_first:
            # ((magic + q) - (magic + z)) * s in dtype x2 before the MMA: one accumulator set,
            # no Σx MMA, no per-group rescale (fewer registers for the 16-token tiles)
            comptime for j in range(U):
                var sv = s_pc
                var zv = z_pc
                comptime if not PER_CHANNEL:
                    comptime gi = j // GT if GS > 1 else 0
                    var sd = st.unsafe_offset(LW + LX + (gi * 32 + lane) * 16).unsafe_bitcast[Scalar[dtype]]()
                    sv = sd.unsafe_load[width=8, alignment=16]()
                    comptime if has_zeros:
                        zv = sd.unsafe_offset(LS // 2).unsafe_load[width=8, alignment=16]() + magic.cast[dtype]()
                var wv = st.unsafe_offset((j * 32 + lane) * 16).unsafe_bitcast[UInt32]().unsafe_load[width=4, alignment=16]()
                var bfr = b_fragments[j](st)
                comptime for w in range(4):
                    var a = _a_fragment[dtype, True, True](
                        wv[w], SIMD[dtype, 2](zv[2 * w]), SIMD[dtype, 2](zv[2 * w + 1]),
                        SIMD[dtype, 2](sv[2 * w]), SIMD[dtype, 2](sv[2 * w + 1]))
                    comptime for tm in range(MT):
                        comptime q = w * MT + tm
                        mma(acc[q], a, bfr[tm], acc[q])
        else:
            comptime for j in range(U):
                var wv = st.unsafe_offset((j * 32 + lane) * 16).unsafe_bitcast[UInt32]().unsafe_load[width=4, alignment=16]()
                var bfr = b_fragments[j](st)
                comptime for tm in range(MT):
                    mma(xsg[tm], ones, bfr[tm], xsg[tm])
                comptime for w in range(4):
                    var a = _a_fragment[dtype, False, False](wv[w], SIMD[dtype, 2](0), SIMD[dtype, 2](0), SIMD[dtype, 2](0), SIMD[dtype, 2](0))
                    comptime for tm in range(MT):
                        comptime q = w * MT + tm
                        mma(accg[q], a, bfr[tm], accg[q])
                comptime if GS > 1:
                    comptime if (j + 1) % GT == 0:
                        # several groups per chunk: rescale at each group's last tile
                        var sd = st.unsafe_offset(LW + LX + ((j // GT) * 32 + lane) * 16).unsafe_bitcast[Scalar[dtype]]()
                        var zv = z_pc
                        comptime if has_zeros:
                            zv = sd.unsafe_offset(LS // 2).unsafe_load[width=8, alignment=16]() + magic.cast[dtype]()
                        rescale(sd.unsafe_load[width=8, alignment=16](), zv)
            comptime if GS == 1:
                if (t_begin + (c + 1) * U) % GT == 0:  # this chunk ends a group
                    var sd = st.unsafe_offset(LW + LX + lane * 16).unsafe_bitcast[Scalar[dtype]]()
                    var zv = z_pc
                    comptime if has_zeros:
                        zv = sd.unsafe_offset(LS // 2).unsafe_load[width=8, alignment=16]() + magic.cast[dtype]()
                    rescale(sd.unsafe_load[width=8, alignment=16](), zv)
        # refill the slot read in the previous iteration (every lane has passed this
        # iteration's syncwarp, so all reads of that slot are done)
        if c + S - 1 < nchunks:
            issue(c + S - 1)
        async_copy_commit_group()

    comptime if PER_CHANNEL and not cfg.dequant_first:
        rescale(s_pc, z_pc)

    async_copy_wait_group(Int32(0))
    barrier()  # all rings drained: reuse the smem for the reductions
    _reduce_spread_and_store[dtype, has_bias, MT, KW, NB, clusters](
        acc, smem.unsafe_bitcast[Float32](), c_ptr, b_ptr, kpart, nb_i, lane, nsplit, ks,
        (band0 + nb_i) * 64, m0, m, n,
    )

"""Problem shape and the persistent tile scheduler of `grouped_matmul_sm100_persistent`.

Semantics every path (CPU, naive GPU, SM90, SM100) shares:

- a [A_rows, K] tokens sorted by group; b [E, N, K] (expert e's weight is [N, K]); c [T, Nc]
  with Nc = N, or N / 2 with the SwiGLU epilogue. A_rows = T, or 3 T with a_plane_splits.
- Group g (g < G = len(expert_ids)) owns rows [a_offsets[g], a_offsets[g + 1]) of c.
- Only groups g < G_active = expert_usage_stats[1] are visited; the others touch nothing.
- Runtime data is trusted but clamped so that nothing outside c / a / b is ever accessed:
  * G_active is clamped to G;
  * a group's row range is [min(a_offsets[g], T), min(a_offsets[g + 1], T)) and is EMPTY when
    that is not increasing (non-monotone offsets skip the group; overlapping ranges may write
    the same rows twice, still inside c);
  * an expert id outside [0, E) (−1 or >= E) makes the group's rows zeros (no weight is read).
- a_plane_splits (s0, s1), on when s0 > 0: a is a [3 T, K] Q/K/V plane stack and matmul column
  n reads plane p(n) = 0 if n < s0, 1 if n < s1, else 2, i.e. a row `token + p * T`.
  s0 and s1 are multiples of PLANE_ALIGN (= every kernel's column tile) so a tile has one plane.

The scheduler: work is a linear index over the tiles of the active groups, groups
concatenated in order; a group with `rows` tokens has R = ceil(rows / BN) token tiles and
W = ceil(N / BM) weight tiles. A persistent CTA takes indices block_idx.x, block_idx.x +
grid_dim.x, ...; every warp role runs its own copy and they agree without talking. It reads
a_offsets / expert_ids / expert_usage_stats on the device only.

Order inside a group (`panel_tile`): panels of p = ceil(grid / R) weight tiles, each panel's
p x R tiles one after another (weight tile fastest inside the panel). The grid's CTAs work on
about one panel at a time, so every weight tile is read from HBM once and the group's token
tiles stay in L2 across its panels. With the weight tile fastest over the whole group, a group
wider than one wave (Mixtral's gate_up: W = 224, R = 4 at T = 4096) re-read its weights from
HBM once per token tile. R = 1 (every decode group) keeps that order exactly.
"""

from std.math import ceildiv
from std.utils.index import IndexList

comptime U32Ptr = Pointer[UInt32, MutAnyOrigin]
comptime I32Ptr = Pointer[Int32, MutAnyOrigin]
comptime F32Ptr = Pointer[Float32, MutAnyOrigin]
comptime ElemPtr[dtype: DType] = Pointer[Scalar[dtype], MutAnyOrigin]

comptime OP_NAME = "grouped_matmul_sm100_persistent"
comptime PLANE_ALIGN = 128
"""a_plane_splits must be multiples of this (the widest column tile of any kernel)."""
comptime SWIGLU_BLOCK = 8
"""SwiGLU weight interleave: matmul columns [16j, 16j + 8) are gate_j, [16j + 8, 16j + 16) up_j."""


@always_inline
def plane_of[s0: Int, s1: Int](n: Int) -> Int:
    """Q/K/V plane (0, 1, 2) read by matmul column `n`; always 0 when planes are off."""
    comptime if s0 <= 0:
        return 0
    else:
        if n < s0:
            return 0
        return 1 if n < s1 else 2


@always_inline
def swiglu_gate_col(i: Int) -> Int:
    """Matmul column of the gate of output column `i` (its up is 8 columns further)."""
    return 2 * SWIGLU_BLOCK * (i // SWIGLU_BLOCK) + i % SWIGLU_BLOCK


@fieldwise_init
struct GroupedShape(ImplicitlyCopyable):
    """Validated run-time shape of one grouped matmul call (all tensors dense row-major)."""

    var T: Int
    """Rows of c (tokens)."""
    var K: Int
    var N: Int
    """Matmul columns (b.dim(1))."""
    var Nc: Int
    """Columns of c: N, or N / 2 with SwiGLU."""
    var E: Int
    """Experts (b.dim(0))."""
    var G: Int
    """Groups (len(expert_ids)); a_offsets has G + 1 entries."""
    var a_rows: Int
    """Rows of a: T, or 3 T with plane splits."""

    @staticmethod
    def validate[s0: Int, s1: Int, swiglu: Bool, has_row_scale: Bool](
        c_shape: IndexList[2],
        a_shape: IndexList[2],
        b_shape: IndexList[3],
        num_offsets: Int,
        num_ids: Int,
        num_stats: Int,
        row_scale_len: Int,
    ) raises -> Self:
        """Checks every shape and returns the problem; raises an Error naming the first bad one."""
        comptime assert s0 == 0 and s1 == 0 or (
            0 < s0 and s0 <= s1 and s0 % PLANE_ALIGN == 0 and s1 % PLANE_ALIGN == 0
        ), String(OP_NAME, ": a_plane_splits must be (0, 0) or 0 < s0 <= s1, multiples of 128")
        var T = c_shape[0]
        var K = a_shape[1]
        var E = b_shape[0]
        var N = b_shape[1]
        if K <= 0 or b_shape[2] != K:
            raise Error(OP_NAME, ": b.dim(2) = ", b_shape[2], " must equal a.dim(1) = K = ", K, " > 0")
        if N <= 0 or E <= 0:
            raise Error(OP_NAME, ": b must be [E, N, K] with E, N > 0, got E = ", E, ", N = ", N)
        var Nc = N
        comptime if swiglu:
            if N % (2 * SWIGLU_BLOCK) != 0:
                raise Error(OP_NAME, ": the SwiGLU epilogue needs N = b.dim(1) a multiple of 16, got ", N)
            Nc = N // 2
        if c_shape[1] != Nc:
            raise Error(OP_NAME, ": c.dim(1) = ", c_shape[1], " but expected ", Nc)
        var a_rows = T
        comptime if s0 > 0:
            a_rows = 3 * T
            if s1 > N:
                raise Error(OP_NAME, ": a_plane_splits[1] = ", s1, " exceeds N = ", N)
        if a_shape[0] != a_rows:
            raise Error(OP_NAME, ": a.dim(0) = ", a_shape[0], " but c has ", T,
                        " rows (a must have 3 T rows with plane splits, else T)")
        if num_offsets != num_ids + 1:
            raise Error(OP_NAME, ": a_offsets has ", num_offsets, " entries but expert_ids has ",
                        num_ids, " (need G + 1 and G)")
        if num_stats != 2:
            raise Error(OP_NAME, ": expert_usage_stats must have 2 entries, got ", num_stats)
        comptime if has_row_scale:
            if row_scale_len != T:
                raise Error(OP_NAME, ": row_scale has ", row_scale_len, " entries but c has ", T, " rows")
        return Self(T=T, K=K, N=N, Nc=Nc, E=E, G=num_ids, a_rows=a_rows)


@always_inline
def group_row_range(a_offsets: U32Ptr, g: Int, T: Int) -> Tuple[Int, Int]:
    """Clamped rows [start, end) of group g; end <= start means empty."""
    var start = min(Int(a_offsets[unsafe_offset=g]), T)
    var end = min(Int(a_offsets[unsafe_offset=g + 1]), T)
    return (start, end)


@always_inline
def valid_expert(expert: Int, E: Int) -> Bool:
    """True when the group computes a product; otherwise its rows are zero-filled."""
    return expert >= 0 and expert < E


@always_inline
def active_groups(stats: U32Ptr, G: Int) -> Int:
    """G_active = expert_usage_stats[1], clamped to G."""
    return min(Int(stats[unsafe_offset=1]), G)


@always_inline
def panel_tile(local: Int, R: Int, W: Int, wave: Int) -> Tuple[Int, Int]:
    """(token tile, weight tile) of tile `local` of a group of R token tiles x W weight tiles,
    in the panel order (module docstring): panels of p = ceil(wave / R) weight tiles (at most
    W), the last one narrower. A bijection of [0, R W) onto the tiles (R >= 1). 32-bit
    arithmetic: 64-bit divisions cost the persistent kernels registers (spills)."""
    var r = UInt32(R)
    var w = UInt32(W)
    var p = min(w, max(UInt32(1), (UInt32(wave) + r - 1) // r))
    var span = p * r
    var panel = UInt32(local) // span
    var w0 = panel * p
    var pw = min(p, w - w0)
    var within = UInt32(local) - panel * span
    return (Int(within // pw), Int(w0 + within % pw))


@fieldwise_init
struct WorkTile(ImplicitlyCopyable):
    """One unit of work: a weight tile x token tile of one group."""

    var group: Int
    var expert: Int
    """Expert id as stored (may be invalid: see valid_expert)."""
    var m: Int
    """First matmul column (weight row) of the tile."""
    var row0: Int
    """First token row of the tile (absolute row of c)."""
    var row_end: Int
    """End of the group's rows: rows >= row_end belong to another group."""
    var done: Bool
    """No more work for this CTA."""


struct GroupedTileScheduler[BM: Int, BN: Int](ImplicitlyCopyable):
    """Walks the linear work index of one persistent CTA over groups x token tiles x weight tiles.

    BM: matmul columns (weight rows) per tile; BN: tokens per tile. Indices only increase, so
    the scheduler keeps the group it is in and the first index of that group.
    """

    var a_offsets: Pointer[UInt32, MutUntrackedOrigin]
    var expert_ids: Pointer[Int32, MutUntrackedOrigin]
    var T: Int
    var G_active: Int
    var n_weight_tiles: Int
    var group: Int
    var group_base: Int
    var group_start: Int
    var group_end: Int
    var group_tiles: Int
    var group_token_tiles: Int
    var idx: Int
    var stride: Int

    @always_inline
    def __init__(
        out self,
        a_offsets: U32Ptr,
        expert_ids: I32Ptr,
        stats: U32Ptr,
        T: Int,
        N: Int,
        G: Int,
        first: Int,
        stride: Int,
    ):
        self.a_offsets = a_offsets.unsafe_origin_cast[MutUntrackedOrigin]()
        self.expert_ids = expert_ids.unsafe_origin_cast[MutUntrackedOrigin]()
        self.T = T
        self.G_active = active_groups(stats, G)
        self.n_weight_tiles = ceildiv(N, Self.BM)
        self.group = -1
        self.group_base = 0
        self.group_start = 0
        self.group_end = 0
        self.group_tiles = 0
        self.group_token_tiles = 0
        self.idx = first
        self.stride = stride

    @always_inline
    def _enter_group(mut self, g: Int):
        self.group = g
        var r = group_row_range(self.a_offsets.as_unsafe_any_origin(), g, self.T)
        self.group_start = r[0]
        self.group_end = r[1]
        var rows = max(r[1] - r[0], 0)
        self.group_token_tiles = ceildiv(rows, Self.BN)
        self.group_tiles = self.group_token_tiles * self.n_weight_tiles

    @always_inline
    def next(mut self) -> WorkTile:
        """The next tile of this CTA (done = True when none is left)."""
        if self.group < 0:
            if self.G_active <= 0:
                return WorkTile(0, 0, 0, 0, 0, True)
            self._enter_group(0)
        while self.idx >= self.group_base + self.group_tiles:
            self.group_base += self.group_tiles
            if self.group + 1 >= self.G_active:
                self.group = self.G_active
                self.group_tiles = 0
                return WorkTile(0, 0, 0, 0, 0, True)
            self._enter_group(self.group + 1)
        var local = self.idx - self.group_base
        self.idx += self.stride
        var tiles = panel_tile(local, self.group_token_tiles, self.n_weight_tiles, self.stride)
        var m = tiles[1] * Self.BM
        var row0 = self.group_start + tiles[0] * Self.BN
        var expert = Int(self.expert_ids[unsafe_offset=self.group])
        return WorkTile(self.group, expert, m, row0, self.group_end, False)

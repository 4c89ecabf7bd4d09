"""The packed int4 weight layout of `multistage_gemm_q`, Mojo side.

This is the one place in Mojo that knows the layout defined by
python/mojo_gemm/int4/layout.py (keep the two in sync):

- qweight: uint32 [Np / 64, Kp * 8]. Row T is the 64-column band n in [64T, 64T + 64); along
  the row, 16(K) x 64(N) tiles of 128 words follow each other in K order. Inside a tile, word
  `4 * lane + w` (lane 0..31, w 0..3) holds in nibble j (bits 4j..4j+3) the code of
  n_local = lane // 4 + 16 * w + 8 * ((j >> 1) & 1),
  k_local = 2 * (lane % 4) + 8 * (j & 1) + (j >> 2).
- scales / zeros: [Kp / g, Np] with an 8 x 8 transpose inside every 64 columns:
  stored[grp, 64T + 8r + i] = logical[grp, 64T + r + 8i].

It also holds `Int4GemmShape`, the run-time shape checks every path relies on.
"""

from std.utils.index import IndexList

comptime N_TILE = 64
"""Output columns per packed band."""
comptime K_TILE = 16
"""K extent of one packed tile."""
comptime K_ALIGN = 128
"""Kp is a multiple of this."""
comptime PACK_FACTOR = 8
"""4-bit codes per uint32 word."""
comptime WORDS_PER_TILE = K_TILE * N_TILE // PACK_FACTOR
"""Words in one 16 x 64 tile (128)."""


@always_inline
def tile_n_local(word: Int, nibble: Int) -> Int:
    """Column (0..63 inside the band) of nibble `nibble` of word `word` (0..127) of a tile."""
    return (word // 4) // 4 + 16 * (word % 4) + 8 * ((nibble >> 1) & 1)


@always_inline
def tile_k_local(word: Int, nibble: Int) -> Int:
    """K row (0..15 inside the tile) of nibble `nibble` of word `word` (0..127) of a tile."""
    return 2 * ((word // 4) % 4) + 8 * (nibble & 1) + (nibble >> 2)


@always_inline
def tile_word_offset(k: Int) -> Int:
    """Offset, in words along a band row of qweight, of the tile that holds K index `k`."""
    return (k // K_TILE) * WORDS_PER_TILE


@always_inline
def permuted_col(col: Int) -> Int:
    """Stored column of logical column `col` in scales/zeros (the 8 x 8 transpose inside each
    64 columns). The transpose is its own inverse, so this also maps stored -> logical."""
    return (col & ~(N_TILE - 1)) | ((col & 7) << 3) | ((col >> 3) & 7)


# ---- Row view of a tile (the CPU decode) -------------------------------------------------
# Write lane = 4a + b (a = lane // 4 in 0..7, b = lane % 4) and j = j0 + 2*j1 + 4*j2. The maps
# above become n_local = a + 8*j1 + 16*w and k_local = 2b + 8*j0 + j2, in word 16a + 4b + w.
# So for one K row (fixed b, j0, j2) the 64 codes sit in the 32 words {16a + 4b + w}, nibbles
# j1 = 0 and 1. The CPU gathers those words into two 16-lane vectors, half h = a // 4 with
# lane l = 4 * (a % 4) + w, and one shift + mask per (k_local, j1, h) yields 16 codes of one
# row. Its dequantized rows are therefore laid out in "row-view order":
# position p = 32*j1 + 16*h + l  <->  n_local = 4h + l // 4 + 8*j1 + 16*(l % 4).

comptime ROW_VIEW_LANES = 16
"""Codes per (k_local, j1, h) vector of the row view."""


@always_inline
def row_view_word(b: Int, h: Int, l: Int) -> Int:
    """Word (0..127) of a tile feeding lane `l` (0..15) of half `h` for K rows with
    (k_local >> 1) & 3 == b. Lanes 4c..4c+3 are contiguous words."""
    return 16 * (4 * h + l // 4) + 4 * b + l % 4


@always_inline
def row_view_nibble(k_local: Int, j1: Int) -> Int:
    """Nibble holding K row `k_local` (0..15) for column half-select `j1` (0 or 1)."""
    return (k_local >> 3) + 2 * j1 + 4 * (k_local & 1)


@always_inline
def row_view_n_local(p: Int) -> Int:
    """Band column (0..63) of row-view position `p` (0..63)."""
    var j1 = p // 32
    var h = (p // 16) % 2
    var l = p % 16
    return 4 * h + l // 4 + 8 * j1 + 16 * (l % 4)


def row_view_scale_mask[j1: Int]() -> IndexList[ROW_VIEW_LANES]:
    """Shuffle mask that turns stored scales [32h, 32h + 32) (two 16-lane vectors) into the
    16 scales of row-view positions 32*j1 + 16*h + l, l = 0..15 (h drops out)."""
    var mask = IndexList[ROW_VIEW_LANES]()
    for l in range(ROW_VIEW_LANES):
        mask[l] = permuted_col(row_view_n_local(32 * j1 + l))
    return mask


def row_view_is_consistent() -> Bool:
    """True when the row view reproduces `tile_n_local` / `tile_k_local` for every code of a
    tile (checked at compile time by its users)."""
    for k_local in range(K_TILE):
        var b = (k_local >> 1) & 3
        for p in range(N_TILE):
            var word = row_view_word(b, (p // 16) % 2, p % 16)
            var nibble = row_view_nibble(k_local, p // 32)
            if tile_k_local(word, nibble) != k_local:
                return False
            if tile_n_local(word, nibble) != row_view_n_local(p):
                return False
    return True


# ---- Shapes ----------------------------------------------------------------------------
@fieldwise_init
struct Int4GemmShape(ImplicitlyCopyable):
    """Validated problem shape of `multistage_gemm_q`; all tensors are row-major contiguous.

    M, N: output [M, N]. Kp: padded K (x is [M, Kp]). Np: padded N (64 * qweight rows).
    group: K rows per scale group (g = Kp for per-channel).
    """

    var M: Int
    var N: Int
    var Kp: Int
    var Np: Int
    var group: Int

    @staticmethod
    def validate[
        group_size: Int, has_zeros: Bool, has_bias: Bool
    ](
        out_shape: IndexList[2],
        x_shape: IndexList[2],
        qweight_shape: IndexList[2],
        scales_shape: IndexList[2],
        zeros_shape: IndexList[2],
        bias_len: Int,
    ) raises -> Self:
        """Check every tensor shape against the layout and return the problem shape.

        Raises an Error naming the first inconsistency. The zeros / bias tensors are only
        checked (and later read) when has_zeros / has_bias; otherwise they may be any dummy.
        M is the output's rows; x may have more rows (never read): the graph function pads x
        with one zero row so that its K-padding kernel never gets an empty tensor when M = 0.
        """
        comptime assert (
            group_size == -1 or group_size == 32 or group_size == 64 or group_size == 128
        ), "multistage_gemm_q: group_size must be 32, 64, 128 or -1 (per-channel)"
        comptime E = "multistage_gemm_q: "
        var M = out_shape[0]
        var Kp = x_shape[1]
        var Np = N_TILE * qweight_shape[0]
        var N = out_shape[1]
        if Kp <= 0 or Kp % K_ALIGN != 0:
            raise Error(E, "Kp = x.dim(1) = ", Kp, " must be a positive multiple of ", K_ALIGN)
        if qweight_shape[1] != Kp * PACK_FACTOR:
            raise Error(E, "qweight.dim(1) = ", qweight_shape[1], " != Kp * 8 = ", Kp * PACK_FACTOR)
        if x_shape[0] < M:
            raise Error(E, "output has ", M, " rows but x only ", x_shape[0])
        if N <= 0 or N % 8 != 0 or N > Np:
            raise Error(E, "N = ", N, " must be a positive multiple of 8 and <= Np = ", Np)
        if scales_shape[1] != Np:
            raise Error(E, "scales.dim(1) = ", scales_shape[1], " != 64 * qweight.dim(0) = ", Np)
        var n_groups = scales_shape[0]
        if n_groups <= 0 or Kp % n_groups != 0:
            raise Error(E, "scales.dim(0) = ", n_groups, " does not divide Kp = ", Kp)
        var group = Kp // n_groups
        comptime if group_size > 0:
            if group != group_size:
                raise Error(E, "scales give group size ", group, " but group_size = ", group_size)
        else:
            if group != Kp:
                raise Error(E, "group_size = -1 needs scales.dim(0) = 1, got ", n_groups)
        comptime if has_zeros:
            if zeros_shape[0] != n_groups or zeros_shape[1] != Np:
                raise Error(E, "zeros shape [", zeros_shape[0], ", ", zeros_shape[1],
                            "] must equal scales shape [", n_groups, ", ", Np, "]")
        comptime if has_bias:
            if bias_len != N:
                raise Error(E, "bias length ", bias_len, " != N = ", N)
        return Self(M=M, N=N, Kp=Kp, Np=Np, group=group)

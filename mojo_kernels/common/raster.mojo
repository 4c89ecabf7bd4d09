"""The raster order of a tiled GEMM's output tiles, shared by the wgmma kernels."""


@always_inline
def raster_tile[group_m: Int](lin: Int, ntm: Int, ntn: Int) -> Tuple[Int, Int]:
    """(M tile, N tile) of tile `lin` of an ntm x ntn grid: groups of `group_m` M tiles walk the
    N tiles, so the CTAs running at once share both their M-side and N-side tiles in L2. 32-bit
    arithmetic (tile counts are far below 2^32): fewer registers in the warps that compute it."""
    var l = UInt32(lin)
    var per_group = UInt32(group_m) * UInt32(ntn)
    var first = (l // per_group) * UInt32(group_m)
    var rows = min(UInt32(ntm) - first, UInt32(group_m))
    var r = l % per_group
    return (Int(first + r % rows), Int(r // rows))

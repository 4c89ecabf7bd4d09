"""Epilogue stores through shared memory for wgmma kernels with the tokens on the N side
(swap-AB; NVIDIA sm_90a+): the two steps a kernel's staged epilogue is made of.

1. `stmatrix_tokens_x4`: four 8 x 8 blocks of a wgmma fragment (weight rows x tokens, mma
   layout) go to shared memory token-major, each token's 8 weight rows as 16 contiguous bytes.
2. `store_row_piece`: 8 consecutive elements of a token row from shared memory to the output,
   one 16-byte store where the row allows it.
Stored from the fragments directly, each thread writes 2 bytes at a time and a warp store
covers 4 tokens x 16 bytes; these write whole 16-byte pieces (the grouped GEMM's prefill tiles
and the int4 kernel's split-1 tiles; measurements in their design documents).
"""

from std.memory import bitcast
from std.sys import size_of
from max.gpu.compute.mma import st_matrix
from max.gpu.memory import AddressSpace


@always_inline
def stmatrix_tokens_x4[dtype: DType](
    row_addr: Pointer[Scalar[dtype], MutUntrackedOrigin, address_space=AddressSpace.SHARED],
    v: SIMD[dtype, 8],
):
    """`stmatrix.trans` of four 8 x 8 16-bit blocks: v[2 i], v[2 i + 1] are this lane's pair of
    block i in mma layout (weight row lane / 4, tokens 2 (lane % 4) + {0, 1}); lane 8 i + k
    gives `row_addr`, where token k of block i gets its 8 weight rows (16-byte aligned)."""
    comptime assert size_of[dtype]() == 2, "stmatrix moves 16-bit elements"
    st_matrix[4, transpose=True](row_addr, bitcast[DType.float32, 4](v))


@always_inline
def store_row_piece[dtype: DType](
    dst: Pointer[Scalar[dtype], MutAnyOrigin], v: SIMD[dtype, 8], col: Int, limit: Int, vec_ok: Bool
):
    """Stores v as the 8 elements of a row from column `col` (dst points at column col): one
    16-byte store where `vec_ok` (the row's pieces are 16-byte aligned) and col + 8 <= limit,
    else the elements before column `limit` one by one."""
    if vec_ok and col + 8 <= limit:
        dst.unsafe_store[alignment=16](0, v)
    else:
        comptime for e in range(8):
            if col + e < limit:
                dst[unsafe_offset=e] = v[e]

# PTX probe for scripts/check_ptx.py (check int4_sm90): the int4 op's GPU entry point
# (`launch_int4_gemm`, target "gpu", the path the MAX op takes) for bf16 and fp16, one group
# size each. On sm_90a that instantiates `int4_gemm_gpu`, i.e. every kernel the op can pick at
# run time (wgmma + TMA from 17 tokens, mma.sync below), so the PTX holds the instructions the
# check requires without the 55 MB of the full GPU test program
# (tests/mojo/int4_gemm_gpu_test.mojo, which scripts/gpu-check builds and runs on a GPU).
# Only built (`mojo build --emit asm`): its buffers are never filled and its output unchecked.
from max.gpu.host import DeviceContext
from std.utils.index import IndexList

from mojo_kernels.int4_gemm.entry import launch_int4_gemm


def probe[dtype: DType, group_size: Int, has_zeros: Bool, has_bias: Bool](ctx: DeviceContext) raises:
    comptime M = 64
    comptime N = 256
    comptime KP = 256
    var groups = KP // (KP if group_size <= 0 else group_size)
    var out = ctx.enqueue_create_buffer[dtype](M * N)
    var x = ctx.enqueue_create_buffer[dtype](M * KP)
    var q = ctx.enqueue_create_buffer[DType.uint32](N // 64 * KP * 8)
    var s = ctx.enqueue_create_buffer[dtype](groups * N)
    var z = ctx.enqueue_create_buffer[dtype](groups * N)
    var b = ctx.enqueue_create_buffer[dtype](N)
    var s_shape = IndexList[2](groups, N)
    launch_int4_gemm[dtype, group_size, has_zeros, has_bias, "gpu"](
        out.unsafe_ptr().as_unsafe_any_origin(), x.unsafe_ptr().as_unsafe_any_origin(),
        q.unsafe_ptr().as_unsafe_any_origin(), s.unsafe_ptr().as_unsafe_any_origin(),
        z.unsafe_ptr().as_unsafe_any_origin(), b.unsafe_ptr().as_unsafe_any_origin(),
        IndexList[2](M, N), IndexList[2](M, KP), IndexList[2](N // 64, KP * 8), s_shape, s_shape,
        N, ctx)
    ctx.synchronize()


def main() raises:
    var ctx = DeviceContext()
    probe[DType.bfloat16, 128, True, True](ctx)
    probe[DType.float16, 128, False, False](ctx)

"""Handing data from one CTA to another through global memory (NVIDIA): the stores, loads,
fences and flag waits the int4 kernel's stream-K launch is made of (one CTA publishes a partial
tile and sets a flag, another waits for it and reads the tile), for any kernel that splits a
tile's work over CTAs without a cluster.

Order: the writer stores its data (`st_cg_f32x4`), every writing thread fences
(`fence_acq_rel_gpu`), the CTA passes a barrier, one thread sets the flag (`st_release_gpu`);
the reader waits on the flag with acquire loads (`wait_flag`), then reads with `ld_cg_f32x4`
(from L2: an L1 line of the reader's SM could predate the write). Waits are bounded
(%globaltimer, then `trap`), so a protocol bug fails the launch instead of hanging the GPU.
"""

from std.sys import inlined_assembly, _RegisterPackType


@always_inline
def globaltimer() -> UInt64:
    """The GPU's nanosecond clock (%globaltimer)."""
    return inlined_assembly["mov.u64 $0, %globaltimer;", UInt64, constraints="=l", has_side_effect=True]()


@always_inline
def trap():
    """Aborts the kernel launch (the host sees a launch failure)."""
    inlined_assembly["trap;", NoneType, constraints="", has_side_effect=True]()


@always_inline
def st_cg_f32x4(addr: UInt64, v: SIMD[DType.float32, 4]):
    """16-byte global store that stays out of L1 (data another SM reads)."""
    inlined_assembly["st.global.cg.v4.f32 [$0], {$1, $2, $3, $4};", NoneType, constraints="l,f,f,f,f,~{memory}",
                     has_side_effect=True](addr, v[0], v[1], v[2], v[3])


@always_inline
def ld_cg_f32x4(addr: UInt64) -> SIMD[DType.float32, 4]:
    """16-byte global load from L2 (never a stale L1 line of data another SM wrote)."""
    var r = inlined_assembly[
        "ld.global.cg.v4.f32 {$0, $1, $2, $3}, [$4];", _RegisterPackType[Float32, Float32, Float32, Float32],
        constraints="=f,=f,=f,=f,l,~{memory}", has_side_effect=True,
    ](addr)
    return SIMD[DType.float32, 4](r[0], r[1], r[2], r[3])


@always_inline
def fence_acq_rel_gpu():
    """Orders this thread's earlier memory accesses before its later ones at GPU scope."""
    inlined_assembly["fence.acq_rel.gpu;", NoneType, constraints="~{memory}", has_side_effect=True]()


@always_inline
def st_release_gpu(addr: UInt64, v: UInt32):
    """Release store of a flag (GPU scope)."""
    inlined_assembly["st.release.gpu.global.u32 [$0], $1;", NoneType, constraints="l,r,~{memory}",
                     has_side_effect=True](addr, v)


@always_inline
def ld_acquire_gpu(addr: UInt64) -> UInt32:
    """Acquire load of a flag (GPU scope)."""
    return inlined_assembly["ld.acquire.gpu.global.u32 $0, [$1];", UInt32, constraints="=r,l,~{memory}",
                            has_side_effect=True](addr)


@always_inline
def wait_flag[limit_ns: Int](addr: UInt64):
    """Spins until the flag at `addr` is nonzero (acquire: what the setter published before it
    is visible); traps after `limit_ns`."""
    if ld_acquire_gpu(addr) != 0:
        return
    var t0 = globaltimer()
    while ld_acquire_gpu(addr) == 0:
        if globaltimer() - t0 > UInt64(limit_ns):
            trap()


@always_inline
def red_release_add(addr: UInt64, v: UInt32):
    """Release add to a counter (GPU scope): every CTA of a group announces its part."""
    inlined_assembly["red.release.gpu.global.add.u32 [$0], $1;", NoneType, constraints="l,r,~{memory}",
                     has_side_effect=True](addr, v)


@always_inline
def wait_count[limit_ns: Int](addr: UInt64, count: UInt32):
    """Spins until the counter at `addr` reaches `count` (acquire); traps after `limit_ns`."""
    if ld_acquire_gpu(addr) >= count:
        return
    var t0 = globaltimer()
    while ld_acquire_gpu(addr) < count:
        if globaltimer() - t0 > UInt64(limit_ns):
            trap()


@always_inline
def ld_cg_u32(addr: UInt64) -> UInt32:
    """4-byte global load from L2 (never a stale L1 line of data another kernel wrote)."""
    return inlined_assembly["ld.global.cg.u32 $0, [$1];", UInt32, constraints="=r,l,~{memory}",
                            has_side_effect=True](addr)

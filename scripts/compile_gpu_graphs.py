"""Compiles every op's GPU graph for a GPU target on a machine without a GPU (CI).

    python scripts/compile_gpu_graphs.py [--arch sm_90a] [--one-graph] [--ptx-checks [--keep DIR]]

Uses MAX's virtual devices (set before any device exists; "gfx..." targets get the HIP API,
the rest CUDA): the graphs are compiled, nothing runs. By default one graph holds every op's
specializations (option combinations covered pairwise), compiled in one module with the example
decoder sharded over 2 virtual devices (one compile's fixed cost for both); --one-graph
compiles a single graph holding one instance of every op instead (each target's kernel path
once, for the targets CI checks besides sm_90a; the grouped SM100 kernel's epilogue variants
and both cta_group values are built by the sm_100a PTX check of scripts/check_ptx.py).

--ptx-checks: also runs scripts/check_ptx.py's checks for this target on the PTX of the kernels
this compile builds (MAX's assembler routed through scripts/ptxas-capture, with a MAX cache of
its own so that every kernel is assembled); without ptxas 12.8 or newer on PATH it builds those
checks' harnesses instead. --keep DIR keeps the captured PTX and reports there.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from max import driver

SCRIPTS = Path(__file__).resolve().parent


def _int4_part():  # type: ignore[no-untyped-def]
    """Int4Linear layers covering the op's GPU specializations (pairwise over group size,
    symmetric, act-order, bias and dtype), as a part of _compile_parts."""
    from max.dtype import DType
    from max.graph import DeviceRef, TensorType
    from max.nn import LayerList

    from mojo_gemm import Int4Linear

    gpu = DeviceRef.GPU()
    # (k, n, group_size, symmetric, act_order, bias, dtype)
    configs = [
        (4096, 4096, 128, True, False, False, DType.bfloat16),
        (256, 200, 64, False, True, True, DType.float16),
        (192, 72, 32, False, False, False, DType.bfloat16),
        (200, 64, -1, True, False, True, DType.float16),
    ]

    layers = LayerList([
        Int4Linear(k, n, group_size=g, symmetric=s, act_order=a, has_bias=b, dtype=d, device=gpu)
        for k, n, g, s, a, b, d in configs
    ])

    def build(inputs):  # type: ignore[no-untyped-def]
        return [layer(x.tensor) for layer, x in zip(layers, inputs, strict=True)]

    types = [TensorType(d, [f"m{i}", k], gpu) for i, (k, *_, d) in enumerate(configs)]
    return types, build, layers


def _build_parts(name: str, parts: list, module) -> None:  # type: ignore[no-untyped-def, type-arg]
    """Builds ONE graph holding every part into `module`: a part is (input types, build,
    module or None), build taking its inputs and returning its outputs, the module holding its
    weights. One graph instead of one per op saves the per-graph cost of MAX's compile (about
    30 CPU-s) for each part after the first."""
    from max.graph import Graph
    from max.nn import LayerList

    # the state dict gives every weight its unique FQN name
    LayerList([m for _, _, m in parts if m is not None]).state_dict()
    types = [t for part_types, _, _ in parts for t in part_types]
    with Graph(name, input_types=types, module=module) as graph:
        inputs, outputs = list(graph.inputs), []
        for part_types, build, _ in parts:
            mine, inputs = inputs[:len(part_types)], inputs[len(part_types):]
            outputs += build(mine)
        graph.output(*outputs)


def _grouped_part():  # type: ignore[no-untyped-def]
    """grouped_matmul instances covering its GPU specializations, as a part of _compile_parts.

    bf16 plain (functional output), fp16 SwiGLU + row scale written in place, bf16 with
    a_plane_splits; symbolic T and G. On sm_90a each instance builds the SM90 kernel with both
    token tiles (and the TMA-less fallback).
    """
    from max.dtype import DType
    from max.graph import BufferType, DeviceRef, TensorType

    from mojo_gemm.grouped.op import grouped_matmul

    gpu = DeviceRef.GPU()
    e = 8
    types = [
        TensorType(DType.bfloat16, ["t", 512], gpu),
        TensorType(DType.bfloat16, [e, 384, 512], gpu),
        TensorType(DType.float16, ["t", 256], gpu),
        TensorType(DType.float16, [e, 512, 256], gpu),
        BufferType(DType.float16, ["t", 256], gpu),
        TensorType(DType.float32, ["t"], gpu),
        TensorType(DType.bfloat16, ["t3", 256], gpu),
        TensorType(DType.bfloat16, [e, 768, 256], gpu),
        TensorType(DType.uint32, ["g1"], gpu),
        TensorType(DType.int32, ["g"], gpu),
        TensorType(DType.uint32, [2], gpu),
    ]

    def build(inputs):  # type: ignore[no-untyped-def]
        a1, b1, a2, b2, c2, rs, a3, b3, offs, ids, stats = inputs
        route = (offs.tensor, ids.tensor, stats.tensor)
        y1 = grouped_matmul(a1.tensor, b1.tensor, *route)
        grouped_matmul(a2.tensor, b2.tensor, *route, swiglu=True, row_scale=rs.tensor,
                       out=c2.buffer)
        y3 = grouped_matmul(a3.tensor, b3.tensor, *route, a_plane_splits=(256, 512))
        return [y1, y3]

    return types, build, None


def _k_cache_part():  # type: ignore[no-untyped-def]
    """k_matmul_ragged_paged_scale instances covering its GPU kernels, and
    fp8_blockwise_matmul on the same operands (the same kernels writing a dense output), as a
    part of _compile_parts.

    Granularity (1, 128, 128) builds the TMA + wgmma kernel (both tile configs) and the mma.sync
    split-K kernel, (2, 64, 32) the SIMT fallback; bf16 and fp8 caches, per-head kv_scale.
    """
    from max.dtype import DType
    from max.graph import BufferType, DeviceRef, TensorType
    from max.nn.kv_cache import MHAKVCacheParams, PagedCacheValues

    from mojo_gemm.fp8.matmul import fp8_blockwise_matmul
    from mojo_gemm.k_cache.op import k_matmul_ragged_paged_scale

    gpu, cpu = DeviceRef.GPU(), DeviceRef.CPU()
    fp8 = DType.float8_e4m3fn
    # (cache dtype, K, (gm, gn, gk), kv_scale heads or None)
    configs = [
        (DType.bfloat16, 7168, (1, 128, 128), None),
        (fp8, 4096, (1, 128, 128), 8),
        (DType.bfloat16, 200, (2, 64, 32), None),
    ]
    types: list[TensorType | BufferType] = [TensorType(DType.uint32, ["B1"], gpu)]
    for i, (dt, k, (_gm, gn, gk), heads) in enumerate(configs):
        p = MHAKVCacheParams(dtype=dt, n_kv_heads=8, head_dim=128, num_layers=2, page_size=128,
                             devices=[gpu])
        n = 8 * 128
        types += [
            BufferType(dt, [f"pages{i}", *p.shape_per_block], gpu),
            TensorType(DType.int64, [1], cpu),
            TensorType(DType.uint32, ["B"], gpu),
            TensorType(DType.uint32, ["B", f"cols{i}"], gpu),
            TensorType(DType.uint32, [1], cpu),
            TensorType(DType.uint32, [1], cpu),
            TensorType(fp8, ["T", k], gpu),
            TensorType(fp8, [n, k], gpu),
            TensorType(DType.float32, [-(-k // gk), f"ts{i}"], gpu),
            TensorType(DType.float32, [-(-n // gn), -(-k // gk)], gpu),
        ]
        if heads is not None:
            types.append(TensorType(DType.float32, [heads], gpu))

    def build(inputs):  # type: ignore[no-untyped-def]
        it = iter(inputs)
        offsets = next(it).tensor
        outs = []
        for dt, _k, gran, heads in configs:
            p = MHAKVCacheParams(dtype=dt, n_kv_heads=8, head_dim=128, num_layers=2,
                                 page_size=128, devices=[gpu])
            blocks, stride, lens, lut, mp, mc, x, w, xs, ws = (next(it) for _ in range(10))
            coll = PagedCacheValues(
                kv_blocks=blocks.buffer, cache_lengths=lens.tensor, lookup_table=lut.tensor,
                max_prompt_length=mp.tensor, max_cache_length=mc.tensor, page_stride=stride.tensor,
            )
            kv_scale = next(it).tensor if heads is not None else None
            k_matmul_ragged_paged_scale(p, x.tensor, offsets, w.tensor, xs.tensor, ws.tensor, coll,
                                        gran, 1, kv_scale=kv_scale)
            if gran == (1, 128, 128) and heads is None:
                # the dense op once: its kernels are the K op's (SIMT with a dense output is
                # compiled by the other targets' one-graph builds)
                outs.append(fp8_blockwise_matmul(x.tensor, xs.tensor, w.tensor, ws.tensor, gran))
        return outs

    return types, build, None


def _kv_projection_part():  # type: ignore[no-untyped-def]
    """Two PagedKVProjection layers, as a part of _compile_parts: `quantize_fp8_rows` (bf16 and
    fp16 activations) feeding `kv_matmul_ragged_paged_scale` (both halves; granularity
    (1, 128, 128): wgmma and mma.sync kernels) into a bf16 and an fp8 cache; symbolic T and B.
    """
    from max.dtype import DType
    from max.graph import BufferType, DeviceRef, TensorType
    from max.nn import LayerList
    from max.nn.kv_cache import MHAKVCacheParams, PagedCacheValues

    from mojo_gemm.k_cache.layer import PagedKVProjection

    gpu, cpu = DeviceRef.GPU(), DeviceRef.CPU()
    # (cache dtype, activation dtype, hidden)
    configs = [(DType.bfloat16, DType.bfloat16, 7168), (DType.float8_e4m3fn, DType.float16, 2048)]
    params = [MHAKVCacheParams(dtype=dt, n_kv_heads=8, head_dim=128, num_layers=2, page_size=128,
                               devices=[gpu]) for dt, _, _ in configs]

    layers = LayerList([
        PagedKVProjection(p, hidden, 1, dtype=xdt, device=gpu)
        for (_, xdt, hidden), p in zip(configs, params, strict=True)
    ])

    def build(inputs):  # type: ignore[no-untyped-def]
        offsets, *rest = inputs
        it = iter(rest)
        for layer in layers:
            x, blocks, stride, lens, lut, mp, mc = (next(it) for _ in range(7))
            coll = PagedCacheValues(
                kv_blocks=blocks.buffer, cache_lengths=lens.tensor, lookup_table=lut.tensor,
                max_prompt_length=mp.tensor, max_cache_length=mc.tensor, page_stride=stride.tensor,
            )
            layer(x.tensor, offsets.tensor, coll)
        return []

    types: list[TensorType | BufferType] = [TensorType(DType.uint32, ["kvB1"], gpu)]
    for i, ((_, xdt, hidden), p) in enumerate(zip(configs, params, strict=True)):
        types += [
            TensorType(xdt, ["kvT", hidden], gpu),
            BufferType(p.dtype, [f"kvpages{i}", *p.shape_per_block], gpu),
            TensorType(DType.int64, [1], cpu),
            TensorType(DType.uint32, ["kvB"], gpu),
            TensorType(DType.uint32, ["kvB", f"kvcols{i}"], gpu),
            TensorType(DType.uint32, [1], cpu),
            TensorType(DType.uint32, [1], cpu),
        ]
    return types, build, layers


def _moe_route_part():  # type: ignore[no-untyped-def]
    """Two moe_route instances (bf16 E = 64 top-8 at H = 2048, fp16 E = 5 top-5 at H = 96),
    the router and grouping kernels of each dtype, and moe_combine of each (bf16 H = 2048 top-8:
    16-byte columns; fp16 H = 7 top-5: scalar ones), symbolic T; plus the decoder's
    add_rms_norm forms the sharded decoder beside it does not build (float32 h + bf16 y at
    H = 2048 with the fused e4m3 rows of add_rms_norm_fp8: the one-device decoder's attention
    norm, 4-wide columns; float32 h + float32 y to fp16 at H = 7: scalar columns); a part of
    _compile_parts."""
    from max.dtype import DType
    from max.graph import DeviceRef, TensorType

    from mojo_gemm.norm.op import add_rms_norm, add_rms_norm_fp8
    from mojo_gemm.router.combine import moe_combine
    from mojo_gemm.router.op import moe_route

    gpu = DeviceRef.GPU()
    f32, bf16 = DType.float32, DType.bfloat16
    configs = [(DType.bfloat16, 2048, 64, 8), (DType.float16, 96, 5, 5)]
    combines = [(DType.bfloat16, 2048, 8), (DType.float16, 7, 5)]
    norms = [(f32, bf16, bf16, 2048, 128), (f32, f32, DType.float16, 7, 0)]
    types = []
    for dt, h, e, _ in configs:
        types += [TensorType(dt, ["tr", h], gpu), TensorType(dt, [e, h], gpu)]
    for n, (dt, h, _) in enumerate(combines):
        types += [TensorType(dt, [f"rc{n}", h], gpu), TensorType(DType.int64, [f"rc{n}"], gpu)]
    for n, (hd, yd, _, h, _) in enumerate(norms):
        types += [TensorType(hd, [f"tn{n}", h], gpu), TensorType(yd or hd, [f"tn{n}", h], gpu),
                  TensorType(f32, [h], gpu)]

    def build(inputs):  # type: ignore[no-untyped-def]
        outs = []
        for n, (*_, k) in enumerate(configs):
            r = moe_route(inputs[2 * n].tensor, inputs[2 * n + 1].tensor, k)
            outs += [r.topk_ids, r.topk_weights, r.token_index, r.row_scale, r.inverse,
                     r.a_offsets, r.expert_usage_stats]
        first = 2 * len(configs)
        for n, (*_, k) in enumerate(combines):
            outs.append(moe_combine(inputs[first + 2 * n].tensor,
                                    inputs[first + 2 * n + 1].tensor, k))
        first += 2 * len(combines)
        for n, (_, yd, od, _, block) in enumerate(norms):
            h, y, w = (inputs[first + 3 * n + i].tensor for i in range(3))
            if block:
                s, *rest = add_rms_norm_fp8(h, y, w, 1e-5, block, od)
            else:
                s, *rest = add_rms_norm(h, y if yd else None, w, 1e-5, od, keep_sum=yd is not None)
            outs += ([] if s is None else [s]) + rest
        return outs

    return types, build, None


def build_every_specialization(module) -> None:  # type: ignore[no-untyped-def]
    """Every op's GPU specializations (the parts above) in ONE graph, built into `module`."""
    _build_parts("every_specialization_gpu_compile",
                 [_int4_part(), _grouped_part(), _k_cache_part(), _moe_route_part(),
                  _kv_projection_part()], module)


SPECIALIZATIONS_NAME = ("every specialization of multistage_gemm_q, "
                        "grouped_matmul_sm100_persistent, k_matmul_ragged_paged_scale, "
                        "fp8_blockwise_matmul, moe_route_topk_group, moe_combine_rows, "
                        "add_rms_norm_rows, rms_norm_rows, "
                        "quantize_fp8_rows + kv_matmul_ragged_paged_scale (PagedKVProjection) "
                        "(one graph)")


def compile_every_op() -> None:
    """Compiles one graph holding one instance of every op: an Int4Linear (bf16, group 128),
    a plain bf16 grouped_matmul, and a PagedKVProjection (quantize_fp8_rows feeding
    kv_matmul_ragged_paged_scale at granularity (1, 128, 128)
    into a bf16 cache), fp8_blockwise_matmul on quantize_fp8_rows' output,
    moe_route_topk_group (MoEBlock's router, 4 experts top-2) and moe_combine_rows on its rows,
    add_rms_norm_rows (with its e4m3 output) on the combined rows; symbolic token counts."""
    from max.driver import CPU, Accelerator
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import BufferType, DeviceRef, TensorType, ops
    from max.nn import Module
    from max.nn.kv_cache import MHAKVCacheParams, PagedCacheValues

    from mojo_gemm import Int4Linear, fp8_blockwise_matmul, quantize_fp8_rows
    from mojo_gemm.grouped.op import grouped_matmul
    from mojo_gemm.k_cache.layer import PagedKVProjection
    from mojo_gemm.norm.op import add_rms_norm_fp8
    from mojo_gemm.router.combine import moe_combine
    from mojo_gemm.router.op import moe_route

    gpu, cpu = DeviceRef.GPU(), DeviceRef.CPU()
    bf16, hidden, experts = DType.bfloat16, 512, 4
    params = MHAKVCacheParams(dtype=bf16, n_kv_heads=2, head_dim=128, num_layers=1,
                              page_size=128, devices=[gpu])

    class EveryOp(Module):
        def __init__(self) -> None:
            super().__init__()
            self.int4 = Int4Linear(hidden, 256, group_size=128, dtype=bf16, device=gpu)
            self.kv = PagedKVProjection(params, hidden, 0, dtype=bf16, device=gpu)

        def __call__(self, x, a, b, offs, ids, stats, rw, w8, ws8, offsets, *cache):  # type: ignore[no-untyped-def]
            blocks, stride, lens, lut, mp, mc = cache
            coll = PagedCacheValues(
                kv_blocks=blocks.buffer, cache_lengths=lens.tensor, lookup_table=lut.tensor,
                max_prompt_length=mp.tensor, max_cache_length=mc.tensor, page_stride=stride.tensor,
            )
            self.kv(x.tensor, offsets.tensor, coll)
            y = grouped_matmul(a.tensor, b.tensor, offs.tensor, ids.tensor, stats.tensor)
            r = moe_route(x.tensor, rw.tensor, 2)
            back = moe_combine(ops.gather(x.tensor, r.token_index, axis=0), r.inverse, 2)
            xq, xs = quantize_fp8_rows(x.tensor)
            dense = fp8_blockwise_matmul(xq, xs, w8.tensor, ws8.tensor)
            ones = ops.constant(1.0, DType.float32, device=gpu).broadcast_to([hidden])
            s, normed, nq, ns = add_rms_norm_fp8(ops.cast(x.tensor, DType.float32), back, ones,
                                                 1e-5)
            return (self.int4(x.tensor), y, r.row_scale, r.a_offsets, back, dense, s, normed, nq,
                    ns)

    types: list[TensorType | BufferType] = [
        TensorType(bf16, ["t", hidden], gpu),
        TensorType(bf16, ["ta", hidden], gpu),
        TensorType(bf16, [experts, 256, hidden], gpu),
        TensorType(DType.uint32, ["g1"], gpu),
        TensorType(DType.int32, ["g"], gpu),
        TensorType(DType.uint32, [2], gpu),
        TensorType(bf16, [experts, hidden], gpu),
        TensorType(DType.float8_e4m3fn, [256, hidden], gpu),
        TensorType(DType.float32, [2, hidden // 128], gpu),
        TensorType(DType.uint32, ["B1"], gpu),
        BufferType(bf16, ["pages", *params.shape_per_block], gpu),
        TensorType(DType.int64, [1], cpu),
        TensorType(DType.uint32, ["B"], gpu),
        TensorType(DType.uint32, ["B", "cols"], gpu),
        TensorType(DType.uint32, [1], cpu),
        TensorType(DType.uint32, [1], cpu),
    ]
    layers = EveryOp()
    registry = layers.state_dict()  # zero weights; also gives every weight its unique FQN name
    session = InferenceSession(devices=[CPU(), Accelerator()])
    layers.compile(*types, session=session, weights=registry)


ONE_GRAPH_NAME = ("every op (multistage_gemm_q, grouped_matmul_sm100_persistent, quantize_fp8_rows,"
                  " kv_matmul_ragged_paged_scale, fp8_blockwise_matmul, moe_route_topk_group,"
                  " moe_combine_rows, add_rms_norm_rows)")


SHARDED_NAME = ("the example decoder sharded (ShardedMoEDecoder: Int4Linear rowwise + columnwise"
                " shards, PagedKVProjection head shards, flash attention per device, MoEBlock"
                " expert shards, allreduce; up to the LM head) on 2 devices")
"""The sharded decoder's name in the default (sm_90a) build."""


def build_sharded_decoder(module) -> None:  # type: ignore[no-untyped-def]
    """The example decoder sharded over 2 GPUs (`ShardedMoEDecoder`: one layer, flash
    attention, heads and KV heads split, experts expert-parallel, MAX's allreduce), built into
    `module` up to its LM head (`head=False`): the head is the one-device decoder's (MAX's
    float32 matmul on devices[0], compiled and run by the GPU tests) and would add ~55 CPU-s of
    compile here."""
    from max.graph import DeviceRef

    from mojo_gemm.models.decoder import DecoderConfig
    from mojo_gemm.models.sharded import ShardedMoEDecoder, build_sharded_graph

    config = DecoderConfig(vocab_size=256, hidden_size=512, num_layers=1, num_heads=4,
                           num_kv_heads=2, head_dim=128, num_experts=4, top_k=2,
                           moe_intermediate_size=256, page_size=128, attention="flash")
    gpus = [DeviceRef.GPU(0), DeviceRef.GPU(1)]
    model = ShardedMoEDecoder(config, gpus)
    model.state_dict()  # gives every weight its unique FQN name
    build_sharded_graph(model, module, head=False)


def compile_sm90a_graphs() -> None:
    """Every specialization's graph and the sharded decoder's, compiled as one module (one
    compile's fixed cost; nothing runs on virtual devices, so nothing is initialized)."""
    from max.driver import CPU, Accelerator
    from max.engine import InferenceSession
    from max.graph import Module

    from mojo_gemm import kernels_package

    module = Module()
    build_every_specialization(module)
    build_sharded_decoder(module)
    session = InferenceSession(devices=[CPU(), Accelerator(0), Accelerator(1)])
    session.compile(module, custom_extensions=[kernels_package()])


PTXAS_MIN = (12, 8)
"""The oldest ptxas the capture uses (the first release that assembles sm_100a); an older one
would fail the compile that MAX's own assembler passes."""


def ptxas_release(ptxas: str) -> tuple[int, int] | None:
    """(major, minor) of `ptxas --version` ("release 13.0"), None when unreadable."""
    try:
        out = subprocess.run([ptxas, "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"release (\d+)\.(\d+)", out)
    return (int(found[1]), int(found[2])) if found else None


def capture_ptx(capture: Path) -> bool:
    """Routes MAX's assembler through scripts/ptxas-capture into `capture` (False, changing
    nothing, when ptxas is not on PATH or older than PTXAS_MIN). MAX's compile cache moves into
    `capture` (a cached graph assembles nothing); the kernel package's cache stays where it
    was."""
    ptxas = shutil.which("ptxas")
    release = ptxas_release(ptxas) if ptxas is not None else None
    if ptxas is None or release is None or release < PTXAS_MIN:
        return False
    os.environ["MOJO_GEMM_CACHE"] = (os.environ.get("MOJO_GEMM_CACHE")
                                     or os.environ.get("XDG_CACHE_HOME")
                                     or str(Path.home() / ".cache"))
    os.environ["XDG_CACHE_HOME"] = str(capture / "max-cache")
    os.environ["MODULAR_NVPTX_COMPILER_PATH"] = str(SCRIPTS / "ptxas-capture")
    os.environ["PTXAS_CAPTURE_REAL"] = ptxas
    os.environ["PTXAS_CAPTURE_DIR"] = str(capture)
    return True


def ptx_checks(arch: str, capture: Path | None) -> int:
    """scripts/check_ptx.py's checks for `arch` that a graph compile covers, on the captured
    PTX, or (capture None) on their harnesses; the number of failed checks."""
    sys.path.insert(0, str(SCRIPTS))
    import check_ptx

    if capture is not None:
        return check_ptx.check_captured(capture, arch)
    names = [c.name for c in check_ptx.captured_checks(arch)]
    if not names:
        return 0
    run = subprocess.run([sys.executable, str(SCRIPTS / "check_ptx.py"), "--only", *names],
                         check=False)
    return run.returncode


def main() -> None:
    """Sets up the virtual device, then compiles each op's graph and prints the time."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", default="sm_90a")
    parser.add_argument("--one-graph", action="store_true",
                        help="one graph with one instance of every op")
    parser.add_argument("--ptx-checks", action="store_true",
                        help="run check_ptx.py's checks on the kernels this compile builds")
    parser.add_argument("--keep", type=Path, default=None,
                        help="with --ptx-checks: capture into this folder and keep it")
    args = parser.parse_args()
    capture = None
    if args.ptx_checks:
        capture = args.keep or Path(tempfile.mkdtemp(prefix="ptx_capture_"))
        capture.mkdir(parents=True, exist_ok=True)
    if capture is not None and not capture_ptx(capture):
        if args.keep is None:
            shutil.rmtree(capture)
        capture = None
    driver.set_virtual_device_api("hip" if args.arch.startswith("gfx") else "cuda")
    driver.set_virtual_device_target_arch(args.arch)
    driver.set_virtual_device_count(1 if args.one_graph else 2)
    t0 = time.perf_counter()
    if args.one_graph:
        compile_every_op()
        names = [ONE_GRAPH_NAME]
    else:
        compile_sm90a_graphs()
        names = [SPECIALIZATIONS_NAME, SHARDED_NAME]
    for name in names:
        print(f"compiled {name} for {args.arch} in {time.perf_counter() - t0:.1f}s", flush=True)
    print("all GPU graphs compiled", flush=True)
    failed = ptx_checks(args.arch, capture) if args.ptx_checks else 0
    if capture is not None and args.keep is None:
        shutil.rmtree(capture, ignore_errors=True)
    # Skip interpreter teardown: with virtual devices MAX 26.7 sometimes aborts there
    # ("terminate called without an active exception", rc 134) after a good compile.
    os._exit(1 if failed else 0)


if __name__ == "__main__":
    main()

"""What one op costs inside a MAX graph on the device, for MAX's own ops and ours.

    python benchmarks/graph_floor.py        # needs a GPU (~2 min: four graph compiles)

Each graph applies one op R = 16 times to R distinct inputs (the timing method of
shared/reference/README.md) at a size where the kernel itself takes a few µs, so the per-op
time is the graph runtime's floor: MAX's `ops.matmul` (bf16 [T, 1024] x [1024, 1024]) and
elementwise add ([T, 1024]), our `quantize_fp8_rows` ([T, 1024]) and our
`k_matmul_ragged_paged_scale` (N = 1024, K = 4096, bf16 cache). per_op_us = median(execute +
synchronize) / R; host_us = execute alone / R. If MAX's own ops show the same floor as ours,
small-size bars measured through graphs are bounded by MAX's runtime, not by our kernels.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_k_matmul_paged as kcache

import harness

R = 16
H = 1024
T_VALUES = (1, 16)


def repeated_op_graph(name: str, device: Any, build: Callable[..., Any], arity: int) -> Any:
    """R independent ops `build(*inputs)` on bf16 [T, H] inputs (a weight [H, H] for matmul)."""
    from max.dtype import DType
    from max.graph import Graph, TensorType

    from mojo_gemm import kernels_package

    shapes = [["T", H]] + [[H, H] if name == "max_matmul" else ["T", H]] * (arity - 1)
    types = [TensorType(DType.bfloat16, s, device) for _ in range(R) for s in shapes]
    with Graph(name, input_types=types, custom_extensions=[kernels_package()]) as g:
        vals = [v.tensor for v in g.inputs]
        outs = []
        for i in range(R):
            res = build(*vals[i * arity:(i + 1) * arity])
            outs += list(res) if isinstance(res, tuple) else [res]
        g.output(*outs)
    return g


def main() -> None:
    """Builds, compiles and times the four graphs; prints a table, writes JSON."""
    from max.driver import CPU, Accelerator, Buffer
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Module, ops

    from mojo_gemm import kernels_package, quantize_fp8_rows

    acc = Accelerator()
    dev = DeviceRef.GPU()
    session = InferenceSession(devices=[CPU(), acc])
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []

    def bf16(shape: tuple[int, ...]) -> Any:
        """Random bf16 values (truncated float32 normals) in a device buffer."""
        bits = rng.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16
        return Buffer.from_numpy(bits.astype(np.uint16)).view(DType.bfloat16).to(acc)

    kinds: dict[str, tuple[Callable[..., Any], int]] = {
        "max_matmul": (lambda x, w: ops.matmul(x, w), 2),
        "max_add": (lambda x, y: x + y, 2),
        "ours_quantize_fp8_rows": (lambda x: quantize_fp8_rows(x), 1),
    }
    for name, (build, arity) in kinds.items():
        t0 = time.perf_counter()
        model = session.load(repeated_op_graph(name, dev, build, arity))
        compile_s = time.perf_counter() - t0
        for t in T_VALUES:
            args = [bf16((H, H) if (name == "max_matmul" and j % 2) else (t, H))
                    for _ in range(R) for j in range(arity)]
            rows.append({"op": name, "T": t, "compile_s": compile_s,
                         "per_op_us": harness.time_max_model(model, args, R, acc.synchronize) * 1e6,
                         "host_us": harness.time_max_host(model, args, R, acc.synchronize) * 1e6})
            print(rows[-1], flush=True)
    p = kcache.Problem(8, 4096)
    module = Module()
    graph = kcache.build_graph(module, "ours", p, "bf16", R, R, dev)
    t0 = time.perf_counter()
    compiled = session.compile(module, custom_extensions=[kernels_package()])
    model = session.init_all(compiled)[graph.name]
    compile_s = time.perf_counter() - t0
    d = kcache.problem_data(p, R, rng, acc, dev)
    for t in T_VALUES:
        batch = kcache.make_batch(t)
        pool = kcache.Pool(p, "bf16", batch.pages, R, acc, dev)
        case = kcache.make_case(d, "bf16", t, pool, R, rng, acc)
        kcache.check_ours(model, case, pool, acc.synchronize)
        per_op = harness.time_max_model(model, case.args, R, acc.synchronize)
        host = harness.time_max_host(model, case.args, R, acc.synchronize)
        rows.append({"op": "ours_k_matmul_ragged_paged_scale", "T": t, "compile_s": compile_s,
                     "per_op_us": per_op * 1e6, "host_us": host * 1e6})
        print(rows[-1], flush=True)
    print("| op | T | per_op_us | host_us |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['op']} | {r['T']} | {r['per_op_us']:.1f} | {r['host_us']:.1f} |")
    harness.OUT_DIR.mkdir(exist_ok=True)
    path = harness.OUT_DIR / f"graph_floor-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps(rows, indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()

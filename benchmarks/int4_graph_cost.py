"""Where the int4 op's per-op time goes inside a MAX graph (diagnostic, GPU only, ~1.5 min).

    python benchmarks/int4_graph_cost.py

The graph method times `multistage_gemm_q` at 22-30 µs per op for small layers at M = 1 whose
kernel takes ~10 µs, with ~20 µs of host time per op, twice MAX's own ops (RESULTS.md
2026-12-01). Four graphs of R = 16 ops on 8B.o (N = K = 4096) at M = 1 separate the suspects:
  symbolic+reshape: symbolic dims, the absent bias stood in by a reshape of the scales (as
                    `int4_matmul` did until 2026-12-01, with the op's bias then rank 1);
  symbolic+scales:  symbolic dims, the scales themselves as the (rank-2) bias dummy;
  static+scales:    static dims, the same;
  static+R weights: static dims, each op its own weight and scales inputs (3 R inputs, as in
                    bench_int4_matmul.py's graph; the same buffers are passed): does the
                    number of graph inputs cost host time?
Prints per_op_us (execute + sync) and host_us (execute alone) per graph. Measured on the H200
(2026-12-01, rank-1 bias op, a separate [1] input instead of the scales): 15.4 / 14.0 / 11.5
us per op, host 14.2 / 12.4 / 9.2 us: the reshape costs ~1.5 us and symbolic dims ~2.5 us of
MAX runtime per op; static and without the reshape the op costs what MAX's own ops do.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

R = 16
N = K = 4096
GROUP = 128


def build(name: str, static: bool, reshape_bias: bool, own_weights: bool = False) -> Any:
    """R int4 ops on distinct x; one shared weight (the question is host cost, not bandwidth)
    unless own_weights (then R weights and scales, as graph inputs)."""
    from max.dtype import DType
    from max.graph import DeviceRef, Graph, TensorType, ops

    from mojo_gemm import kernels_package

    gpu = DeviceRef.GPU()
    m, kp, nb, kw, g, np_ = (1, K, N // 64, K * 8, K // GROUP, N) if static else (
        "m", "kp", "nb", "kw", "g", "np")
    types = [TensorType(DType.bfloat16, [m, kp], gpu) for _ in range(R)]
    nw = R if own_weights else 1
    types += [TensorType(DType.uint32, [nb, kw], gpu) for _ in range(nw)]
    types += [TensorType(DType.bfloat16, [g, np_], gpu) for _ in range(nw)]
    with Graph(name, input_types=types, custom_extensions=[kernels_package()]) as gr:
        vals = [v.tensor for v in gr.inputs]
        qs, ss = vals[R:R + nw], vals[R + nw:]
        outs = []
        for i, x in enumerate(vals[:R]):
            q, s = qs[i % nw], ss[i % nw]
            bias = s.reshape([1, -1]) if reshape_bias else s
            outs.append(ops.custom(
                "multistage_gemm_q", gpu, [x, q, s, s, bias],
                [TensorType(DType.bfloat16, [x.shape[0], s.shape[1]], gpu)],
                parameters={"group_size": GROUP, "has_zeros": False, "has_bias": False},
            )[0].tensor)
        gr.output(*outs)
    return gr


def main() -> None:
    """Compiles and times the four graphs; prints one line each."""
    from max.driver import CPU, Accelerator
    from max.dtype import DType
    from max.engine import InferenceSession

    from mojo_gemm._host import to_buffer

    dev = Accelerator()
    session = InferenceSession(devices=[CPU(), dev])
    rng = np.random.default_rng(0)
    xs = [to_buffer(rng.standard_normal((1, K), dtype=np.float32), DType.bfloat16).to(dev)
          for _ in range(R)]
    qweight = rng.integers(0, 1 << 32, (N // 64, K * 8), dtype=np.uint32)
    scales = rng.uniform(0.002, 0.02, (K // GROUP, N)).astype(np.float32)
    q = to_buffer(qweight, DType.uint32).to(dev)
    s = to_buffer(scales, DType.bfloat16).to(dev)
    cases = (("symbolic+reshape", False, True, False), ("symbolic+scales", False, False, False),
             ("static+scales", True, False, False), ("static+R weights", True, False, True))
    for name, static, reshape_bias, own in cases:
        args = [*xs, *([q] * R), *([s] * R)] if own else [*xs, q, s]
        t0 = time.perf_counter()
        graph_name = name.replace("+", "_").replace(" ", "_")
        model = session.load(build(graph_name, static, reshape_bias, own))
        compile_s = time.perf_counter() - t0
        per_op = harness.time_max_model(model, args, R, dev.synchronize) * 1e6
        host = harness.time_max_host(model, args, R, dev.synchronize) * 1e6
        print(f"{name:18s} per_op_us {per_op:6.1f}  host_us {host:6.1f}"
              f"  (compile {compile_s:.0f} s)", flush=True)


if __name__ == "__main__":
    main()

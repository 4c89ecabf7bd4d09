"""An int4 (GPTQ-style, group 128) linear layer through mojo-gemm's Mojo op, checked vs numpy.

    python examples/int4_linear.py [--device cpu|gpu]   (default: gpu when present, else cpu)

Quantizes a random float weight, packs it, builds a MAX graph with `Int4Linear`, runs a batch
and compares with a float64 numpy computation of the same dequantized weight.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from max.driver import CPU, Accelerator, accelerator_count
from max.dtype import DType
from max.engine import InferenceSession
from max.graph import DeviceRef, TensorType

from mojo_gemm import Int4Linear, Int4Weight
from mojo_gemm.core.host import numpy_dtype, to_buffer, to_numpy


def main() -> None:
    """Builds, runs and checks the layer; prints timings and the error."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", choices=["cpu", "gpu"],
                        default="gpu" if accelerator_count() > 0 else "cpu")
    parser.add_argument("--m", type=int, default=64, help="tokens (rows of x)")
    parser.add_argument("--n", type=int, default=1024, help="out_features")
    parser.add_argument("--k", type=int, default=1024, help="in_features")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    dtype = DType.bfloat16
    w_float = rng.standard_normal((args.n, args.k)).astype(np.float32) * 0.05
    weight = Int4Weight.from_float(w_float, group_size=128, symmetric=True)

    gpu = args.device == "gpu"
    device_ref = DeviceRef.GPU() if gpu else DeviceRef.CPU()
    device = Accelerator() if gpu else CPU()
    layer = Int4Linear(args.k, args.n, group_size=128, dtype=dtype, device=device_ref)
    layer.load_int4(weight)

    t0 = time.perf_counter()
    session = InferenceSession(devices=[CPU(), device] if gpu else [CPU()])
    model = layer.compile(TensorType(dtype, ["m", args.k], device_ref), session=session)
    print(f"compiled for {args.device} in {time.perf_counter() - t0:.1f}s")

    x = rng.standard_normal((args.m, args.k)).astype(numpy_dtype(dtype))
    x_dev = to_buffer(x, dtype).to(device)
    model.execute(x_dev)  # warm-up
    t0 = time.perf_counter()
    out = model.execute(x_dev)[0]
    y = to_numpy(out).astype(np.float64)
    print(f"y = x[{args.m}, {args.k}] · Wᵀ[{args.k}, {args.n}]: "
          f"{(time.perf_counter() - t0) * 1e3:.2f} ms")

    ref = x.astype(np.float64) @ weight.dequantize().astype(np.float64).T
    err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
    quant_err = float(np.linalg.norm(weight.dequantize() - w_float) / np.linalg.norm(w_float))
    print(f"rel. error vs float64 reference: {err:.2e}  (int4 quantization error of W: "
          f"{quant_err:.2e})")
    print("match" if err <= 1e-2 else "MISMATCH")
    if err > 1e-2:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

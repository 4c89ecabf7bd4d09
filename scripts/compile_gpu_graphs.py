"""Compiles every op's GPU graph for a GPU target on a machine without a GPU (CI).

    python scripts/compile_gpu_graphs.py [--arch sm_90a]

Uses MAX's virtual devices (set before any device exists): the graphs are compiled, nothing
runs. Option combinations are covered pairwise in one graph per op so compilation stays short.
"""

from __future__ import annotations

import argparse
import time

from max import driver


def compile_int4() -> None:
    """Builds and compiles one graph with int4 layers covering the op's GPU specializations."""
    from max.driver import CPU, Accelerator
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, TensorType
    from max.nn import LayerList, Module

    from mojo_gemm import Int4Linear

    gpu = DeviceRef.GPU()
    # (k, n, group_size, symmetric, act_order, bias, dtype): pairwise over the parameters
    configs = [
        (4096, 4096, 128, True, False, False, DType.bfloat16),
        (256, 200, 64, False, True, True, DType.float16),
        (192, 72, 32, False, False, False, DType.bfloat16),
        (200, 64, -1, True, False, True, DType.float16),
    ]

    class Layers(Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = LayerList([
                Int4Linear(k, n, group_size=g, symmetric=s, act_order=a, has_bias=b, dtype=d,
                           device=gpu)
                for k, n, g, s, a, b, d in configs
            ])

        def __call__(self, *xs):  # type: ignore[no-untyped-def]
            return tuple(layer(x) for layer, x in zip(self.layers, xs, strict=True))

    layers = Layers()
    registry = layers.state_dict()  # zero weights; also gives every weight its unique FQN name
    types = [TensorType(d, [f"m{i}", k], gpu) for i, (k, *_, d) in enumerate(configs)]
    session = InferenceSession(devices=[CPU(), Accelerator()])
    layers.compile(*types, session=session, weights=registry)


def main() -> None:
    """Sets up the virtual device, then compiles each op's graph and prints the time."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", default="sm_90a")
    args = parser.parse_args()
    driver.set_virtual_device_api("cuda")
    driver.set_virtual_device_target_arch(args.arch)
    driver.set_virtual_device_count(1)
    for name, build in (("multistage_gemm_q", compile_int4),):
        t0 = time.perf_counter()
        build()
        print(f"compiled {name} for {args.arch} in {time.perf_counter() - t0:.1f}s", flush=True)
    print("all GPU graphs compiled")


if __name__ == "__main__":
    main()

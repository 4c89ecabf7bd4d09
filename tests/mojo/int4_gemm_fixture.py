"""Writes small W4A16 problems packed with python/mojo_gemm/int4/layout.py, plus their
float64 results, for tests/mojo/int4_gemm_gpu_test.mojo (which checks the GPU kernels against
them, so the Mojo side is tested against the layout's single definition).

    python tests/mojo/int4_gemm_fixture.py OUT.bin

File: int32 count, then per case: int32[8] header (M, N, Np, Kp, g (-1: per channel),
has_zeros, has_bias, dtype (0 bf16, 1 fp16)), then little-endian arrays:
uint32 qweight[Np/64 * Kp*8], f32 x[M*Kp], f32 scales[G*Np] (stored layout), f32 zeros[G*Np]
(stored layout; all 8 without zeros), f32 bias[N] (zeros without bias), f32 ref[M*N].
Every float is exactly representable in the case's dtype; ref is the float64 result.
"""

import sys
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
from mojo_gemm.int4.layout import pack_codes, padded_shape, permute_group_params

# (M, N, K, g, has_zeros, has_bias, dtype): one case per tile config of gpu_dispatch.
CASES = [
    (5, 200, 384, 128, True, True, "bf16"),  # M <= 8, N < Np, g128 + zeros + bias
    (12, 136, 512, 64, True, False, "fp16"),  # M <= 16, fp16, g64 zeros
    (19, 136, 256, -1, False, False, "fp16"),  # 17 <= M <= 32 (sm_90a: wgmma), per-channel
    (40, 256, 1024, 32, False, True, "bf16"),  # M <= 64, g32 (several groups per stage)
    (70, 64, 512, 128, False, False, "bf16"),  # M > 64 (large tile), 2 M-blocks
]


def rnd(a: np.ndarray, dt: str) -> np.ndarray:
    t = ml_dtypes.bfloat16 if dt == "bf16" else np.float16
    return a.astype(t).astype(np.float32)


def main(out: str) -> None:
    rng = np.random.default_rng(20261129)
    blobs = [np.array([len(CASES)], np.int32).tobytes()]
    for m, n, k, g, hz, hb, dt in CASES:
        np_, kp = padded_shape(n, k)
        gs = kp if g == -1 else g
        groups = kp // gs
        codes = rng.integers(0, 16, size=(np_, kp), dtype=np.uint8)
        x = rnd(rng.uniform(-1, 1, size=(m, kp)), dt)
        s = rnd(rng.uniform(0.5, 1.5, size=(groups, np_)) / 16, dt)
        z = (rng.integers(0, 16, size=(groups, np_)).astype(np.float32) if hz
             else np.full((groups, np_), 8.0, np.float32))
        bias = rnd(rng.uniform(-1, 1, size=(n,)), dt) if hb else np.zeros(n, np.float32)
        grp = np.arange(kp) // gs
        w = (codes.astype(np.float64) - z[grp, :].T) * s[grp, :].T  # [Np, Kp]
        ref = x.astype(np.float64) @ w[:n, :].T + bias.astype(np.float64)
        hdr = np.array([m, n, np_, kp, g, int(hz), int(hb), 0 if dt == "bf16" else 1], np.int32)
        blobs += [
            hdr.tobytes(),
            pack_codes(codes).astype("<u4").tobytes(),
            x.astype("<f4").tobytes(),
            permute_group_params(s).astype("<f4").tobytes(),
            permute_group_params(z).astype("<f4").tobytes(),
            bias.astype("<f4").tobytes(),
            ref.astype("<f4").tobytes(),
        ]
    Path(out).write_bytes(b"".join(blobs))
    print(f"wrote {len(CASES)} cases to {out}")


if __name__ == "__main__":
    main(sys.argv[1])

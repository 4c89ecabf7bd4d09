"""A small MoE decoder on mojo-gemm's ops, generating greedily, checked against float64 numpy.

    python examples/moe_decoder.py [--device cpu|gpu] [--steps N] [--seed S]

The model (`mojo_gemm.models.decoder`, deterministic random weights): 2 layers, hidden 512,
8 query / 2 KV heads of 64, 8 experts top-2 (SwiGLU, intermediate 256) through the grouped GEMM,
int4 Q/O projections, FP8 K/V projections written into MAX's paged KV cache (page 16), plain
graph attention over the cache, vocab 1024. One graph (symbolic token count) runs the prefill
of a ragged batch of prompts and then one token per sequence per decode step. The float64
reference (`mojo_gemm.models.reference`) runs the same steps on its own; the script prints
"match" and exits 0 only when every step's logits are within rel. error 2e-2 and the
generated ids are identical.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from mojo_gemm.models.decoder import DecoderConfig, random_weights
from mojo_gemm.models.reference import ReferenceDecoder
from mojo_gemm.models.runtime import DecoderRunner

PROMPT_LENGTHS = (7, 19, 1, 12)
TOL = 2e-2


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """Relative Frobenius error of got vs ref."""
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def main() -> None:
    """Builds, runs and checks the decoder; prints timings, ids and the verdict."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--steps", type=int, default=4, help="decode steps after the prefill")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    config = DecoderConfig()
    weights = random_weights(config, args.seed)
    rng = np.random.default_rng(args.seed + 1)
    prompts = [rng.integers(0, config.vocab_size, n).tolist() for n in PROMPT_LENGTHS]

    runner = DecoderRunner(weights, args.device, num_sequences=len(prompts))
    print(f"compiled the decoder graph for {args.device} in {runner.compile_seconds:.1f}s")
    reference = ReferenceDecoder(weights, num_sequences=len(prompts))

    generated: list[list[int]] = [[] for _ in prompts]
    ref_generated: list[list[int]] = [[] for _ in prompts]
    tokens, ref_tokens = prompts, prompts
    ok = True
    for step in range(args.steps + 1):
        out = runner.step(tokens)
        t0 = time.perf_counter()
        ref_logits, ref_ids = reference.step(ref_tokens)
        ref_seconds = time.perf_counter() - t0
        err = rel_err(out.logits.astype(np.float64), ref_logits)
        ok &= err <= TOL
        name = "prefill" if step == 0 else f"decode {step}"
        print(f"{name:>9}: {sum(len(t) for t in tokens):3d} tokens  graph "
              f"{out.seconds * 1e3:8.2f} ms  (numpy reference {ref_seconds * 1e3:7.1f} ms)  "
              f"logits rel. error {err:.2e}")
        for seq, (i, r) in enumerate(zip(out.next_ids, ref_ids, strict=True)):
            generated[seq].append(int(i))
            ref_generated[seq].append(int(r))
        tokens = [[int(i)] for i in out.next_ids]
        ref_tokens = [[int(i)] for i in ref_ids]
    same_ids = generated == ref_generated
    for seq, (ids, ref_ids_seq) in enumerate(zip(generated, ref_generated, strict=True)):
        print(f"sequence {seq} (prompt {len(prompts[seq]):2d} tokens): generated {ids}"
              + ("" if ids == ref_ids_seq else f"  reference {ref_ids_seq}"))
    if ok and same_ids:
        print("match")
        return
    print("MISMATCH: " + ("logits rel. error > 2e-2; " if not ok else "")
          + ("generated ids differ" if not same_ids else ""))
    raise SystemExit(1)


if __name__ == "__main__":
    main()

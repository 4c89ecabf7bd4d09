"""A small MoE decoder on mojo-gemm's ops, generating greedily, checked against float64 numpy.

    python examples/moe_decoder.py [--device cpu|gpu] [--steps N] [--seed S] [--devices N]

The model (`mojo_gemm.models.decoder`, deterministic random weights): 2 layers, hidden 512,
8 query / 2 KV heads of 64, 8 experts top-2 (SwiGLU, intermediate 256) through the grouped GEMM,
int4 Q/O projections, FP8 K/V projections written into MAX's paged KV cache (page 16), plain
graph attention over the cache, vocab 1024. One graph (symbolic token count) runs the prefill
of a ragged batch of prompts and then one token per sequence per decode step; on the GPU the
decode steps replay a captured device graph (as `max serve` does), and the script ends with the
eager and captured step times. The float64 reference (`mojo_gemm.models.reference`) runs every
step on the same input tokens as the graph (teacher forcing: each step compares like with
like); the script prints "match" and exits 0
only when every step's logits are within rel. error 2e-2 and every greedy id equals the
reference's.

`--devices N` (GPU, N > 1) runs the same model sharded over N GPUs (`ShardedMoEDecoder`: query
and KV heads and the experts split over the devices, MAX's allreduce, each GPU its share of the
paged cache) with MAX's flash attention (4 query / 2 KV heads of 128, page 128, so that N = 2
splits every head count), eager steps, against the same float64 reference.

Greedy ids are a sharp test: a random model's top two logits are often within 1e-3 standard
deviations of each other, closer than float32-vs-float64 rounding can guarantee (an FP8 block
scale that moves by one bf16 ulp re-rounds a whole block). The default seed is one whose
smallest top-2 gap over the run is 0.06 standard deviations of the logits (seeds 0-11 range
from 0.0015 to 0.062); the script prints that gap, and on a mismatch the reference's gap and
the graph's error at each differing id (in standard deviations of that row's logits).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from mojo_gemm.models.decoder import DecoderConfig, random_weights
from mojo_gemm.models.reference import ReferenceDecoder
from mojo_gemm.models.runtime import DecoderRunner

PROMPT_LENGTHS = (7, 19, 1, 12)
SHARDED_CONFIG = DecoderConfig(num_heads=4, num_kv_heads=2, head_dim=128, page_size=128,
                               attention="flash")
"""The model of `--devices N > 1`: MAX's flash attention, head counts that 2 GPUs split."""
TOL = 2e-2


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """Relative Frobenius error of got vs ref."""
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def top2_gap(logits: np.ndarray) -> float:
    """(largest - second largest) / std of one row of logits."""
    top = np.partition(logits, -2)[-2:]
    return float((top[1] - top[0]) / logits.std())


def print_step_times(runner: DecoderRunner, tokens: list[list[int]], steps: int = 10) -> None:
    """Median wall time of `steps` eager decode steps (`Model.execute`) and of `steps`
    captured ones (a replayed device graph), each including the host copies in and the read
    of the logits and next ids, continuing the sequences past the checked steps."""
    times: dict[str, list[float]] = {"eager": [], "captured": []}
    for mode in ("eager", "captured"):
        for _ in range(steps):
            out = runner.eager_step(tokens) if mode == "eager" else runner.step(tokens)
            times[mode].append(out.seconds)
            tokens = [[int(i)] for i in out.next_ids]
    eager, captured = (float(np.median(times[m])) * 1e3 for m in ("eager", "captured"))
    print(f"decode step ({len(tokens)} sequences, median of {steps}): eager {eager:.2f} ms, "
          f"captured {captured:.2f} ms ({eager / captured:.1f}x)")


def main() -> None:
    """Builds, runs and checks the decoder; prints timings, ids and the verdict."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--steps", type=int, default=4, help="decode steps after the prefill")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--devices", type=int, default=1, help="GPUs to shard the model over")
    args = parser.parse_args()
    if args.devices > 1 and args.device != "gpu":
        parser.error("--devices > 1 needs --device gpu")

    config = DecoderConfig() if args.devices == 1 else SHARDED_CONFIG
    weights = random_weights(config, args.seed)
    rng = np.random.default_rng(args.seed + 1)
    prompts = [rng.integers(0, config.vocab_size, n).tolist() for n in PROMPT_LENGTHS]

    runner = DecoderRunner(weights, args.device, num_sequences=len(prompts),
                           devices=args.devices)
    where = args.device if args.devices == 1 else f"{args.devices} GPUs"
    print(f"compiled the decoder graph for {where} in {runner.compile_seconds:.1f}s")
    reference = ReferenceDecoder(weights, num_sequences=len(prompts))

    generated: list[list[int]] = [[] for _ in prompts]
    ref_generated: list[list[int]] = [[] for _ in prompts]
    tokens = prompts
    ok = True
    min_gap, near_ties = np.inf, []
    for step in range(args.steps + 1):
        out = runner.step(tokens)
        t0 = time.perf_counter()
        ref_logits, ref_ids = reference.step(tokens)
        ref_seconds = time.perf_counter() - t0
        got = out.logits.astype(np.float64)
        err = rel_err(got, ref_logits)
        ok &= err <= TOL
        name = "prefill" if step == 0 else f"decode {step}"
        print(f"{name:>9}: {sum(len(t) for t in tokens):3d} tokens  graph "
              f"{out.seconds * 1e3:8.2f} ms  (numpy reference {ref_seconds * 1e3:7.1f} ms)  "
              f"logits rel. error {err:.2e}")
        last = np.cumsum([len(t) for t in tokens]) - 1
        for seq, (i, r, row) in enumerate(zip(out.next_ids, ref_ids, last, strict=True)):
            generated[seq].append(int(i))
            ref_generated[seq].append(int(r))
            gap = top2_gap(ref_logits[row])
            min_gap = min(min_gap, gap)
            if i != r:
                # the graph's error at this row, in the same units as the gap
                row_err = float(np.abs(got[row] - ref_logits[row]).max() / ref_logits[row].std())
                near_ties.append(f"{name}, sequence {seq}: gap {gap:.1e}, error {row_err:.1e}")
        tokens = [[int(i)] for i in out.next_ids]
    if args.device == "gpu" and args.devices == 1:
        print_step_times(runner, tokens)
    same_ids = generated == ref_generated
    for seq, (ids, ref_ids_seq) in enumerate(zip(generated, ref_generated, strict=True)):
        print(f"sequence {seq} (prompt {len(prompts[seq]):2d} tokens): generated {ids}"
              + ("" if ids == ref_ids_seq else f"  reference {ref_ids_seq}"))
    print(f"smallest top-2 logit gap of the reference: {min_gap:.4f} std")
    if ok and same_ids:
        print("match")
        return
    for line in near_ties:
        print("  id differs at " + line + " (gap and error in std of the row's logits)")
    print("MISMATCH: " + ("logits rel. error > 2e-2; " if not ok else "")
          + ("generated ids differ" if not same_ids else ""))
    raise SystemExit(1)


if __name__ == "__main__":
    main()

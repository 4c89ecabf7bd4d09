"""Where the example decoder's graph and its float64 reference part, step by step.

    python scripts/decoder_diagnosis.py [--device cpu|gpu] [--seed S ...] [--steps N]

Runs `examples/moe_decoder.py`'s model (same config, prompts and seeds) with the reference on
the graph's own tokens (teacher forcing) and prints per step: the logits' rel. error, the
largest and median per-token rel. error, the largest rel. difference of any cached K/V row
(graph cache vs reference cache), and per sequence whether the greedy ids agree ("=" / "X")
with the reference's top-2 gap in standard deviations of that row ("m0.062"). On the CPU the
median per-token error is ~1.6e-7 and rare discrete events (an FP8 block scale re-rounding)
explain the rest; a device whose median is far above that computes something differently.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from moe_decoder import PROMPT_LENGTHS, top2_gap

from mojo_gemm.models.decoder import DecoderConfig, random_weights
from mojo_gemm.models.reference import ReferenceDecoder
from mojo_gemm.models.runtime import DecoderRunner


def cache_delta(runner: DecoderRunner, ref: ReferenceDecoder, config: DecoderConfig) -> float:
    """Largest |graph - reference| / max |reference| over every layer's and sequence's K and V."""
    worst = 0.0
    for layer in range(config.num_layers):
        for seq in range(len(PROMPT_LENGTHS)):
            k, v = runner.cache.contents(layer, seq)
            for got, want in ((k, ref.k_cache[layer][seq]), (v, ref.v_cache[layer][seq])):
                if want.size:
                    worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
    return worst


def diagnose(device: str, seed: int, steps: int) -> None:
    """Prints one line per step for one seed (see the module docstring)."""
    config = DecoderConfig()
    weights = random_weights(config, seed)
    rng = np.random.default_rng(seed + 1)
    tokens = [rng.integers(0, config.vocab_size, n).tolist() for n in PROMPT_LENGTHS]
    start = time.perf_counter()
    runner = DecoderRunner(weights, device, num_sequences=len(tokens))
    print(f"seed {seed}: graph compiled in {time.perf_counter() - start:.1f}s", flush=True)
    ref = ReferenceDecoder(weights, num_sequences=len(tokens))
    for step in range(steps + 1):
        out = runner.step(tokens)
        want, want_ids = ref.step(tokens)
        got = out.logits.astype(np.float64)
        per_token = np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1)
        last = np.cumsum([len(t) for t in tokens]) - 1
        ids = " ".join(
            f"{b}:{'=' if out.next_ids[b] == want_ids[b] else 'X'}m{top2_gap(want[r]):.3f}"
            for b, r in enumerate(last))
        print(f"  step {step}: rel {np.linalg.norm(got - want) / np.linalg.norm(want):.2e}  "
              f"token max {per_token.max():.2e} median {np.median(per_token):.2e}  "
              f"cache {cache_delta(runner, ref, config):.2e}  | {ids}", flush=True)
        tokens = [[int(i)] for i in out.next_ids]


def main() -> None:
    """Parses the arguments and diagnoses each seed."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--seed", type=int, nargs="+", default=[7])
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    for seed in args.seed:
        diagnose(args.device, seed, args.steps)


if __name__ == "__main__":
    main()

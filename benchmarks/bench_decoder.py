"""The package's decoder at real dimensions beside the same model from MAX 26.7 built-ins (H200).

    python benchmarks/bench_decoder.py                  # OLMoE-1B-7B dims, 4 layers (< 9 min)
    python benchmarks/bench_decoder.py --layers 2 --skip-max
    python benchmarks/bench_decoder.py --devices 2     # sharded over 2 GPUs against 1 GPU

Model (`DecoderConfig.olmoe`): hidden 2048, 16 q / 16 KV heads of 128 (no RoPE), 64 experts
top-8 of intermediate 1024, a bf16 paged cache of page 128, MAX's paged flash attention (causal);
random weights in checkpoint formats: q/o int4 GPTQ g128 (the package's `int4_pow2` quantizer),
K/V FP8 e4m3 with 128 x 128 block scales (`quantize_fp8_blockwise`), bf16 experts. The
vocabulary is 256, so the LM head (which every step still computes: the graph returns logits)
is < 0.1 % of a step's bytes; its bytes are in the floors.

- ours: `MoEDecoder` (our int4 op for q/o, our FP8 K/V ops into the cache, our grouped op with
  fused SwiGLU), through `DecoderRunner`; MAX: `max_builtin_decoder.MaxDecoder` (MAX's GPTQ
  kernel, MAX's FP8 K-cache matmul and FP8 matmul + cache store for V, MAX's grouped matmul),
  through the same runner.
- correctness first: a prefill of short prompts, 2 teacher-forced decode steps (captured, a
  batch of len(CHECK_PROMPTS)) and a decode step of one sequence alone (batch 1: every op at one
  token) against the float64 reference; logits rel. Frobenius error <= 2e-2 and
  layer 0's cached K/V <= 2e-2, on check tokens whose router decisions all have a margin
  >= NEAR_TIE (`check_schedule`: a decision closer than that may flip under any kernel's
  rounding); the report prints the reference's smallest margins. A mismatch is reported (and
  recorded) and the timing still runs; errors > ABORT_ERR (a broken op, not rounding) stop the
  run.
- decode (captured): batch {1, 8, 32, 64} at contexts {1024, 4096} (`cache.reserve`), one
  step through `runner.step` (copies in, replay, logits out: `step_ms`), then the captured
  bucket replayed REPLAYS times back to back and synchronized once (`replay_ms`, the device
  time per step); tok/s = batch / replay_ms.
- prefill (eager): {512, 4096} tokens as 8 sequences of T/8 (int64 arrays), fresh sequences
  per call, median of `runner.step` wall times (`step_ms`: inputs in, execute, the next ids on
  the host; the [T, vocab] logits stay on the device, as a server's prefill leaves them).
- breakdown: a CUPTI trace (torch.profiler) of one replay (decode) or one step (prefill):
  kernel µs of ours (names containing "mojo_kernels"), attention (MAX's mha kernels) and the
  rest, as durations (`*_us`, overlapping under programmatic launches) and as shares of the
  critical path (`*_crit_us` + `idle_us` = the traced span; `kernel_breakdown`), and the
  critical path by op (`crit_by_op`, `KERNEL_OPS`: the grouped GEMMs, int4, FP8 K/V, router,
  combine, quantization, attention, norms, gather, elementwise, vendor GEMMs) in a second
  table under the run's RESULTS.md section.
- floors: decode = (weights read: attention projections + the experts the batch routes to,
  E·(1 − (1 − k/E)^batch) expected for random routing + router + LM head, + K/V read) / 4.24
  TB/s; prefill = max(bf16 FLOPs / 728 TFLOP/s + FP8 FLOPs / 1456, bytes / 4.24 TB/s), bytes =
  weights (all experts routed) + K/V written and read (activations not counted). Those are
  the H200's rates; on an H100 the bandwidth is scaled by the HBM peaks (2.96 TB/s,
  `harness.card_rates`), and the method line names the rates a run used.
- MAX's model: decode at batch 1 and 8 (its grouped kernel is naive on Hopper) and one timed
  prefill of MAX_PREFILL_T tokens.

`--devices N`: instead, the model sharded over N GPUs (`ShardedMoEDecoder` through
`DecoderRunner(devices=N)`: heads, KV heads and experts split, MAX's allreduce) beside the same
sharded model on one GPU, both eager (the sharded runner does not capture): the same check,
then decode batch SHARDED_BATCH at context 1024 (median of SHARDED_REPS steps) and prefill of
SHARDED_PREFILL_T tokens; tok/s per GPU count and the N-GPU / 1-GPU throughput ratio
(`decoder_sharded` in RESULTS.md). `--devices 1` runs the one-GPU half alone.

Results: benchmarks/out/decoder-*.json and a table in RESULTS.md. Env: BENCH_BUDGET_S (default
540): MAX's model is skipped when less than MAX_MIN_S of it is left.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
from mojo_gemm.fp8.quant import quantize_fp8_blockwise
from mojo_gemm.models.decoder import (
    FP8_BLOCK,
    DecoderConfig,
    DecoderWeights,
    LayerWeights,
    int4_pow2,
)

T0 = time.perf_counter()
BUDGET_S = float(os.environ.get("BENCH_BUDGET_S", "540"))
MAX_MIN_S = 200.0
"""Seconds MAX's model needs (compile ~1-3 min, its naive grouped kernel, a prefill call)."""
BATCHES = (1, 8, 32, 64)
CONTEXTS = (1024, 4096)
PREFILL_T = (512, 4096)
PREFILL_SEQS = 8
PREFILL_REPS = 5
REPLAYS = 20
MAX_BATCHES = (1, 8)
MAX_PREFILL_T = 512
TOP_KERNELS = 40
"""Kernels (by name: launches, total µs, critical-path µs) kept per row of the breakdown."""
TIMELINE = 48
"""Kernels of a row's trace kept in start order (name, start, duration, critical-path µs)."""
POOL = 1 << 25
"""Normals in the pool the expert matrices are cut from (`bench_weights`)."""
CHECK_PROMPTS = (7, 12)
CHECK_DECODES = 2
TOL = 2e-2
ABORT_ERR = 0.2
NEAR_TIE = 1e-3
"""Router margins (in logit standard deviations) below this may flip under kernel rounding."""
CHECK_SEEDS = 8
"""Token seeds `check_schedule` tries for a check without router near-ties."""
BARS = {"decode_b1": 2.0, "decode_b8+": 1.5, "prefill": 2.0}
SHARDED_BATCH = 64
SHARDED_CONTEXT = 1024
SHARDED_PREFILL_T = 4096
SHARDED_REPS = 5
SHARDED_BARS = {"decode": 1.0, "prefill": 1.7}
"""N-GPU / 1-GPU throughput the sharded model must reach (decode: no slower)."""


def log(*parts: object) -> None:
    """Prints with the seconds since start."""
    print(f"[{time.perf_counter() - T0:6.1f}s]", *parts, flush=True)


def left() -> float:
    """Seconds of the budget left."""
    return BUDGET_S - (time.perf_counter() - T0)


# ------------------------------------------------------------------------------------ weights
def bench_weights(config: DecoderConfig, seed: int = 0) -> DecoderWeights:
    """Random weights of `config` in the checkpoint formats, quickly at real size.

    q/o: `int4_pow2` of fan-in scaled normals (int4 g128, power-of-two scales); K/V:
    `quantize_fp8_blockwise` (e4m3, 128 x 128 block scales); router, norms, embedding, LM head as
    `random_weights` makes them. Experts (3.2 GB of bf16 for 4 OLMoE layers) are bf16 arrays cut
    at random offsets from one pool of 2^25 fan-in scaled normals: distinct, uncorrelated
    matrices without drawing 1.6 G normals.
    """
    rng = np.random.default_rng(seed)
    h, e, i = config.hidden_size, config.num_experts, config.moe_intermediate_size
    base = rng.standard_normal(POOL, dtype=np.float32)
    pools = {n: (base / np.float32(np.sqrt(n))).astype(ml_dtypes.bfloat16) for n in {h, i}}

    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(shape[-1]))

    def bank(rows: int, cols: int) -> np.ndarray:  # [E, rows, cols] bf16, fan-in cols
        size = rows * cols
        starts = rng.integers(0, POOL - size, e)
        return np.stack([pools[cols][s : s + size].reshape(rows, cols) for s in starts])

    def norm() -> np.ndarray:
        return 1.0 + 0.1 * rng.standard_normal(h)

    g = config.int4_group_size
    layers = tuple(
        LayerWeights(attn_norm=norm(), q=int4_pow2(normal(config.q_size, h), g),
                     k=quantize_fp8_blockwise(normal(config.kv_size, h), (FP8_BLOCK, FP8_BLOCK)),
                     v=quantize_fp8_blockwise(normal(config.kv_size, h), (FP8_BLOCK, FP8_BLOCK)),
                     o=int4_pow2(normal(h, config.q_size), g), ffn_norm=norm(),
                     router=normal(e, h), gate=bank(i, h), up=bank(i, h), down=bank(h, i))
        for _ in range(config.num_layers)
    )
    return DecoderWeights(embed=rng.standard_normal((config.vocab_size, h)), layers=layers,
                          final_norm=norm(), lm_head=normal(config.vocab_size, h), config=config)


# ------------------------------------------------------------------------------------- floors
def attn_weight_bytes(c: DecoderConfig) -> float:
    """Bytes per layer of q, o (int4 + bf16 scales), K, V (e4m3 + f32 block scales), router and
    norms."""
    h, q = c.hidden_size, c.q_size
    int4 = 2 * (q * h / 2 + 2 * q * h / c.int4_group_size)
    fp8 = 2 * (c.kv_size * h + 4 * (c.kv_size / FP8_BLOCK) * (h / FP8_BLOCK))
    return int4 + fp8 + 2 * c.num_experts * h + 4 * h


def expert_bytes(c: DecoderConfig) -> float:
    """Bytes of one expert's bf16 gate, up and down."""
    return 3 * c.moe_intermediate_size * c.hidden_size * 2


def routed_experts(c: DecoderConfig, tokens: int) -> float:
    """Expected distinct experts `tokens` random tokens route to (each picks top_k of E)."""
    return c.num_experts * (1 - (1 - c.top_k / c.num_experts) ** tokens)


def kv_token_bytes(c: DecoderConfig) -> float:
    """Bytes of one token's K and V in one layer (bf16 cache)."""
    return 2 * c.kv_size * 2


def head_bytes(c: DecoderConfig) -> float:
    """Bytes of the LM head and the final norm (bf16)."""
    return 2 * c.vocab_size * c.hidden_size + 2 * c.hidden_size


def decode_floor(c: DecoderConfig, batch: int, context: int) -> dict[str, float]:
    """Memory floor of one decode step (every sequence at `context` cached tokens)."""
    weights = c.num_layers * (attn_weight_bytes(c) + routed_experts(c, batch) * expert_bytes(c))
    kv = c.num_layers * batch * (context + 1) * kv_token_bytes(c)
    total = weights + kv + head_bytes(c)
    return {"floor_bytes": total, "floor_ms": total / harness.card_rates()[0] * 1e3}


def prefill_floor(c: DecoderConfig, tokens: int, seqs: int) -> dict[str, float]:
    """Floor of a prefill of `tokens` tokens as `seqs` equal fresh sequences."""
    h, q, kv, i = c.hidden_size, c.q_size, c.kv_size, c.moe_intermediate_size
    per_seq = tokens // seqs
    attn_pairs = seqs * per_seq * (per_seq + 1) / 2  # causal (query, key) pairs
    bf16 = c.num_layers * (tokens * (2 * h * q * 2 + c.top_k * 6 * h * i + 2 * h * c.num_experts)
                           + 4 * attn_pairs * c.head_dim * c.num_heads) \
        + tokens * 2 * h * c.vocab_size
    fp8 = c.num_layers * tokens * 2 * 2 * h * kv
    weights = c.num_layers * (attn_weight_bytes(c) + routed_experts(c, tokens) * expert_bytes(c))
    total = weights + 2 * c.num_layers * tokens * kv_token_bytes(c) + head_bytes(c)
    bandwidth, bf16_flops = harness.card_rates()
    compute_ms = (bf16 + fp8 / 2) / bf16_flops * 1e3  # FP8 at twice the bf16 rate
    memory_ms = total / bandwidth * 1e3
    return {"floor_bytes": total, "floor_flops": bf16 + fp8, "compute_ms": compute_ms,
            "memory_ms": memory_ms, "floor_ms": max(compute_ms, memory_ms)}


# ---------------------------------------------------------------------------------- breakdown
KERNEL_OPS = (
    # (op, substrings of the lower-cased kernel name; first match wins)
    ("grouped", ("mojo_kernels_grouped_gemm",)),
    ("int4", ("mojo_kernels_int4_gemm",)),
    ("fp8 K/V", ("mojo_kernels_k_cache_matmul",)),
    ("router", ("mojo_kernels_moe_route",)),
    ("combine", ("mojo_kernels_moe_combine",)),
    ("fp8 quant", ("mojo_kernels_fp8_quant",)),
    ("attention", ("mha", "flash")),
    ("norm", ("rms_norm", "layer_norm")),
    ("gather", ("gather",)),
    ("elementwise", ("mogg_foreach", "elementwise")),
    ("vendor gemm", ("gemm", "gemv", "splitk", "cublas", "cutlass")),
)
"""Op of a traced kernel, for the per-op critical-path table (mangled Mojo names keep their
module path, e.g. `mojo_kernels_grouped_gemm_kern...`)."""


def kernel_op(name: str) -> str:
    """The KERNEL_OPS op of kernel `name` ("other" when none matches)."""
    low = name.lower()
    for op, keys in KERNEL_OPS:
        if any(k in low for k in keys):
            return op
    return "other"


def kernel_breakdown(fn: Callable[[], None], sync: Callable[[], None]) -> dict[str, Any]:
    """CUPTI kernel time (µs) of one call of `fn`, split into ours ("mojo_kernels" in the kernel
    name), attention (MAX's "mha" kernels) and the rest, twice: `*_us` the kernels' durations
    (with programmatic launches a kernel's span includes its wait for the one before, so these
    overlap), and `*_crit_us` each kernel's share of the critical path (its end minus the latest
    end before it, in start order; `idle_us` the gaps with no kernel running), which adds up to
    the traced span. {} when torch is missing or the trace is empty."""
    try:
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return {}
    sync()
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            sync()
    except (RuntimeError, OSError, AssertionError) as e:  # diagnostic: never lose the row
        log(f"trace: no trace ({e!r})"[:300])
        return {}
    spans = sorted((ev.time_range.start, ev.time_range.end, ev.name) for ev in prof.events()
                   if ev.device_type.name == "CUDA"
                   and not ev.name.startswith(("Memcpy", "Memset")))
    if not spans:
        return {}
    parts = {f"{p}{s}": 0.0 for s in ("_us", "_crit_us") for p in ("ours", "attn", "rest")}
    by_op: dict[str, float] = {}
    by_name: dict[str, list[float]] = {}
    timeline = []
    frontier, idle = spans[0][0], 0.0
    for start, end, name in spans:
        op = kernel_op(name)
        part = ("ours" if "mojo_kernels" in name.lower() else
                "attn" if op == "attention" else "rest")
        crit = max(0.0, end - max(start, frontier))
        idle += max(0.0, start - frontier)
        frontier = max(frontier, end)
        parts[f"{part}_us"] += end - start
        parts[f"{part}_crit_us"] += crit
        by_op[op] = by_op.get(op, 0.0) + crit
        entry = by_name.setdefault(name[:160], [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += end - start
        entry[2] += crit
        if len(timeline) < TIMELINE:
            timeline.append([name[:60], round(start - spans[0][0], 2), round(end - start, 2),
                             round(crit, 2)])
    top = sorted(([n, int(c), round(u, 2), round(x, 2)] for n, (c, u, x) in by_name.items()),
                 key=lambda row: -row[3])[:TOP_KERNELS]
    return {**parts, "idle_us": idle, "span_us": frontier - spans[0][0],
            "kernel_us": sum(parts[f"{p}_us"] for p in ("ours", "attn", "rest")),
            "kernels": len(spans), "top_kernels": top, "timeline": timeline,
            "crit_by_op": {op: round(us, 2) for op, us in by_op.items()}}


def op_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown: each traced row's critical path by op (µs per step; KERNEL_OPS), the ops in
    KERNEL_OPS order, rows without a trace left out."""
    ops = [op for op, _ in KERNEL_OPS] + ["other"]
    traced = [r for r in rows if r.get("crit_by_op")]
    used = [op for op in ops if any(op in r["crit_by_op"] for r in traced)]
    if not traced:
        return ""
    lines = ["| model | phase | batch | context | tokens | " + " | ".join(used) + " |",
             "|" + "---|" * (5 + len(used))]
    for r in traced:
        cells = [f"{r['crit_by_op'].get(op, 0.0):.1f}" for op in used]
        lines.append(f"| {r['model']} | {r['phase']} | {r['batch']} | {r['context']} | "
                     f"{r['tokens']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -------------------------------------------------------------------------------- correctness
def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """Relative Frobenius error of got vs ref (float64)."""
    return float(np.linalg.norm(got.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))


def check(name: str, runner: Any, weights: DecoderWeights, seqs: Sequence[int],
          schedule: list[list[list[int]]], ref_steps: list[tuple[np.ndarray, np.ndarray]],
          ref_k0: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
    """Runs `schedule` (prefill, then 1-token decode steps; a step with fewer token lists than
    sequences runs the first ones alone) on `seqs` and compares with the reference's
    precomputed steps and layer-0 K/V; returns the check's record."""
    errs, agree = [], []
    for step, tokens in enumerate(schedule):
        out = runner.step(tokens, sequences=list(seqs)[:len(tokens)])
        if not np.isfinite(out.logits).all():
            raise SystemExit(f"{name}: non-finite logits at step {step}")
        errs.append(rel_err(out.logits, ref_steps[step][0]))
        agree.append(bool(np.array_equal(out.next_ids, ref_steps[step][1])))
    kv_errs = []
    if hasattr(runner.cache, "contents"):
        for b, seq in enumerate(seqs):
            k, v = runner.cache.contents(0, seq)
            kv_errs += [rel_err(k, ref_k0[b][0]), rel_err(v, ref_k0[b][1])]
    decode_errs = errs[1:]
    ok = max(decode_errs) <= TOL and (not kv_errs or max(kv_errs) <= TOL)
    rec = {"model": name, "logits_rel_err": errs, "next_ids_agree": agree,
           "layer0_kv_rel_err_max": max(kv_errs) if kv_errs else None, "pass": ok}
    log(f"{name} check ({'PASS' if ok else 'FAIL'}, tol {TOL}): logits rel err per step "
        f"(prefill, decodes, batch-1 decode) {[f'{e:.2e}' for e in errs]}, next ids agree "
        f"{agree}, layer-0 K/V rel err max {rec['layer0_kv_rel_err_max']}")
    if max(errs) > ABORT_ERR:
        raise SystemExit(f"{name}: logits rel err {max(errs):.3g} > {ABORT_ERR}: broken, not "
                         "rounding; stopping before the timing")
    return rec


def check_schedule(config: DecoderConfig, weights: DecoderWeights) -> tuple[
        list[list[list[int]]], tuple[Any, Any, list[list[float]]]]:
    """The check's token schedule (prompts of CHECK_PROMPTS tokens, then CHECK_DECODES random
    single tokens per sequence, then one token for the first sequence alone: a batch-1 decode,
    the one-token shapes of every op) and its reference: the first of CHECK_SEEDS token seeds whose
    every router decision has a margin >= NEAR_TIE, so the check compares like with like (a
    random 64-expert top-8 router has near-ties a kernel's rounding may flip, like the greedy
    near-ties the example decoder avoids by its seed); the last tried if none has."""
    for seed in range(1, CHECK_SEEDS + 1):
        rng = np.random.default_rng(seed)
        schedule = [[rng.integers(0, config.vocab_size, n).tolist() for n in CHECK_PROMPTS]]
        schedule += [[[int(t)] for t in rng.integers(0, config.vocab_size,
                                                    len(CHECK_PROMPTS))]
                     for _ in range(CHECK_DECODES)]
        schedule.append([[int(rng.integers(0, config.vocab_size))]])
        ref = reference_steps(weights, schedule)
        smallest = min(min(m) for m in ref[2])
        log(f"check tokens seed {seed}: smallest router margin {smallest:.2e} std")
        if smallest >= NEAR_TIE:
            break
    return schedule, ref


def reference_steps(weights: DecoderWeights, schedule: list[list[list[int]]]) -> tuple[
        list[tuple[np.ndarray, np.ndarray]], list[tuple[np.ndarray, np.ndarray]],
        list[list[float]]]:
    """The float64 reference over `schedule` (a step with fewer token lists than sequences
    steps the first ones alone): per step (logits, next ids), layer 0's K/V per sequence
    afterwards, and the per-layer router margins of each step."""
    from mojo_gemm.models.reference import ReferenceDecoder

    ref = ReferenceDecoder(weights, num_sequences=len(schedule[0]))
    steps, margins = [], []
    for tokens in schedule:
        steps.append(ref.step(tokens, tuple(range(len(tokens)))))
        margins.append(list(ref.route_margins))
    k0 = [(ref.k_cache[0][b], ref.v_cache[0][b]) for b in range(len(schedule[0]))]
    return steps, k0, margins


# ------------------------------------------------------------------------------------- timing
class Sequences:
    """Hands out sequence indices of a runner's cache: each phase its own, so the cache of a
    sequence only ever grows."""

    def __init__(self) -> None:
        self.next = 0

    def take(self, n: int) -> list[int]:
        """n fresh sequence indices."""
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


def time_decode(runner: Any, model: str, c: DecoderConfig, decode_seqs: list[int],
                batches: Sequence[int], rng: np.random.Generator) -> list[dict[str, Any]]:
    """Captured decode rows (see the module docstring) for `batches` x CONTEXTS."""
    rows = []
    sync = runner.device.synchronize
    for context in CONTEXTS:
        lengths = np.array(runner.cache.lengths, np.int64)
        lengths[decode_seqs] = context
        runner.cache.reserve(lengths)
        for b in batches:
            seqs = decode_seqs[:b]
            tokens = [[int(t)] for t in rng.integers(0, c.vocab_size, b)]
            steps = [runner.step(tokens, sequences=seqs).seconds for _ in range(3)]
            # the bucket the last step replayed (its inputs stay loaded: replays redo that step)
            graph = runner.decode_graph(b, int(runner.cache.lengths[seqs].max()))
            for _ in range(3):
                graph.replay()
            sync()
            t = time.perf_counter()
            for _ in range(REPLAYS):
                graph.replay()
            sync()
            replay_ms = (time.perf_counter() - t) / REPLAYS * 1e3
            floor = decode_floor(c, b, context)
            row = {"model": model, "phase": "decode", "batch": b, "context": context,
                   "tokens": b, "replay_ms": replay_ms, "step_ms": min(steps) * 1e3,
                   "tok_per_s": b / replay_ms * 1e3, **floor,
                   "x_floor": replay_ms / floor["floor_ms"],
                   **kernel_breakdown(graph.replay, sync)}
            rows.append(row)
            log(model, "decode", {k: v for k, v in row.items() if k not in ("model", "phase")})
    return rows


def time_prefill(runner: Any, model: str, c: DecoderConfig, seqs: Sequences,
                 sizes: Sequence[int], reps: int, rng: np.random.Generator
                 ) -> list[dict[str, Any]]:
    """Eager prefill rows: `sizes` tokens as PREFILL_SEQS fresh sequences, `reps` timed calls
    (each on fresh sequences) after one warm-up (none when reps == 1)."""
    rows = []
    for total in sizes:
        per = total // PREFILL_SEQS  # calls per size: prefill_calls(reps)

        def call(per: int = per) -> float:
            # int64 arrays, as a MAX server holds token ids (a list of Python ints would add
            # its per-token conversion to the step's host time)
            tokens = [rng.integers(0, c.vocab_size, per, dtype=np.int64)
                      for _ in range(PREFILL_SEQS)]
            return runner.step(tokens, sequences=seqs.take(PREFILL_SEQS)).seconds

        if reps > 1:
            call()
        times = [call() for _ in range(reps)]
        ms = statistics.median(times) * 1e3
        floor = prefill_floor(c, total, PREFILL_SEQS)
        row = {"model": model, "phase": "prefill", "batch": PREFILL_SEQS, "context": 0,
               "tokens": total, "step_ms": ms, "tok_per_s": total / ms * 1e3, **floor,
               "x_floor": ms / floor["floor_ms"]}
        if reps > 1:
            row.update(kernel_breakdown(call, runner.device.synchronize))
        rows.append(row)
        log(model, "prefill", {k: v for k, v in row.items() if k not in ("model", "phase")})
    return rows


def prefill_calls(reps: int) -> int:
    """`runner.step` calls per prefill size of `time_prefill`: warm-up, reps, traced call."""
    return reps + 2 if reps > 1 else reps


# --------------------------------------------------------------------------------------- runs
def pages_for(lengths: Sequence[int], page: int) -> int:
    """Pages that sequences of these lengths occupy."""
    return sum(-(-n // page) for n in lengths)


def run_model(name: str, weights: DecoderWeights, schedule: list[list[list[int]]],
              ref: tuple[Any, Any, Any], batches: Sequence[int], prefill: Sequence[int],
              prefill_reps: int, model: Any = None) -> tuple[list[dict[str, Any]],
                                                             dict[str, Any]]:
    """Compiles one model variant in a `DecoderRunner`, checks it, times it."""
    from mojo_gemm.models.runtime import DecoderRunner

    c = weights.config
    max_ctx = max(CONTEXTS) + c.page_size
    decode_n = max(batches)
    calls = prefill_calls(prefill_reps)
    prefill_n = PREFILL_SEQS * calls * len(prefill)
    num_seqs = len(schedule[0]) + decode_n + prefill_n
    pages = (pages_for([max_ctx] * decode_n, c.page_size)
             + pages_for([sum(len(s[b]) for s in schedule if b < len(s))
                          for b in range(len(schedule[0]))],
                         c.page_size)
             + PREFILL_SEQS * calls * sum(-(-(t // PREFILL_SEQS) // c.page_size)
                                          for t in prefill) + 8)
    t = time.perf_counter()
    runner = DecoderRunner(weights, "gpu", num_seqs, total_pages=pages, max_cache_length=max_ctx,
                           model=model)
    log(f"{name}: compiled in {time.perf_counter() - t:.1f}s ({num_seqs} sequences, "
        f"{pages} pages of {c.page_size})")
    seqs = Sequences()
    rec = check(name, runner, weights, seqs.take(len(schedule[0])), schedule, ref[0], ref[1])
    rng = np.random.default_rng(5)
    rows: list[dict[str, Any]] = []
    decode_seqs = seqs.take(decode_n)
    # A failing phase (e.g. a graph that cannot be captured) is recorded; the other still runs.
    for phase, run in (("decode", lambda: time_decode(runner, name, c, decode_seqs, batches,
                                                      rng)),
                       ("prefill", lambda: time_prefill(runner, name, c, seqs, prefill,
                                                        prefill_reps, rng))):
        try:
            rows += run()
        except Exception as e:  # report and go on: the JSON keeps the error
            rec[f"{phase}_error"] = repr(e)[:800]
            log(f"{name} {phase}: FAILED {e!r}"[:800])
    return rows, rec  # the runner (and its cache) is freed here, before the next model


def run_sharded(devices: int, weights: DecoderWeights, schedule: list[list[list[int]]],
                ref: tuple[Any, Any, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The sharded model over `devices` GPUs (eager): the check, decode batch SHARDED_BATCH at
    SHARDED_CONTEXT and a prefill of SHARDED_PREFILL_T tokens."""
    from mojo_gemm.models.runtime import DecoderRunner

    c, name = weights.config, f"ours x{devices}"
    max_ctx = SHARDED_CONTEXT + c.page_size
    calls = prefill_calls(SHARDED_REPS)
    num_seqs = len(schedule[0]) + SHARDED_BATCH + PREFILL_SEQS * calls
    pages = (pages_for([max_ctx] * (len(schedule[0]) + SHARDED_BATCH), c.page_size)
             + PREFILL_SEQS * calls * -(-(SHARDED_PREFILL_T // PREFILL_SEQS) // c.page_size) + 8)
    t = time.perf_counter()
    runner = DecoderRunner(weights, "gpu", num_seqs, total_pages=pages, max_cache_length=max_ctx,
                           devices=devices, sharded=True)
    log(f"{name}: compiled in {time.perf_counter() - t:.1f}s")
    seqs = Sequences()
    rec = check(name, runner, weights, seqs.take(len(schedule[0])), schedule, ref[0], ref[1])
    rng = np.random.default_rng(5)
    decode_seqs = seqs.take(SHARDED_BATCH)
    lengths = np.array(runner.cache.lengths, np.int64)
    lengths[decode_seqs] = SHARDED_CONTEXT
    runner.cache.reserve(lengths)
    tokens = [[int(t)] for t in rng.integers(0, c.vocab_size, SHARDED_BATCH)]
    runner.step(tokens, sequences=decode_seqs)
    ms = statistics.median(runner.step(tokens, sequences=decode_seqs).seconds
                           for _ in range(SHARDED_REPS)) * 1e3
    rows = [{"model": name, "phase": "decode", "batch": SHARDED_BATCH,
             "context": SHARDED_CONTEXT, "tokens": SHARDED_BATCH, "step_ms": ms,
             "tok_per_s": SHARDED_BATCH / ms * 1e3}]
    log(name, "decode", rows[0])
    rows += time_prefill(runner, name, c, seqs, (SHARDED_PREFILL_T,), SHARDED_REPS, rng)
    return rows, rec


def sharded_main(devices: int, weights: DecoderWeights, schedule: list[list[list[int]]],
                 ref: tuple[Any, Any, Any]) -> None:
    """`--devices N`: the sharded model on 1 and N GPUs, their throughput ratio, recorded."""
    rows, checks = [], []
    for n in sorted({1, devices}):
        r, rec = run_sharded(n, weights, schedule, ref)
        rows += r
        checks.append(rec)
    summary: dict[str, Any] = {}
    if devices > 1:
        for phase, bar in SHARDED_BARS.items():
            one, many = (next(r["tok_per_s"] for r in rows
                              if r["model"] == f"ours x{n}" and r["phase"] == phase)
                         for n in (1, devices))
            summary[phase] = {"speedup": many / one, "bar": bar, "pass": many / one >= bar}
            log(f"bar {phase}: {devices} GPUs / 1 GPU throughput {many / one:.3f} (bar {bar})")
    harness.record(
        "decoder_sharded", rows,
        ["model", "phase", "batch", "context", "tokens", "step_ms", "tok_per_s"],
        method=f"DecoderConfig.olmoe(num_layers={weights.config.num_layers}) as "
               "ShardedMoEDecoder over 1 and N GPUs (heads, KV heads, experts split; MAX "
               "allreduce), eager: step_ms = median runner.step over "
               f"{SHARDED_REPS} calls (decode batch {SHARDED_BATCH} at context "
               f"{SHARDED_CONTEXT}; prefill {SHARDED_PREFILL_T} tokens as {PREFILL_SEQS} "
               "fresh sequences)",
        extra={"checks": checks, "bars": summary, "config": weights.config.__dict__})
    log("done")


def max_model(weights: DecoderWeights) -> Any:
    """`MaxDecoder` with `weights` loaded (q/o repacked by MAX on the GPU)."""
    from max.driver import CPU, Accelerator
    from max.engine import InferenceSession
    from max.graph import DeviceRef
    from max_builtin_decoder import MaxDecoder, gptq_buffer, repack_gptq

    from mojo_gemm.int4.quant import Int4Weight

    acc = Accelerator()
    raws = [gptq_buffer(w) for layer in weights.layers for w in (layer.q, layer.o)]
    first = weights.layers[0].q  # the GPTQ buffer is the same weight (exact round trip)
    back = Int4Weight.from_max_gptq(raws[0], n=first.n, k=first.k).dequantize()
    if not np.array_equal(back, first.dequantize()):
        raise SystemExit("gptq_buffer does not round-trip layer 0's q")
    t = time.perf_counter()
    packed = repack_gptq(raws, InferenceSession(devices=[CPU(), acc]), acc)
    log(f"max: GPTQ repack (MAX's GPTQ_gpu_repack_b4_g128) in {time.perf_counter() - t:.1f}s")
    model = MaxDecoder(weights.config, DeviceRef.GPU())
    model.load_state_dict(model.max_state(weights, list(zip(packed[::2], packed[1::2],
                                                            strict=True))))
    return model


def bars(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's bars on our rows: worst ratio to floor per bar and whether it holds."""
    ours = [r for r in rows if r["model"] == "ours"]
    groups = {
        "decode_b1": [r for r in ours if r["phase"] == "decode" and r["batch"] == 1],
        "decode_b8+": [r for r in ours if r["phase"] == "decode" and r["batch"] >= 8],
        "prefill": [r for r in ours if r["phase"] == "prefill"],
    }
    out = {}
    for key, rs in groups.items():
        worst = max((r["x_floor"] for r in rs), default=None)
        out[key] = {"bar_x_floor": BARS[key], "worst_x_floor": worst,
                    "pass": worst is not None and worst <= BARS[key]}
    return out


def main() -> None:
    """Builds the weights and the reference, runs ours then MAX's model, records the table."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--config", choices=["olmoe"], default="olmoe")
    parser.add_argument("--skip-max", action="store_true", help="only the package's decoder")
    parser.add_argument("--devices", type=int, default=0,
                        help="the sharded model over N GPUs against 1 GPU (instead)")
    args = parser.parse_args()
    from max.driver import accelerator_count

    if accelerator_count() == 0:
        raise SystemExit("bench_decoder.py needs a GPU (captured decode, MAX's flash kernel)")
    if args.devices > accelerator_count():
        raise SystemExit(f"--devices {args.devices}: this machine has {accelerator_count()} "
                         "GPU(s)")
    config = DecoderConfig.olmoe(num_layers=args.layers)
    weights = bench_weights(config, seed=0)
    log(f"weights ({config.num_layers} layers) ready")
    schedule, ref = check_schedule(config, weights)
    margins = ref[2]
    near = [(s, li, m) for s, ms in enumerate(margins) for li, m in enumerate(ms)
            if m < NEAR_TIE]
    log(f"reference done; smallest router margin per step (logit stds) "
        f"{[f'{min(m):.2e}' for m in margins]}; near ties (< {NEAR_TIE}): {near}")
    if args.devices:
        sharded_main(args.devices, weights, schedule, ref)
        return
    rows, checks = [], []
    r, rec = run_model("ours", weights, schedule, ref, BATCHES, PREFILL_T, PREFILL_REPS)
    rows += r
    checks.append(rec)
    max_note = "not run (--skip-max)"
    if not args.skip_max and left() < MAX_MIN_S:
        max_note = f"skipped: {left():.0f}s of the budget left (< {MAX_MIN_S:.0f}s)"
    elif not args.skip_max:
        try:
            r, rec = run_model("max", weights, schedule, ref, MAX_BATCHES, (MAX_PREFILL_T,), 1,
                               model=max_model(weights))
            rows += r
            checks.append(rec)
            max_note = "run"
        except Exception as e:  # MAX's model is a contender: report, keep our rows
            max_note = f"failed: {e!r}"[:800]
    log(f"MAX-built-in model: {max_note}")
    summary = bars(rows)
    for key, b in summary.items():
        log(f"bar {key}: worst x floor {b['worst_x_floor']} (bar {b['bar_x_floor']}): "
            f"{'PASS' if b['pass'] else 'FAIL'}")
    for r in rows:
        for key in ("floor_bytes", "floor_flops"):
            if key in r:
                r[key] = float(r[key])
    ops = op_table(rows)
    harness.record(
        "decoder", rows,
        ["model", "phase", "batch", "context", "tokens", "replay_ms", "step_ms", "tok_per_s",
         "floor_ms", "x_floor", "span_us", "ours_crit_us", "attn_crit_us", "rest_crit_us",
         "idle_us", "ours_us", "attn_us", "rest_us"],
        method=f"DecoderConfig.olmoe(num_layers={config.num_layers}) (vocab 256); decode "
               f"captured: replay_ms = {REPLAYS} replays back to back / {REPLAYS}, step_ms = "
               "best of 3 runner.step; prefill eager: median runner.step (through the next "
               f"ids; logits left on the device) over {PREFILL_REPS} calls (MAX: 1), 8 fresh "
               "sequences; CUPTI trace of one "
               "replay / step (ours = mojo_kernels, attn = MAX mha): *_crit_us each part's "
               "share of the critical path (+ idle_us = span_us), *_us summed kernel "
               "durations (overlapping under programmatic launches); floors: see "
               f"bench_decoder.py, at {harness.card_rates()[0] / 1e12:.2f} TB/s and "
               f"{harness.card_rates()[1] / 1e12:.0f} TFLOP/s bf16; MAX model: q/o "
               "qmatmul_b4_g128 (repacked once), K "
               "matmul_k_cache_ragged_scaled_float8, V dynamic_scaled_matmul + "
               "store_v_cache_ragged, experts grouped_matmul_ragged; " + max_note,
        extra={"checks": checks, "router_margins": margins, "bars": summary,
               "config": config.__dict__},
        notes_md=("Critical path by op, µs per step (the same traces; `grouped` holds both "
                  "expert GEMMs, `vendor gemm` the LM head):\n\n" + ops) if ops else "",
    )
    log("done")


if __name__ == "__main__":
    main()

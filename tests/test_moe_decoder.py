"""End to end: the example MoE decoder's graph vs its float64 reference over a prefill, decode
steps and a ragged continuation, with MAX's paged KV cache checked after every step.

The test model is smaller than the example's and deliberately uneven (vocab 300, page 8, int4
group 64, K/V width 64 < the FP8 block, 6 experts), so prompts cross pages and most expert groups
of a decode step are empty. The cache arena starts poisoned with random finite bf16 values:
after each step every cached K/V slot must match the reference's cache (rel. error 2e-2) and
every other element of the arena must still hold its poison.
"""

from __future__ import annotations

from functools import cache

import graph_pool
import numpy as np
import pytest
from max.driver import CPU, Accelerator, Buffer, Device, accelerator_count
from max.dtype import DType
from max.engine import InferenceSession, Model
from max.graph import DeviceRef, Graph, TensorType
from max.graph import Module as GraphModule

from mojo_gemm.core.host import to_numpy
from mojo_gemm.models.decoder import (
    DecoderConfig,
    DecoderWeights,
    MoEDecoder,
    build_graph,
    logits_and_next,
    random_weights,
)
from mojo_gemm.models.reference import ReferenceDecoder
from mojo_gemm.models.runtime import DecoderRunner, PagedKVCache

CONFIG = DecoderConfig(vocab_size=300, hidden_size=256, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=32, num_experts=6, top_k=2,
                       moe_intermediate_size=96, int4_group_size=64, page_size=8)
PROMPTS = (5, 17, 1, 9)
# after the prefill: (name, new tokens per sequence; None = one, the greedy next token)
STEPS = (("decode 1", None), ("continuation", (3, 1, 8, 2)), ("decode 2", None),
         ("decode 3", None))
TOL = 2e-2
TOTAL_PAGES = 24
NEAR_TIE = 1e-3
"""Smallest router margin (logit standard deviations) the test data may have: a closer top-k
decision can flip under any kernel's rounding, and a flipped expert is not an error of the ops."""


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))


def poison(runner: DecoderRunner, rng: np.random.Generator) -> np.ndarray:
    """Fills the cache arena with random finite bf16 values; returns their bits (uint16)."""
    blocks = runner.cache.blocks
    bits = rng.integers(0, 1 << 16, size=tuple(int(d) for d in blocks.shape), dtype=np.uint16)
    bits &= np.uint16(0xBFFF)  # exponent MSB cleared: finite values of magnitude < 2
    blocks.inplace_copy_from(Buffer.from_numpy(bits).view(blocks.dtype).to(blocks.device))
    return bits


def assert_no_near_tie(ref: ReferenceDecoder, where: str) -> None:
    """The reference step just taken routed every token with a margin >= NEAR_TIE."""
    smallest = min(ref.route_margins)
    assert smallest >= NEAR_TIE, f"{where}: test data has a router near-tie ({smallest:.1e})"


def check_cache(runner: DecoderRunner, ref: ReferenceDecoder, poisoned: np.ndarray,
                where: str) -> None:
    """Cached K/V of every sequence and layer vs the reference; the rest still poisoned."""
    cache, page = runner.cache, CONFIG.page_size
    written = np.zeros(poisoned.shape, bool)
    if cache.scratch_page is not None:  # padded rows of captured decode steps write here
        written[cache.scratch_page] = True
    for seq, pages in enumerate(cache.pages):
        pos = np.arange(cache.lengths[seq])
        ids = np.asarray(pages, np.int64)[pos // page]
        written[ids, :, :, pos % page] = True
        for layer in range(CONFIG.num_layers):
            k, v = cache.contents(layer, seq)
            for name, got, want in (("K", k, ref.k_cache[layer][seq]),
                                    ("V", v, ref.v_cache[layer][seq])):
                assert got.shape == want.shape, f"{where}: {name} seq {seq} layer {layer}"
                err = rel_err(got.astype(np.float64), want)
                assert err <= TOL, f"{where}: {name} seq {seq} layer {layer} rel. error {err:.2e}"
    bits = to_numpy_bits(runner)
    stray = (bits != poisoned) & ~written
    assert not stray.any(), f"{where}: {int(stray.sum())} cache elements changed outside the " \
                            "slots of the cached tokens"


def to_numpy_bits(runner: DecoderRunner) -> np.ndarray:
    """The cache arena's bf16 bits (uint16), same shape as the arena."""
    as_f32 = to_numpy(runner.cache.blocks)
    return (as_f32.view(np.uint32) >> 16).astype(np.uint16)


WEIGHT_SEED = 3


def _pooled(module: GraphModule) -> graph_pool.Built:
    model = cpu_model()
    weights = graph_pool.prefixed_weights("moe_decoder", model)
    return build_graph(model, module), weights


@cache
def cpu_model() -> MoEDecoder:
    """The test decoder on the CPU with the WEIGHT_SEED weights loaded (its graph is compiled
    in the suite's CPU pool)."""
    model = MoEDecoder(CONFIG, DeviceRef.CPU())
    model.load_state_dict(model.state(random_weights(CONFIG, seed=WEIGHT_SEED)))
    return model


graph_pool.register("moe_decoder", _pooled)


def run(device_kind: str) -> None:
    weights = random_weights(CONFIG, seed=WEIGHT_SEED)
    rng = np.random.default_rng(4)
    if device_kind == "cpu":
        runner = DecoderRunner(None, "cpu", num_sequences=len(PROMPTS), total_pages=TOTAL_PAGES,
                               model=cpu_model(), compiled=graph_pool.model("moe_decoder"))
    else:
        runner = DecoderRunner(weights, device_kind, num_sequences=len(PROMPTS),
                               total_pages=TOTAL_PAGES)
    ref = ReferenceDecoder(weights, num_sequences=len(PROMPTS))
    poisoned = poison(runner, rng)
    tokens = [rng.integers(0, CONFIG.vocab_size, n).tolist() for n in PROMPTS]
    schedule = (("prefill", None), *STEPS)
    for step, (name, _) in enumerate(schedule):
        where = f"{device_kind} step {step} ({name})"
        out = runner.step(tokens)
        ref_logits, ref_ids = ref.step(tokens)
        assert_no_near_tie(ref, where)
        assert out.logits.shape == ref_logits.shape, where
        assert np.isfinite(out.logits).all(), f"{where}: non-finite logits"
        err = rel_err(out.logits.astype(np.float64), ref_logits)
        assert err <= TOL, f"{where}: logits rel. error {err:.2e} > {TOL}"
        np.testing.assert_array_equal(out.next_ids, ref_ids, err_msg=where)
        check_cache(runner, ref, poisoned, where)
        if step + 1 < len(schedule):  # the greedy next token, then (continuation) random ones
            sizes = schedule[step + 1][1] or (1,) * len(PROMPTS)
            tokens = [[int(i), *rng.integers(0, CONFIG.vocab_size, n - 1).tolist()]
                      for i, n in zip(out.next_ids, sizes, strict=True)]


@pytest.mark.slow
def test_moe_decoder_cpu() -> None:
    """Prefill, decode, ragged continuation, two decodes on the CPU."""
    run("cpu")


@pytest.mark.gpu
def test_moe_decoder_gpu() -> None:
    """The same steps on the GPU (the decode steps replay captured graphs)."""
    run("gpu")


@pytest.mark.gpu
def test_captured_decode_gpu() -> None:
    """Captured decode: after an eager prefill, decode steps with new tokens and growing caches
    replay one captured graph per padded batch size and match the float64 reference; a step of
    3 of the 4 sequences replays the padded bucket of 4 (its padding row writes only the
    scratch page); the replays launch what an eager run launches (debug_verify_replay); the
    cache outside the cached slots keeps its poison."""
    weights = random_weights(CONFIG, seed=5)
    rng = np.random.default_rng(13)  # a seed whose routing has no near-tie
    runner = DecoderRunner(weights, "gpu", num_sequences=len(PROMPTS), total_pages=TOTAL_PAGES)
    ref = ReferenceDecoder(weights, num_sequences=len(PROMPTS))
    poisoned = poison(runner, rng)
    prompts = [rng.integers(0, CONFIG.vocab_size, n).tolist() for n in PROMPTS]
    out = runner.step(prompts)
    ref.step(prompts)
    assert_no_near_tie(ref, "prefill")
    check_cache(runner, ref, poisoned, "prefill")
    schedule = [None, None, None, (0, 2, 3), None, (1,)]  # None: every sequence
    next_ids = dict(enumerate(out.next_ids))
    for step, seqs in enumerate(schedule):
        seqs = tuple(range(len(PROMPTS))) if seqs is None else seqs
        where = f"captured decode {step} (sequences {seqs})"
        tokens = [[int(next_ids[s])] for s in seqs]
        out = runner.step(tokens, seqs)
        ref_logits, ref_ids = ref.step(tokens, seqs)
        assert_no_near_tie(ref, where)
        err = rel_err(out.logits.astype(np.float64), ref_logits)
        assert err <= TOL, f"{where}: logits rel. error {err:.2e} > {TOL}"
        np.testing.assert_array_equal(out.next_ids, ref_ids, err_msg=where)
        check_cache(runner, ref, poisoned, where)
        next_ids.update(zip(seqs, out.next_ids, strict=True))
    buckets = sorted(b for b, _ in runner._graphs)
    assert buckets == [1, 4], f"captured buckets {buckets}, expected [1, 4]"
    for graph in runner._graphs.values():
        graph.verify()


LM_HEAD = (2048, 256)
"""(hidden, vocab) of the LM head test: the real-size decoder's (OLMoE's hidden, the benchmark's
vocabulary), where one form of the product gave a wrong float32 GPU result at one token (the
test model's hidden 256 did not show it)."""


def _lm_head_graph(module: GraphModule, device: DeviceRef) -> Graph:
    """`logits_and_next` alone: normed float32 [T, H], lm_head float32 [V, H], offsets [B + 1]."""
    h, v = LM_HEAD
    types = [TensorType(DType.float32, ["T", h], device), TensorType(DType.float32, [v, h], device),
             TensorType(DType.uint32, ["B1"], device)]
    with Graph(f"lm_head_{device.device_type}", input_types=types, module=module) as g:
        normed, lm_head, offsets = (value.tensor for value in g.inputs)
        g.output(*logits_and_next(normed, lm_head, offsets))
    return g


graph_pool.register("lm_head", lambda module: (_lm_head_graph(module, DeviceRef.CPU()), {}))


def check_lm_head(model: Model, device: Device) -> None:
    """Logits and greedy ids of 1 token (one sequence) and of 7 tokens (sequences of 2 and 5)
    against float64."""
    rng = np.random.default_rng(7)
    h, v = LM_HEAD
    lm_head = rng.standard_normal((v, h)).astype(np.float32)
    for offsets in ([0, 1], [0, 2, 7]):
        t = offsets[-1]
        normed = rng.standard_normal((t, h)).astype(np.float32)
        ref = normed.astype(np.float64) @ lm_head.astype(np.float64).T
        last = ref[np.asarray(offsets[1:]) - 1]
        top2 = np.sort(last, axis=-1)[:, -2:]
        assert (top2[:, 1] - top2[:, 0] > 1e-3 * ref.std()).all(), "test data has a near-tie"
        args = [Buffer.from_numpy(a).to(device)
                for a in (normed, lm_head, np.asarray(offsets, np.uint32))]
        logits, ids = (to_numpy(out) for out in model.execute(*args))
        assert logits.shape == (t, v), f"T={t}: logits shape {logits.shape}"
        err = rel_err(logits.astype(np.float64), ref)
        assert err <= TOL, f"T={t}: logits rel. error {err:.2e} > {TOL}"
        np.testing.assert_array_equal(ids, last.argmax(axis=-1), err_msg=f"T={t}")


def test_lm_head_cpu() -> None:
    """The decoder's LM head and greedy pick at one token and at a ragged batch (CPU)."""
    check_lm_head(graph_pool.model("lm_head"), CPU())


@pytest.mark.gpu
def test_lm_head_gpu() -> None:
    """The same on the GPU, at the real-size hidden width: one token is batch-1 decode."""
    device = Accelerator()
    module = GraphModule()
    graph = _lm_head_graph(module, DeviceRef.GPU())
    session = InferenceSession(devices=[device])
    check_lm_head(session.init_all(session.compile(module))[graph.name], device)


SHARDED_CONFIG = DecoderConfig(vocab_size=300, hidden_size=256, num_layers=2, num_heads=4,
                               num_kv_heads=2, head_dim=128, num_experts=6, top_k=2,
                               moe_intermediate_size=96, int4_group_size=64, page_size=128,
                               attention="flash")
"""The 2-GPU model: flash attention (head_dim 128, page 128), heads, KV heads and experts even."""


FLASH_NEAR_TIE = 1e-2
"""NEAR_TIE for MAX's flash attention: its internal rounding moves the logits ~8e-3 (relative)
from the float64 reference, and margins of 1-2e-3 flipped on the H200 (a flipped expert cost
one token 14-29 % of its logits); 1e-2 keeps 5x clear of those."""


def flash_test_data(config: DecoderConfig, seeds: range = range(3, 100)) -> tuple[
        DecoderWeights, list[list[list[int]]]]:
    """Weights and a token schedule (PROMPTS, then STEPS with the reference's greedy ids fed
    back) whose every router decision has a margin >= FLASH_NEAR_TIE: the first such seed."""
    for seed in seeds:
        weights = random_weights(config, seed=seed)
        rng = np.random.default_rng(seed + 1)
        ref = ReferenceDecoder(weights, num_sequences=len(PROMPTS))
        schedule = [[rng.integers(0, config.vocab_size, n).tolist() for n in PROMPTS]]
        _, ids = ref.step(schedule[0])
        ok = min(ref.route_margins) >= FLASH_NEAR_TIE
        for _, sizes in STEPS:
            if not ok:
                break
            sizes = sizes or (1,) * len(PROMPTS)
            schedule.append([[int(i), *rng.integers(0, config.vocab_size, n - 1).tolist()]
                             for i, n in zip(ids, sizes, strict=True)])
            _, ids = ref.step(schedule[-1])
            ok = min(ref.route_margins) >= FLASH_NEAR_TIE
        if ok:
            return weights, schedule
    raise AssertionError(f"no seed in {seeds} gives router margins >= {FLASH_NEAR_TIE}")


@pytest.mark.gpu
@pytest.mark.parametrize("devices", [1, pytest.param(2, marks=pytest.mark.skipif(
    accelerator_count() < 2, reason="needs 2 GPUs"))])
def test_sharded_decoder_gpus(devices: int) -> None:
    """`ShardedMoEDecoder` over `devices` GPUs (heads, KV heads and experts split, MAX's
    allreduce; one GPU runs the same sharded layers): prefill, decode steps and a ragged
    continuation match the float64 reference, and every device's share of the cache holds the
    reference's K/V heads."""
    weights, schedule = flash_test_data(SHARDED_CONFIG)
    runner = DecoderRunner(weights, "gpu", num_sequences=len(PROMPTS), total_pages=8,
                           devices=devices, sharded=True)
    ref = ReferenceDecoder(weights, num_sequences=len(PROMPTS))
    for step, tokens in enumerate(schedule):
        where = f"{devices} GPU(s) step {step}"
        out = runner.step(tokens)
        ref_logits, ref_ids = ref.step(tokens)
        err = rel_err(out.logits.astype(np.float64), ref_logits)
        assert err <= TOL, f"{where}: logits rel. error {err:.2e} > {TOL}"
        np.testing.assert_array_equal(out.next_ids, ref_ids, err_msg=where)
        for seq in range(len(PROMPTS)):
            for layer in range(SHARDED_CONFIG.num_layers):
                k, v = runner.cache.contents(layer, seq)
                for got, want in ((k, ref.k_cache[layer][seq]), (v, ref.v_cache[layer][seq])):
                    assert rel_err(got.astype(np.float64), want) <= TOL, f"{where}: cache"


# ------------------------------------------------------------------------------- configuration
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_heads": 6, "num_kv_heads": 4}, "multiple of num_kv_heads"),
        ({"hidden_size": 192}, "multiples of int4_group_size"),
        ({"vocab_size": 0}, "vocab_size must be >= 1"),
        ({"page_size": 0}, "page_size must be >= 1"),
    ],
    ids=["gqa", "int4_group", "vocab", "page"],
)
def test_bad_decoder_config(kwargs: dict[str, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DecoderConfig(**kwargs)


def test_paged_cache_bookkeeping() -> None:
    """Pages are scattered, the lookup table holds MAX's sentinel past each sequence's pages,
    and running out of pages or a wrong batch size is an error."""
    cache = PagedKVCache(CONFIG.kv_params(DeviceRef.CPU()), total_pages=5, num_sequences=2,
                         device=CPU())
    _, lengths, lut, max_prompt, max_cache, _ = cache.step_inputs([9, 3])
    lut_np = lut.to_numpy()
    assert lut_np.shape == (2, 2)
    assert lut_np[1, 1] == 5 and len({*lut_np[0], lut_np[1, 0]}) == 3
    assert lengths.to_numpy().tolist() == [0, 0]
    assert int(max_prompt.to_numpy()[0]) == 9 and int(max_cache.to_numpy()[0]) == 9
    cache.commit([9, 3])
    with pytest.raises(ValueError, match="new_tokens must have 2 entries"):
        cache.step_inputs([1])
    with pytest.raises(ValueError, match="out of pages"):
        cache.step_inputs([30, 1])

"""The PyTorch bridge: the three ops on torch tensors vs torch float64 references.

Skipped without torch. Each op runs on the CPU (the bridge's MAX graphs have CPU paths) and,
marked `gpu`, on CUDA. Every op's graph has symbolic token dims, so the second size of each
op reuses the compiled graph. References use the checkpoint fixtures' own dequant formula
(int4), plain float64 math (grouped), and the fp8 operands decoded by torch (K cache).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("max.experimental.torch")

from checkpoint_fixtures import make_gptq  # noqa: E402
from mojo_gemm import (  # noqa: E402
    Int4Weight,
    group_tokens_by_expert,
    interleave_gate_up,
    torch_bridge,
)
from mojo_gemm.fp8.quant import quantize_fp8_blockwise, quantize_fp8_input  # noqa: E402
from mojo_gemm.torch_bridge import (  # noqa: E402
    TorchInt4Weight,
    grouped_matmul,
    int4_matmul,
    k_matmul_ragged_paged_scale,
)

TOL = 1e-2
TOL_FP8 = 2e-2


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    got64 = got.detach().to("cpu", torch.float64)
    ref64 = ref.detach().to("cpu", torch.float64)
    return float(torch.linalg.norm(got64 - ref64) / torch.linalg.norm(ref64))


def run_int4(device: str) -> None:
    """GPTQ act-order asymmetric g64 with bias, rank-3 and rank-2 x of two sizes."""
    ck = make_gptq(72, 192, 64, sym=False, act_order=True, seed=41)
    w = Int4Weight.from_gptq(ck.qweight, ck.qzeros, ck.scales, ck.g_idx, group_size=64)
    tw = TorchInt4Weight.from_int4(w, torch.bfloat16, device)
    gen = torch.Generator().manual_seed(1)
    bias = torch.randn(72, generator=gen).to(device, torch.bfloat16)
    w_ref = torch.from_numpy(ck.w_ref)
    registered = []
    for shape in ((2, 3, 192), (37, 192)):
        x = torch.randn(shape, generator=gen).to(device, torch.bfloat16)
        y = int4_matmul(x, tw, bias)
        registered.append(len(torch_bridge._OPS))
        assert y.shape == (*shape[:-1], 72) and y.dtype == torch.bfloat16
        ref = x.to("cpu", torch.float64) @ w_ref.T + bias.to("cpu", torch.float64)
        assert rel_err(y, ref) <= TOL, shape
    assert registered[0] == registered[1], "a new M registered (and compiled) a new op"


def run_grouped(device: str) -> None:
    """SwiGLU grouped GEMM with router row scales; 4 experts, one of them unused."""
    gen = torch.Generator().manual_seed(2)
    e, inter, k = 4, 24, 64
    gate = torch.randn(e, inter, k, generator=gen) * 0.2
    up = torch.randn(e, inter, k, generator=gen) * 0.2
    bank = torch.from_numpy(interleave_gate_up(gate.numpy(), up.numpy()))
    b = bank.to(device, torch.bfloat16)
    for tokens in (29, 5):
        topk = np.random.default_rng(tokens).choice([0, 1, 3], size=tokens)
        grouping = group_tokens_by_expert(topk, e)
        a = torch.randn(tokens, k, generator=gen).to(device, torch.bfloat16)
        scale = torch.rand(tokens, generator=gen).to(device)
        out = grouped_matmul(
            a, b, torch.from_numpy(grouping.a_offsets.astype(np.int64)).to(device),
            torch.from_numpy(grouping.expert_ids).to(device),
            torch.from_numpy(grouping.expert_usage_stats.astype(np.int64)).to(device),
            swiglu=True, row_scale=scale)
        assert out.shape == (tokens, inter) and out.dtype == torch.bfloat16
        expert = torch.empty(tokens, dtype=torch.int64)
        offs = grouping.a_offsets
        for g, ex in enumerate(grouping.expert_ids):
            expert[int(offs[g]):int(offs[g + 1])] = int(ex)
        a64 = a.to("cpu", torch.float64)
        g64 = gate.to(torch.bfloat16).to(torch.float64)[expert]
        u64 = up.to(torch.bfloat16).to(torch.float64)[expert]
        gv = torch.einsum("tk,tnk->tn", a64, g64)
        uv = torch.einsum("tk,tnk->tn", a64, u64)
        ref = torch.nn.functional.silu(gv) * uv * scale.to("cpu", torch.float64)[:, None]
        assert rel_err(out, ref) <= TOL, tokens


PAGE, LAYERS, HEADS, HEAD_DIM, HIDDEN, PAGES = 16, 2, 2, 64, 192, 8


def run_k_cache(device: str) -> None:
    """bf16 paged cache, layer 1, two sequences (one crossing a page), fp8 operands."""
    rng = np.random.default_rng(3)
    n = HEADS * HEAD_DIM
    wq = quantize_fp8_blockwise(rng.standard_normal((n, HIDDEN)) * 0.1)
    w_ref = torch.from_numpy(wq.dequantize())
    for lengths, cached in (([3, 9], [4, 12]), ([1, 1], [0, 31])):
        tokens = sum(lengths)
        x = rng.standard_normal((tokens, HIDDEN))
        xq, x_scale = quantize_fp8_input(x, 1, 128)
        blocks = torch.randn(PAGES, 2, LAYERS, PAGE, HEADS, HEAD_DIM).to(device, torch.bfloat16)
        before = blocks.clone()
        lut = torch.from_numpy(rng.permutation(PAGES - 1)[:6].reshape(2, 3).astype(np.int64))
        offsets = torch.tensor([0, lengths[0], tokens])
        k_matmul_ragged_paged_scale(
            blocks, torch.tensor(cached).to(device), lut.to(device),
            torch.from_numpy(xq.view(np.uint8)).to(device), offsets.to(device),
            torch.from_numpy(wq.bits).to(device), torch.from_numpy(x_scale).to(device),
            torch.from_numpy(wq.scales).to(device), layer_idx=1)
        # reference: dequantized operands in float64, placed at each token's cache slot
        x_deq = torch.from_numpy(xq.astype(np.float64) * np.repeat(
            x_scale[:, :tokens].T, 128, axis=1)[:, :HIDDEN])
        k_ref = x_deq @ w_ref.T
        expect = before.to("cpu", torch.float64).clone()
        slots = []
        for b, (length, start) in enumerate(zip(lengths, cached, strict=True)):
            for i in range(length):
                pos = start + i
                page = int(lut[b, pos // PAGE])
                slot = (page, 0, 1, pos % PAGE)
                expect[slot] = k_ref[offsets[b] + i].reshape(HEADS, HEAD_DIM)
                slots.append(slot)
        got = blocks.to("cpu", torch.float64)
        written = torch.zeros_like(got, dtype=torch.bool)
        for slot in slots:
            written[slot] = True
        assert torch.equal(got[~written], expect[~written]), "cache changed outside the slots"
        got_k = torch.stack([got[s] for s in slots])
        ref_k = torch.stack([expect[s] for s in slots])
        assert rel_err(got_k, ref_k) <= TOL_FP8, lengths


def test_int4_cpu() -> None:
    run_int4("cpu")


def test_grouped_cpu() -> None:
    run_grouped("cpu")


def test_k_cache_cpu() -> None:
    run_k_cache("cpu")


def test_bad_x_raises() -> None:
    ck = make_gptq(16, 64, 32, sym=True, act_order=False, seed=4)
    w = Int4Weight.from_gptq(ck.qweight, ck.qzeros, ck.scales, ck.g_idx, group_size=32)
    tw = TorchInt4Weight.from_int4(w, torch.float16)
    with pytest.raises(ValueError, match=r"x: expected last dim K = 64, got shape \(3, 32\)"):
        int4_matmul(torch.zeros(3, 32, dtype=torch.float16), tw)


@pytest.mark.gpu
def test_int4_gpu() -> None:
    run_int4("cuda")


@pytest.mark.gpu
def test_grouped_gpu() -> None:
    run_grouped("cuda")


@pytest.mark.gpu
def test_k_cache_gpu() -> None:
    run_k_cache("cuda")

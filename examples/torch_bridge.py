"""mojo-gemm's three ops called on PyTorch tensors (`mojo_gemm.torch_bridge`), checked vs torch.

    python examples/torch_bridge.py [--device cpu|cuda]   (default: cuda when present, else cpu)

Needs torch (>= 2.7; not a dependency of mojo-gemm). 1) an int4 GPTQ-style linear, 2) a SwiGLU
MoE expert bank through the grouped GEMM, 3) FP8 K projection written into a paged bf16 KV
cache held by torch. Each result is compared with a float64 torch computation. The first call
of each op compiles its MAX graph (slow on CPU); later calls of any token count reuse it.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from mojo_gemm import Int4Weight, group_tokens_by_expert, interleave_gate_up
from mojo_gemm.fp8.quant import quantize_fp8_blockwise, quantize_fp8_input
from mojo_gemm.torch_bridge import (
    TorchInt4Weight,
    grouped_matmul,
    int4_matmul,
    k_matmul_ragged_paged_scale,
)


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error of got vs ref, in float64 on the CPU."""
    got64, ref64 = got.to("cpu", torch.float64), ref.to("cpu", torch.float64)
    return float(torch.linalg.norm(got64 - ref64) / torch.linalg.norm(ref64))


def timed(label: str, fn: object, *args: object, **kwargs: object) -> object:
    """Calls fn twice (the first compiles); prints both times."""
    t0 = time.perf_counter()
    fn(*args, **kwargs)  # type: ignore[operator]
    t1 = time.perf_counter()
    out = fn(*args, **kwargs)  # type: ignore[operator]
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    print(f"{label}: first call {t1 - t0:.1f}s, second {1e3 * (time.perf_counter() - t1):.2f} ms")
    return out


def int4_demo(device: str, gen: torch.Generator) -> None:
    """y = x · dequant(W)ᵀ with a group-128 int4 weight quantized from a random float one."""
    n, k, m = 512, 1024, 16
    w_float = torch.randn(n, k, generator=gen) * 0.05
    weight = Int4Weight.from_float(w_float.numpy(), group_size=128, symmetric=True)
    tw = TorchInt4Weight.from_int4(weight, torch.bfloat16, device)
    x = torch.randn(m, k, generator=gen).to(device, torch.bfloat16)
    y = timed("int4_matmul", int4_matmul, x, tw)
    ref = x.to("cpu", torch.float64) @ torch.from_numpy(weight.dequantize()).double().T
    print(f"  y {tuple(y.shape)} {y.dtype}, rel. error vs float64: {rel_err(y, ref):.2e}")


def grouped_demo(device: str, gen: torch.Generator) -> None:
    """silu(x·gateᵀ)·(x·upᵀ) per token's expert (top-1 routing over 8 experts)."""
    experts, inter, hidden, tokens = 8, 128, 256, 100
    gate = torch.randn(experts, inter, hidden, generator=gen) * 0.05
    up = torch.randn(experts, inter, hidden, generator=gen) * 0.05
    bank = torch.from_numpy(interleave_gate_up(gate.numpy(), up.numpy())).to(device,
                                                                            torch.bfloat16)
    choice = torch.randint(0, experts, (tokens,), generator=gen)
    g = group_tokens_by_expert(choice.numpy(), experts)
    x = torch.randn(tokens, hidden, generator=gen)
    a = x[torch.from_numpy(g.token_index)].to(device, torch.bfloat16)  # rows sorted by expert
    out = timed("grouped_matmul (swiglu)", grouped_matmul, a, bank,
                torch.from_numpy(g.a_offsets.astype(np.int64)).to(device),
                torch.from_numpy(g.expert_ids).to(device),
                torch.from_numpy(g.expert_usage_stats.astype(np.int64)).to(device), swiglu=True)
    rows_expert = choice[torch.from_numpy(g.token_index)]
    a64 = a.to("cpu", torch.float64)
    gv = torch.einsum("tk,tnk->tn", a64, gate.bfloat16().double()[rows_expert])
    uv = torch.einsum("tk,tnk->tn", a64, up.bfloat16().double()[rows_expert])
    ref = torch.nn.functional.silu(gv) * uv
    print(f"  out {tuple(out.shape)}, rel. error vs float64: {rel_err(out, ref):.2e}")


def k_cache_demo(device: str, gen: torch.Generator) -> None:
    """K = x_fp8 · W_fp8ᵀ (128-blocks) written into layer 0 of a paged bf16 cache."""
    pages, layers, page, heads, head_dim, hidden = 16, 2, 128, 4, 64, 512
    lengths, cached = [7, 130], [0, 50]
    tokens = sum(lengths)
    w = quantize_fp8_blockwise((torch.randn(heads * head_dim, hidden, generator=gen) * 0.05)
                               .numpy())
    x = torch.randn(tokens, hidden, generator=gen).numpy()
    xq, x_scale = quantize_fp8_input(x, 1, 128)
    blocks = torch.zeros(pages, 2, layers, page, heads, head_dim, dtype=torch.bfloat16,
                         device=device)
    lut = torch.tensor([[3, 9], [5, 1]], device=device)
    args = (blocks, torch.tensor(cached, device=device), lut,
            torch.from_numpy(xq.view(np.uint8)).to(device),
            torch.tensor([0, lengths[0], tokens], device=device),
            torch.from_numpy(w.bits).to(device), torch.from_numpy(x_scale).to(device),
            torch.from_numpy(w.scales).to(device))
    timed("k_matmul_ragged_paged_scale", k_matmul_ragged_paged_scale, *args, layer_idx=0)
    x_deq = torch.from_numpy(xq.astype(np.float64) * np.repeat(x_scale[:, :tokens].T, 128, 1))
    k_ref = x_deq @ torch.from_numpy(w.dequantize()).T
    got, ref = [], []
    for b, (n_tok, start) in enumerate(zip(lengths, cached, strict=True)):
        for i in range(n_tok):
            pos = start + i
            got.append(blocks[int(lut[b, pos // page]), 0, 0, pos % page].reshape(-1))
            ref.append(k_ref[[0, lengths[0]][b] + i])
    print(f"  {tokens} K rows written, rel. error vs float64: "
          f"{rel_err(torch.stack(got), torch.stack(ref)):.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", choices=["cpu", "cuda"],
                        default="cuda" if torch.cuda.is_available() else "cpu")
    device = parser.parse_args().device
    gen = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__} on {device}")
    int4_demo(device, gen)
    grouped_demo(device, gen)
    k_cache_demo(device, gen)


if __name__ == "__main__":
    main()

"""Running the example decoder: MAX's paged KV cache managed on the host, and one compiled graph.

`PagedKVCache` builds the cache inputs MAX's `PagedKVCacheManager` would (that manager needs
`max[serve]`): the page arena from `KVCacheParams.allocate_buffers`, a lookup table per step,
cache lengths, the max prompt/cache lengths and the page stride. `DecoderRunner` compiles
`MoEDecoder` once (symbolic tokens, batch and pages) and runs prefill and decode steps with it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from max.driver import CPU, Accelerator, Buffer, Device
from max.engine import InferenceSession
from max.graph import DeviceRef
from max.nn.kv_cache import MHAKVCacheParams
from max.nn.kv_cache.cache_params import page_stride_of

from .._host import to_numpy
from .decoder import DecoderWeights, MoEDecoder, build_graph


class PagedKVCache:
    """The page arena of MAX's paged KV cache plus host-side bookkeeping for B sequences.

    Pages are handed out in a shuffled order (seeded), so sequences own scattered pages and
    the lookup table really is an indirection. Unused lookup-table entries hold MAX's sentinel,
    the page count.
    """

    def __init__(self, params: MHAKVCacheParams, total_pages: int, num_sequences: int,
                 device: Device, seed: int = 0) -> None:
        if total_pages < 1 or num_sequences < 1:
            raise ValueError(f"PagedKVCache: total_pages and num_sequences must be >= 1, got "
                             f"{total_pages} and {num_sequences}")
        self.params, self.total_pages, self.device = params, total_pages, device
        self.blocks: Buffer = params.allocate_buffers(total_pages)[0].values[0]
        self._free = [int(p) for p in np.random.default_rng(seed).permutation(total_pages)]
        self.pages: list[list[int]] = [[] for _ in range(num_sequences)]
        self.lengths = np.zeros(num_sequences, np.int64)

    def step_inputs(self, new_tokens: Sequence[int]) -> list[Buffer]:
        """Allocates pages for `new_tokens` [B] more tokens per sequence and returns the cache
        inputs in `graph_input_types` order: kv_blocks, cache_lengths uint32 [B], lookup_table
        uint32 [B, P] (P = most pages any sequence needs now), max_prompt_length,
        max_cache_length, page_stride (the last three on the CPU).
        Raises ValueError when the arena has too few pages left."""
        if len(new_tokens) != len(self.pages):
            raise ValueError(f"PagedKVCache: new_tokens must have {len(self.pages)} entries, "
                             f"got {len(new_tokens)}")
        page = self.params.page_size
        totals = self.lengths + np.asarray(new_tokens, np.int64)
        for seq, total in enumerate(totals):
            while len(self.pages[seq]) * page < total:
                if not self._free:
                    raise ValueError(f"PagedKVCache: out of pages ({self.total_pages} total)")
                self.pages[seq].append(self._free.pop())
        cols = max(len(p) for p in self.pages)
        lut = np.full((len(self.pages), max(cols, 1)), self.total_pages, np.uint32)
        for seq, pages in enumerate(self.pages):
            lut[seq, : len(pages)] = pages
        return [
            self.blocks,
            Buffer.from_numpy(self.lengths.astype(np.uint32)).to(self.device),
            Buffer.from_numpy(lut).to(self.device),
            Buffer.from_numpy(np.array([max(new_tokens)], np.uint32)),
            Buffer.from_numpy(np.array([int(totals.max())], np.uint32)),
            Buffer.from_numpy(np.array([page_stride_of(self.blocks)], np.int64)),
        ]

    def commit(self, new_tokens: Sequence[int]) -> None:
        """Records that the step wrote `new_tokens` [B] tokens per sequence."""
        self.lengths += np.asarray(new_tokens, np.int64)

    def contents(self, layer: int, seq: int) -> tuple[np.ndarray, np.ndarray]:
        """K and V of `seq`'s cached tokens in `layer`: float32 [length, n_kv_heads, head_dim]."""
        blocks = to_numpy(self.blocks)  # [pages, 2, layers, page, heads, dim]
        page = self.params.page_size
        pos = np.arange(self.lengths[seq])
        ids = np.asarray(self.pages[seq], np.int64)[pos // page]
        return blocks[ids, 0, layer, pos % page], blocks[ids, 1, layer, pos % page]


@dataclass(frozen=True)
class StepOutput:
    """One step's results: logits float32 [T, vocab], next ids int64 [B], wall seconds."""

    logits: np.ndarray
    next_ids: np.ndarray
    seconds: float


class DecoderRunner:
    """`MoEDecoder` with `weights`, compiled once for `device_kind` ("cpu" or "gpu"), plus its
    paged cache for `num_sequences` sequences."""

    def __init__(self, weights: DecoderWeights, device_kind: str, num_sequences: int,
                 total_pages: int = 64) -> None:
        if device_kind not in ("cpu", "gpu"):
            raise ValueError(f"DecoderRunner: device_kind must be 'cpu' or 'gpu', got "
                             f"{device_kind!r}")
        gpu = device_kind == "gpu"
        dref = DeviceRef.GPU() if gpu else DeviceRef.CPU()
        self.device: Device = Accelerator() if gpu else CPU()
        model = MoEDecoder(weights.config, dref)
        model.load_state_dict(model.state(weights))
        start = time.perf_counter()
        graph = build_graph(model)
        session = InferenceSession(devices=[CPU(), self.device] if gpu else [CPU()])
        self.model = session.load(graph, weights_registry=model.state_dict())
        self.compile_seconds = time.perf_counter() - start
        self.cache = PagedKVCache(weights.config.kv_params(dref), total_pages, num_sequences,
                                  self.device)

    def step(self, tokens: Sequence[Sequence[int]]) -> StepOutput:
        """Runs one step: tokens[b] are sequence b's new tokens (a prompt, or one token).

        Returns the logits of every new token (in sequence order) and each sequence's greedy
        next token; the cache then holds the new tokens' K and V."""
        counts = [len(t) for t in tokens]
        start = time.perf_counter()
        flat = np.concatenate([np.asarray(t, np.int64) for t in tokens])
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.uint32)
        inputs = [Buffer.from_numpy(flat).to(self.device),
                  Buffer.from_numpy(offsets).to(self.device),
                  *self.cache.step_inputs(counts)]
        logits, next_ids = self.model.execute(*inputs)
        out = StepOutput(to_numpy(logits), to_numpy(next_ids).astype(np.int64),
                         time.perf_counter() - start)
        self.cache.commit(counts)
        return out

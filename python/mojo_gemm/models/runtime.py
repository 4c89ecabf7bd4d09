"""Running the example decoder: MAX's paged KV cache managed on the host, one compiled graph,
and captured decode steps on the GPU.

`PagedKVCache` builds the cache inputs MAX's `PagedKVCacheManager` would (that manager needs
`max[serve]`): the page arena from `KVCacheParams.allocate_buffers`, a lookup table per step,
cache lengths, the max prompt/cache lengths, the page stride and, for MAX's flash attention,
its dispatch metadata. `DecoderRunner` compiles `MoEDecoder` once (symbolic tokens, batch and
pages). Prefill and mixed steps run eagerly (`Model.execute`). On the GPU a decode step (one
new token per sequence) runs as a replay of a device graph captured once per padded batch size
(`Model.capture` / `Model.replay`, what `max serve`'s device graph capture does): the step's
tokens, cache lengths and lookup table are copied into the captured input buffers and the graph
is replayed, with no host synchronisation until the caller reads the outputs.

What a captured step freezes, and why that is sound:
- shapes: a bucket has B_pad = next power of two >= B sequences and a lookup table of
  ceil(max_cache_length / page_size) columns; padded sequences decode one dummy token each into
  a scratch page no sequence owns, and unused lookup-table entries hold MAX's sentinel;
- host inputs (max_prompt_length = 1, max_cache_length, page_stride, attention dispatch
  metadata): read on the host only at capture, so they are pinned to the bucket's upper bounds
  (max_cache_length = the runner's bound; MAX's flash-attention partition count resolved for a
  cache-length bucket, a multiple of 256, so a step replays the bucket that covers its longest
  sequence).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
from max.driver import CPU, Accelerator, Buffer, Device
from max.engine import InferenceSession, Model
from max.graph import DeviceRef
from max.nn import Module, Signals
from max.nn.kv_cache import MHAKVCacheParams
from max.nn.kv_cache.cache_params import page_stride_of

from ..core.host import to_numpy
from .decoder import DecoderWeights, MoEDecoder, build_graph
from .sharded import ShardedMoEDecoder, build_sharded_graph

CACHE_LENGTH_BUCKET = 256
"""Granularity of the cache-length buckets of captured flash-attention decode graphs (MAX's
own probe granularity, `graph_capture_probe_cache_lengths`)."""


def uses_flash_attention(params_or_config: object) -> bool:
    """Whether a decoder config asks for MAX's flash attention (which needs dispatch metadata)."""
    return getattr(params_or_config, "attention", "graph") == "flash"


def padded_batch(batch: int) -> int:
    """The capture bucket of a decode batch: the next power of two >= batch (batch >= 1)."""
    return 1 << max(batch - 1, 0).bit_length()


class PagedKVCache:
    """The page arena of MAX's paged KV cache plus host-side bookkeeping for B sequences.

    Pages are handed out in a shuffled order (seeded), so sequences own scattered pages and
    the lookup table really is an indirection. Unused lookup-table entries hold MAX's sentinel,
    the page count. `scratch_page` (None until a padded decode bucket needs it) is the page the
    padded rows of captured decode steps write to; no sequence owns it.
    """

    def __init__(self, params: MHAKVCacheParams, total_pages: int, num_sequences: int,
                 device: Device | Sequence[Device], seed: int = 0,
                 flash_attention: bool = False) -> None:
        if total_pages < 1 or num_sequences < 1:
            raise ValueError(f"PagedKVCache: total_pages and num_sequences must be >= 1, got "
                             f"{total_pages} and {num_sequences}")
        self.devices: list[Device] = [device] if isinstance(device, Device) else list(device)
        self.params, self.total_pages, self.device = params, total_pages, self.devices[0]
        self.flash_attention = flash_attention
        # one page arena per device (a multi-device `params` splits the KV heads); every
        # device's arena uses the same page ids, so one lookup table serves them all
        self.device_blocks: list[Buffer] = list(params.allocate_buffers(total_pages)[0].values)
        self.blocks: Buffer = self.device_blocks[0]
        self._free = [int(p) for p in np.random.default_rng(seed).permutation(total_pages)]
        self.pages: list[list[int]] = [[] for _ in range(num_sequences)]
        self.lengths = np.zeros(num_sequences, np.int64)
        self.scratch_page: int | None = None

    @property
    def num_sequences(self) -> int:
        """B, the number of sequences the cache tracks."""
        return len(self.pages)

    def _take_page(self) -> int:
        if not self._free:
            raise ValueError(f"PagedKVCache: out of pages ({self.total_pages} total)")
        return self._free.pop()

    def _allocate(self, sequences: Sequence[int], totals: np.ndarray) -> None:
        page = self.params.page_size
        for seq, total in zip(sequences, totals, strict=True):
            while len(self.pages[seq]) * page < total:
                self.pages[seq].append(self._take_page())

    def _sequences(self, sequences: Sequence[int] | None, count: int) -> list[int]:
        seqs = list(range(self.num_sequences)) if sequences is None else [int(s) for s in
                                                                          sequences]
        if len(seqs) != count:
            raise ValueError(f"PagedKVCache: new_tokens must have {len(seqs)} entries, "
                             f"got {count}")
        if len(set(seqs)) != len(seqs) or any(not 0 <= s < self.num_sequences for s in seqs):
            raise ValueError(f"PagedKVCache: sequences must be distinct ids in "
                             f"[0, {self.num_sequences}), got {seqs}")
        return seqs

    def reserve(self, lengths: Sequence[int]) -> None:
        """Gives sequence b `lengths[b]` cached tokens without running a model: pages are
        allocated, their contents left as they are (for timing decode at a long context)."""
        seqs = self._sequences(None, len(lengths))
        totals = np.asarray(lengths, np.int64)
        if (totals < self.lengths).any():
            raise ValueError(f"PagedKVCache.reserve: lengths {list(totals)} must not be below "
                             f"the cached lengths {list(self.lengths)}")
        self._allocate(seqs, totals)
        self.lengths[:] = totals

    def lookup_table(self, sequences: Sequence[int], rows: int, cols: int) -> np.ndarray:
        """uint32 [rows, cols]: the pages of `sequences` (row i = sequences[i]), MAX's sentinel
        elsewhere; rows past len(sequences) (padding) point at the scratch page."""
        lut = np.full((rows, cols), self.total_pages, np.uint32)
        for row, seq in enumerate(sequences):
            lut[row, : len(self.pages[seq])] = self.pages[seq]
        if rows > len(sequences):
            if self.scratch_page is None:
                self.scratch_page = self._take_page()
            lut[len(sequences):, 0] = self.scratch_page
        return lut

    def dispatch_metadata(self, batch: int, max_prompt: int, max_cache: int,
                          device: int = 0) -> list[Buffer]:
        """MAX's attention dispatch metadata for a step on device index `device` (a list of
        one host buffer) when the model uses MAX's flash attention, else []."""
        if not self.flash_attention:
            return []
        key = self.params.resolve_attn_key(batch, max_prompt, max_cache)
        return [key.pack_into_buffer(self.devices[device], max_cache)]

    def step_inputs(self, new_tokens: Sequence[int],
                    sequences: Sequence[int] | None = None) -> list[Buffer]:
        """Allocates pages for `new_tokens[b]` more tokens of sequence `sequences[b]` (default:
        every sequence) and returns the cache inputs in `graph_input_types` order: kv_blocks,
        cache_lengths uint32 [B], lookup_table uint32 [B, P] (P = most pages any of them needs
        now), max_prompt_length, max_cache_length, page_stride (the last three on the CPU),
        then MAX's attention dispatch metadata for a flash-attention model; on several devices
        that group once per device, in device order (`sharded_graph_input_types`).
        Raises ValueError when the arena has too few pages left."""
        seqs = self._sequences(sequences, len(new_tokens))
        totals = self.lengths[seqs] + np.asarray(new_tokens, np.int64)
        self._allocate(seqs, totals)
        cols = max(1, *(len(self.pages[s]) for s in seqs))
        lut = self.lookup_table(seqs, len(seqs), cols)
        max_prompt, max_cache = max(new_tokens), int(totals.max())
        lengths = self.lengths[seqs].astype(np.uint32)
        inputs = []
        for i, (dev, blocks) in enumerate(zip(self.devices, self.device_blocks, strict=True)):
            inputs += [
                blocks,
                Buffer.from_numpy(lengths).to(dev),
                Buffer.from_numpy(lut).to(dev),
                Buffer.from_numpy(np.array([max_prompt], np.uint32)),
                Buffer.from_numpy(np.array([max_cache], np.uint32)),
                Buffer.from_numpy(np.array([page_stride_of(blocks)], np.int64)),
                *self.dispatch_metadata(len(seqs), max_prompt, max_cache, i),
            ]
        return inputs

    def commit(self, new_tokens: Sequence[int], sequences: Sequence[int] | None = None) -> None:
        """Records that the step wrote `new_tokens[b]` tokens of sequence `sequences[b]`."""
        seqs = self._sequences(sequences, len(new_tokens))
        self.lengths[seqs] += np.asarray(new_tokens, np.int64)

    def contents(self, layer: int, seq: int) -> tuple[np.ndarray, np.ndarray]:
        """K and V of `seq`'s cached tokens in `layer`: float32 [length, n_kv_heads, head_dim]
        (on several devices, their heads concatenated in device order)."""
        # [pages, 2, layers, page, heads of the device, dim] per device
        blocks = np.concatenate([to_numpy(b) for b in self.device_blocks], axis=4)
        page = self.params.page_size
        pos = np.arange(self.lengths[seq])
        ids = np.asarray(self.pages[seq], np.int64)[pos // page]
        return blocks[ids, 0, layer, pos % page], blocks[ids, 1, layer, pos % page]


class StepOutput:
    """One step's results: logits float32 [T, vocab], next ids int64 [B], wall seconds.

    An eager step's logits stay where the graph wrote them until `logits` is first read (a
    prefill of 4096 tokens returns 4 MB of them; generation needs only the next ids), so
    `seconds` covers the step through its next ids on the host."""

    def __init__(self, logits: np.ndarray | Buffer, next_ids: np.ndarray, seconds: float) -> None:
        self._logits = logits
        self.next_ids = next_ids
        self.seconds = seconds

    @property
    def logits(self) -> np.ndarray:
        """float32 [T, vocab], copied to the host on first read."""
        if not isinstance(self._logits, np.ndarray):
            self._logits = to_numpy(self._logits)
        return self._logits


class DecodeGraph:
    """One captured decode bucket: B_pad sequences, a lookup table of `cols` pages.

    `inputs` are the captured input buffers (the graph reads these addresses at every replay),
    `outputs` the buffers the replays write (logits float32 [B_pad, vocab], next ids int64
    [B_pad]). `load` copies a step's tokens, cache lengths and lookup table into the inputs
    (device copies ordered on the stream; the host sources are kept until the next load, by
    which time the caller has read the previous outputs); `replay` launches the graph and
    returns at once.
    """

    def __init__(self, model: Model, key: int, inputs: list[Buffer], batch: int,
                 cols: int) -> None:
        self.model, self.key, self.inputs, self.batch, self.cols = model, key, inputs, batch, cols
        self.outputs: list[Buffer] = model.capture(key, *inputs)
        self._staged: list[Buffer] = []

    def load(self, tokens: np.ndarray, cache_lengths: np.ndarray, lut: np.ndarray) -> None:
        """Copies tokens int64 [B_pad], cache_lengths uint32 [B_pad] and the lookup table
        uint32 [B_pad, cols] into the captured input buffers."""
        staged = [Buffer.from_numpy(np.ascontiguousarray(a)) for a in (tokens, cache_lengths, lut)]
        for index, src in zip((0, 3, 4), staged, strict=True):
            self.inputs[index].inplace_copy_from(src)
        self._staged = staged

    def replay(self) -> None:
        """Replays the captured step on the device (no host synchronisation)."""
        self.model.replay(self.key, *self.inputs)

    def verify(self) -> None:
        """MAX's `debug_verify_replay`: runs the step eagerly on the current inputs and raises
        if its kernel launches differ from the captured graph's."""
        self.model.debug_verify_replay(self.key, *self.inputs)


class DecoderRunner:
    """`MoEDecoder` with `weights` (or a prebuilt `model` with its call signature, `.config`
    and `.device`, state loaded), compiled once for `device_kind` ("cpu" or "gpu"), plus its
    paged cache for `num_sequences` sequences.

    On the GPU, decode steps (one new token for each stepped sequence) replay a device graph
    captured on first use per padded batch size (and, with MAX's flash attention, per
    cache-length bucket); `captured=False` runs every step eagerly. `max_cache_length` bounds
    every sequence's cache (it sizes the captured lookup tables; default: the whole arena).
    `devices` > 1 (GPU, flash attention), or `sharded=True`: the model is `ShardedMoEDecoder`
    over that many GPUs (MAX's multi-device graph and allreduce, a KV-head share of the cache on
    each; one GPU runs the same sharded layers with nothing to reduce), every step eager.
    `compiled`: `build_graph(model)` already compiled and initialized with `model`'s weights
    (e.g. beside other graphs of one `max.graph.Module`), used instead of compiling it here.
    """

    def __init__(self, weights: DecoderWeights | None, device_kind: str, num_sequences: int,
                 total_pages: int = 64, *, max_cache_length: int | None = None,
                 model: Module | None = None, captured: bool = True, devices: int = 1,
                 sharded: bool = False, compiled: Model | None = None) -> None:
        if device_kind not in ("cpu", "gpu"):
            raise ValueError(f"DecoderRunner: device_kind must be 'cpu' or 'gpu', got "
                             f"{device_kind!r}")
        gpu = device_kind == "gpu"
        sharded = sharded or devices > 1
        if devices < 1 or (sharded and (not gpu or model is not None)):
            raise ValueError(f"DecoderRunner: devices must be 1, or the sharded decoder on the "
                             f"GPU (no prebuilt model), got devices={devices}, sharded={sharded}"
                             f" ({device_kind})")
        if compiled is not None and (model is None or sharded):
            raise ValueError("DecoderRunner: compiled needs the prebuilt model it was compiled "
                             f"from (one device), got model={model!r}, sharded={sharded}")
        drefs = [DeviceRef.GPU(i) for i in range(devices)] if gpu else [DeviceRef.CPU()]
        self.devices: list[Device] = ([Accelerator(i) for i in range(devices)] if gpu
                                      else [CPU()])
        self.device: Device = self.devices[0]
        self._signals: list[Buffer] = []
        if model is None:
            if weights is None:
                raise ValueError("DecoderRunner: pass weights or a prebuilt model")
            model = (ShardedMoEDecoder(weights.config, drefs) if sharded
                     else MoEDecoder(weights.config, drefs[0]))
            model.load_state_dict(model.state(weights))
        self.config = config = model.config
        start = time.perf_counter()
        if compiled is not None:
            self.model: Model = compiled
        else:
            if sharded:
                graph = build_sharded_graph(model)
                self._signals = list(Signals(drefs).buffers())
            else:
                graph = build_graph(model)
            session = InferenceSession(devices=[CPU(), *self.devices] if gpu else [CPU()])
            self.model = session.load(graph, weights_registry=model.state_dict())
        self.compile_seconds = time.perf_counter() - start
        self.cache = PagedKVCache(config.kv_params(drefs if sharded else drefs[0]),
                                  total_pages, num_sequences, self.devices,
                                  flash_attention=uses_flash_attention(config))
        page = config.page_size
        bound = total_pages * page if max_cache_length is None else max_cache_length
        if bound < 1:
            raise ValueError(f"DecoderRunner: max_cache_length must be >= 1, got {bound}")
        self.max_cache_length = bound
        self.captured = gpu and captured and not sharded
        self._graphs: dict[tuple[int, int], DecodeGraph] = {}

    # ------------------------------------------------------------------ captured decode
    def _cache_bucket(self, longest: int) -> int:
        """The max_cache_length a decode graph is captured for: the runner's bound, or for
        MAX's flash attention the next multiple of CACHE_LENGTH_BUCKET (capped at the bound),
        so the partition count it freezes fits the step."""
        if not self.cache.flash_attention:
            return self.max_cache_length
        rounded = -(-longest // CACHE_LENGTH_BUCKET) * CACHE_LENGTH_BUCKET
        return min(max(rounded, 1), self.max_cache_length)

    def decode_graph(self, batch: int, longest: int | None = None) -> DecodeGraph:
        """The captured decode bucket for `batch` sequences whose longest cache (after the
        step) is `longest` tokens (default: the bound); captured on first use."""
        if not 1 <= batch <= self.cache.num_sequences:
            raise ValueError(f"DecoderRunner.decode_graph: batch must be in [1, "
                             f"{self.cache.num_sequences}], got {batch}")
        b_pad = padded_batch(batch)
        bucket = self._cache_bucket(self.max_cache_length if longest is None else longest)
        found = self._graphs.get((b_pad, bucket))
        if found is not None:
            return found
        page = self.config.page_size
        cols = -(-self.max_cache_length // page)
        cache, dev = self.cache, self.device
        # Inputs in graph order; the device ones are the buffers every replay reads.
        lut = cache.lookup_table([], b_pad, cols)  # all padding until the first load
        inputs = [
            Buffer.from_numpy(np.zeros(b_pad, np.int64)).to(dev),
            Buffer.from_numpy(np.arange(b_pad + 1, dtype=np.uint32)).to(dev),
            cache.blocks,
            Buffer.from_numpy(np.zeros(b_pad, np.uint32)).to(dev),
            Buffer.from_numpy(lut).to(dev),
            Buffer.from_numpy(np.array([1], np.uint32)),
            Buffer.from_numpy(np.array([bucket], np.uint32)),
            Buffer.from_numpy(np.array([page_stride_of(cache.blocks)], np.int64)),
            *cache.dispatch_metadata(b_pad, 1, bucket),
        ]
        graph = DecodeGraph(self.model, len(self._graphs) + 1, inputs, b_pad, cols)
        self._graphs[(b_pad, bucket)] = graph
        return graph

    def _captured_step(self, tokens: Sequence[Sequence[int]], seqs: list[int]) -> StepOutput:
        start = time.perf_counter()
        cache = self.cache
        totals = cache.lengths[seqs] + 1
        if int(totals.max()) > self.max_cache_length:
            raise ValueError(f"DecoderRunner: a sequence would hold {int(totals.max())} tokens, "
                             f"over max_cache_length = {self.max_cache_length}")
        cache._allocate(seqs, totals)
        graph = self.decode_graph(len(seqs), int(totals.max()))
        b_pad = graph.batch
        ids = np.zeros(b_pad, np.int64)
        ids[: len(seqs)] = [int(t[0]) for t in tokens]
        lengths = np.zeros(b_pad, np.uint32)
        lengths[: len(seqs)] = cache.lengths[seqs]
        graph.load(ids, lengths, cache.lookup_table(seqs, b_pad, graph.cols))
        graph.replay()
        logits, next_ids = graph.outputs
        out = StepOutput(to_numpy(logits)[: len(seqs)],
                         to_numpy(next_ids).astype(np.int64)[: len(seqs)],
                         time.perf_counter() - start)
        cache.commit([1] * len(seqs), seqs)
        return out

    # ------------------------------------------------------------------ steps
    def step(self, tokens: Sequence[Sequence[int]],
             sequences: Sequence[int] | None = None) -> StepOutput:
        """Runs one step: tokens[b] are the new tokens (a prompt, or one token) of sequence
        `sequences[b]` (default: every sequence, in order); int64 arrays are taken as they are,
        lists of Python ints are converted token by token first (host time on every step).

        Returns the logits of every new token (in the order given) and each stepped
        sequence's greedy next token; the cache then holds the new tokens' K and V. A GPU
        step of one token per sequence replays a captured graph; others run eagerly."""
        seqs = self.cache._sequences(sequences, len(tokens))
        counts = [len(t) for t in tokens]
        if self.captured and all(c == 1 for c in counts):
            return self._captured_step(tokens, seqs)
        return self.eager_step(tokens, seqs)

    def eager_step(self, tokens: Sequence[Sequence[int]],
                   sequences: Sequence[int] | None = None) -> StepOutput:
        """`step` through `Model.execute`, whatever the step's shape."""
        counts = [len(t) for t in tokens]
        start = time.perf_counter()
        flat = np.concatenate([np.asarray(t, np.int64) for t in tokens])
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.uint32)
        inputs = []
        for dev in self.devices:
            inputs += [Buffer.from_numpy(flat).to(dev), Buffer.from_numpy(offsets).to(dev)]
        inputs += [*self.cache.step_inputs(counts, sequences), *self._signals]
        logits, next_ids = self.model.execute(*inputs)
        # the next ids wait for the whole step; the logits are copied only when read (each
        # execute returns fresh buffers, so reading them later is safe)
        next_host = to_numpy(next_ids).astype(np.int64)
        out = StepOutput(logits, next_host, time.perf_counter() - start)
        self.cache.commit(counts, sequences)
        return out

"""A paged KV cache: one pool of fixed-size blocks per layer, and a block table per sequence.

The static cache of notebook 4 gives every sequence one contiguous row of ``block_size`` positions,
reserved up front. Here the keys and values of all sequences live in one shared pool of small
blocks (16 positions by default), handed out as a sequence grows and returned when it finishes.

Three parts, along nano-vllm's seams: the bookkeeping (:class:`kvlib.blocks.BlockManager`: which
block holds what, for whom; no tensors), the keys and values (:class:`KVPool`), and the runner
(:class:`PagedKVCache`: it asks the bookkeeping, reserves, builds each pass's slot mapping as a
:class:`PagedBatch`, and runs the model over it). Reading order: ``KVPool`` -> ``PagedKVCache`` ->
``PagedBatch``, then ``parallel_sample`` (forks sharing a prompt's blocks); ``kvlib.verify.verify_paged``
proves that none of this changes an output.

Shapes: L layers, N blocks, b block size, H heads, D head size; B sequences, T new tokens, S keys.
"""
from __future__ import annotations

from array import array
from contextlib import contextmanager, nullcontext
from itertools import repeat

import torch

from .blocks import KV_BLOCK_SIZE, BlockManager, BlockTable, block_hash, ceil_div  # noqa: F401  (re-exported)
from .checks import (check_banned, check_bool, check_choice, check_config, check_device, check_dtype, check_id_list, check_int,
                     check_key, check_model, check_seed)
from .sampling import Sampling, ban, check_logits, sample_next, token_mask
from .cache import ContextLimitError, check_cache_made_for, check_multi_head
from .decoding import DECODERS
from .fast import PagedStep
from .guards import one_thread_at_a_time
from .model import GPT, GPTConfig
from .weights import check_weights

MAX_POSITIONS = 2**22  # a pool holds at most this many positions (num_blocks x kv_block_size)


class KVPool:
    """Keys and values of every block, ``k``, ``v`` (L, N * b, H, D): views of one buffer ``kv`` (L, N * b, 2, H, D).

    A slot's key and value sit side by side, so that the lean step reads both with one gather. Slot
    ``s`` of the flat second axis is position ``s % b`` of block ``s // b``.
    """

    def __init__(self, config: GPTConfig, num_blocks: int, kv_block_size: int = KV_BLOCK_SIZE, device=None, dtype=None):
        check_config(config, GPTConfig)
        check_multi_head(config, "the paged cache", "so do the serving engine and parallel sampling built on it; "
                         "decode this model with generate(..., decoder='model'), which keeps a KVCache")
        self.kv_block_size = check_int("kv_block_size", kv_block_size, 1, config.block_size,
                                       f"an int in [1, {config.block_size}] (the model's block size at most)")
        top = MAX_POSITIONS // self.kv_block_size
        self.num_blocks = check_int("num_blocks", num_blocks, 1, top,
                                    f"an int in [1, {top}] (at most {MAX_POSITIONS} positions in the pool)")
        device, dtype = check_device(device), check_dtype(dtype)
        shape = (config.n_layer, num_blocks * kv_block_size, 2, config.n_head, config.head_size)
        self.kv = torch.zeros(shape, device=device, dtype=dtype)  # a slot's key and value side by side
        self.k, self.v = self.kv.unbind(2)                        # (L, N * b, H, D) each, views of it

    def block(self, bid: int) -> torch.Tensor:
        """The keys and values of block ``bid``: (L, b, 2, H, D), a view."""
        b = self.kv_block_size
        return self.kv[:, bid * b:(bid + 1) * b]

    def copy(self, src: int, dst: int) -> None:
        src, dst = check_int("src", src, 0, self.num_blocks - 1), check_int("dst", dst, 0, self.num_blocks - 1)
        self.block(dst).copy_(self.block(src))


class PagedKVCache:
    """Sequences over one pool of blocks: they come, grow, share blocks and go.

    ``add_sequence(sid, prompt)`` finds the prompt's full blocks already in the pool (prefix caching)
    and returns how many prompt tokens need no computing; ``forward(model, sids, new_tokens)`` runs
    the model over a batch of sequences, each with its own new tokens, and returns each one's last
    logits; ``fork`` starts a sequence that shares all of another's blocks; ``free`` ends one. The
    questions a scheduler asks first (``can_allocate``, ``can_append``, ``num_free_blocks``) and the
    tables are the bookkeeping's, ``block_manager``'s.
    """

    def __init__(self, config: GPTConfig, num_blocks: int, kv_block_size: int = KV_BLOCK_SIZE, *,
                 enable_prefix_caching: bool = True, device=None, dtype=None):
        check_config(config, GPTConfig)
        enable_prefix_caching = check_bool("enable_prefix_caching", enable_prefix_caching)
        self.config = config
        self.pool = KVPool(config, num_blocks, kv_block_size, device, dtype)
        self.kv_block_size = self.pool.kv_block_size
        self.block_manager = BlockManager(self.pool.num_blocks, self.kv_block_size,
                                          enable_prefix_caching=enable_prefix_caching)
        # The lean step, made on first use; any callable with PagedStep's contract may take its place (a compiled one).
        self.step_runner: PagedStep | None = None
        self.rollback: dict[int, torch.Tensor] | None = None  # in a transaction: blocks' contents before it wrote

    @classmethod
    def for_model(cls, model: GPT, num_blocks: int, kv_block_size: int = KV_BLOCK_SIZE, *,
                  enable_prefix_caching: bool = True) -> "PagedKVCache":
        """A cache for ``model``: its config, its weights' device and dtype."""
        check_model(model)
        weight = model.lm_head.weight
        return cls(model.config, num_blocks, kv_block_size, enable_prefix_caching=enable_prefix_caching,
                   device=weight.device, dtype=weight.dtype)

    # -- what the bookkeeping knows ----------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.block_manager.num_free

    @property
    def prefix_hit_tokens(self) -> int:
        return self.block_manager.prefix_hit_tokens

    @property
    def copies_on_write(self) -> int:
        return self.block_manager.copies_on_write

    def table(self, sid) -> BlockTable:
        return self.block_manager.table(sid)

    def blocks_needed(self, n_tokens: int) -> int:
        return self.block_manager.blocks_needed(n_tokens)

    def can_allocate(self, n_tokens: int) -> bool:
        return self.block_manager.can_allocate(n_tokens)

    def can_append(self, sids: list, new_tokens: list[list[int]]) -> bool:
        return self.block_manager.can_append(sids, new_tokens)

    def used_blocks(self) -> int:
        return self.block_manager.used_blocks()

    def stored_tokens(self) -> int:
        return self.block_manager.stored_tokens()

    # -- sequences -----------------------------------------------------------------------------------
    @one_thread_at_a_time
    def add_sequence(self, sid, prompt: list[int]) -> int:
        """Start sequence ``sid``; returns the number of prompt tokens already cached (full blocks only)."""
        prompt = check_id_list("prompt", prompt, self.config.vocab_size, max_len=self.config.block_size)
        return self.block_manager.add_sequence(sid, prompt)

    @one_thread_at_a_time
    def fork(self, parent, child) -> None:
        """``child`` shares every block of ``parent`` (parallel sampling): no copy until one of them writes."""
        self.block_manager.fork(parent, child)

    @one_thread_at_a_time
    def free(self, sid) -> None:
        self.block_manager.free(sid)

    @one_thread_at_a_time
    def truncate(self, sid, n) -> None:
        """Keep the first ``n`` tokens of sequence ``sid`` (a roll-back): blocks past them go back to the pool.

        More than moving a length: whole blocks beyond the kept tokens are released, and a kept block
        that a prefix may still find by its hash is copied before the sequence writes into it again.
        """
        length = self.table(sid).length
        n = check_int("n", n, 0, length, f"an int in [0, {length}] (tokens of {sid!r} to keep)")
        self.block_manager.truncate(sid, n)

    def slots_needed(self, sid, n_new: int) -> int:
        """Blocks that appending ``n_new`` tokens to ``sid`` takes from the pool (copy-on-write included)."""
        self.table(sid)
        return self.block_manager.blocks_to_append([sid], [[0] * check_int("n_new", n_new, 0)])

    @one_thread_at_a_time
    def reserve(self, sid, n_new: int) -> None:
        """Make room for ``n_new`` more tokens: copy a shared last block, then add blocks as needed.

        ``forward`` reserves for every sequence of its batch; refused, with nothing taken, when the pool
        cannot give what it needs."""
        room = self.config.block_size - self.table(sid).length
        n_new = check_int("n_new", n_new, 1, room, f"an int in [1, {room}] (room left in the model's block)")
        if not self.can_append([sid], [[0] * n_new]):
            raise RuntimeError(f"the block pool is full: sequence {sid!r} needs more blocks than the "
                               f"{self.num_free_blocks} free; free or preempt a sequence first")
        before = set(self.table(sid).blocks)
        copies = self.block_manager.append(sid, n_new)
        for bid in self.table(sid).blocks:
            if bid not in before:  # handed out again: it may hold a preempted sequence's or a cached prefix's keys
                self.keep_for_rollback(bid)
        for src, dst in copies:
            self.pool.copy(src, dst)

    # -- all or nothing ------------------------------------------------------------------------------
    @contextmanager
    def transaction(self):
        """A block of calls that happens entirely or not at all: if it raises, the cache is put back.

        The bookkeeping is restored from its snapshot, and so are the keys and values of every block
        reserved inside (a preempted sequence's, an evicted prefix's), saved before it was written.
        Nested transactions join the outer one.
        """
        if self.rollback is not None:
            yield
            return
        saved, self.rollback = self.block_manager.snapshot(), {}
        try:
            yield
        except BaseException:
            for bid, kv in self.rollback.items():
                self.pool.block(bid).copy_(kv)
            self.block_manager.restore(saved)
            raise
        finally:
            self.rollback = None

    def keep_for_rollback(self, bid: int) -> None:
        """Inside a transaction, save a block's keys and values before this cache writes into it."""
        if self.rollback is not None and bid not in self.rollback:
            self.rollback[bid] = self.pool.block(bid).clone()

    # -- the forward pass -----------------------------------------------------------------------------
    def batch(self, sids: list, new_tokens: list[list[int]]) -> "PagedBatch":
        """Reserve room for every sequence's new tokens and lay out the pass; all checked first, so that bad input
        changes nothing."""
        for name, x in (("sids", sids), ("new_tokens", new_tokens)):
            if isinstance(x, (str, bytes)) or not isinstance(x, (list, tuple)):
                raise TypeError(f"{name} must be a list, got {x!r:.60}")
        if len(sids) != len(new_tokens):
            raise ValueError(f"sids and new_tokens must be lists of the same length, got {len(sids)} and "
                             f"{len(new_tokens)}")
        if not sids:
            raise ValueError("sids must name at least one sequence: a batch needs one, got []")
        for i, sid in enumerate(sids):
            check_key(f"sids[{i}]", sid)
        if len(set(sids)) != len(sids):
            raise ValueError(f"sids must name each sequence once in a batch, got {list(sids)!r:.100}")
        for i, new in enumerate(new_tokens):
            if isinstance(new, (list, tuple)) and not new:
                raise ValueError(f"new_tokens[{i}] is empty: sequence {sids[i]!r} has no new tokens; every row "
                                 f"needs at least one")
        new_tokens = [check_id_list(f"new_tokens[{i}]", new, self.config.vocab_size)
                      for i, new in enumerate(new_tokens)]
        for sid, new in zip(sids, new_tokens):
            if self.table(sid).length + len(new) > self.config.block_size:
                raise ContextLimitError(f"sequence {sid!r} would reach {self.table(sid).length + len(new)} "
                                        f"positions; the model's block holds {self.config.block_size}")
        need = self.block_manager.blocks_to_append(sids, new_tokens)
        if need > self.num_free_blocks:
            raise RuntimeError(f"the block pool is full: this batch needs {need} blocks at its peak, "
                               f"{self.num_free_blocks} are free; free or preempt a sequence first")
        for sid, new in zip(sids, new_tokens):
            self.reserve(sid, len(new))
        return PagedBatch(self, list(sids), new_tokens)

    @one_thread_at_a_time
    @torch.inference_mode()
    def forward(self, model: GPT, sids: list, new_tokens: list[list[int]], decoder: str = "fast") -> torch.Tensor:
        """Feed each sequence its new tokens in one batched forward; (B, V) logits of each one's last token.

        ``decoder="fast"``: the lean step of :class:`kvlib.fast.PagedStep`, the single-stream fast
        path's arithmetic, for decode steps and prefills alike. ``decoder="model"``: ``GPT.forward``,
        the path notebook 7 explains.
        """
        check_model(model)
        check_choice("decoder", decoder, tuple(DECODERS))
        check_cache_made_for(model.config, self)
        with self.transaction():  # refused or interrupted: the reserved blocks and copies are undone
            return self.run(model, self.batch(sids, new_tokens), decoder)

    def run(self, model: GPT, batch: "PagedBatch", decoder: str) -> torch.Tensor:
        """The model over a batch laid out by :meth:`batch`: the lean step, or ``GPT.forward`` with the batch as its cache."""
        weight = model.lm_head.weight
        # A model whose weights do not match the pool goes to GPT.forward, which says what does not match.
        if decoder == "fast" and weight.dtype == self.pool.k.dtype and weight.device == self.pool.k.device:
            if self.step_runner is None:
                self.step_runner = PagedStep()
            T = batch.idx.shape[1]
            logits = self.step_runner(model, self.pool.kv, batch.idx, batch.position_ids, batch.read_slots,
                                      batch.key_mask, None if T == 1 else batch.write_rows * T + batch.write_cols,
                                      batch.write_slots)
            batch.advance(T)
        else:
            logits, _ = model(batch.idx, cache=batch, key_mask=batch.key_mask, position_ids=batch.position_ids,
                              last_only=True)
            logits = logits[:, -1]
        # Refused inside the caller's transaction, so nothing is stored: NaN or +inf logits (a float16 model
        # overflowing, say) cannot be ranked, and an argmax over them would write garbage.
        return check_logits(logits, "the model's logits")


def _longs(values: array, *shape: int) -> torch.Tensor:
    """An int64 tensor of ``shape`` over the array's memory (no copy; the tensor keeps the array alive)."""
    return torch.frombuffer(values, dtype=torch.long).view(shape)


class PagedBatch:
    """A batch of sequences of one :class:`PagedKVCache`, offering what ``GPT.forward`` reads from a cache.

    Rows are right-aligned (padded on the left) as in notebook 6: row ``b``'s ``n_b`` keys fill the last ``n_b`` of ``S``
    columns, its new tokens the last ones of ``T``; ``key_mask`` hides the columns to their left and
    ``position_ids`` count each row's own positions. ``write(layer, k, v)`` scatters the new keys
    into their slots and returns every row's keys *gathered* from its blocks, (B, H, S, D), so the
    model's attention runs unchanged.

    This gather is the teaching shortcut: it copies each sequence's keys into a contiguous tensor at
    every layer and step. A real paged-attention kernel (vLLM's PagedAttention, FlashAttention's
    paged mode) never builds that tensor: it takes the block table as an argument and, inside the
    kernel, reads each block of keys and values straight from the pool while it computes the
    softmax, so the only memory traffic is the one reading the cache needs anyway.
    """

    def __init__(self, cache: PagedKVCache, sids: list, new_tokens: list[list[int]]):
        """The layout of one pass over blocks already reserved (:meth:`PagedKVCache.batch` reserves, then makes it)."""
        if not isinstance(cache, PagedKVCache):
            raise TypeError(f"cache must be a PagedKVCache, got {type(cache).__name__}")
        if not isinstance(sids, list) or not isinstance(new_tokens, list) or len(sids) != len(new_tokens) or not sids:
            raise ValueError("sids and new_tokens must be non-empty lists of the same length (make a batch with "
                             "PagedKVCache.batch, which reserves its blocks)")
        tables = [cache.table(sid) for sid in sids]
        for sid, table, new in zip(sids, tables, new_tokens):
            if len(table.blocks) < cache.blocks_needed(table.length + len(new)):
                raise ValueError(f"sequence {sid!r} has no blocks reserved for its {len(new)} new tokens: make the "
                                 f"batch with PagedKVCache.batch")
        new_tokens = [check_id_list(f"new tokens of {sid!r}", new, cache.config.vocab_size)
                      for sid, new in zip(sids, new_tokens)]
        self.cache, self.sids, self.new_tokens = cache, sids, new_tokens
        self.advanced = False
        b = cache.kv_block_size
        # This runs before every decode step, so it stays in Python's arrays: each row's tokens, slots and
        # positions are appended to flat arrays, and tensors are made over them without a copy (a tensor
        # op on a small tensor costs more than the Python that replaces it; torch.tensor of a list costs
        # a third of a µs an item).
        n_new = [len(t) for t in new_tokens]
        totals = [table.length + n for table, n in zip(tables, n_new)]       # tokens after this pass
        B, T, S = len(sids), max(n_new), max(totals)
        self.length, self.max_len = S - T, S  # GPT.forward: positions start at length, S keys in all
        idx, slots, positions, rows, cols, writes = (array("q") for _ in range(6))
        for r, (table, total, tokens) in enumerate(zip(tables, totals, new_tokens)):
            n = len(tokens)
            idx.extend(repeat(0, T - n))
            idx.extend(tokens)
            slots.extend(repeat(table.blocks[0] * b, S - total))              # padding reads the row's first slot
            for i, bid in enumerate(table.blocks[:ceil_div(total, b)]):
                slots.extend(range(bid * b, bid * b + min(b, total - i * b)))
            writes.extend(slots[len(slots) - n:])                              # the new tokens' slots: its last n
            positions.extend(max(p, 0) for p in range(total - T, total))     # padding columns at 0
            rows.extend(repeat(r, n))
            cols.extend(range(T - n, T))
        self.idx = _longs(idx, B, T)                                           # (B, T), left-padded
        self.read_slots = _longs(slots, B, S)                                  # (B, S): each row's keys, right-aligned
        self.read_flat = self.read_slots.view(B * S)                               # (B * S,) for index_select
        self.position_ids = _longs(positions, B, T)                            # (B, T)
        self.key_mask = None if min(totals) == S else torch.frombuffer(        # (B, S) or None: False on padding
            bytearray(b"".join(bytes(S - t) + b"\x01" * t for t in totals)), dtype=torch.bool).view(B, S)
        N = len(writes)                                                        # the real new tokens, row by row
        self.write_rows, self.write_cols, self.write_slots = _longs(rows, N), _longs(cols, N), _longs(writes, N)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Store the new keys (B, H, T, D) in their slots; return every row's keys so far (B, H, S, D).

        ``index_copy_`` and ``index_select`` along the pool's slot axis do the scatter and the gather:
        the same as indexing with ``[slots]``, one kernel each.
        """
        pool, (B, S) = self.cache.pool, self.read_slots.shape
        cfg, T = self.cache.config, self.idx.shape[1]
        layer = check_int("layer", layer, 0, cfg.n_layer - 1)
        want = (B, cfg.n_head, T, cfg.head_size)
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.dtype != pool.k.dtype:
                got = f"a {t.dtype} tensor" if isinstance(t, torch.Tensor) else type(t).__name__
                raise TypeError(f"{name} must be a {pool.k.dtype} tensor of shape (B, H, T, D) = {want}, got {got}")
            if tuple(t.shape) != want:
                raise ValueError(f"{name} must be a {pool.k.dtype} tensor of shape (B, H, T, D) = {want}, got shape "
                                 f"{tuple(t.shape)}")
        shape = (B, S) + tuple(k.shape[1:2]) + tuple(k.shape[3:])          # (B, S, H, D)
        out = []
        for store, new in ((pool.k[layer], k), (pool.v[layer], v)):
            store.index_copy_(0, self.write_slots, new.transpose(1, 2)[self.write_rows, self.write_cols])  # (N, H, D)
            out.append(store.index_select(0, self.read_flat).view(shape).transpose(1, 2))  # (B, H, S, D)
        return tuple(out)

    takes_padding = True  # its rows are left-padded to one width, with a key_mask

    @property
    def batch_size(self) -> int:
        return len(self.sids)

    @property
    def config(self) -> GPTConfig:
        return self.cache.config

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks its sequences hold (a block shared by two of them counted once)."""
        blocks = {bid for sid in self.sids for bid in self.cache.table(sid).blocks}
        return len(blocks) * self.pool_block_bytes

    @property
    def pool_block_bytes(self) -> int:
        pool = self.cache.pool
        return pool.kv.nbytes // pool.num_blocks

    def next_positions(self, T: int, device=None) -> torch.Tensor:
        """(B, T): each row's own positions for this pass's new tokens (padding columns at 0)."""
        if T != self.idx.shape[1]:
            raise ValueError(f"T must be this batch's {self.idx.shape[1]} new-token columns, got {T!r}")
        return self.position_ids.to(device) if device is not None else self.position_ids

    def attending(self, model):
        """Nothing to observe: a paged batch only stores and gathers."""
        return nullcontext()

    def reset(self) -> None:
        """Drop every sequence's tokens (:meth:`truncate` to 0)."""
        self.truncate(0)

    def advance(self, n: int) -> None:
        """The new tokens are stored (``GPT.forward`` calls this once, with ``n`` = T, after its last layer)."""
        T = self.idx.shape[1]
        n = check_int("n", n, T, T, f"{T} (the batch's new-token columns)")
        if self.advanced:
            raise RuntimeError("this batch has already advanced: its tokens are stored; make a new batch")
        self.advanced = True
        for sid, t in zip(self.sids, self.new_tokens):
            self.cache.block_manager.commit(sid, t)

    def truncate(self, n) -> None:
        """Keep at most ``n`` tokens of every sequence of the batch (:meth:`PagedKVCache.truncate` each)."""
        n = check_int("n", n, 0, self.length, f"an int in [0, {self.length}] (tokens to keep per sequence)")
        for sid in self.sids:
            self.cache.truncate(sid, min(n, self.cache.table(sid).length))


MAX_PARALLEL = 1024  # continuations of one prompt


@torch.inference_mode()
def parallel_sample(model: GPT, prompt: list[int], n: int, max_new_tokens: int, *, temperature: float = 0.8,
                    top_k: int | None = 40, seed: int = 0, kv_block_size: int = KV_BLOCK_SIZE,
                    banned: tuple[int, ...] = ()) -> dict:
    """``n`` sampled continuations of one prompt whose prompt blocks are stored once and shared.

    The prompt is prefilled once; ``n - 1`` forks share its blocks (reference counts go up). A
    continuation that writes into the shared, partly filled last block while others still use it
    copies that block first (copy-on-write): ``n - 1`` copies, the last writer finds the block its
    own. The full blocks stay shared to the end. ``banned`` token ids are never drawn
    (the poem separator, say, to keep every continuation inside the poem).
    """
    check_model(model)
    check_weights(model)
    cfg = model.config
    prompt = check_id_list("prompt", prompt, cfg.vocab_size, max_len=cfg.block_size - 1)
    n = check_int("n", n, 1, MAX_PARALLEL)
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1, cfg.block_size - len(prompt),
                               f"an int in [1, {cfg.block_size - len(prompt)}] for a {len(prompt)}-token prompt "
                               f"and block size {cfg.block_size}")
    temperature, top_k, _ = Sampling(temperature, top_k, None)
    seed = check_seed(seed)
    kv_block_size = check_int("kv_block_size", kv_block_size, 1, cfg.block_size,
                              f"an int in [1, {cfg.block_size}] (the model's block size at most)")
    banned = token_mask(check_banned(banned, cfg.vocab_size), cfg.vocab_size)  # (V,)
    need = n * ceil_div(len(prompt) + max_new_tokens, kv_block_size)
    cache = PagedKVCache.for_model(model, need, kv_block_size, enable_prefix_caching=False)
    cache.add_sequence(0, prompt)
    logits = cache.forward(model, [0], [prompt])
    prompt_blocks = cache.block_manager.blocks_of(0)
    for i in range(1, n):
        cache.fork(0, i)
    shared_after_fork = cache.used_blocks()
    gen = torch.Generator().manual_seed(seed)
    logits = logits.expand(n, -1)
    outputs = [[] for _ in range(n)]
    for step in range(max_new_tokens):
        nxt = sample_next(ban(logits, banned), temperature, top_k, None, gen)[:, 0].tolist()
        for o, t in zip(outputs, nxt):
            o.append(t)
        if step + 1 < max_new_tokens:
            logits = cache.forward(model, list(range(n)), [[t] for t in nxt])
    return {"n": n, "prompt_tokens": len(prompt), "prompt_blocks": len(prompt_blocks),
            "blocks_after_fork": shared_after_fork, "blocks_at_end": cache.used_blocks(),
            "blocks_without_sharing": n * len(cache.block_manager.blocks_of(0)),
            "full_prompt_blocks_still_shared": sum(cache.block_manager.blocks[b].ref_count == n for b in prompt_blocks),
            "copies_on_write": cache.copies_on_write, "outputs": outputs}

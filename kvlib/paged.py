"""A paged KV cache: one pool of fixed-size blocks per layer, and a block table per sequence.

The static cache of notebook 4 gives every sequence one contiguous row of ``block_size`` positions,
reserved up front. Here the keys and values of all sequences live in one shared pool of small
blocks (16 positions by default), handed out as a sequence grows and returned when it finishes; a
sequence's *block table* lists its blocks in order, as a page table lists a process's pages.

Reading order: ``Block`` (what the pool knows about one block) -> ``BlockPool`` (the tensors, the
free lists, reference counts, the hash table of full blocks for prefix caching) -> ``PagedKVCache``
(block tables, allocation, copy-on-write, forking) -> ``PagedBatch`` (what ``GPT.forward`` writes
into and reads from) -> ``verify_paged`` (the proof that none of this changes an output).

Shapes: L layers, N blocks, b block size, H heads, D head size; B sequences, T new tokens, S keys.
"""
from __future__ import annotations

from array import array
from collections import OrderedDict, deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import repeat

import torch

from .checks import (ContextLimitError, check_bool, check_cache_made_for, check_choice, check_config, check_device,
                     check_dtype, check_id_list, check_int, check_key, check_logits, check_model, check_multi_head)
from .decoding import DECODERS
from .fast import PagedStep
from .model import GPT, GPTConfig

KV_BLOCK_SIZE = 16
MAX_POSITIONS = 2**22  # a pool holds at most this many positions (num_blocks x kv_block_size)


@dataclass
class Block:
    """One physical block: who uses it and, once full, which tokens it holds (its prefix-cache key)."""
    id: int
    ref_count: int = 0
    hash: int | None = None          # set when the block is full: hash of (previous block's hash, tokens)
    token_ids: tuple[int, ...] = ()  # the tokens behind the hash, compared on a hit (no false sharing)


def ceil_div(a: int, b: int) -> int:
    """a / b rounded up: the blocks that ``a`` positions need, ``b`` to a block."""
    return -(-a // b)


def block_hash(previous: int | None, token_ids) -> int:
    """The key of a full block: its tokens *and* the block before it, so equal keys mean equal prefixes."""
    return hash((previous, tuple(token_ids)))


class BlockPool:
    """Keys and values of every block, ``k``, ``v`` (L, N * b, H, D), and the bookkeeping of who owns what.

    ``k`` and ``v`` are views of one buffer ``kv`` (L, N * b, 2, H, D): a slot's key and value sit side
    by side, so that the lean step reads both with one gather.

    Slot ``s`` of the flat second axis is position ``s % b`` of block ``s // b``. A block is in use
    (``ref_count > 0``), free and fresh, or free but still holding a full prefix that a later request
    may hit (``free_cached``, least recently freed first). Allocation takes a fresh block if there is
    one and otherwise evicts the least recently used cached block: its hash is forgotten.
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
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_fresh: deque[int] = deque(range(num_blocks))
        self.free_cached: OrderedDict[int, None] = OrderedDict()  # block id -> None, oldest first
        self.by_hash: dict[int, int] = {}                          # full-block hash -> block id
        self.evictions = 0
        self._saved: dict[int, torch.Tensor] | None = None  # in a transaction: contents of blocks handed out again

    @property
    def num_free(self) -> int:
        return len(self.free_fresh) + len(self.free_cached)

    def _check_bid(self, name: str, bid, in_use: bool = True) -> int:
        bid = check_int(name, bid, 0, self.num_blocks - 1)
        if in_use and self.blocks[bid].ref_count < 1:
            raise ValueError(f"{name} = {bid} is a free block; allowed are blocks in use (ref_count >= 1)")
        return bid

    def allocate(self) -> int:
        if self.free_fresh:
            bid = self.free_fresh.popleft()
        elif self.free_cached:
            bid, _ = self.free_cached.popitem(last=False)      # least recently used
            block = self.blocks[bid]
            del self.by_hash[block.hash]                       # forgotten: its contents will change
            block.hash, block.token_ids = None, ()
            self.evictions += 1
        else:
            raise RuntimeError("the block pool is full: free or preempt a sequence first")
        self._save_for_rollback(bid)
        self.blocks[bid].ref_count = 1
        return bid

    def _save_for_rollback(self, bid: int) -> None:
        """Inside a transaction, keep a block's old keys and values before it is written again."""
        if self._saved is not None and bid not in self._saved:
            b = self.kv_block_size
            self._saved[bid] = self.kv[:, bid * b:(bid + 1) * b].clone()

    def lookup(self, h: int, token_ids) -> int | None:
        """The block holding exactly these tokens after this prefix, or None."""
        if isinstance(h, bool) or not isinstance(h, int):
            raise TypeError(f"h must be an int block hash (from block_hash), got {h!r:.60}")
        token_ids = check_id_list("token_ids", token_ids, min_len=0, max_len=self.kv_block_size)
        bid = self.by_hash.get(h)
        if bid is None or self.blocks[bid].token_ids != tuple(token_ids):
            return None
        return bid

    def share(self, bid: int) -> None:
        """One more user of a block; a free cached block comes back into use (a fresh free block cannot)."""
        bid = check_int("bid", bid, 0, self.num_blocks - 1)
        if self.blocks[bid].ref_count < 1 and bid not in self.free_cached:
            raise ValueError(f"bid = {bid} is a fresh free block with nothing to share; allowed are blocks in use "
                             f"or free blocks still holding a cached prefix")
        self.free_cached.pop(bid, None)
        self.blocks[bid].ref_count += 1

    def release(self, bid: int) -> None:
        block = self.blocks[self._check_bid("bid", bid)]
        block.ref_count -= 1
        if block.ref_count == 0:
            if block.hash is not None and self.by_hash.get(block.hash) == bid:
                self.free_cached[bid] = None                   # kept for a later hit, evicted last
            else:                                              # nothing to find it by (or a duplicate)
                block.hash, block.token_ids = None, ()
                self.free_fresh.append(bid)

    def register(self, bid: int, h: int, token_ids) -> None:
        """A block just filled up: make it findable by its hash.

        Two sequences that computed the same block at once both know its hash (the next block's hash
        is built on it), but the table keeps the first: the other is freed as a plain block.
        """
        block = self.blocks[self._check_bid("bid", bid)]
        if isinstance(h, bool) or not isinstance(h, int):
            raise TypeError(f"h must be an int block hash (from block_hash), got {h!r:.60}")
        token_ids = check_id_list("token_ids", token_ids, min_len=self.kv_block_size, max_len=self.kv_block_size)
        block.hash, block.token_ids = h, tuple(token_ids)
        self.by_hash.setdefault(h, bid)

    def copy(self, src: int, dst: int) -> None:
        src, dst = check_int("src", src, 0, self.num_blocks - 1), check_int("dst", dst, 0, self.num_blocks - 1)
        b = self.kv_block_size
        self.kv[:, dst * b:(dst + 1) * b] = self.kv[:, src * b:(src + 1) * b]


@dataclass
class BlockTable:
    """One sequence's view of the pool: its blocks in order and the tokens stored in them."""
    blocks: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)  # the tokens whose keys and values are stored

    @property
    def length(self) -> int:
        return len(self.token_ids)


class PagedKVCache:
    """Block tables over one :class:`BlockPool`: sequences come, grow, share blocks and go.

    ``add_sequence(sid, prompt)`` finds the prompt's full blocks already in the pool (prefix caching)
    and returns how many prompt tokens need no computing; ``forward(model, sids, new_tokens)`` runs
    the model over a batch of sequences, each with its own new tokens, and returns each one's
    last logits; ``fork`` starts a sequence that shares all of another's blocks; ``free`` ends one.
    """

    def __init__(self, config: GPTConfig, num_blocks: int, kv_block_size: int = KV_BLOCK_SIZE, *,
                 enable_prefix_caching: bool = True, device=None, dtype=None):
        check_config(config, GPTConfig)
        self.enable_prefix_caching = check_bool("enable_prefix_caching", enable_prefix_caching)
        self.config = config
        self.pool = BlockPool(config, num_blocks, kv_block_size, device, dtype)
        self.kv_block_size = self.pool.kv_block_size
        self.tables: dict[object, BlockTable] = {}
        self.prefix_hit_tokens = 0   # prompt tokens found in the pool instead of computed
        self.copies_on_write = 0
        self._step: PagedStep | None = None  # the lean step, made on first use

    @classmethod
    def for_model(cls, model: GPT, num_blocks: int, kv_block_size: int = KV_BLOCK_SIZE, *,
                  enable_prefix_caching: bool = True) -> "PagedKVCache":
        """A cache for ``model``: its config, its weights' device and dtype."""
        check_model(model)
        weight = model.lm_head.weight
        return cls(model.config, num_blocks, kv_block_size, enable_prefix_caching=enable_prefix_caching,
                   device=weight.device, dtype=weight.dtype)

    # -- all or nothing ---------------------------------------------------------------------------
    @contextmanager
    def transaction(self):
        """A block of calls that happens entirely or not at all: if it raises, the cache is put back.

        Tables, reference counts, free lists and the prefix hashes are restored, and so are the keys
        and values of every block handed out again inside it (a preempted sequence's, an evicted
        prefix's), whose old contents were saved as each was allocated. Nested transactions join the
        outer one.
        """
        if self.pool._saved is not None:
            yield
            return
        pool = self.pool
        tables = {sid: (t, list(t.blocks), list(t.token_ids)) for sid, t in self.tables.items()}
        blocks = [(b.ref_count, b.hash, b.token_ids) for b in pool.blocks]
        lists = (deque(pool.free_fresh), OrderedDict(pool.free_cached), dict(pool.by_hash))
        counters = (pool.evictions, self.prefix_hit_tokens, self.copies_on_write)
        pool._saved = {}
        try:
            yield
        except BaseException:
            b = self.kv_block_size
            for bid, kv in pool._saved.items():
                pool.kv[:, bid * b:(bid + 1) * b] = kv
            for block, (ref_count, h, token_ids) in zip(pool.blocks, blocks):
                block.ref_count, block.hash, block.token_ids = ref_count, h, token_ids
            pool.free_fresh, pool.free_cached, pool.by_hash = lists
            pool.evictions, self.prefix_hit_tokens, self.copies_on_write = counters
            self.tables = {}
            for sid, (table, kept_blocks, kept_tokens) in tables.items():
                table.blocks, table.token_ids = kept_blocks, kept_tokens
                self.tables[sid] = table
            raise
        finally:
            pool._saved = None

    # -- bookkeeping ------------------------------------------------------------------------------
    def blocks_needed(self, n_tokens: int) -> int:
        return ceil_div(check_int("n_tokens", n_tokens, 0), self.kv_block_size)

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def blocks_of(self, sid) -> list[int]:
        """The blocks of sequence ``sid``, in order (a copy)."""
        return list(self.table(sid).blocks)

    def can_append(self, sids: list, new_tokens: list[list[int]]) -> bool:
        """Whether the free blocks cover this batch's new tokens (copies on write included): the query
        before ``forward``, so that a scheduler preempts before it asks for what the pool cannot give."""
        return self._blocks_to_take(sids, new_tokens) <= self.pool.num_free

    def can_allocate(self, n_tokens: int) -> bool:
        """Whether a new sequence of ``n_tokens`` fits in the free blocks (prefix hits not counted on)."""
        return self.blocks_needed(n_tokens) <= self.pool.num_free

    def add_sequence(self, sid, prompt: list[int]) -> int:
        """Start sequence ``sid``; returns the number of prompt tokens already cached (full blocks only).

        At least the last prompt token is always left to compute: its logits choose the next token.
        """
        check_key("sid", sid)
        block = self.config.block_size
        prompt = check_id_list("prompt", prompt, self.config.vocab_size, max_len=block)
        if sid in self.tables:
            raise ValueError(f"sequence {sid!r} is already in the cache")
        table = self.tables[sid] = BlockTable()
        if not self.enable_prefix_caching:
            return 0
        b, h = self.kv_block_size, None
        for i in range((len(prompt) - 1) // b):
            chunk = prompt[i * b:(i + 1) * b]
            h = block_hash(h, chunk)
            bid = self.pool.lookup(h, chunk)
            if bid is None:
                break
            self.pool.share(bid)
            table.blocks.append(bid)
            table.token_ids.extend(chunk)
        self.prefix_hit_tokens += table.length
        return table.length

    def table(self, sid) -> BlockTable:
        """The block table of sequence ``sid``; a clear KeyError naming the sequences held if there is none."""
        try:
            return self.tables[sid]
        except TypeError:
            raise TypeError(f"sid must be hashable (an int or a str, say), got {type(sid).__name__}") from None
        except KeyError:
            raise KeyError(f"no sequence {sid!r} in this cache; it holds {sorted(self.tables, key=repr)!r:.120}") from None

    def fork(self, parent, child) -> None:
        """``child`` shares every block of ``parent`` (parallel sampling): no copy until one of them writes."""
        src = self.table(parent)
        check_key("child", child)
        if child in self.tables:
            raise ValueError(f"sequence {child!r} is already in the cache")
        for bid in src.blocks:
            self.pool.share(bid)
        self.tables[child] = BlockTable(list(src.blocks), list(src.token_ids))

    def free(self, sid) -> None:
        self.table(sid)
        for bid in self.tables.pop(sid).blocks:
            self.pool.release(bid)

    def truncate(self, sid, n) -> None:
        """Keep the first ``n`` tokens of sequence ``sid`` (a roll-back): blocks past them go back to the pool.

        More than moving a length: whole blocks beyond the kept tokens are released, and a kept block
        that a prefix may still find by its hash is copied before the sequence writes into it again.
        """
        table = self.table(sid)
        n = check_int("n", n, 0, table.length, f"an int in [0, {table.length}] (tokens of {sid!r} to keep)")
        keep = self.blocks_needed(n)
        for bid in table.blocks[keep:]:
            self.pool.release(bid)
        del table.blocks[keep:], table.token_ids[n:]

    def slots_needed(self, sid, n_new: int) -> int:
        """Blocks that appending ``n_new`` tokens to ``sid`` takes from the pool (copy-on-write included)."""
        table, b = self.table(sid), self.kv_block_size
        n_new = check_int("n_new", n_new, 0)
        need = self.blocks_needed(table.length + n_new) - len(table.blocks)
        if table.length % b and self._must_copy(table.blocks[-1]):
            need += 1  # the shared, partly filled last block is copied before it is written
        return need

    def reserve(self, sid, n_new: int) -> None:
        """Make room for ``n_new`` more tokens: copy a shared last block, then add blocks as needed.

        ``forward`` reserves for every sequence of its batch; refused, with nothing taken, when the pool
        cannot give what it needs."""
        table = self.table(sid)
        n_new = check_int("n_new", n_new, 1, self.config.block_size - table.length,
                          f"an int in [1, {self.config.block_size - table.length}] (room left in the model's block)")
        if self._blocks_to_take([sid], [[0] * n_new]) > self.pool.num_free:
            raise RuntimeError(f"the block pool is full: sequence {sid!r} needs more blocks than the "
                               f"{self.pool.num_free} free; free or preempt a sequence first")
        self._reserve(table, n_new)

    def _reserve(self, table: BlockTable, n_new: int) -> None:
        """``reserve``'s work, once the pool is known to have room."""
        b = self.kv_block_size
        if table.length % b:  # the next token goes into the last block, which must be ours alone
            last = table.blocks[-1]
            if self._must_copy(last):
                new = self.pool.allocate()
                self.pool.copy(last, new)
                self.pool.release(last)
                table.blocks[-1] = new
                self.copies_on_write += 1
        while len(table.blocks) < ceil_div(table.length + n_new, b):
            table.blocks.append(self.pool.allocate())

    def _must_copy(self, bid: int) -> bool:
        """A partly filled last block is shared, or (after a roll-back) still findable by its hash."""
        block = self.pool.blocks[bid]
        return block.ref_count > 1 or block.hash is not None

    def _commit(self, sid, new_tokens: list[int]) -> None:
        """The new tokens are stored: remember them and register every block they filled."""
        table, b = self.tables[sid], self.kv_block_size
        before = table.length
        table.token_ids.extend(new_tokens)
        if not self.enable_prefix_caching:
            return
        for i in range(before // b, table.length // b):
            bid = self.pool.blocks[table.blocks[i]]
            if bid.hash is None:
                previous = self.pool.blocks[table.blocks[i - 1]].hash if i else None
                chunk = table.token_ids[i * b:(i + 1) * b]
                self.pool.register(table.blocks[i], block_hash(previous, chunk), chunk)

    # -- what the memory holds ------------------------------------------------------------------------
    def used_blocks(self) -> int:
        return self.pool.num_blocks - self.pool.num_free

    def stored_tokens(self) -> int:
        """Positions of the blocks in use that hold a real token (a shared block counted once)."""
        filled: dict[int, int] = {}
        b = self.kv_block_size
        for table in self.tables.values():
            for i, bid in enumerate(table.blocks):
                filled[bid] = max(filled.get(bid, 0), min(b, table.length - i * b))
        return sum(max(0, n) for n in filled.values())

    # -- the forward pass -----------------------------------------------------------------------------
    def batch(self, sids: list, new_tokens: list[list[int]]) -> "PagedBatch":
        """Reserve room for every sequence's new tokens; all checked first, so that bad input changes nothing."""
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
                raise ContextLimitError(f"sequence {sid!r} would reach {self.tables[sid].length + len(new)} "
                                        f"positions; the model's block holds {self.config.block_size}")
        return self._reserved_batch(list(sids), new_tokens)

    def _reserved_batch(self, sids: list, new_tokens: list[list[int]]) -> "PagedBatch":
        """``batch``'s work once its input is known to be good: refused, with nothing taken, if the pool is short."""
        need = self._blocks_to_take(sids, new_tokens)
        if need > self.pool.num_free:
            raise RuntimeError(f"the block pool is full: this batch needs {need} blocks at its peak, "
                               f"{self.pool.num_free} are free; free or preempt a sequence first")
        for sid, new in zip(sids, new_tokens):
            self._reserve(self.tables[sid], len(new))
        return PagedBatch._reserved(self, sids, new_tokens)

    def _blocks_to_take(self, sids, new_tokens) -> int:
        """Free blocks that ``reserve`` will take for this batch, in its order (copies on write included)."""
        b, refs, free = self.kv_block_size, {}, self.pool.num_free
        lowest = free
        for sid, new in zip(sids, new_tokens):
            table = self.tables[sid]
            if table.length % b:
                last = table.blocks[-1]
                block = self.pool.blocks[last]
                refs.setdefault(last, block.ref_count)
                if refs[last] > 1 or block.hash is not None:
                    free -= 1                   # the copy
                    lowest = min(lowest, free)
                    refs[last] -= 1
                    if refs[last] == 0:
                        free += 1               # the original goes back to a free list
            free -= max(0, ceil_div(table.length + len(new), b) - len(table.blocks))
            lowest = min(lowest, free)
        return self.pool.num_free - lowest

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
            return self._forward(model, self.batch(sids, new_tokens), decoder)

    @torch.inference_mode()
    def _forward_own(self, model: GPT, sids: list, new_tokens: list[list[int]], decoder: str) -> torch.Tensor:
        """``forward`` for a caller whose sequences, tokens and model this cache has seen already (the
        serving engine's step: its requests were checked when added): the same pass, without checking them again."""
        with self.transaction():
            return self._forward(model, self._reserved_batch(sids, new_tokens), decoder)

    def _forward(self, model: GPT, batch: "PagedBatch", decoder: str) -> torch.Tensor:
        weight = model.lm_head.weight
        # A model whose weights do not match the pool goes to GPT.forward, which says what does not match.
        if decoder == "fast" and weight.dtype == self.pool.k.dtype and weight.device == self.pool.k.device:
            if self._step is None:
                self._step = PagedStep()
            T = batch.idx.shape[1]
            logits = self._step(model, self.pool.kv, batch.idx, batch.position_ids, batch.read_slots,
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
        if not isinstance(cache, PagedKVCache):
            raise TypeError(f"cache must be a PagedKVCache, got {type(cache).__name__}")
        if not isinstance(sids, list) or not isinstance(new_tokens, list) or len(sids) != len(new_tokens) or not sids:
            raise ValueError("sids and new_tokens must be non-empty lists of the same length (make a batch with "
                             "PagedKVCache.batch, which reserves its blocks)")
        for sid, new in zip(sids, new_tokens):
            table = cache.table(sid)
            new = check_id_list(f"new tokens of {sid!r}", new, cache.config.vocab_size)
            if len(table.blocks) < cache.blocks_needed(table.length + len(new)):
                raise ValueError(f"sequence {sid!r} has no blocks reserved for its {len(new)} new tokens: make the "
                                 f"batch with PagedKVCache.batch")
        self._build(cache, sids, [list(map(int, t)) for t in new_tokens])

    @classmethod
    def _reserved(cls, cache: PagedKVCache, sids: list, new_tokens: list[list[int]]) -> "PagedBatch":
        """The batch ``PagedKVCache.batch`` has just checked and reserved, without checking it again."""
        batch = cls.__new__(cls)
        batch._build(cache, sids, new_tokens)
        return batch

    def _build(self, cache: PagedKVCache, sids: list, new_tokens: list[list[int]]) -> None:
        self.cache, self.sids, self.new_tokens = cache, sids, new_tokens
        self._advanced = False
        b, tables = cache.kv_block_size, [cache.tables[s] for s in sids]
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
        self._read = self.read_slots.view(B * S)                               # (B * S,) for index_select
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
            out.append(store.index_select(0, self._read).view(shape).transpose(1, 2))  # (B, H, S, D)
        return tuple(out)

    @property
    def batch_size(self) -> int:
        return len(self.sids)

    def advance(self, n: int) -> None:
        """The new tokens are stored (``GPT.forward`` calls this once, with ``n`` = T, after its last layer)."""
        T = self.idx.shape[1]
        n = check_int("n", n, T, T, f"{T} (the batch's new-token columns)")
        if self._advanced:
            raise RuntimeError("this batch has already advanced: its tokens are stored; make a new batch")
        self._advanced = True
        for sid, t in zip(self.sids, self.new_tokens):
            self.cache._commit(sid, t)

    def truncate(self, n) -> None:
        """Keep at most ``n`` tokens of every sequence of the batch (:meth:`PagedKVCache.truncate` each)."""
        n = check_int("n", n, 0, self.length, f"an int in [0, {self.length}] (tokens to keep per sequence)")
        for sid in self.sids:
            self.cache.truncate(sid, min(n, self.cache.tables[sid].length))

"""Block bookkeeping of the paged cache: which block holds what, for whom. No tensors here.

A sequence's *block table* lists its blocks in order, as a page table lists a process's pages. A
block is in use (``ref_count > 0``), free and fresh, or free but still holding a full prefix that a
later request may hit (``free_cached``, least recently freed first). Allocation takes a fresh block
if there is one and otherwise evicts the least recently used cached block (its hash is forgotten).

The manager answers before it acts (nano-vllm's ``BlockManager`` works the same way): a scheduler
asks ``can_allocate`` / ``can_append`` and preempts until the answer is yes, then calls
``add_sequence`` / ``append``, which cannot fail for want of blocks. :mod:`kvlib.paged` keeps the
keys and values of every block and runs the model over them.

Reading order: ``Block`` -> ``block_hash`` -> ``BlockTable`` -> ``BlockManager`` (blocks: allocate,
share, release, lookup, register; sequences: add, append, commit, fork, truncate, free).
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from .checks import check_id_list, check_int, check_key

KV_BLOCK_SIZE = 16


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


@dataclass
class BlockTable:
    """One sequence's view of the pool: its blocks in order and the tokens stored in them."""
    blocks: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)  # the tokens whose keys and values are stored

    @property
    def length(self) -> int:
        return len(self.token_ids)


class BlockManager:
    """Blocks, free lists, reference counts, the hash table of full blocks, and every sequence's table."""

    def __init__(self, num_blocks: int, kv_block_size: int = KV_BLOCK_SIZE, *, enable_prefix_caching: bool = True):
        self.num_blocks, self.kv_block_size = num_blocks, kv_block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_fresh: deque[int] = deque(range(num_blocks))
        self.free_cached: OrderedDict[int, None] = OrderedDict()  # block id -> None, oldest first
        self.by_hash: dict[int, int] = {}                          # full-block hash -> block id
        self.tables: dict[object, BlockTable] = {}
        self.evictions = 0
        self.prefix_hit_tokens = 0   # prompt tokens found in the pool instead of computed
        self.copies_on_write = 0

    # -- one block ---------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self.free_fresh) + len(self.free_cached)

    def check_block(self, name: str, bid, in_use: bool = True) -> int:
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
        self.blocks[bid].ref_count = 1
        return bid

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
        block = self.blocks[self.check_block("bid", bid)]
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
        block = self.blocks[self.check_block("bid", bid)]
        if isinstance(h, bool) or not isinstance(h, int):
            raise TypeError(f"h must be an int block hash (from block_hash), got {h!r:.60}")
        token_ids = check_id_list("token_ids", token_ids, min_len=self.kv_block_size, max_len=self.kv_block_size)
        block.hash, block.token_ids = h, tuple(token_ids)
        self.by_hash.setdefault(h, bid)

    # -- questions a scheduler asks before it acts ---------------------------------------------------
    def blocks_needed(self, n_tokens: int) -> int:
        return ceil_div(check_int("n_tokens", n_tokens, 0), self.kv_block_size)

    def can_allocate(self, n_tokens: int) -> bool:
        """Whether a new sequence of ``n_tokens`` fits in the free blocks (prefix hits not counted on)."""
        return self.blocks_needed(n_tokens) <= self.num_free

    def blocks_to_append(self, sids, new_tokens) -> int:
        """Free blocks that appending each sequence's new tokens takes, in this order, at the peak (copies on
        write included: a shared or findable partly filled last block is copied before it is written)."""
        b, refs, free = self.kv_block_size, {}, self.num_free
        lowest = free
        for sid, new in zip(sids, new_tokens):
            table = self.table(sid)
            if table.length % b:
                last = table.blocks[-1]
                block = self.blocks[last]
                refs.setdefault(last, block.ref_count)
                if refs[last] > 1 or block.hash is not None:
                    free -= 1                   # the copy
                    lowest = min(lowest, free)
                    refs[last] -= 1
                    if refs[last] == 0:
                        free += 1               # the original goes back to a free list
            free -= max(0, ceil_div(table.length + len(new), b) - len(table.blocks))
            lowest = min(lowest, free)
        return self.num_free - lowest

    def can_append(self, sids, new_tokens) -> bool:
        """Whether the free blocks cover this batch's new tokens (the question before :meth:`append`)."""
        return self.blocks_to_append(sids, new_tokens) <= self.num_free

    def table(self, sid) -> BlockTable:
        """The block table of sequence ``sid``; a clear KeyError naming the sequences held if there is none."""
        try:
            return self.tables[sid]
        except TypeError:
            raise TypeError(f"sid must be hashable (an int or a str, say), got {type(sid).__name__}") from None
        except KeyError:
            raise KeyError(f"no sequence {sid!r} in this cache; it holds {sorted(self.tables, key=repr)!r:.120}") from None

    def blocks_of(self, sid) -> list[int]:
        """The blocks of sequence ``sid``, in order (a copy)."""
        return list(self.table(sid).blocks)

    def used_blocks(self) -> int:
        return self.num_blocks - self.num_free

    def stored_tokens(self) -> int:
        """Positions of the blocks in use that hold a real token (a shared block counted once)."""
        filled: dict[int, int] = {}
        b = self.kv_block_size
        for table in self.tables.values():
            for i, bid in enumerate(table.blocks):
                filled[bid] = max(filled.get(bid, 0), min(b, table.length - i * b))
        return sum(max(0, n) for n in filled.values())

    # -- sequences -----------------------------------------------------------------------------------
    def add_sequence(self, sid, prompt: list[int]) -> int:
        """Start sequence ``sid``; returns the number of prompt tokens already cached (full blocks only).

        At least the last prompt token is always left to compute: its logits choose the next token.
        """
        check_key("sid", sid)
        if sid in self.tables:
            raise ValueError(f"sequence {sid!r} is already in the cache")
        table = self.tables[sid] = BlockTable()
        if not self.enable_prefix_caching:
            return 0
        b, h = self.kv_block_size, None
        for i in range((len(prompt) - 1) // b):
            chunk = prompt[i * b:(i + 1) * b]
            h = block_hash(h, chunk)
            bid = self.lookup(h, chunk)
            if bid is None:
                break
            self.share(bid)
            table.blocks.append(bid)
            table.token_ids.extend(chunk)
        self.prefix_hit_tokens += table.length
        return table.length

    def append(self, sid, n_new: int) -> list[tuple[int, int]]:
        """Give ``sid`` room for ``n_new`` more tokens; returns the (source, copy) blocks whose keys and values
        must be copied before it writes (copy-on-write of a shared last block). Ask :meth:`can_append` first."""
        table, b, copies = self.table(sid), self.kv_block_size, []
        if table.length % b:  # the next token goes into the last block, which must be ours alone
            last = table.blocks[-1]
            if self.must_copy(last):
                new = self.allocate()
                copies.append((last, new))
                self.release(last)
                table.blocks[-1] = new
                self.copies_on_write += 1
        while len(table.blocks) < ceil_div(table.length + n_new, b):
            table.blocks.append(self.allocate())
        return copies

    def must_copy(self, bid: int) -> bool:
        """A partly filled last block is shared, or (after a roll-back) still findable by its hash."""
        block = self.blocks[bid]
        return block.ref_count > 1 or block.hash is not None

    def commit(self, sid, new_tokens: list[int]) -> None:
        """The new tokens are stored: remember them and register every block they filled."""
        table, b = self.table(sid), self.kv_block_size
        before = table.length
        table.token_ids.extend(new_tokens)
        if not self.enable_prefix_caching:
            return
        for i in range(before // b, table.length // b):
            block = self.blocks[table.blocks[i]]
            if block.hash is None:
                previous = self.blocks[table.blocks[i - 1]].hash if i else None
                chunk = table.token_ids[i * b:(i + 1) * b]
                self.register(table.blocks[i], block_hash(previous, chunk), chunk)

    def fork(self, parent, child) -> None:
        """``child`` shares every block of ``parent`` (parallel sampling): no copy until one of them writes."""
        src = self.table(parent)
        check_key("child", child)
        if child in self.tables:
            raise ValueError(f"sequence {child!r} is already in the cache")
        for bid in src.blocks:
            self.share(bid)
        self.tables[child] = BlockTable(list(src.blocks), list(src.token_ids))

    def truncate(self, sid, n: int) -> None:
        """Keep the first ``n`` tokens of ``sid``: blocks past them go back to the pool."""
        table = self.table(sid)
        keep = self.blocks_needed(n)
        for bid in table.blocks[keep:]:
            self.release(bid)
        del table.blocks[keep:], table.token_ids[n:]

    def free(self, sid) -> None:
        for bid in self.table(sid).blocks:
            self.release(bid)
        del self.tables[sid]

    # -- all or nothing --------------------------------------------------------------------------------
    def snapshot(self) -> tuple:
        """What :meth:`restore` needs to undo everything after this call (cheap: plain copies of small lists)."""
        tables = {sid: (t, list(t.blocks), list(t.token_ids)) for sid, t in self.tables.items()}
        blocks = [(b.ref_count, b.hash, b.token_ids) for b in self.blocks]
        lists = (deque(self.free_fresh), OrderedDict(self.free_cached), dict(self.by_hash))
        return tables, blocks, lists, (self.evictions, self.prefix_hit_tokens, self.copies_on_write)

    def restore(self, saved: tuple) -> None:
        """Back to a :meth:`snapshot` (every table object stays the one callers hold)."""
        tables, blocks, lists, counters = saved
        for block, (ref_count, h, token_ids) in zip(self.blocks, blocks):
            block.ref_count, block.hash, block.token_ids = ref_count, h, token_ids
        self.free_fresh, self.free_cached, self.by_hash = lists
        self.evictions, self.prefix_hit_tokens, self.copies_on_write = counters
        self.tables = {}
        for sid, (table, kept_blocks, kept_tokens) in tables.items():
            table.blocks, table.token_ids = kept_blocks, kept_tokens
            self.tables[sid] = table

"""The engine's decode step compiled: the paged cache's one-token step for any number of rows, built once.

:class:`kvlib.fast.PagedStep` gathers every row's keys and values from the pool at each layer and step, as
the teaching path does. Compiled, the gather is an index inside the attention's loops: each row's keys are
read from its blocks in place, which is what a paged-attention kernel does. Rows are any in number (a
dimension the compiled code takes as it comes) and every row reads ``block_size`` slots, left-padded and
hidden, so that one build serves every step. Prefills, and models or pools it was not built for, go to
the eager step. Install it with :func:`compiled_engine_step` as an engine's ``cache.step_runner``.
"""
from __future__ import annotations

import torch

from ..fast import PagedStep, step_weights
from ..model import GPT
from ..weights import weights_key
from .compiled_step import attend_past_and_new, compile_step, compiler_available, one_token_forward


class PagedDecodeStep(torch.nn.Module):
    """``(idx, pos, read_slots, hidden, write_slots, kv_pool) -> (B, V)``: one token a row (``idx, pos,
    write_slots`` (B,)) attends to the slots ``read_slots`` (B, S) not ``hidden`` (B, S) and to itself; its keys
    and values go to ``write_slots`` of the pool (layers, slots, 2, H, D), after every read."""

    def __init__(self, model: GPT):
        super().__init__()
        self.w, self.n_head = step_weights(model), model.config.n_head

    def forward(self, idx, pos, read_slots, hidden, write_slots, kv_pool):
        B, S = read_slots.shape
        hidden = hidden.view(B, 1, S)

        def attend(i, q, k, v):
            past = kv_pool[i][read_slots]                                       # (B, S, 2, H, D), read in place
            return attend_past_and_new(q, past[:, :, 0].transpose(1, 2), past[:, :, 1].transpose(1, 2), hidden, k, v)

        logits, new = one_token_forward(self.w, self.n_head, idx, pos, attend)  # new: (layers, B, 2, H, D)
        kv_pool.index_copy_(1, write_slots, new)
        return logits


class CompiledPagedStep:
    """:class:`~kvlib.fast.PagedStep`'s contract, its decode steps compiled for ``model`` (see the module)."""

    def __init__(self, model: GPT, kv_pool: torch.Tensor, way: str = "aoti"):
        self.eager, self.model, self.state = PagedStep(), model, weights_key(model)
        self.slots = model.config.block_size
        B, S = 2, self.slots
        example = (torch.zeros(B, dtype=torch.long), torch.zeros(B, dtype=torch.long),
                   torch.zeros(B, S, dtype=torch.long), torch.ones(B, S, dtype=torch.bool),
                   torch.zeros(B, dtype=torch.long), kv_pool)
        self.step, self.compile_seconds = compile_step(PagedDecodeStep(model), example, way, rows_in=5)
        self.pool_shape = tuple(kv_pool.shape)

    def takes(self, model, kv_pool, idx) -> bool:
        """A decode step (one token a row) of the model it was built for, unchanged, on a pool of its shape."""
        return (idx.shape[1] == 1 and model is self.model and tuple(kv_pool.shape) == self.pool_shape
                and kv_pool.dtype == torch.float32 and weights_key(model) == self.state)

    @torch.inference_mode()
    def __call__(self, model, kv_pool, idx, position_ids, read_slots, key_mask, new_rows, write_slots):
        if not self.takes(model, kv_pool, idx):
            return self.eager(model, kv_pool, idx, position_ids, read_slots, key_mask, new_rows, write_slots)
        (B, S), L = read_slots.shape, self.slots
        read = read_slots[:, :1].expand(B, L).clone()         # the padding reads each row's first slot, hidden
        read[:, L - S:] = read_slots
        hidden = torch.ones(B, L, dtype=torch.bool)
        hidden[:, L - S:-1] = False if key_mask is None else ~key_mask[:, :-1]  # the last column: the new token
        return self.step(idx.view(B), position_ids.view(B), read, hidden, write_slots, kv_pool)[0]


def compiled_engine_step(engine, way: str = "aoti"):
    """Give ``engine``'s paged cache the compiled decode step (where a C++ compiler exists); returns the engine."""
    if compiler_available():
        engine.cache.step_runner = CompiledPagedStep(engine.model, engine.cache.pool.kv, way)
    return engine

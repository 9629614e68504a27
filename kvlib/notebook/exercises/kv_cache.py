"""Notebook 4's check: greedy decoding written by hand over a ``KVCache``."""
from __future__ import annotations

import torch

from ...decoding import generate
from ...poems import encode_prompt
from ...verify import greedy_agreement
from .harness import as_ints, brief, call, show, stops_at_placeholder


DECODE_PROMPTS = ("床前看月光，", "白日依山尽，黄河入海", "春")


@stops_at_placeholder
def check_cached_greedy(fn, model, tokenizer, n_new: int = 12, prompts=DECODE_PROMPTS) -> bool:
    """``fn(model, idx, n_new) -> list[int]``: greedy decoding written by hand over a ``KVCache``.

    Compared with ``generate(model, idx, n_new, temperature=0.0, decoder="model")`` (the same arithmetic) on each
    prompt: the new token ids must be equal, or part only at a near-tie that rounding may flip
    (:func:`kvlib.verify.greedy_agreement`), and the loop may run at most P + n_new - 1 tokens through the model for a
    prompt of P (the prompt once, then each new token but the last, which is never fed back; a loop without the cache
    runs P + i tokens at step i). A mismatch is
    reported with the prompt, the step where the two first differ, and both texts.
    """
    passed, V = True, tokenizer.vocab_size
    fed = [0]  # tokens the embedding table looked up: every token the model ran, on GPT.forward's path
    handle = model.transformer.wte.register_forward_hook(lambda m, args, out: fed.__setitem__(0, fed[0] + args[0].numel()))
    try:
        for text in prompts:
            idx = torch.tensor([encode_prompt(tokenizer, text)])
            expected = generate(model, idx, n_new, temperature=0.0, decoder="model").new_tokens[0].tolist()
            label, fed[0] = f"prompt 「{text}」", 0  # counted from here: the learner's loop only
            ok, got = call(fn, model, idx.clone(), n_new, label=label)
            if not ok:
                passed = False
                continue
            ids = as_ints(got)
            if ids is None or None in ids or not all(0 <= i < V for i in ids):
                print(f"✗ {label}: expected a list of {n_new} token ids (ints in [0, {V})), got {brief(got)}")
                passed = False
                continue
            ran = fed[0]
            agree = "same" if ids == expected else "differ" if len(ids) != len(expected) else \
                greedy_agreement(model, idx[0], ids, expected)
            if agree != "differ" and ran <= idx.shape[1] + n_new - 1:
                print(f"✓ {label}: the same {n_new} tokens as generate: {show(ids, tokenizer)}" if agree == "same" else
                      f"✓ {label}: the tokens part from generate's only where the model's two best scores are within "
                      f"1e-4, so rounding may pick either (a near-tie, notebook 4's section 7): {show(ids, tokenizer)}")
                continue
            passed = False
            if agree != "differ":
                fed_back = ran == idx.shape[1] + n_new
                print(f"✗ {label}: the right tokens, but your loop ran {ran:,} tokens through the model for "
                      f"{n_new} new ones after a prompt of {idx.shape[1]}; with the cache it takes "
                      f"{idx.shape[1] + n_new - 1}: the prompt once, then only each new token (the cache holds the rest)"
                      + ("; the last new token is never fed back: nothing comes after it" if fed_back else ""))
            elif len(ids) != len(expected):
                print(f"✗ {label}: expected {len(expected)} new token ids, got {len(ids)}"
                      + (": that is the prompt and the new tokens; return only the new ones"
                         if len(ids) == idx.shape[1] + n_new and ids[idx.shape[1]:] == expected else ""))
            else:
                step = next(i for i, (a, b) in enumerate(zip(ids, expected)) if a != b)
                print(f"✗ {label}: the tokens differ from step {step} on: expected {show(expected, tokenizer)}, got "
                      f"{show(ids, tokenizer)}. "
                      + ("Step 0 comes from the prefill: the argmax of the last row of its logits (greedy)."
                         if step == 0 else "At each decode step feed only the new token to model(…, cache=cache), "
                         "which advances the cache itself (no cache.advance of your own), with one fresh cache per call."))
    finally:
        handle.remove()
    return passed

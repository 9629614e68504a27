"""Notebook 5's checks: what a cache weighs against the weights, sequences that fit, token-forwards."""
from __future__ import annotations

from .harness import (as_bool, as_number, brief, exact_case, matching_hints, pair_of_ints, sentences,
                      stops_at_placeholder)


def check_tokens_to_match_weights(tokens, inside_context, model_name: str = "Llama 3 8B") -> bool:
    """``tokens``: how long one sequence must be for its bf16 cache to take as many bytes as the bf16 weights
    (within 1 %); ``inside_context``: whether that length is within the model's trained context (True/False)."""
    from ...memory import SHAPES

    shape = SHAPES[model_name]
    want = shape.weight_bytes() / shape.kv_bytes_per_token()
    passed = True
    got = as_number(tokens, "the number of tokens")
    if got is None:
        passed = False
    elif abs(got - want) <= 0.01 * want:
        print(f"✓ {got:,.0f} tokens: the cache of one sequence that long takes as many bytes as the weights "
              f"({shape.weight_bytes():,} bytes)")
    elif got <= 0:
        passed = False
        print(f"✗ the number of tokens: expected about {want:,.0f} (weights {shape.weight_bytes():,} bytes / cache "
              f"per token), got {got:,.0f}: a length is a positive number of tokens")
    else:
        passed = False
        # got = want / ratio: what the usual slips do to the quotient weights / (cache per token)
        hints = [(2.0, "the weights take 2 bytes a parameter in bf16 (count bytes, not parameters), and the cache "
                       "is bf16 too: 2 bytes a number, not 4"),
                 (0.5, "a token's cache holds a key and a value (the factor 2) for every layer and key/value head, "
                       "and the weights are bf16: 2 bytes a parameter, not 4"),
                 (4.0, f"{model_name} caches {shape.n_kv_head} key/value heads per layer, not its {shape.n_head} "
                       "query heads (grouped-query attention)")]
        hint = matching_hints(want / got, hints, lambda r, ratio: abs(r - ratio) <= 0.02 * ratio)
        print(f"✗ the number of tokens: expected about {want:,.0f} (weights {shape.weight_bytes():,} bytes / "
              f"cache per token), got {got:,.0f}" + (f". Off by a factor {want / got:g}{hint}" if hint else ""))
    inside = as_bool(inside_context)
    if inside is None:
        print(f"✗ whether it is inside the trained context must be True or False, got {brief(inside_context)}")
        return False
    inside_context = inside
    if inside_context != (want <= shape.context):
        print(f"✗ inside the trained context: expected {want <= shape.context}, got {inside_context}: "
              f"{want:,.0f} tokens against a trained context of {shape.context:,}")
        return False
    print(f"✓ {'inside' if inside_context else 'outside'} the trained context of {shape.context:,} tokens")
    return passed


def check_sequences_that_fit(answers, gpu_bytes: int = 80 * 10**9, tokens: int = 4096,
                             models=("Llama 2 7B", "Llama 3 8B")) -> bool:
    """``answers``: {model name: how many whole sequences of ``tokens`` tokens fit, with their bf16 cache, in a GPU of
    ``gpu_bytes`` bytes (80 GB = 80 × 10⁹ bytes) once the bf16 weights are loaded}.

    A wrong answer gets the hint of the slip that gives it. Where two slips give the same number for one model
    (a KiB taken as 1,000 bytes, or rounding up), the slip that also explains the other models' answers is named.
    """
    from ...memory import SHAPES

    if not isinstance(answers, dict):
        print(f"✗ expected a dict {{model name: number of sequences}} for {', '.join(models)}, got {brief(answers)}")
        return False
    passed, wrong = True, {}
    for name in models:
        shape = SHAPES[name]
        weights, per_sequence = shape.weight_bytes(), shape.kv_cache_bytes(tokens)
        want = (gpu_bytes - weights) // per_sequence
        if name not in answers:
            print(f"✗ {name}: no answer (the dict has {sorted(answers)})")
            passed = False
            continue
        got = as_number(answers[name], f"the answer for {name}")
        if got is None:
            passed = False
        elif got == want:
            print(f"✓ {name}: {want} sequences of {tokens:,} tokens ({per_sequence:,} bytes each) in the "
                  f"{gpu_bytes - weights:,} bytes left after the weights")
        else:
            passed = False
            wrong[name] = (got, want, _slips(shape, gpu_bytes, tokens))
    # the slips that give every wrong answer: one mistake made on both models is named alone
    def matching(got, slips):  # which slips (by their place in the list) give this answer
        return {i for i, (value, _) in enumerate(slips) if abs(got - value) < 1e-6}
    everywhere = set.intersection(*(matching(got, slips) for got, _, slips in wrong.values())) if wrong else set()
    for name, (got, want, slips) in wrong.items():
        shape = SHAPES[name]
        fits = sorted(matching(got, slips) & everywhere or matching(got, slips))
        fits = [slips[i][1] for i in fits]
        print(f"✗ {name}: expected {want} sequences, got {got:g}" + (sentences(dict.fromkeys(fits)) or
              f" ({gpu_bytes:,} bytes, minus {shape.weight_bytes():,} of weights, over "
              f"{shape.kv_cache_bytes(tokens):,} bytes per sequence)"))
    return passed


def _slips(shape, gpu_bytes: int, tokens: int) -> list[tuple[float, str]]:
    """(the answer a slip gives, its hint) for the usual slips of exercise 2."""
    weights, per_sequence = shape.weight_bytes(), shape.kv_cache_bytes(tokens)
    kib_per_token = shape.kv_bytes_per_token() // 1024
    left = gpu_bytes - weights
    return [((80 * 2**30 - weights) // per_sequence,
             f"that is 80 GiB (80 × 2³⁰ = {80 * 2**30:,} bytes); here 80 GB means 80 × 10⁹ bytes, as in the table's GB"),
            (left / per_sequence, "a sequence fits only whole: round down"),
            (left // per_sequence + 1, "a sequence fits only whole: round down, not up"),
            (gpu_bytes // per_sequence, "the weights take their share of the memory first: subtract them"),
            (left // (kib_per_token * 1000 * tokens),
             f"a KiB is 1,024 bytes, not 1,000: {kib_per_token} KiB per token is {shape.kv_bytes_per_token():,} bytes")]


@stops_at_placeholder
def check_token_forwards(fn, cases=((1, 1), (1, 120), (1, 300), (16, 10), (4, 125), (13, 24))) -> bool:
    """``fn(prompt_len, n_new) -> (recompute, cached)``: the token-forwards each loop makes to write ``n_new``
    tokens after a prompt of ``prompt_len`` (a block long enough that nothing slides). Recompute runs
    ``prompt_len + i`` tokens at step i; the cached loop runs the prompt once, then each new token but the last."""
    passed = True
    for P, N in cases:
        want = (N * P + N * (N - 1) // 2, P + N - 1)

        def slip(pair, got):
            if pair is None or None in pair:
                return f"expected a pair of whole numbers (recompute, cached), got {brief(got)}"
            hints = ["the last new token is never fed back: no step comes after it" if pair[1] == P + N else "",
                     "step i (from 0) runs the prompt and the i tokens written so far: the last step runs P + N − 1 "
                     "tokens, not P + N" if pair[0] == N * P + N * (N + 1) // 2 else "",
                     "every recompute step runs the whole prompt again" if P > 1 and pair[0] == N * (N + 1) // 2 else ""]
            return f"expected ({want[0]:,}, {want[1]:,}), got ({pair[0]:,}, {pair[1]:,})" + sentences(hints)
        passed &= exact_case(fn, (P, N), f"prompt of {P}, {N} new token{'s' * (N > 1)}", want, pair_of_ints,
                              lambda pair: f"{pair[0]:,} without the cache, {pair[1]:,} with it", slip)
    return passed

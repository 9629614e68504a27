"""Notebook 9's check: the bytes a quantized cache takes per token."""
from __future__ import annotations

import math

import torch

from .harness import number_case, sentences, stops_at_placeholder


@stops_at_placeholder
def check_bytes_per_token(fn, config, cases=((8, 16), (4, 16), (2, 16), (2, 32), (4, 8))) -> bool:
    """``fn(bits, group_size) -> bytes``: one position of a ``QuantizedKVCache`` without a full-precision
    window, every layer, keys and values, codes, scales and zero points; compared with the size the cache
    measures after two full key groups of positions."""
    from ...quantized import QuantizedKVCache

    config = getattr(config, "config", config)  # the model itself will do
    passed = True
    for bits, group in cases:
        cache = QuantizedKVCache(config, 1, 2 * group, bits=bits, group_size=group)
        H, D, gen = config.n_head, config.head_size, torch.Generator().manual_seed(bits)
        with torch.inference_mode():
            for layer in range(config.n_layer):
                k, v = torch.randn(2, 1, H, 2 * group, D, generator=gen)
                cache.write(layer, k, v)
            cache.advance(2 * group)
        want = cache.nbytes / (2 * group)
        numbers = config.n_layer * 2 * config.n_embd  # keys and values, every layer
        # (the number a slip gives, its hint, and the slip in a few words for when two slips give one number)
        slips = [(numbers * bits / 8, f"the codes alone take {numbers * bits / 8:,.0f} bytes: add 4 bytes (a float16 "
                                      f"scale and a float16 zero point) for every {group} numbers",
                  f"counting the codes without their scales and zero points (4 bytes for every {group} numbers)"),
                 (numbers * (bits / 8 + 2 / group), f"the zero point is a float16 too: 4 bytes of scale and zero point "
                                                    f"for every {group} numbers, not 2",
                  f"counting one float16 a group instead of two (a scale and a zero point: 4 bytes for every "
                  f"{group} numbers)"),
                 (want / 2, "count the values as well as the keys, in every layer",
                  "counting the keys without the values"),
                 (want * 8, "that is in bits: divide by 8", "counting bits instead of bytes"),
                 (numbers * (bits / 8 + 8 / group), f"the count of numbers already holds the keys and the values: 4 bytes "
                                                    f"of scale and zero point for every {group} of them, not 8",
                  "counting the scales and zero points twice")]
        hint = lambda got, slips=slips: one_hint(got, slips)  # noqa: E731
        passed &= number_case(fn, (bits, group), f"{bits} bits, groups of {group}", "bytes",
                               lambda got, want=want: math.isclose(got, want, rel_tol=1e-9),
                               f"{want:,.0f} bytes a token, as the cache measures", f"{want:,.0f} bytes a token", hint)
    return passed


def one_hint(got: float, slips) -> str:
    """One hint for ``got``: the hint of the slip that gives it, or, where two slips give the same number (2 bits in
    groups of 16: the codes alone, or the keys alone), one sentence naming both."""
    found = list(dict.fromkeys((hint, short) for value, hint, short in slips if math.isclose(got, value)))
    if len(found) == 1:
        return sentences([found[0][0]])
    if found:
        shorts = [short for _, short in found]
        return sentences([f"this number comes from either {', '.join(shorts[:-1])} or {shorts[-1]}"])
    return ""

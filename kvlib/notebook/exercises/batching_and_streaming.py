"""Notebook 6's checks: right padding, characters of one token, the filler share of a batch."""
from __future__ import annotations

import torch

from ...tokenizer import token_label
from .harness import as_number, brief, call, close, stops_at_placeholder


RIGHT_PAD_CASES = (([[0, 5, 6], [0, 7], [0]], 9), ([[3, 4], [5, 6]], 0))
RIGHT_PAD_TEXTS = (("春风", "白日依山尽，", "床前看月光，疑是地上霜。"), ("春", "白日依山尽，黄河入海流。"))


def _pad_right(prompts, pad_id):
    T = max(len(p) for p in prompts)
    idx = torch.full((len(prompts), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), T, dtype=torch.bool)
    for b, p in enumerate(prompts):
        idx[b, :len(p)] = torch.tensor(p)
        mask[b, :len(p)] = True
    return idx, mask


@stops_at_placeholder
def check_right_padding(pad_right, next_logits, model, tokenizer, texts=RIGHT_PAD_TEXTS) -> bool:
    """Right padding, in two functions. ``pad_right(prompts, pad_id) -> (idx, key_mask)``: the real tokens of each
    row first, pads after them, ``key_mask`` True on real tokens. ``next_logits(model, idx, key_mask) -> (B, V)``:
    each row's next-token logits from one forward pass over the right-padded batch. Each row must give what its
    prompt gives alone (log-probabilities within 1e-4)."""
    from ...decoding import pad_prompts, position_ids_from_mask

    passed = True
    for prompts, pad_id in RIGHT_PAD_CASES:
        want_idx, want_mask = _pad_right(prompts, pad_id)
        label = f"pad_right({prompts}, pad_id={pad_id})"
        ok, got = call(pad_right, [list(p) for p in prompts], pad_id, label=label)
        if not ok:
            passed = False
            continue
        try:
            if not (isinstance(got, (tuple, list)) and len(got) == 2):  # a lone tensor of two rows is not a pair
                raise TypeError
            got_idx, got_mask = (torch.as_tensor(x) for x in got)
            same = torch.equal(got_idx.long(), want_idx) and torch.equal(got_mask.bool(), want_mask)
        except Exception:
            print(f"✗ {label}: expected a pair of tensors (idx, key_mask), got {brief(got)}")
            passed = False
            continue
        if same:
            print(f"✓ {label}: idx {want_idx.tolist()}")
            continue
        passed = False
        left_idx, _ = pad_prompts(prompts, pad_id)
        hint = (". That is left padding: here the real tokens come first and the pads after them"
                if got_idx.shape == left_idx.shape and torch.equal(got_idx.long(), left_idx) else "")
        print(f"✗ {label}: expected idx {want_idx.tolist()} and key_mask {want_mask.int().tolist()}, got idx "
              f"{got_idx.tolist()} and key_mask {got_mask.int().tolist()}{hint}")
    for group in texts:
        prompts = [[tokenizer.eos_id, *tokenizer.encode(t)] for t in group]
        idx, mask = _pad_right(prompts, tokenizer.eos_id)
        with torch.inference_mode():  # what reading the last column gives, with or without the mask and positions
            last_column = [model(idx, key_mask=mask, position_ids=position_ids_from_mask(mask))[0][:, -1],
                           model(idx, key_mask=mask)[0][:, -1], model(idx)[0][:, -1]]
        ok, got = call(next_logits, model, idx.clone(), mask.clone(), label=f"next_logits for {list(group)}")
        if not ok:
            passed = False
            continue
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (len(prompts), tokenizer.vocab_size):
            print(f"✗ next_logits for {list(group)}: expected a tensor of shape {(len(prompts), tokenizer.vocab_size)}, "
                  f"got {brief(got) if not isinstance(got, torch.Tensor) else tuple(got.shape)}")
            passed = False
            continue
        got = got.detach().float().log_softmax(-1)
        for b, (text, p) in enumerate(zip(group, prompts)):
            with torch.inference_mode():
                alone = model(torch.tensor([p]))[0][0, -1].log_softmax(-1)
            diff = float((got[b] - alone).abs().max())
            if diff < 1e-4:
                print(f"✓ row {b} 「{text}」: the same next-token distribution as the prompt alone")
                continue
            passed = False
            kl = max(0.0, float((alone.exp() * (alone - got[b])).sum()))
            hint = (f". You read the last column, which in this row is a pad: the row has {len(p)} real tokens of "
                    f"{idx.shape[1]}, so its last real token is in column {len(p) - 1}"
                    if any(float((got[b] - c[b].log_softmax(-1)).abs().max()) < 1e-4 for c in last_column) else "")
            want_top, got_top = token_label(tokenizer, alone.argmax()), token_label(tokenizer, got[b].argmax())
            print(f"✗ row {b} 「{text}」: {kl:.3f} nats (KL) from the prompt alone; "
                  + (f"the favourite is the same, {want_top!r}, but the probabilities are not" if want_top == got_top
                     else f"its favourite next token should be {want_top!r}, yours is {got_top!r}") + hint)
    return passed


@stops_at_placeholder
def check_one_token_characters(fn, tokenizer, poems, ns=(20, 150)) -> bool:
    """``fn(poems, tokenizer, n) -> (single, split)``: the ``n`` most frequent characters of ``poems`` (punctuation
    counts; a tie at the n-th place may be broken either way), in two lists: those ``tokenizer`` encodes as one
    token, and those it splits into several."""
    from collections import Counter

    counts = Counter("".join(poems))
    ranked = counts.most_common()
    passed = True
    for n in ns:
        label = f"n = {n}"
        ok, got = call(fn, poems, tokenizer, n, label=label)
        if not ok:
            passed = False
            continue
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(
                isinstance(part, (list, tuple, str, set, frozenset)) and all(isinstance(c, str) for c in part)
                for part in got)):
            print(f"✗ {label}: expected a pair of lists of characters (single, split), got {brief(got)}")
            passed = False
            continue
        single, split = list(got[0]), list(got[1])
        nth = ranked[n - 1][1]                                     # how often the n-th most frequent occurs
        must = {c for c, k in ranked if k > nth}
        problems = []
        if len(single) + len(split) != n:
            problems.append(f"the two lists hold {len(single) + len(split)} characters, expected {n}")
        if len(set(single + split)) != len(single + split):
            problems.append("a character appears twice")
        missing = sorted(must - set(single + split), key=lambda c: (-counts[c], c))
        if missing:
            problems.append(f"leaves out {''.join(missing[:8])} (e.g. {missing[0]!r} occurs {counts[missing[0]]:,} "
                            f"times; the character at place {n} of the ranking occurs {nth:,} times)")
        if any(c in ("\n", "⏎") for c in single + split):
            problems.append("includes the end of a poem, which is not one of the characters here: count the "
                            "characters inside the poems, ''.join(poems)")
        rare = [c for c in single + split if counts.get(c, 0) < nth and c not in ("\n", "⏎")]
        if rare:
            problems.append(f"includes {''.join(rare[:8])!r}, which occur{'s' * (len(rare) == 1)} fewer than {nth:,} "
                            f"times (e.g. {rare[0]!r}: {counts.get(rare[0], 0):,})")
        for c in single:
            if len(tokenizer.encode(c)) != 1:
                problems.append(f"puts {c!r} among the single tokens, but it is encoded as "
                                f"{len(tokenizer.encode(c))} tokens ({' | '.join(tokenizer.token_bytes(i).hex(' ') for i in tokenizer.encode(c))})")
                break
        for c in split:
            if len(tokenizer.encode(c)) == 1:
                problems.append(f"puts {c!r} among the split characters, but it is one token "
                                f"({tokenizer.token_bytes(tokenizer.encode(c)[0]).hex(' ')})")
                break
        if problems:
            print(f"✗ {label}: " + "; ".join(problems))
            passed = False
        else:
            print(f"✓ {label}: {len(single)} are one token, {len(split)} are split"
                  + (f" (e.g. {''.join(split[:5])})" if split else ""))
    return passed


FILLER_CASES = (("two rows, one ends early", [[5, 6, 0, 0], [5, 6, 7, 8]], 0),
                ("no row ends", [[1, 2, 3], [4, 5, 6]], 0),
                ("a row ends at its first step", [[0, 0, 0, 0], [1, 2, 3, 0]], 0),
                ("three rows", [[1, 2, 0], [0, 0, 0], [1, 0, 0]], 0),
                ("the separator is id 3", [[7, 3, 3], [1, 2, 3]], 3),
                ("other tokens after the separator", [[5, 0, 6, 7], [1, 2, 3, 4]], 0))


def _filler(rows, eos_id, eos_is_filler=False, unfinished_useful=True):
    steps = len(rows[0])
    useful = [(r.index(eos_id) + (0 if eos_is_filler else 1)) if eos_id in r else (steps if unfinished_useful else 0)
              for r in rows]
    return 1 - sum(useful) / (len(rows) * steps)


@stops_at_placeholder
def check_filler_share(fn, cases=FILLER_CASES) -> bool:
    """``fn(new_tokens, eos_id) -> float``: the share of row-steps that were filler, as a fraction. ``new_tokens`` is
    (B, N); a row's steps up to and including its first ``eos_id`` wrote its poem, every step after it is filler, and
    a row that never writes ``eos_id`` has no filler."""
    passed = True
    for name, rows, eos in cases:
        want = _filler(rows, eos)
        label = f"{name}: {rows}, eos_id {eos}"
        ok, got = call(fn, torch.tensor(rows), eos, label=label)
        if not ok:
            passed = False
            continue
        share = as_number(got, f"the answer for {name}")
        if share is None:
            passed = False
            continue
        if close(share, want):
            print(f"✓ {label}: {share:.3f}")
            continue
        passed = False
        hints = [(100 * want, "give a fraction, not a percentage"),
                 (_filler(rows, eos, eos_is_filler=True), "the step that writes the separator is not filler: it ends "
                                                          "the poem; only the steps after it are"),
                 (_filler(rows, eos, unfinished_useful=False), "a row that never writes the separator works at "
                                                               "every step: none of its steps is filler"),
                 (1 - want, "that is the useful share: the filler is the rest")]
        hint = next((h for value, h in hints if close(share, value) and not close(value, want)), "")
        print(f"✗ {label}: expected {want:.4f}, got {share:.4f}" + (f". {hint[0].upper()}{hint[1:]}" if hint else ""))
    return passed

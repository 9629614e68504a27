"""Notebook 3's checks: the logits hooks of a fixed-format quatrain and of no repeated character."""
from __future__ import annotations

import torch

from ...decoding import generate
from ...poems import encode_prompt
from ...tokenizer import token_label
from .harness import NotWritten, brief, call, show, stops_at_placeholder


def _write_with(hook, model, tokenizer, n_new: int, seed: int) -> list[int] | None:
    """The token ids of a new poem written with the learner's hook at temperature 1, or None (said why)."""
    try:
        out = generate(model, torch.tensor([[tokenizer.eos_id]]), n_new, temperature=1.0, logits_hook=hook,
                       generator=torch.Generator().manual_seed(seed))
    except Exception as e:  # the learner's code: say what it raised
        print(f"✗ seed {seed}: generate with your hook raised {type(e).__name__}: {e}")
        return None
    return out.new_tokens[0].tolist()


def _judge_writing(hook, model, tokenizer, n_new: int, seeds, judge) -> bool:
    """A text written with the hook for each seed, one line each: ``judge(new_ids) -> (right, what to say)``."""
    passed = True
    for seed in seeds:
        new = _write_with(hook, model, tokenizer, n_new, seed)
        if new is None:
            return False
        right, said = judge(new)
        print(f"{'✓' if right else '✗'} seed {seed}: {said}")
        passed &= right
    return passed


def _probe(hook, step: int, tokens: list[int], vocab_size: int, label: str) -> torch.Tensor | None:
    """(V,) bool: the tokens ``hook`` leaves allowed after ``tokens`` at ``step``, given flat logits; None (said
    why) if it raised or did not return logits. A score of -1e4 or below counts as banned."""
    if not callable(hook):
        print(f"✗ {label}: expected your hook, a function (step, tokens, logits) -> logits, got {brief(hook)}")
        raise NotWritten
    ok, out = call(hook, step, torch.tensor([tokens]), torch.zeros(1, vocab_size), label=label)
    if not ok:
        return None
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (1, vocab_size):
        print(f"✗ {label}: your hook must return logits of shape (1, {vocab_size}), got {brief(out)}")
        return None
    return out[0] > -1e4


def _names(ids, tokenizer, most: int = 6) -> str:
    shown = "".join(token_label(tokenizer, i).replace("\n", "⏎") for i in ids[:most])
    return f"{shown}{'…' if len(ids) > most else ''} ({len(ids)} token{'s' * (len(ids) != 1)})"


# A seven-character quatrain the checks feed to a hook as the text so far (李白 Li Bai, 早发白帝城)
QUATRAIN = "朝辞白帝彩云间，千里江陵一日还。两岸猿声啼不住，轻舟已过万重山。"


@stops_at_placeholder
def check_quatrain_hook(hook, model, tokenizer, chars_per_line: int = 7, seeds=(0, 1, 2)) -> bool:
    """A logits hook for a fixed-format quatrain: ，or 。 exactly after every ``chars_per_line`` characters
    (the last one 。), no punctuation anywhere else.

    First the hook itself, at every step after the opening of a real quatrain, given flat logits: inside a
    line it must leave exactly the characters (no punctuation, no separator); at a line end some of ，。 and
    nothing else; at the last, only 。. Then three poems written with it by ``generate`` from the separator."""
    from ...constraints import punctuation_mask

    n, line = 4 * (chars_per_line + 1), chars_per_line + 1
    text = QUATRAIN if chars_per_line == 7 else "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。"
    prefix = [tokenizer.eos_id] + tokenizer.encode(text)
    chars = ~punctuation_mask(tokenizer)
    char_ids = set(chars.nonzero().flatten().tolist())
    marks = {tokenizer.encode(m)[0] for m in "，。"}
    full_stop = tokenizer.encode("。")[0]
    for step in range(n):
        label = f"step {step} (new token {step + 1})"
        allowed = _probe(hook, step, prefix[:1 + step], tokenizer.vocab_size, label)
        if allowed is None:
            return False
        ids = set(allowed.nonzero().flatten().tolist())
        if (step + 1) % line:
            may, must, what = char_ids, char_ids, "exactly the Chinese characters, no punctuation or separator"
        elif step + 1 < n:
            may, must, what = marks, set(), "only ，or 。 (at least one of them)"
        else:
            may, must, what = {full_stop}, {full_stop}, "only 。"
        extra, missing = sorted(ids - may), sorted(must - ids)
        if extra or missing or not ids:
            print(f"✗ {label}, after 「{tokenizer.decode(prefix[1:1 + step])}」: must allow {what}; your hook "
                  + "; ".join(x for x in (f"allows {_names(extra, tokenizer)} it should ban" if extra else "",
                                          f"bans {_names(missing, tokenizer)} it should allow" if missing else "",
                                          "bans every token" if not ids else "") if x)
                  + (f". Steps count from 0: step s chooses new token s + 1, so the line ends are steps "
                     f"{', '.join(str(line * i - 1) for i in range(1, 5))}" if ids and ids <= marks and may is char_ids
                     else ""))
            return False
    print(f"✓ your hook allows the right tokens at each of the {n} steps (probed after the opening of 「{text}」)")

    def form(new):
        punct = [i + 1 for i, t in enumerate(new) if bool(~chars[t]) == bool((i + 1) % line)]
        kept = not punct and new[-1] == full_stop
        return kept, show(new, tokenizer) + ("" if kept else f": new tokens {punct[:8] or [n]} break the form")
    return _judge_writing(hook, model, tokenizer, n, seeds, form)


@stops_at_placeholder
def check_no_repeat_hook(hook, model, tokenizer, seeds=(0, 1, 2), n_new: int = 40) -> bool:
    """A logits hook that forbids any Chinese character already in the text (punctuation may repeat).

    First the hook itself after a couplet and a half, given flat logits: exactly the characters in the text
    must be banned, every other score left as it was (punctuation and the separator too). Then three texts
    written with it by ``generate``."""
    from ...tokenizer import is_ideograph

    text = "床前明月光，疑是地上霜。举头望明月，"
    tokens = encode_prompt(tokenizer, text)
    allowed = _probe(hook, 0, tokens, tokenizer.vocab_size, f"after 「{text}」")
    if allowed is None:
        return False
    used = {t for t in tokens if is_ideograph(tokenizer.decode([t]))}
    want = torch.ones(tokenizer.vocab_size, dtype=torch.bool)
    want[sorted(used)] = False
    if not torch.equal(allowed, want):
        kept = sorted(used & set(allowed.nonzero().flatten().tolist()))
        banned = sorted(set((~allowed).nonzero().flatten().tolist()) - used)
        print(f"✗ after 「{text}」: your hook "
              + "; ".join(x for x in (f"still allows {_names(kept, tokenizer)} already in the text" if kept else "",
                                      f"bans {_names(banned, tokenizer)} not among its characters" if banned else "") if x)
              + " (only the Chinese characters already written are forbidden; punctuation may repeat)")
        return False
    print(f"✓ after 「{text}」 your hook bans exactly its {len(used)} different characters")

    def unrepeated(new):
        chars = [ch for ch in tokenizer.decode(new) if is_ideograph(ch)]
        repeats = sorted({ch for ch in chars if chars.count(ch) > 1})
        return (False, f"{show(new, tokenizer)} repeats {'、'.join(repeats[:8])}") if repeats else (
            True, f"{len(chars)} characters, none repeated")
    return _judge_writing(hook, model, tokenizer, n_new, seeds, unrepeated)

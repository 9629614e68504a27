"""The exercise checks answer back: right solutions pass, wrong ones are named with what went wrong."""
from __future__ import annotations

import torch

from kvlib import KVCache
from kvlib.notebook.exercises import check_cached_greedy


def right(model, idx, n_new):
    cache = KVCache(model.config, idx.shape[0], model.config.block_size)
    with torch.inference_mode():
        logits, _ = model(idx, cache=cache)  # prefill
        out = []
        for _ in range(n_new):
            nxt = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
            out.append(nxt.item())
            logits, _ = model(nxt, cache=cache)  # decode: only the new token
    return out


def refeeds_everything(model, idx, n_new):
    """Wrong: feeds the whole text again into the same cache at every step."""
    cache = KVCache(model.config, idx.shape[0], model.config.block_size)
    with torch.inference_mode():
        seq, out = idx, []
        logits, _ = model(seq, cache=cache)
        for _ in range(n_new):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            out.append(nxt.item())
            seq = torch.cat([seq, nxt], dim=1)
            logits, _ = model(seq[:, -2:], cache=cache)
    return out


def first_row(model, idx, n_new):
    """Wrong: takes the first row of the prefill's logits instead of the last."""
    cache = KVCache(model.config, idx.shape[0], model.config.block_size)
    with torch.inference_mode():
        logits, _ = model(idx, cache=cache)
        out = []
        for i in range(n_new):
            nxt = logits[:, 0 if i == 0 else -1].argmax(-1, keepdim=True)
            out.append(nxt.item())
            logits, _ = model(nxt, cache=cache)
    return out


def test_a_right_solution_passes(shipped_char, capsys):
    model, tok = shipped_char
    assert check_cached_greedy(right, model, tok, n_new=6)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(line.startswith("✓") for line in lines)


def test_wrong_solutions_are_told_where_and_how(shipped_char, capsys):
    model, tok = shipped_char
    assert not check_cached_greedy(first_row, model, tok, n_new=6)
    out = capsys.readouterr().out
    assert "differ from step 0" in out and "last row" in out
    assert not check_cached_greedy(refeeds_everything, model, tok, n_new=6)
    out = capsys.readouterr().out
    assert "✗" in out and ("Feed only the new token" in out or "raised" in out)


def test_a_crash_or_a_wrong_length_is_reported_not_raised(shipped_char, capsys):
    model, tok = shipped_char
    assert not check_cached_greedy(lambda m, i, n: 1 / 0, model, tok, n_new=3)
    assert "raised ZeroDivisionError" in capsys.readouterr().out
    assert not check_cached_greedy(lambda m, i, n: [0], model, tok, n_new=3)
    assert "expected 3 new token ids, got 1" in capsys.readouterr().out


# ---- the filters of notebook 2 ---------------------------------------------------------------------------

from kvlib.notebook.exercises import check_no_repeat_hook, check_quatrain_hook, check_top_k, check_top_p  # noqa: E402
from kvlib.sampling import top_k_filter, top_p_filter  # noqa: E402


def test_the_filter_checks_pass_the_library_and_name_what_a_wrong_filter_keeps(capsys):
    assert check_top_k(top_k_filter) and check_top_p(top_p_filter)
    capsys.readouterr()

    def strict_top_k(scores, k):  # drops ties with the k-th
        return scores.masked_fill(scores.argsort(-1, descending=True).argsort(-1) >= k, float("-inf"))

    assert not check_top_k(strict_top_k)
    assert "a three-way tie" in capsys.readouterr().out

    def crossing_dropped(scores, p):  # drops the token that crosses p
        probs = scores.softmax(-1)
        sorted_probs, order = probs.sort(-1, descending=True)
        drop = sorted_probs.cumsum(-1) > p
        drop[:, 0] = False
        return scores.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))

    assert not check_top_p(crossing_dropped)
    assert "dropped but should be kept" in capsys.readouterr().out
    assert not check_top_p(lambda scores, p: scores * 2)
    assert "the kept scores changed" in capsys.readouterr().out or "kept" in capsys.readouterr().out


def test_the_hook_checks_tell_a_form_kept_from_a_form_broken(shipped_char, capsys):
    from kvlib import constraints

    model, tok = shipped_char
    assert check_quatrain_hook(constraints.schedule_hook(constraints.quatrain_schedule(tok, 7)), model, tok)
    capsys.readouterr()
    assert not check_quatrain_hook(lambda step, tokens, logits: logits, model, tok)
    assert "break the form" in capsys.readouterr().out

    def no_repeats(step, tokens, logits):
        seen = torch.zeros(tok.vocab_size, dtype=torch.bool)
        seen[tokens[0]] = True
        return constraints.ban(logits, seen & ~constraints.punctuation_mask(tok))

    assert check_no_repeat_hook(no_repeats, model, tok)
    capsys.readouterr()
    assert not check_no_repeat_hook(lambda step, tokens, logits: logits, model, tok, n_new=80)
    assert "repeats" in capsys.readouterr().out

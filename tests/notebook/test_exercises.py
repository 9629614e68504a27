"""The exercise checks answer back: right solutions pass, wrong ones are named with what went wrong."""
from __future__ import annotations

import pytest
import torch

from kvlib import KVCache, generate
from kvlib.notebook.exercises import check_cached_greedy


def right(model, idx, n_new):
    cache = KVCache(model.config, idx.shape[0], model.config.block_size)
    with torch.inference_mode():
        logits, _ = model(idx, cache=cache)  # prefill
        out = []
        for i in range(n_new):
            nxt = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
            out.append(nxt.item())
            if i + 1 < n_new:  # the last token is never fed back
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
    assert "✗" in out and ("feed only the new token" in out or "raised" in out)


def recompute(model, idx, n_new):
    """Right tokens, no cache: the whole text through the model at every step."""
    seq, out = idx, []
    with torch.inference_mode():
        for _ in range(n_new):
            nxt = model(seq)[0][:, -1].argmax(-1, keepdim=True)
            out.append(nxt.item())
            seq = torch.cat([seq, nxt], dim=1)
    return out


def as_tensors(model, idx, n_new):
    """Right, but returns a list of (1, 1) tensors and floats in turn: ids all the same."""
    return [torch.tensor([[t]]) if i % 2 else float(t) for i, t in enumerate(right(model, idx, n_new))]


def test_the_cached_greedy_check_reads_any_list_of_ids_and_counts_what_ran(shipped_char, capsys):
    model, tok = shipped_char
    assert check_cached_greedy(as_tensors, model, tok, n_new=4)
    capsys.readouterr()
    assert not check_cached_greedy(recompute, model, tok, n_new=4)
    assert "the right tokens, but your loop ran" in capsys.readouterr().out
    for wrong, said in ((lambda m, i, n: None, "returned None"), (lambda m, i, n: "一夜", "expected a list of 4 token ids"),
                        (lambda m, i, n: [[1]] * n, "expected a list"), (lambda m, i, n: [10**9] * n, "ints in [0,")):
        assert not check_cached_greedy(wrong, model, tok, n_new=4)
        assert said in capsys.readouterr().out


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


def _top_p_by_hand(scores, p, dtype=torch.float32, ties_to_higher_ids=False):
    """A correct top-p a learner might write: its own dtype, and its own order among tied scores."""
    if p == 1:
        return scores.clone()
    probs = scores.to(dtype).softmax(-1)
    if ties_to_higher_ids:  # a flipped vocabulary: among equal probabilities the higher id comes first
        sorted_probs, order = probs.flip(-1).sort(dim=-1, descending=True, stable=True)
        order = probs.shape[-1] - 1 - order
    else:
        sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
    drop = sorted_probs.cumsum(-1) - sorted_probs >= p           # keep while the mass before it is below p
    drop[:, 0] = False
    return scores.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))


def _top_p_ascending(scores, p):
    """The rule written the other way round, as transformers does: drop the tail whose mass is at most 1 - p."""
    if p == 1:
        return scores.clone()
    sorted_scores, order = scores.sort(-1, descending=False)
    tail = sorted_scores.double().softmax(-1).cumsum(-1) <= 1 - p
    tail[:, -1] = False
    return scores.masked_fill(torch.zeros_like(tail).scatter(-1, order, tail), float("-inf"))


@pytest.mark.parametrize("name, fn", [
    ("float64", lambda s, p: _top_p_by_hand(s, p, torch.float64)),
    ("float32", lambda s, p: _top_p_by_hand(s, p, torch.float32)),
    ("ties to the higher ids", lambda s, p: _top_p_by_hand(s, p, torch.float64, ties_to_higher_ids=True)),
    ("ascending, as transformers", _top_p_ascending),
])
def test_a_correct_top_p_passes_in_either_precision_and_any_order_of_ties(name, fn, capsys):
    assert check_top_p(fn), capsys.readouterr().out
    assert check_top_p(top_p_filter)


def test_the_top_p_check_keeps_its_values_of_p_away_from_every_boundary():
    from kvlib.notebook.exercises.sampling import TOP_P_SETTINGS, _filter_cases

    for case, scores in _filter_cases().items():
        for row in scores:
            probs = row.double().softmax(-1).sort(descending=True).values
            before = probs.cumsum(0) - probs                     # each prefix mass, in float64
            for p in TOP_P_SETTINGS:
                if p < 1:
                    assert (before - p).abs().min() > 1e-3, (case, p)


def test_the_top_p_check_still_counts_the_tokens_of_a_flat_row(capsys):
    def one_too_many(scores, p):  # keeps the token after the one that crosses p
        kept = torch.isfinite(top_p_filter(scores, p))
        probs = scores.softmax(-1)
        order = probs.sort(dim=-1, descending=True, stable=True).indices
        n = kept.sum(-1, keepdim=True).clamp(max=scores.shape[-1] - 1)
        kept.scatter_(-1, order.gather(-1, n), True)
        return scores.masked_fill(~kept, float("-inf"))

    assert not check_top_p(one_too_many)
    assert "a flat row" in capsys.readouterr().out


def test_the_hook_checks_tell_a_form_kept_from_a_form_broken(shipped_char, capsys):
    from kvlib import constraints

    model, tok = shipped_char
    assert check_quatrain_hook(constraints.schedule_hook(constraints.quatrain_schedule(tok, 7)), model, tok)
    capsys.readouterr()
    assert not check_quatrain_hook(lambda step, tokens, logits: logits, model, tok)
    assert "step 0 (new token 1)" in capsys.readouterr().out

    def no_repeats(step, tokens, logits):
        seen = torch.zeros(tok.vocab_size, dtype=torch.bool)
        seen[tokens[0]] = True
        return constraints.ban(logits, seen & ~constraints.punctuation_mask(tok))

    assert check_no_repeat_hook(no_repeats, model, tok)
    capsys.readouterr()
    assert not check_no_repeat_hook(lambda step, tokens, logits: logits, model, tok, n_new=80)
    assert "still allows" in capsys.readouterr().out


def test_the_hook_checks_probe_the_hook_at_every_step(shipped_char, capsys):
    """Hooks that a few sampled poems might not expose are caught by calling them directly."""
    from kvlib import constraints

    model, tok = shipped_char
    form = constraints.schedule_hook(constraints.quatrain_schedule(tok, 7))
    separator = torch.zeros(tok.vocab_size, dtype=torch.bool)
    separator[tok.eos_id] = True

    def lets_the_separator_in(step, tokens, logits):
        out = form(step, tokens, logits)
        return out if (step + 1) % 8 == 0 else out.masked_fill(separator, 0.0)

    def exclaims(step, tokens, logits):
        return logits.masked_fill(torch.arange(tok.vocab_size) != tok.encode("！")[0], float("-inf")) if step == 7 \
            else form(step, tokens, logits)

    for hook, said in ((lets_the_separator_in, "step 0 (new token 1)"), (exclaims, "step 7 (new token 8)"),
                       (None, "expected your hook, a function")):
        assert not check_quatrain_hook(hook, model, tok)
        out = capsys.readouterr().out
        assert said in out and len(out.splitlines()) == 1, out
    punctuation = constraints.punctuation_mask(tok)

    def penalises(step, tokens, logits):  # a soft penalty is not a ban
        used = torch.zeros(tok.vocab_size, dtype=torch.bool)
        used[tokens[0]] = True
        return logits.masked_fill(used & ~punctuation, -5.0)

    def bans_punctuation_too(step, tokens, logits):
        used = torch.zeros(tok.vocab_size, dtype=torch.bool)
        used[tokens[0]] = True
        return constraints.ban(logits, used)

    for hook, said in ((penalises, "still allows"), (bans_punctuation_too, "not among its characters")):
        assert not check_no_repeat_hook(hook, model, tok)
        assert said in capsys.readouterr().out


# ---- notebooks 1, 5, 6 and 8: functions and numbers with known answers ------------------------------------

from collections import Counter  # noqa: E402

from kvlib import memory, pad_prompts, position_ids_from_mask  # noqa: E402
from kvlib.notebook.exercises import (check_best_gamma, check_blocks_to_free, check_filler_share,  # noqa: E402
                                      check_followers, check_half_cover, check_kept_share,
                                      check_one_token_characters, check_rank, check_right_padding,
                                      check_sequences_that_fit, check_token_forwards, check_tokens_to_match_weights)
from kvlib.speculative import expected_tokens_per_round  # noqa: E402
from kvlib.poems import count_followers, next_token_probs, rank_of  # noqa: E402


def placeholder(*args):
    raise NotImplementedError("your code here")


def assert_placeholder_reported(check, *args):
    """The untouched placeholder (raising or returning None): False and one line, never an exception."""
    import io
    from contextlib import redirect_stdout

    for stub in (placeholder, lambda *a: None):
        out = io.StringIO()
        with redirect_stdout(out):
            assert check(stub, *args) is False
        lines = out.getvalue().splitlines()
        assert len(lines) == 1 and lines[0].startswith("✗"), lines
        assert "NotImplementedError" in lines[0] or "returned None" in lines[0]


def test_check_rank(shipped_char, capsys):
    model, tok = shipped_char
    assert check_rank(lambda text, ch, opening: rank_of(model, tok, text, ch, opening), model, tok)
    assert all(line.startswith("✓") for line in capsys.readouterr().out.splitlines())

    def zero_based_percent(text, ch, opening):
        rank, p = rank_of(model, tok, text, ch, opening)
        return rank - 1, 100 * p

    assert not check_rank(zero_based_percent, model, tok)
    out = capsys.readouterr().out
    assert "expected rank 122" in out and "got rank 121" in out
    assert "ranks count from 1" in out.lower() and "not as a percentage" in out
    assert not check_rank(lambda text, ch, opening: rank_of(model, tok, text, ch, True), model, tok)
    out = capsys.readouterr().out
    assert "piece from anywhere: expected" in out and "opening=False" in out
    assert_placeholder_reported(check_rank, model, tok)


def test_check_followers(shipped_char, capsys):
    from kvlib.tools.corpus import load_poems

    model, tok = shipped_char
    poems = load_poems()[:20000]

    def table(text, opening=False, over_top=False):
        counts = count_followers(poems, text)
        top = sorted(counts.items(), key=lambda kv: -kv[1])[:5]
        total = sum(c for _, c in top) if over_top else sum(counts.values())
        p = next_token_probs(model, tok, text, opening=opening)
        return [(ch, c / total, float(p[tok.encode(ch)[0]])) for ch, c in top]

    texts = ("明月", "春风")
    assert check_followers(table, model, tok, poems, texts)
    capsys.readouterr()
    assert not check_followers(lambda text: table(text, opening=True), model, tok, poems, texts)
    out = capsys.readouterr().out
    assert "should be" in out and "with the separator in front" in out
    assert not check_followers(lambda text: table(text, over_top=True), model, tok, poems, texts)
    assert "not only the top 5" in capsys.readouterr().out
    assert not check_followers(lambda text: table(text)[::-1], model, tok, poems, texts)
    assert "place 1 should be" in capsys.readouterr().out
    assert_placeholder_reported(check_followers, model, tok, poems, texts)


def test_check_half_cover(shipped_char, capsys):
    model, tok = shipped_char

    def right(probs):
        return int((probs.sort(descending=True).values.cumsum(0) < 0.5).sum()) + 1

    assert check_half_cover(right, model, tok) and check_half_cover(right)
    capsys.readouterr()
    assert not check_half_cover(lambda probs: int((probs.cumsum(0) < 0.5).sum()) + 1)
    out = capsys.readouterr().out
    assert "(not sorted): expected 2, got 3" in out and "Sort the probabilities" in out
    assert not check_half_cover(lambda probs: int((probs.sort(descending=True).values.cumsum(0) <= 0.5).sum()) + 1)
    assert "eight tokens of 0.125: expected 4, got 5" in capsys.readouterr().out
    assert_placeholder_reported(check_half_cover)


def test_check_tokens_to_match_weights(capsys):
    shape = memory.SHAPES["Llama 3 8B"]
    tokens = shape.weight_bytes() / shape.kv_bytes_per_token()
    assert check_tokens_to_match_weights(round(tokens), False)
    capsys.readouterr()
    assert not check_tokens_to_match_weights(tokens / 4, False)
    assert "Off by a factor 4" in capsys.readouterr().out
    assert not check_tokens_to_match_weights(tokens * 2, False)     # the factor 2 of keys and values left out
    assert "key and a value" in capsys.readouterr().out
    assert not check_tokens_to_match_weights(tokens / 2, False)     # parameters, not bytes; or a cache in fp32
    assert "2 bytes a parameter" in capsys.readouterr().out
    assert not check_tokens_to_match_weights(0, False)
    assert "a positive number of tokens" in capsys.readouterr().out
    assert check_tokens_to_match_weights(torch.tensor(tokens), torch.tensor(tokens) <= shape.context)
    assert not check_tokens_to_match_weights(tokens, True)
    assert "inside the trained context: expected False, got True" in capsys.readouterr().out
    assert not check_tokens_to_match_weights(None, None)
    out = capsys.readouterr().out
    assert "still None" in out and "True or False" in out


def test_check_sequences_that_fit(capsys):
    names = ("Llama 2 7B", "Llama 3 8B")
    right = {n: (80 * 10**9 - memory.SHAPES[n].weight_bytes()) // memory.SHAPES[n].kv_cache_bytes(4096) for n in names}
    assert right == {"Llama 2 7B": 30, "Llama 3 8B": 119}
    assert check_sequences_that_fit(right)
    capsys.readouterr()
    gib = {n: (80 * 2**30 - memory.SHAPES[n].weight_bytes()) // memory.SHAPES[n].kv_cache_bytes(4096) for n in names}
    assert not check_sequences_that_fit(gib)
    out = capsys.readouterr().out
    assert "expected 30 sequences, got 33" in out and "80 GiB" in out and "80 × 10⁹ bytes" in out
    assert not check_sequences_that_fit({"Llama 2 7B": 31, "Llama 3 8B": 119})
    assert "round down" in capsys.readouterr().out
    assert not check_sequences_that_fit(None) and not check_sequences_that_fit({n: None for n in names})
    assert "still None" in capsys.readouterr().out


def test_sequences_that_fit_names_the_one_slip_that_explains_both_answers(capsys):
    """For Llama 2 7B, taking a KiB as 1,000 bytes and rounding up both give 31: the other model's answer says which."""
    import math
    names = ("Llama 2 7B", "Llama 3 8B")
    left = {n: 80 * 10**9 - memory.SHAPES[n].weight_bytes() for n in names}
    kib_as_1000 = {n: left[n] // (memory.SHAPES[n].kv_bytes_per_token() // 1024 * 1000 * 4096) for n in names}
    rounded_up = {n: math.ceil(left[n] / memory.SHAPES[n].kv_cache_bytes(4096)) for n in names}
    assert kib_as_1000["Llama 2 7B"] == rounded_up["Llama 2 7B"] == 31
    assert not check_sequences_that_fit(kib_as_1000)
    out = capsys.readouterr().out.splitlines()
    assert all("KiB is 1,024 bytes" in line and "round" not in line for line in out), out
    assert not check_sequences_that_fit(rounded_up)
    out = capsys.readouterr().out.splitlines()
    assert all("round down, not up" in line and "KiB" not in line for line in out), out


def test_check_token_forwards(capsys):
    assert check_token_forwards(lambda P, N: (N * P + N * (N - 1) // 2, P + N - 1))
    capsys.readouterr()
    assert not check_token_forwards(lambda P, N: (N * P + N * (N + 1) // 2, P + N))
    out = capsys.readouterr().out
    assert "prompt of 1, 120 new tokens: expected (7,260, 120), got (7,380, 121)" in out
    assert "never fed back" in out and "P + N − 1" in out
    assert not check_token_forwards(lambda P, N: (N * (N + 1) // 2, P + N - 1))
    assert "runs the whole prompt again" in capsys.readouterr().out
    assert_placeholder_reported(check_token_forwards)


def test_check_right_padding(shipped_char, capsys):
    model, tok = shipped_char

    def pad_right(prompts, pad_id):
        T = max(len(p) for p in prompts)
        idx = torch.full((len(prompts), T), pad_id)
        mask = torch.zeros(len(prompts), T, dtype=torch.bool)
        for b, p in enumerate(prompts):
            idx[b, :len(p)], mask[b, :len(p)] = torch.tensor(p), True
        return idx, mask

    def own_last_token(model, idx, key_mask):
        with torch.inference_mode():
            logits, _ = model(idx, key_mask=key_mask, position_ids=position_ids_from_mask(key_mask))
        return logits[torch.arange(len(idx)), key_mask.sum(-1) - 1]

    def last_column(model, idx, key_mask):
        with torch.inference_mode():
            return model(idx, key_mask=key_mask)[0][:, -1]

    assert check_right_padding(pad_right, own_last_token, model, tok)
    capsys.readouterr()
    assert not check_right_padding(pad_right, last_column, model, tok)
    out = capsys.readouterr().out
    assert "row 0 「春风」" in out and "nats (KL)" in out and "You read the last column" in out
    assert "✓ row 2" in out  # the longest row has no pad: its last column is right
    assert not check_right_padding(pad_prompts, own_last_token, model, tok)
    assert "That is left padding" in capsys.readouterr().out
    assert_placeholder_reported(lambda fn, *a: check_right_padding(fn, fn, *a), model, tok)


def test_check_one_token_characters(bpe_tokenizer, capsys):
    split_char = next(c for c in "马望别闻阳髭髦饥骊鹧鸪" if len(bpe_tokenizer.encode(c)) > 1)
    poems = ["白日依山尽，黄河入海流。欲穷千里目，更上一层楼。", "床前看月光，疑是地上霜。举头望山月，低头思故乡。",
             "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。"] * 3 + ["山月山月山，" + split_char * 4 + "。"]

    def right(poems, tokenizer, n):
        top = [c for c, _ in Counter("".join(poems)).most_common(n)]
        return [c for c in top if len(tokenizer.encode(c)) == 1], [c for c in top if len(tokenizer.encode(c)) > 1]

    assert check_one_token_characters(right, bpe_tokenizer, poems, ns=(3, 10))
    capsys.readouterr()
    top = [c for c, _ in Counter("".join(poems)).most_common(10)]
    assert any(len(bpe_tokenizer.encode(c)) > 1 for c in top), "the case needs a split character"
    assert not check_one_token_characters(lambda p, t, n: (right(p, t, n)[0] + right(p, t, n)[1], []),
                                          bpe_tokenizer, poems, ns=(10,))
    assert "among the single tokens, but it is encoded as" in capsys.readouterr().out

    def without_punctuation(poems, tokenizer, n):
        top = [c for c, _ in Counter(c for p in poems for c in p if c not in "，。").most_common(n)]
        return [c for c in top if len(tokenizer.encode(c)) == 1], [c for c in top if len(tokenizer.encode(c)) > 1]

    assert not check_one_token_characters(without_punctuation, bpe_tokenizer, poems, ns=(10,))
    out = capsys.readouterr().out
    assert "leaves out" in out and "occurs 19 times" in out
    assert_placeholder_reported(check_one_token_characters, bpe_tokenizer, poems)


def test_check_filler_share(capsys):
    def right(new_tokens, eos_id):
        rows, steps = new_tokens.tolist(), new_tokens.shape[1]
        useful = [r.index(eos_id) + 1 if eos_id in r else steps for r in rows]
        return 1 - sum(useful) / (len(rows) * steps)

    assert check_filler_share(right)
    capsys.readouterr()
    assert not check_filler_share(lambda t, eos: 100 * right(t, eos))
    assert "not a percentage" in capsys.readouterr().out

    def separator_as_filler(new_tokens, eos_id):
        rows, steps = new_tokens.tolist(), new_tokens.shape[1]
        return 1 - sum(r.index(eos_id) if eos_id in r else steps for r in rows) / (len(rows) * steps)

    assert not check_filler_share(separator_as_filler)
    out = capsys.readouterr().out
    assert "expected 0.1250, got 0.2500" in out and "is not filler" in out
    assert_placeholder_reported(check_filler_share)


def test_check_best_gamma(capsys):
    def gain(a, g, c, v):
        return expected_tokens_per_round(a, g) / (g * c + v)

    right = lambda a, c, v: max(range(1, 9), key=lambda g: gain(a, g, c, v))  # noqa: E731
    assert right(0.6, 0.05, 1.2) == 4
    assert check_best_gamma(right)
    capsys.readouterr()
    assert not check_best_gamma(lambda a, c, v: max(range(1, 9), key=lambda g: expected_tokens_per_round(a, g)))
    out = capsys.readouterr().out
    assert "expected γ = 4" in out and "got γ = 8" in out and "divide by what the round costs" in out
    assert not check_best_gamma(lambda a, c, v: 0)
    assert "a whole number from 1 to 8" in capsys.readouterr().out
    assert_placeholder_reported(check_best_gamma)


def certain_moon(model, tok):
    """A draft that always guesses 月, and the target's probability of 月 after the opening 举头望明."""
    from kvlib import encode_prompt, probabilities

    x = tok.encode("月")[0]

    class Certain:
        def propose(self, tokens, gamma):
            return [x] * gamma, None

    with torch.inference_mode():
        p = float(probabilities(model(torch.tensor([encode_prompt(tok, "举头望明")]))[0][:, -1], 1.0)[0, x])
    return Certain(), p


def test_check_kept_share(shipped_char, capsys):
    model, tok = shipped_char
    draft, p = certain_moon(model, tok)
    assert check_kept_share(p + 0.01, model, tok, draft)
    capsys.readouterr()
    assert not check_kept_share(1.0, model, tok, draft)
    assert "Every guess was kept" in capsys.readouterr().out
    assert not check_kept_share(100 * p, model, tok, draft)
    assert "not a percentage" in capsys.readouterr().out
    assert not check_kept_share(None, model, tok, draft)
    assert "still None" in capsys.readouterr().out


def test_check_blocks_to_free(capsys):
    assert check_blocks_to_free(lambda before, after, size=16: list(range(-(-after // size), -(-before // size))))
    capsys.readouterr()
    assert not check_blocks_to_free(lambda before, after, size=16: list(range(after // size, before // size)))
    out = capsys.readouterr().out
    assert "49 → 31 slots, blocks of 16: expected [2, 3], got [1, 2]" in out and "ceil(length / kv_block_size)" in out
    assert not check_blocks_to_free(lambda before, after, size=16: list(range(-(-after // 16), -(-before // 16))))
    assert "20 → 5 slots, blocks of 8: expected [1, 2]" in capsys.readouterr().out
    assert_placeholder_reported(check_blocks_to_free)


def test_bytes_per_token_check_answers_back(capsys):
    from kvlib import GPTConfig
    from kvlib.notebook.exercises import check_bytes_per_token

    cfg = GPTConfig(vocab_size=100)
    assert check_bytes_per_token(lambda b, g: cfg.n_layer * 2 * cfg.n_embd * (b / 8 + 4 / g), cfg)
    assert not check_bytes_per_token(lambda b, g: cfg.n_layer * 2 * cfg.n_embd * b / 8, cfg)
    out = capsys.readouterr().out
    assert "add 4 bytes (a float16 scale and a float16 zero point)" in out
    two = next(line for line in out.splitlines() if line.startswith("✗ 2 bits, groups of 16"))
    assert "either counting the codes without their scales and zero points" in two  # two slips give that number:
    assert "or counting the keys without the values" in two                         # one hint names both
    assert not check_bytes_per_token(lambda b, g: cfg.n_layer * 2 * cfg.n_embd * (b / 8 + 2 / g), cfg)
    assert "The zero point is a float16 too" in capsys.readouterr().out
    assert not check_bytes_per_token(lambda b, g: "1,280", cfg)
    out = capsys.readouterr().out
    assert out.count("✗") == 5 and "8 bits, groups of 16: bytes must be a finite number" in out  # one line a case
    assert not check_bytes_per_token(lambda b, g: None, cfg)
    assert "returned None" in capsys.readouterr().out


def test_bytes_per_token_check_gives_one_hint_a_case_even_where_two_slips_give_its_number(capsys):
    from kvlib import GPTConfig
    from kvlib.notebook.exercises import check_bytes_per_token

    cfg = GPTConfig(vocab_size=100)
    numbers = cfg.n_layer * 2 * cfg.n_embd
    keys_only = lambda b, g: numbers * (b / 8 + 4 / g) / 2  # noqa: E731
    codes_only = lambda b, g: numbers * b / 8  # noqa: E731
    for wrong in (keys_only, codes_only):  # at 2 bits in groups of 16 (and 4 in groups of 8) both give one number
        assert not check_bytes_per_token(wrong, cfg)
        lines = capsys.readouterr().out.splitlines()
        assert len(lines) == 5 and all(line.startswith("✗") for line in lines)
        for line in lines:
            hints = line.split(" bytes a token, got ", 1)[1].split(". ")[1:]  # the sentences after the number
            assert len(hints) == 1, line
        both = [line for line in lines if "either" in line]
        assert [line.split(":")[0] for line in both] == ["✗ 2 bits, groups of 16", "✗ 4 bits, groups of 8"]


def test_bytes_per_token_check_takes_the_model_too(char, capsys):
    from kvlib.notebook.exercises import check_bytes_per_token

    model, _ = char
    cfg = model.config
    assert check_bytes_per_token(lambda b, g: cfg.n_layer * 2 * cfg.n_embd * (b / 8 + 4 / g), model)


def test_memory_share_and_prefix_hit_checks_answer_back(char, capsys):
    from kvlib.notebook.exercises import check_memory_shares, check_prefix_hits
    from kvlib.paged import PagedKVCache
    from kvlib.tools.serving_runs import run_continuous
    from kvlib.tools.traces import make_trace
    from kvlib.poems import encode_prompt

    model, tok = char
    poems = ["床前明月光，疑是地上霜。举头望明月，低头思故乡。", "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。"]
    trace = make_trace(tok, poems, 3, max_new_tokens=8)
    right = lambda bs: run_continuous(model, trace, num_blocks=256 // bs, kv_block_size=bs).memory_share  # noqa: E731
    assert check_memory_shares(right, model, trace, sizes=(4, 16), kv_positions=256)
    capsys.readouterr()
    assert check_memory_shares(lambda bs: torch.tensor(right(bs), dtype=torch.float32), model, trace, sizes=(4,),
                               kv_positions=256)                    # float32 rounding is not a wrong answer
    capsys.readouterr()
    assert not check_memory_shares(lambda bs: 100 * right(bs), model, trace, sizes=(4,), kv_positions=256)
    assert "a fraction of 1, not a percentage" in capsys.readouterr().out
    assert not check_memory_shares(lambda bs: right(bs) * (1 - 1e-4), model, trace, sizes=(4,), kv_positions=256)
    out = capsys.readouterr().out  # close but not equal: the expected value to six digits, and what the engine counts
    assert f"{right(4):,.6g}" in out and "Close, but not the engine's count" in out

    prompts = [encode_prompt(tok, "床前明月光，疑是地上霜。" + c) for c in "举低春"]

    def hits(ps, size):
        pool, found = PagedKVCache(model.config, 256, kv_block_size=size), []
        for i, p in enumerate(ps):
            found.append(pool.add_sequence(i, p))
            pool.forward(model, [i], [p[found[-1]:]])
        return found

    assert check_prefix_hits(hits, model, prompts)
    capsys.readouterr()
    assert not check_prefix_hits(lambda ps, size: [0] * len(ps), model, prompts)
    assert "prefill each before adding the next" in capsys.readouterr().out
    assert not check_prefix_hits(lambda ps, size: hits(ps, 4), model, prompts)  # the block size left out
    assert "blocks of 8: expected" in capsys.readouterr().out
    assert not check_prefix_hits(lambda ps, size: sum(hits(ps, size)), model, prompts)
    assert "got int" in capsys.readouterr().out
    assert not check_prefix_hits(lambda ps, size: None, model, prompts)


# ---- what a learner alone tried: other right forms accepted, slips named by their cause -------------------

def test_the_filter_checks_accept_float32_rounding_at_p_1_and_name_the_usual_slips(capsys):
    def plain_top_p(scores, p):  # no special case for p = 1: float32 may round the running total to 1 early
        probs = scores.softmax(-1)
        ranked, order = probs.sort(dim=-1, descending=True, stable=True)
        drop = (ranked.cumsum(-1) - ranked) >= p
        drop[:, 0] = False
        return scores.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))

    assert check_top_p(plain_top_p), capsys.readouterr().out
    capsys.readouterr()

    def exactly_k(scores, k):
        v, i = scores.topk(k, -1)
        return torch.full_like(scores, float("-inf")).scatter(-1, i, v)

    assert not check_top_k(exactly_k)
    assert "Tokens tied with the k-th largest score are kept too" in capsys.readouterr().out
    assert not check_top_k(lambda s, k: s.masked_fill(s < s.topk(k, -1).values[:, -1:], -1e9))
    assert "float('-inf')" in capsys.readouterr().out

    def placeholder(scores, k):
        raise NotImplementedError("exercise 2")

    assert not check_top_k(placeholder)
    assert len(capsys.readouterr().out.splitlines()) == 1


def test_number_checks_read_numpy_and_tensor_answers_and_give_every_matching_hint(capsys):
    np = pytest.importorskip("numpy")
    shape = memory.SHAPES["Llama 3 8B"]
    tokens = shape.weight_bytes() / shape.kv_bytes_per_token()
    assert check_tokens_to_match_weights(np.float64(tokens), np.float64(tokens) <= shape.context)  # a numpy bool
    assert check_token_forwards(lambda P, N: np.array([N * P + N * (N - 1) // 2, P + N - 1]))
    assert check_token_forwards(lambda P, N: torch.tensor([N * P + N * (N - 1) // 2, P + N - 1]))
    capsys.readouterr()
    gpu, weights = 80 * 10**9, memory.SHAPES["Llama 2 7B"].weight_bytes()
    per_token = memory.SHAPES["Llama 2 7B"].kv_bytes_per_token()
    kib_as_1000 = (gpu - weights) // (per_token // 1024 * 1000 * 4096)        # a KiB taken for 1,000 bytes
    assert not check_sequences_that_fit({"Llama 2 7B": kib_as_1000, "Llama 3 8B": 0})
    out = capsys.readouterr().out
    assert "A KiB is 1,024 bytes" in out and "round down" in out  # both slips give 31: both are named


def test_notebook_1_checks_name_an_inclusive_count_a_log_probability_and_a_rising_sort(shipped_char, capsys):
    import math

    model, tok = shipped_char
    text, char, opening = "举头望", "明", True
    rank, p = rank_of(model, tok, text, char, opening=opening)
    assert not check_rank(lambda t, c, o: (rank + 1, p), model, tok, cases=((text, char, opening),))
    assert "strictly more likely" in capsys.readouterr().out
    assert not check_rank(lambda t, c, o: (rank, math.log(p)), model, tok, cases=((text, char, opening),))
    assert "log-probability" in capsys.readouterr().out
    assert not check_followers(lambda t: [([ch], 0.1, 0.1) for ch in "一二三四五"], model, tok, ["明月光"], texts=("明月",))
    assert "must be a str" in capsys.readouterr().out
    rising = lambda probs: int((probs.sort().values.cumsum(0) < 0.5).sum()) + 1  # noqa: E731
    assert not check_half_cover(rising)
    assert "from the largest down" in capsys.readouterr().out


def test_notebook_6_and_8_checks_name_a_lone_tensor_a_count_and_a_guess_charged_twice(shipped_char, bpe_tokenizer,
                                                                                      capsys):
    model, tok = shipped_char
    assert not check_right_padding(lambda prompts, pad: torch.full((len(prompts), 3), pad), lambda m, i, k: None,
                                   model, tok)
    assert "expected a pair of tensors (idx, key_mask)" in capsys.readouterr().out
    poems = ["床前明月光，疑是地上霜。", "白日依山尽，黄河入海流。"]
    counts = Counter("".join(poems)).most_common()

    def as_sets(ps, tokenizer, n):
        top = [c for c, _ in Counter("".join(ps)).most_common(n)]
        return {c for c in top if len(tokenizer.encode(c)) == 1}, {c for c in top if len(tokenizer.encode(c)) > 1}

    assert counts and check_one_token_characters(as_sets, bpe_tokenizer, poems, ns=(5,))
    capsys.readouterr()
    eos_count = lambda rows, eos: float(((rows == eos).sum() - (rows == eos).any(1).sum()) / rows.numel())  # noqa: E731
    assert not check_filler_share(eos_count)
    assert "other tokens after the separator" in capsys.readouterr().out
    charged_twice = lambda a, gc, vc: max(range(1, 9), key=lambda g: expected_tokens_per_round(a, g) / ((g + 1) * gc + vc))  # noqa: E731
    assert not check_best_gamma(charged_twice)
    assert "α = 0.8, a guess 0.5" in capsys.readouterr().out
    draft, p = certain_moon(model, tok)
    assert not check_kept_share(round(2000 * p), model, tok, draft)
    assert "divide it by the 2,000 draws" in capsys.readouterr().out


def test_second_readings_slips_get_their_own_hints(shipped_char, bpe_tokenizer, capsys):
    """An inclusive half, a crossing token dropped, probabilities returned, k - 1 kept, bits, a doubled scale,
    tokens per round for a share, the poem end as a character, the prompt returned too, a generator."""
    from kvlib import GPTConfig
    from kvlib.notebook.exercises import check_bytes_per_token

    model, tok = shipped_char
    assert not check_half_cover(lambda p: int((p.sort(descending=True).values.cumsum(0) <= 0.5).sum()) + 1)
    assert "a total of exactly 0.5 is enough" in capsys.readouterr().out

    def drops_the_crossing_token(scores, p):
        ranked, order = scores.softmax(-1).sort(dim=-1, descending=True, stable=True)
        drop = ranked.cumsum(-1) > p
        drop[:, 0] = False
        return scores.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))

    assert not check_top_p(drops_the_crossing_token)
    assert "brings the total past p is kept too" in capsys.readouterr().out
    assert not check_top_p(lambda scores, p: top_p_filter(scores, p).softmax(-1))
    out = capsys.readouterr().out
    assert "returned probabilities" in out and len(out.splitlines()) == 1
    assert not check_top_k(lambda s, k: s.masked_fill(s <= s.topk(k, -1).values[:, -1:], float("-inf")))
    assert "<, not <=" in capsys.readouterr().out
    cfg = GPTConfig(vocab_size=100)
    numbers = cfg.n_layer * 2 * cfg.n_embd
    assert not check_bytes_per_token(lambda b, g: 8 * numbers * (b / 8 + 4 / g), cfg)
    assert "in bits" in capsys.readouterr().out
    assert not check_bytes_per_token(lambda b, g: numbers * (b / 8 + 8 / g), cfg)
    assert "already holds the keys and the values" in capsys.readouterr().out
    draft, p = certain_moon(model, tok)
    assert not check_kept_share(1 + p, model, tok, draft)
    assert "the tokens a round writes" in capsys.readouterr().out
    poems = ["床前明月光，疑是地上霜。", "白日依山尽，黄河入海流。"]

    def with_poem_ends(ps, tokenizer, n):
        top = [c for c, _ in Counter("\n".join(ps) + "\n").most_common(n)]
        return [c for c in top if len(tokenizer.encode(c)) == 1], [c for c in top if len(tokenizer.encode(c)) > 1]

    assert not check_one_token_characters(with_poem_ends, bpe_tokenizer, poems, ns=(3,))
    out = capsys.readouterr().out
    assert "the end of a poem" in out and len(out.splitlines()) == 1
    whole = lambda m, idx, n: idx[0].tolist() + generate(m, idx, n, temperature=0.0).new_tokens[0].tolist()  # noqa: E731
    assert not check_cached_greedy(whole, model, tok, n_new=3)
    assert "return only the new ones" in capsys.readouterr().out
    assert check_cached_greedy(lambda m, idx, n: (t for t in generate(m, idx, n, temperature=0.0).new_tokens[0].tolist()),
                               model, tok, n_new=3)


def test_a_loop_that_parts_from_generate_only_at_a_near_tie_passes(shipped_char, capsys, monkeypatch):
    """Rounding may flip a near-tie on another machine: the check excuses that, and nothing wider."""
    from kvlib.notebook.exercises import kv_cache

    model, tok = shipped_char

    def runner_up_at_step_2(model, idx, n_new):  # a cached loop that takes the second choice once
        cache, out = KVCache(model.config, 1, model.config.block_size), []
        with torch.inference_mode():
            logits, _ = model(idx, cache=cache)
            for step in range(n_new):
                nxt = logits[:, -1].topk(2).indices[:, 1 if step == 2 else 0].view(1, 1)
                out.append(nxt.item())
                if step + 1 < n_new:
                    logits, _ = model(nxt, cache=cache)
        return out

    assert not check_cached_greedy(runner_up_at_step_2, model, tok, n_new=6)  # at atol 1e-4: a real difference
    assert "differ from step 2" in capsys.readouterr().out
    real = kv_cache.greedy_agreement
    monkeypatch.setattr(kv_cache, "greedy_agreement", lambda *a: real(*a, atol=100.0))  # every parting a near-tie
    assert check_cached_greedy(runner_up_at_step_2, model, tok, n_new=6)
    assert capsys.readouterr().out.count("near-tie") == 3


@pytest.mark.parametrize("notebook, phrase, check, cases", [
    ("06_batching_and_streaming", "six small batches", "check_filler_share", "cases"),
    ("08_speculative_decoding", "six settings of α", "check_best_gamma", "cases"),
    ("08_speculative_decoding", "eight roll-backs, one of them with blocks of 8", "check_blocks_to_free", "cases")])
def test_the_prose_counts_the_cases_each_check_tries(notebook, phrase, check, cases):
    """"The check tries six ...": the number words before an exercise agree with the check's own cases."""
    import inspect
    import json
    from pathlib import Path

    from kvlib.notebook import exercises

    words = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9}
    path = Path(__file__).resolve().parents[2] / "notebooks" / f"{notebook}.ipynb"
    text = "".join("".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"])
    assert f"the check tries {phrase}" in text
    default = inspect.signature(getattr(exercises, check)).parameters[cases].default
    assert words[phrase.split()[0]] == len(default)
    if "blocks of 8" in phrase:
        assert words[phrase.split(", ")[1].split()[0]] == sum(size == 8 for *_, size in default)


def feeds_the_last_token_back(model, idx, n_new):
    """Right tokens, but the last new token is fed back too: P + N token-forwards instead of P + N - 1."""
    cache = KVCache(model.config, idx.shape[0], model.config.block_size)
    out = []
    with torch.inference_mode():
        logits, _ = model(idx, cache=cache)
        for _ in range(n_new):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            out.append(nxt.item())
            logits, _ = model(nxt, cache=cache)
    return out


def test_a_loop_that_feeds_the_last_token_back_is_told_so(shipped_char, capsys):
    model, tok = shipped_char
    assert not check_cached_greedy(feeds_the_last_token_back, model, tok, n_new=6)
    assert "the last new token is never fed back" in capsys.readouterr().out

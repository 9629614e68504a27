"""Cached decoding equals recomputation, and the check catches the classic cache bugs.

Each bug is injected through ``verify_cache(..., decoder=factory)``: ``generate`` calls
``factory(model, batch_size, max_len)`` and then the decoder it returns as
``dec(idx, key_mask=None, position_ids=None) -> (B, V)`` (the last position's logits), so a test can
run the real model over a deliberately broken cache.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kvlib.model
from kvlib.decoding import pad_prompts, position_ids_from_mask
from kvlib.model import KVCache
from kvlib.verify import CacheReport, check_batch_consistency, verify_cache

BUG_STEPS = 16  # enough decode steps to show a bug, few enough that a bug that inflates length still fits
DECODERS = pytest.mark.parametrize("decoder", [None, "model"], ids=["default decoder", "model decoder"])


class ModelDecoder:
    """The model's cached forward over ``cache``, returning the last position's logits."""

    def __init__(self, model, cache: KVCache):
        self.model = model
        self.cache = cache

    def __call__(self, idx, key_mask=None, position_ids=None):
        logits, _ = self.model(idx, cache=self.cache, key_mask=key_mask, position_ids=position_ids)
        return logits[:, -1]


class OffByOneCache(KVCache):
    """Bug (a): ``length`` moves one slot too far, so every chunk is written one position late."""

    def advance(self, n):
        self.length += n + 1


class AdvancedPerLayerCache(KVCache):
    """Bug (b): every layer moves ``length`` on, so one forward advances it n_layer times."""

    def advance(self, n):
        self.length += n * self.k.shape[0]


class WriteAdvancesCache(KVCache):
    """Bug (b), written the way it usually is: ``write`` advances, ``advance`` does nothing."""

    def write(self, layer, k, v):
        keys_values = super().write(layer, k, v)
        self.length += k.shape[2]
        return keys_values

    def advance(self, n):
        pass


class PositionsFromZero(ModelDecoder):
    """Bug (c): each chunk's positions start at 0 instead of at ``cache.length``."""

    def __call__(self, idx, key_mask=None, position_ids=None):
        B, T = idx.shape
        return super().__call__(idx, key_mask, torch.arange(T).expand(B, T))


def over(cache_class, decoder_class=None):
    """A decoder factory: the model's cached forward over a ``cache_class`` cache."""
    decoder_class = decoder_class or ModelDecoder

    def factory(model, batch_size, max_len):
        return decoder_class(model, cache_class(model.config, batch_size, max_len))
    return factory


def top_left_causal_mask(T, S, device=None):
    """Bug (d): what ``is_causal=True`` means when T < S: query i sees keys 0..i, not the newest ones."""
    return torch.ones(T, S, dtype=torch.bool, device=device).tril()


def poem_prompt(tok, text: str = "床前明月光，") -> torch.Tensor:
    return torch.tensor([[tok.eos_id] + tok.encode(text)])


def random_prompt(length: int = 7) -> torch.Tensor:
    return torch.randint(0, 7184, (1, length), generator=torch.Generator().manual_seed(0))


@pytest.fixture(params=["random", "shipped char"])
def model_and_prompt(request):
    if request.param == "random":
        return request.getfixturevalue("random_gpt"), random_prompt()
    model, tok = request.getfixturevalue("shipped_char")
    return model, poem_prompt(tok)


# ---- The cache changes nothing -----------------------------------------------------------------

@DECODERS
def test_64_steps_on_the_shipped_char_model_pass(shipped_char, decoder):
    model, tok = shipped_char
    report = verify_cache(model, poem_prompt(tok), 64, decoder=decoder)
    print(f"\nmax |cached - recomputed| = {report.max_abs_logit_diff:.2e}; per 16 steps: "
          f"{['%.1e' % d for d in report.chunk_maxima]}; min margin {min(report.margins):.3f}")
    print("greedy continuation:", tok.decode(report.tokens).replace("\n", "⏎"))
    assert report.passed
    assert report.max_abs_logit_diff <= 1e-4
    assert report.tokens_equal and report.first_divergence is None
    assert len(report.tokens) == len(report.step_diffs) == len(report.margins) == 64
    assert len(report.chunk_maxima) == 4
    assert report.chunk_maxima == [max(report.step_diffs[i:i + 16]) for i in range(0, 64, 16)]
    assert all(m >= 0 for m in report.margins)


@DECODERS
def test_64_steps_on_a_random_model_pass(random_gpt, decoder):
    report = verify_cache(random_gpt, random_prompt(), 64, decoder=decoder)
    assert report.passed
    assert report.max_abs_logit_diff <= 1e-4
    assert len(report.tokens) == 64 and len(report.chunk_maxima) == 4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16_bit_model_fails_the_float32_tolerance_with_a_hint_that_passes(shipped_char, dtype):
    """Rounding alone takes a 16-bit model past atol 1e-4: the report says so, and its atol passes."""
    import copy

    model, tok = shipped_char
    low = copy.deepcopy(model).to(dtype)
    report = verify_cache(low, poem_prompt(tok), 32)
    assert not report.passed and report.dtype == str(dtype)
    assert report.rounding_step > report.atol and "rounding steps" in report.hint and "float32" in report.hint
    suggested = float(report.hint.rsplit("atol=", 1)[1])
    assert verify_cache(low, poem_prompt(tok), 32, atol=suggested).passed
    assert verify_cache(model, poem_prompt(tok), 32).hint is None  # float32: no excuse offered


def test_a_real_bug_gets_no_rounding_hint(model_and_prompt):
    model, idx = model_and_prompt
    buggy = verify_cache(model, idx, BUG_STEPS, decoder=over(OffByOneCache))
    assert not buggy.passed and buggy.hint is None


def test_a_correct_hand_made_decoder_passes(model_and_prompt):
    """The control for the bug tests below: the same decoder over a plain KVCache is fine."""
    model, idx = model_and_prompt
    report = verify_cache(model, idx, BUG_STEPS, decoder=over(KVCache))
    assert report.passed and report.max_abs_logit_diff <= 1e-4


def test_verify_cache_checks_its_arguments(random_gpt):
    with pytest.raises(ValueError, match=r"\(1, P\)"):
        verify_cache(random_gpt, random_prompt().repeat(2, 1), 4)
    with pytest.raises(ValueError, match="steps"):
        verify_cache(random_gpt, random_prompt(), 0)
    with pytest.raises(ValueError, match="steps"):
        verify_cache(random_gpt, random_prompt(), 128 - 7 + 2)


# ---- Injected bugs are caught ------------------------------------------------------------------

def assert_caught(report):
    print(f"\nmax |cached - recomputed| = {report.max_abs_logit_diff:.3g}, first divergence "
          f"{report.first_divergence}")
    assert not report.passed
    assert report.max_abs_logit_diff > 1e-3


@pytest.mark.parametrize("cache_class", [OffByOneCache, AdvancedPerLayerCache],
                         ids=["off-by-one length", "length advanced per layer"])
def test_a_cache_whose_length_is_wrong_is_caught(model_and_prompt, cache_class):
    model, idx = model_and_prompt
    assert_caught(verify_cache(model, idx, BUG_STEPS, decoder=over(cache_class)))


def test_a_cache_that_advances_inside_each_layer_cannot_pass_silently(random_gpt):
    """Layer 1 then reads twice the keys the mask was built for: a loud error, never a pass."""
    with pytest.raises((RuntimeError, ValueError)):
        verify_cache(random_gpt, random_prompt(), BUG_STEPS, decoder=over(WriteAdvancesCache))


def test_positions_that_restart_at_zero_are_caught(model_and_prompt):
    model, idx = model_and_prompt
    assert_caught(verify_cache(model, idx, BUG_STEPS, decoder=over(KVCache, PositionsFromZero)))


def test_the_top_left_causal_mask_is_caught(model_and_prompt, monkeypatch):
    model, idx = model_and_prompt
    monkeypatch.setattr(kvlib.model, "causal_mask", top_left_causal_mask)
    assert_caught(verify_cache(model, idx, BUG_STEPS, decoder=over(KVCache)))


# ---- Batches ----------------------------------------------------------------------------------

@DECODERS
def test_three_prompts_of_different_lengths_agree_batched_and_single(shipped_char, decoder):
    model, tok = shipped_char
    prompts = [[tok.eos_id] + tok.encode(t) for t in ("春风", "大漠孤烟直", "床前明月光，疑是地上")]
    result = check_batch_consistency(model, prompts, 24, decoder=decoder)
    print(f"\nbatched vs single: max |logit diff| = {result['max_abs_logit_diff']:.2e}")
    assert [r["prompt_length"] for r in result["rows"]] == [3, 6, 11]
    assert all(r["batch_equals_single"] and r["cached_equals_uncached"] for r in result["rows"])
    assert result["consistent"]
    assert result["max_abs_logit_diff"] <= 1e-4


@DECODERS
def test_a_random_model_agrees_batched_and_single(random_gpt, decoder):
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 7184, (n,), generator=g).tolist() for n in (2, 9, 5)]
    result = check_batch_consistency(random_gpt, prompts, 12, decoder=decoder)
    assert result["consistent"]
    assert result["max_abs_logit_diff"] <= 1e-4


def test_arange_positions_give_the_padded_row_a_wrong_distribution(shipped_char):
    """Positions must count real tokens: the padded row's positions start at its first real token."""
    model, tok = shipped_char
    long = [tok.eos_id] + tok.encode("床前明月光，疑是地上霜。")
    short = [tok.eos_id] + tok.encode("春风")
    idx, mask = pad_prompts([long, short])
    B, T = idx.shape
    with torch.no_grad():
        alone = F.log_softmax(model(torch.tensor([short]))[0][0, -1], -1)
        right, _ = model(idx, key_mask=mask, position_ids=position_ids_from_mask(mask))
        wrong, _ = model(idx, key_mask=mask, position_ids=torch.arange(T).expand(B, T))
    right_diff = (F.log_softmax(right[1, -1], -1) - alone).abs().max().item()
    wrong_diff = (F.log_softmax(wrong[1, -1], -1) - alone).abs().max().item()
    print(f"\npadded row vs alone, max |log-prob diff|: mask-derived positions {right_diff:.2e} nats, "
          f"arange positions {wrong_diff:.3f} nats")
    assert right_diff <= 1e-4
    assert wrong_diff > 0.1
    # The unpadded row is the same either way: for it both position schemes coincide.
    torch.testing.assert_close(right[0], wrong[0])


# ---- The margin-gated excuse ------------------------------------------------------------------

def near_tie(model, prompt, step: int, margin: float):
    """A copy of ``model`` whose token b trails the greedy token a of ``step`` by exactly ``margin``.

    Row b of the tied head is row a scaled so that logit_b = logit_a - margin at that step (b is the
    last id, a character the greedy text never uses). Returns (copy, a, b).
    """
    import copy
    report = verify_cache(model, prompt, step + 1, decoder="model")
    a, b = report.tokens[step], model.config.vocab_size - 1
    with torch.no_grad():
        logit_a = model(torch.tensor([prompt[0].tolist() + report.tokens[:step]]))[0][0, -1, a].item()
        tied = copy.deepcopy(model)
        tied.lm_head.weight[b] = tied.lm_head.weight[a] * (1 - margin / logit_a)
    return tied, a, b


def nudging(a: int, b: int, by: float):
    """A correct cached decoder whose logits move a down and b up by ``by`` (a 'bug' below atol)."""
    from kvlib.decoding import CachedDecoder

    class Nudge(CachedDecoder):
        def __call__(self, idx, key_mask=None, position_ids=None):
            logits = super().__call__(idx, key_mask, position_ids).clone()
            logits[:, a] -= by
            logits[:, b] += by
            return logits
    return Nudge


@pytest.mark.parametrize("margin, excused", [(0.0, True), (5e-5, True), (1.2e-4, False)],
                         ids=["exact tie", "margin 5e-5", "margin 1.2e-4"])
def test_a_flipped_token_is_excused_only_where_the_margin_is_below_atol(shipped_char, margin, excused):
    """A change of 0.8e-4 per logit (under the tolerance) flips a near-tie; only margin < 1e-4 excuses it."""
    model, tok = shipped_char
    prompt = poem_prompt(tok)
    tied, a, b = near_tie(model, prompt, 3, margin)
    control = verify_cache(tied, prompt, 24, decoder="model")
    assert control.tokens_equal and control.passed and b not in control.tokens
    assert min(control.margins) == pytest.approx(margin, abs=5e-6)  # the constructed near-tie is the smallest
    report = verify_cache(tied, prompt, 24, decoder=nudging(a, b, 0.8e-4))
    print(f"\nmargin {report.divergence_margin}, max diff {report.max_abs_logit_diff:.2e}, passed {report.passed}")
    assert report.first_divergence == 3 and report.tokens[3] == b
    assert report.divergence_margin == pytest.approx(margin, abs=5e-6)
    assert report.max_abs_logit_diff <= report.atol      # every logit within the tolerance
    assert not report.tokens_equal
    assert report.passed is excused


def test_the_same_nudge_changes_nothing_away_from_a_near_tie(shipped_char):
    model, tok = shipped_char
    report = verify_cache(model, poem_prompt(tok), 24, decoder=nudging(1, model.config.vocab_size - 1, 0.8e-4))
    assert report.tokens_equal and report.passed


def make_report(diff: float, divergence: int | None, margin: float | None) -> CacheReport:
    return CacheReport(steps=4, max_abs_logit_diff=diff, step_diffs=[diff] * 4, chunk_maxima=[diff],
                       margins=[0.5, 0.5, 0.5, 0.5] if margin is None else [0.5, margin, 0.5, 0.5],
                       tokens_equal=divergence is None, first_divergence=divergence,
                       divergence_margin=margin, tokens=[1, 2, 3, 4])


@pytest.mark.parametrize("diff, divergence, margin, passed", [
    (1e-5, None, None, True),      # agree
    (1e-5, 1, 5e-5, True),         # a flip at a near-tie: excused
    (1e-5, 1, 0.3, False),         # a flip where the margin is large: a bug, whatever the logits say
    (2e-4, None, None, False),     # same tokens, logits beyond the tolerance
    (2e-4, 1, 5e-5, False),        # excused flip, but logits beyond the tolerance
], ids=["agree", "near-tie flip", "large-margin flip", "logits off", "near-tie flip, logits off"])
def test_passed_combines_the_tolerance_and_the_excuse(diff, divergence, margin, passed):
    assert make_report(diff, divergence, margin).passed is passed


# ---- Batch consistency: the excuse, uncached batches, a caught bug ----------------------------

def mask_ignoring(model, batch_size, max_len):
    """Bug: the teaching decoder that drops the key mask and positions (pads visible, columns as positions)."""
    from kvlib.decoding import CachedDecoder
    decoder = CachedDecoder(model, batch_size, max_len)
    return lambda idx, key_mask=None, position_ids=None: decoder(idx)


def test_batch_consistency_reports_margins_and_every_comparison(shipped_char):
    model, tok = shipped_char
    prompts = [[tok.eos_id] + tok.encode(t) for t in ("春风", "床前明月光，")]
    result = check_batch_consistency(model, prompts, 12, decoder="model")
    assert result["consistent"] and result["tokens_equal"] and result["atol"] == 1e-4
    for row in result["rows"]:
        assert set(row["comparisons"]) == {"batch vs single (cached)", "batch vs single (uncached)",
                                           "cached vs uncached (single)"}
        assert row["batch_uncached_equals_single"] and row["batch_equals_single"] and row["cached_equals_uncached"]
        assert len(row["margins"]) == 12 and row["min_margin"] == min(row["margins"]) > 0
    assert result["min_margin"] == min(r["min_margin"] for r in result["rows"])


def test_batch_consistency_catches_a_decoder_that_ignores_the_key_mask(shipped_char):
    model, tok = shipped_char
    prompts = [[tok.eos_id] + tok.encode(t) for t in ("春风", "床前明月光，疑是地上")]
    result = check_batch_consistency(model, prompts, 12, decoder=mask_ignoring)
    short = result["rows"][0]["comparisons"]["batch vs single (cached)"]
    print(f"\npadded row: first divergence {short['first_divergence']}, margin {short['divergence_margin']}, "
          f"max diff {short['max_abs_logit_diff']:.2f}")
    assert not result["consistent"]
    assert result["max_abs_logit_diff"] > 1e-2
    assert not short["equal"] and not short["excused"]
    # The unpadded row and the uncached loops (no decoder) are unaffected.
    assert result["rows"][1]["batch_equals_single"]
    assert all(r["batch_uncached_equals_single"] and r["cached_equals_uncached"] for r in result["rows"])


def batch_only_nudge(a: int, b: int, by: float):
    """The teaching decoder, nudging a down and b up only when it decodes a batch (B > 1)."""
    from kvlib.decoding import CachedDecoder

    class BatchNudge(CachedDecoder):
        def __call__(self, idx, key_mask=None, position_ids=None):
            logits = super().__call__(idx, key_mask, position_ids)
            if idx.shape[0] > 1:
                logits = logits.clone()
                logits[:, a] -= by
                logits[:, b] += by
            return logits
    return BatchNudge


@pytest.mark.parametrize("margin, consistent", [(5e-5, True), (1.2e-4, False)], ids=["margin 5e-5", "margin 1.2e-4"])
def test_batch_consistency_excuses_a_flip_only_below_the_single_prompt_margin(shipped_char, margin, consistent):
    model, tok = shipped_char
    prompt = poem_prompt(tok)
    tied, a, b = near_tie(model, prompt, 3, margin)
    prompts = [prompt[0].tolist(), [tok.eos_id] + tok.encode("春风")]
    result = check_batch_consistency(tied, prompts, 8, decoder=batch_only_nudge(a, b, 0.8e-4))
    c = result["rows"][0]["comparisons"]["batch vs single (cached)"]
    assert c["first_divergence"] == 3 and c["divergence_margin"] == pytest.approx(margin, abs=5e-6)
    assert result["max_abs_logit_diff"] <= 1e-4 and not result["tokens_equal"]
    assert c["excused"] is consistent and result["consistent"] is consistent


def test_greedy_agreement_excuses_a_parting_only_at_a_near_tie(shipped_char):
    from kvlib.decoding import generate
    from kvlib.verify import greedy_agreement

    model, tok = shipped_char
    prompt = poem_prompt(tok)[0].tolist()
    a = generate(model, torch.tensor([prompt]), 8, temperature=0.0).new_tokens[0].tolist()
    with torch.inference_mode():
        top2 = model(torch.tensor([prompt + a[:3]]))[0][0, -1].topk(2)
    margin, runner_up = float(top2.values[0] - top2.values[1]), int(top2.indices[1])
    b = a[:3] + [runner_up] + a[4:]                   # parts at step 3, for the model's second choice
    assert greedy_agreement(model, prompt, a, a) == "same"
    assert greedy_agreement(model, torch.tensor(prompt), torch.tensor(a), a[:5]) == "differ"  # one stopped early
    assert greedy_agreement(model, prompt, a, b, atol=margin * 1.01 + 1e-9) == "near-tie"
    assert greedy_agreement(model, prompt, a, b, atol=margin / 2) == "differ"
    with pytest.raises(ValueError, match=r"b\[0\]"):
        greedy_agreement(model, prompt, a, [10**9])


@pytest.mark.parametrize("atol", [float("nan"), float("inf"), 0.0, -1.0, "1e-4", True])
def test_a_tolerance_that_cannot_judge_is_refused(model_and_prompt, atol):
    from kvlib.verify import greedy_agreement

    model, idx = model_and_prompt
    for call in (lambda: verify_cache(model, idx, 2, atol=atol), lambda: greedy_agreement(model, [1], [2], [3], atol),
                 lambda: check_batch_consistency(model, [[1, 2], [3]], 2, atol=atol)):
        with pytest.raises((TypeError, ValueError), match="atol must be a finite number > 0"):
            call()


def test_a_float64_model_is_not_told_to_use_a_coarser_float32_copy(model_and_prompt):
    import copy

    model, idx = model_and_prompt
    report = verify_cache(copy.deepcopy(model).double(), idx, 4, atol=1e-17)
    assert report.hint is None


def test_spacing_reads_finite_values_only():
    from kvlib.verify import spacing

    assert spacing(torch.tensor([float("-inf"), 3.0])) == torch.finfo(torch.float32).eps * 2
    assert spacing(torch.tensor([float("inf")])) == 0.0 and spacing(torch.zeros(0)) == 0.0


def test_one_near_tie_rule_for_every_proof():
    """A parting at a gap of exactly atol is no near-tie, in verify_cache, batches, greedy_agreement and verify_paged alike."""
    import re
    from pathlib import Path

    from kvlib.verify import is_near_tie

    assert is_near_tie(0.99e-4, 1e-4) and is_near_tie(-0.5e-4, 1e-4) and not is_near_tie(1e-4, 1e-4)
    kvlib_dir = Path(__file__).resolve().parents[1] / "kvlib"
    own = re.compile(r"(margin|gap|logits\[|static\[)[^\n]*<=?\s*(self\.|v\[['\"])?atol")
    found = [f"{p.name}:{n}" for p in kvlib_dir.rglob("*.py") for n, line in enumerate(p.read_text().splitlines(), 1)
             if own.search(line) and line.strip() != "return abs(gap) < atol"]  # the rule itself
    assert not found, f"a near-tie decided outside verify.is_near_tie: {found}"

"""Tests for kvlib.sampling: the filters, the two fences, argument checks, and the RNG contract."""
import math

import pytest
import torch

from kvlib.sampling import apply_temperature, probabilities, sample_next, top_k_filter, top_p_filter

FENCE_PROBS = torch.tensor([0.5, 0.3, 0.1, 0.06, 0.04])


def fence_logits() -> torch.Tensor:
    return FENCE_PROBS.log()[None, :]                                      # (1, 5)


def kept(probs: torch.Tensor) -> set[int]:
    """Token ids with nonzero probability in a single-row distribution (1, V)."""
    return set((probs[0] > 0).nonzero().flatten().tolist())


# --- Fence 1: the nucleus ----------------------------------------------------------------------

@pytest.mark.parametrize("p, expected", [(0.45, {0}), (0.85, {0, 1, 2}), (1.0, {0, 1, 2, 3, 4})])
def test_fence1_nucleus(p, expected):
    probs = probabilities(fence_logits(), top_p=p)
    assert kept(probs) == expected
    assert probs.sum().item() == pytest.approx(1.0, abs=1e-6)
    kept_ids = sorted(expected)
    renormalised = FENCE_PROBS[kept_ids] / FENCE_PROBS[kept_ids].sum()
    torch.testing.assert_close(probs[0, kept_ids], renormalised)


@pytest.mark.parametrize("p, expected", [(0.45, {0}), (0.85, {0, 1, 2}), (1.0, {0, 1, 2, 3, 4})])
@pytest.mark.parametrize("seed", range(5))
def test_fence1_nucleus_after_shuffling_vocabulary(p, expected, seed):
    perm = torch.randperm(5, generator=torch.Generator().manual_seed(seed))  # new slot i holds old perm[i]
    probs = probabilities(fence_logits()[:, perm], top_p=p)
    assert {int(perm[i]) for i in kept(probs)} == expected
    assert probs.sum().item() == pytest.approx(1.0, abs=1e-6)


def test_top_p_filter_marks_dropped_with_minus_inf():
    out = top_p_filter(fence_logits(), 0.85)
    assert torch.isneginf(out[0, 3:]).all()
    torch.testing.assert_close(out[0, :3], fence_logits()[0, :3])


def test_top_p_keeps_top_token_even_when_it_alone_exceeds_p():
    logits = torch.tensor([[5.0, 0.0, 0.0]])
    assert kept(probabilities(logits, top_p=1e-6)) == {0}


def test_top_p_ties_go_to_lower_token_id():
    logits = torch.zeros(1, 4)                                             # four equal tokens
    assert kept(probabilities(logits, top_p=0.5)) == {0, 1}


# --- Fence 2: temperature limits ---------------------------------------------------------------

def test_fence2_low_temperature_is_near_one_hot():
    assert probabilities(fence_logits(), temperature=1e-3).max().item() > 0.999


def test_fence2_high_temperature_is_near_uniform():
    probs = probabilities(fence_logits(), temperature=1e3)
    assert (probs.max() - probs.min()).item() < 1e-2


def test_fence2_temperature_zero_is_argmax_and_the_low_temperature_limit():
    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(0))
    greedy = probabilities(logits, temperature=0)
    near_zero = probabilities(logits, temperature=1e-3)
    torch.testing.assert_close(greedy, torch.nn.functional.one_hot(logits.argmax(-1), 50).float())
    torch.testing.assert_close(near_zero, greedy, atol=1e-3, rtol=0)
    assert torch.equal(sample_next(logits, temperature=0), logits.argmax(-1, keepdim=True))


def test_tiny_temperature_does_not_overflow():
    logits = torch.tensor([[3.0, 1.0, -2.0]])
    probs = probabilities(logits, temperature=1e-40)
    assert torch.isfinite(probs).all()
    assert kept(probs) == {0}


def test_apply_temperature_matches_division_up_to_a_constant():
    logits = torch.randn(3, 10, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(apply_temperature(logits, 0.7).softmax(-1), (logits / 0.7).softmax(-1))


# --- top-k ---------------------------------------------------------------------------------------

def test_top_k_keeps_ties_with_the_kth_value():
    logits = torch.tensor([[4.0, 2.0, 2.0, 2.0, 1.0]])
    out = top_k_filter(logits, 2)
    assert torch.isfinite(out).tolist() == [[True, True, True, True, False]]


def test_top_k_larger_than_vocabulary_is_clamped():
    logits = torch.randn(2, 5)
    assert torch.equal(top_k_filter(logits, 100), logits)


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([[0.1, 3.0, -1.0, 2.0, 0.5]])
    assert kept(probabilities(logits, top_k=2)) == {1, 3}


def test_top_k_then_top_p_order():
    # Top-k 3 renormalises to 5/9, 3/9, 1/9, so top-p 0.85 is reached after two tokens;
    # top-p alone on (0.5, 0.3, 0.1, ...) needs three.
    assert kept(probabilities(fence_logits(), top_k=3, top_p=0.85)) == {0, 1}
    assert kept(probabilities(fence_logits(), top_p=0.85)) == {0, 1, 2}


# --- greedy equivalences -------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(10))
def test_top_k_one_and_temperature_zero_are_argmax(seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, 30, generator=gen)
    argmax = logits.argmax(-1, keepdim=True)
    assert torch.equal(sample_next(logits, temperature=0), argmax)
    assert torch.equal(sample_next(logits, temperature=1.0, top_k=1, generator=gen), argmax)


# --- argument checks -----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    {"top_p": 0}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_p": -0.1}, {"top_p": math.nan},
    {"top_k": 0}, {"top_k": -3},
    {"temperature": -0.5}, {"temperature": math.nan}, {"temperature": math.inf},
])
def test_bad_arguments_raise_value_error(kwargs):
    with pytest.raises(ValueError):
        sample_next(fence_logits(), **kwargs)


@pytest.mark.parametrize("kwargs", [{"top_k": 2.5}, {"top_k": True}, {"temperature": "hot"}, {"top_p": "0.9"}])
def test_wrong_argument_types_raise_type_error(kwargs):
    with pytest.raises(TypeError):
        sample_next(fence_logits(), **kwargs)


def test_filters_are_still_checked_at_temperature_zero():
    with pytest.raises(ValueError, match="top_p"):
        sample_next(fence_logits(), temperature=0, top_p=0)
    with pytest.raises(ValueError, match="top_k"):
        sample_next(fence_logits(), temperature=0, top_k=0)


def test_error_messages_name_the_value():
    with pytest.raises(ValueError, match="-0.5"):
        apply_temperature(fence_logits(), -0.5)
    with pytest.raises(ValueError, match="1.5"):
        top_p_filter(fence_logits(), 1.5)
    with pytest.raises(ValueError, match="got 0"):
        top_k_filter(fence_logits(), 0)


@pytest.mark.parametrize("row", [
    [0.0, math.nan, 1.0],
    [0.0, math.inf, 1.0],
    [-math.inf, -math.inf, -math.inf],
])
def test_non_finite_logits_raise(row):
    logits = torch.tensor([[0.0, 1.0, 2.0], row])
    with pytest.raises(ValueError, match="row 1"):
        sample_next(logits)


def test_minus_inf_entries_are_banned_tokens():
    logits = torch.tensor([[0.0, -math.inf, 0.0]])
    gen = torch.Generator().manual_seed(0)
    draws = torch.cat([sample_next(logits, generator=gen) for _ in range(50)])
    assert 1 not in draws.tolist()


def test_one_dimensional_logits_are_rejected_with_the_expected_shape():
    with pytest.raises(ValueError, match=r"\(B, V\)"):
        sample_next(FENCE_PROBS.log())


def test_integer_logits_are_rejected():
    with pytest.raises(TypeError, match="floating"):
        sample_next(torch.tensor([[1, 2, 3]]))


# --- randomness and output contract -------------------------------------------------------------

def test_same_seed_repeats_and_different_seeds_differ():
    logits = torch.zeros(64, 20)                                           # 64 draws, flat distribution

    def draw(seed):
        return sample_next(logits, top_k=10, top_p=0.9, generator=torch.Generator().manual_seed(seed))

    assert torch.equal(draw(0), draw(0))
    assert not torch.equal(draw(0), draw(1))


def test_global_rng_untouched_when_a_generator_is_given():
    before = torch.get_rng_state()
    sample_next(torch.randn(3, 40, generator=torch.Generator().manual_seed(0)),
                temperature=0.9, top_k=20, top_p=0.9, generator=torch.Generator().manual_seed(7))
    assert torch.equal(torch.get_rng_state(), before)


def test_output_shape_and_dtype():
    logits = torch.randn(3, 17)
    for kwargs in [{}, {"temperature": 0}, {"top_k": 5}, {"top_p": 0.5}, {"temperature": 0.5, "top_k": 3, "top_p": 0.9}]:
        out = sample_next(logits, generator=torch.Generator().manual_seed(0), **kwargs)
        assert out.shape == (3, 1)
        assert out.dtype == torch.int64


def test_inputs_are_not_modified():
    logits = torch.randn(2, 9)
    copy = logits.clone()
    top_k_filter(logits, 3)
    top_p_filter(logits, 0.5)
    apply_temperature(logits, 0.3)
    sample_next(logits, temperature=0.8, top_k=4, top_p=0.7)
    assert torch.equal(logits, copy)


def test_probabilities_rows_sum_to_one():
    logits = torch.randn(5, 33, generator=torch.Generator().manual_seed(3))
    probs = probabilities(logits, temperature=1.3, top_k=12, top_p=0.8)
    torch.testing.assert_close(probs.sum(-1), torch.ones(5))
    assert probs.dtype == torch.float32


# --- temperature at the edges of float64: the limits, never NaN, banned tokens stay banned ---------

EDGE_LOGITS = torch.tensor([[0.0, 1.0, 2.0, 3.0, -math.inf], [5.0, -math.inf, 5.0, 4.0, 1.0]])


@pytest.mark.parametrize("t", [1e-300, 5e-324, 1e-40, 1e-31])
def test_a_tiny_temperature_gives_the_argmax_one_hot(t):
    probs = probabilities(EDGE_LOGITS, t)
    assert not probs.isnan().any()
    assert probs[0].tolist() == [0.0, 0.0, 0.0, 1.0, 0.0]
    assert probs[1].tolist() == [0.5, 0.0, 0.5, 0.0, 0.0]  # a tie at the top shares the mass
    g = torch.Generator().manual_seed(0)
    assert sample_next(EDGE_LOGITS, t, generator=g)[0].item() == 3


@pytest.mark.parametrize("t", [1e31, 1e39, 1e300, 1.7e308])
def test_a_huge_temperature_gives_the_uniform_distribution_over_the_allowed_tokens(t):
    probs = probabilities(EDGE_LOGITS, t)
    assert not probs.isnan().any()
    torch.testing.assert_close(probs, torch.tensor([[0.25, 0.25, 0.25, 0.25, 0.0], [0.25, 0.0, 0.25, 0.25, 0.25]]))
    assert apply_temperature(EDGE_LOGITS, t)[:, [4, 1]].diag().tolist() == [-math.inf, -math.inf]  # still banned
    g = torch.Generator().manual_seed(0)
    draws = sample_next(EDGE_LOGITS.repeat(1000, 1), t, generator=g).flatten()  # rows 0, 1, 0, 1, ...
    assert 4 not in draws[::2].tolist() and 1 not in draws[1::2].tolist()


@pytest.mark.parametrize("t", [1e39, 1e300])
def test_top_k_and_top_p_still_filter_at_a_huge_temperature(t):
    assert kept(probabilities(EDGE_LOGITS[:1], t, top_k=2)) == {2, 3}
    assert kept(probabilities(EDGE_LOGITS[:1], t, top_p=0.5)) == {0, 1}  # uniform: ties go to the lower ids


def test_the_edges_agree_with_the_limits_of_ordinary_temperatures():
    torch.testing.assert_close(probabilities(EDGE_LOGITS, 1e-300), probabilities(EDGE_LOGITS, 1e-3), atol=1e-6, rtol=0)
    torch.testing.assert_close(probabilities(EDGE_LOGITS, 1e300), probabilities(EDGE_LOGITS, 1e6), atol=1e-5, rtol=0)


def test_first_maximum_is_argmax_ties_nan_and_banned_tokens_included():
    from kvlib.sampling import first_maximum

    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float16, torch.float32, torch.float64, torch.bfloat16):
        x = torch.randn(9, 6289, generator=g).to(dtype)
        x[1, 5] = x[1, 7] = x[1].max() + 1          # a tie: the first of the two
        x[2] = float("-inf")
        x[2, 3] = 0.0                                # everything banned but one
        x[3, 11] = float("nan")                      # NaN counts as the maximum, as in torch.argmax
        got = first_maximum(x)
        assert got.dtype == torch.int64 and got.shape == (9,)
        assert torch.equal(got, x.argmax(-1)), dtype
        assert got[1] == 5 and got[2] == 3 and got[3] == 11
    assert torch.equal(first_maximum(torch.tensor([[1.0, 3.0, 3.0]])), torch.tensor([1]))
    t = torch.tensor([[0.0, 2.0]], requires_grad=True)
    assert first_maximum(t).tolist() == [1]          # a tensor that needs grad is read, not changed

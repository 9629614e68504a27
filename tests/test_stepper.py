"""The step-through cache widget's logic: tokens, cache contents and attention weights are the model's."""
from __future__ import annotations

import math

import pytest
import torch

from kvlib.decoding import generate
from kvlib import ContextLimitError
from kvlib.sampling import probabilities, sample_next
from kvlib.stepper import CacheStepper, token_label
from kvlib.poems import no_unk

@pytest.fixture(scope="module")
def tok(tiny_char_tokenizer):
    return tiny_char_tokenizer


def full_attention(model, tokens):
    """Per layer, the last token's attention weights and output, from one uncached forward (hooks)."""
    qkv, outputs = {}, {}
    blocks = model.transformer.h
    handles = []
    for i, b in enumerate(blocks):
        handles.append(b.attn.c_attn.register_forward_hook(lambda m, a, out, i=i: qkv.__setitem__(i, out)))
        handles.append(b.attn.c_proj.register_forward_hook(lambda m, a, out, i=i: outputs.__setitem__(i, a[0])))
    with torch.no_grad():
        model(torch.tensor([tokens]))
    for h in handles:
        h.remove()
    H, D = model.config.n_head, model.config.head_size
    C = H * D
    weights = []
    for i in range(len(blocks)):
        q, k, _ = qkv[i][0].split(C, dim=-1)                        # (T, C) each
        q = q.view(-1, H, D).transpose(0, 1)                         # (H, T, D)
        k = k.view(-1, H, D).transpose(0, 1)
        scores = q @ k.transpose(1, 2) / math.sqrt(D)                # (H, T, T)
        T = scores.shape[-1]
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        weights.append(scores.softmax(-1)[:, -1])                    # (H, T): the last query's row
    return torch.stack(weights), [outputs[i][0, -1] for i in range(len(blocks))]


def test_prefill_writes_the_prompt_in_every_layer(tiny_gpt, tok):
    s = CacheStepper(tiny_gpt, tok, "床前明月光", temperature=0.0)
    assert s.tokens == [tok.eos_id, *tok.encode("床前明月光")]
    view = s.view()
    assert view.cache_length == s.cache.length == 6 and view.step == 0 and view.chosen is None
    assert view.filled.shape == (tiny_gpt.config.n_layer, tiny_gpt.config.block_size)
    assert view.filled[:, :6].all() and not view.filled[:, 6:].any()
    assert view.attention.shape == (tiny_gpt.config.n_layer, tiny_gpt.config.n_head, 6)
    assert view.query_position == 5


@pytest.mark.parametrize("temperature, top_k, top_p", [(0.0, None, None), (0.8, None, None), (1.2, 5, 0.9)])
def test_steps_give_the_tokens_generate_gives(tiny_gpt, tok, temperature, top_k, top_p):
    s = CacheStepper(tiny_gpt, tok, "白日", temperature=temperature, top_k=top_k, top_p=top_p, seed=7)
    chosen = s.run(9)
    idx = torch.tensor([s.prompt_ids])
    ref = generate(tiny_gpt, idx, 9, temperature=temperature, top_k=top_k, top_p=top_p,
                   generator=torch.Generator().manual_seed(7), decoder="model", logits_hook=no_unk(tok))
    assert chosen == ref.new_tokens[0].tolist()
    assert s.tokens == ref.tokens[0].tolist()
    assert s.text() == tok.decode(ref.tokens[0, 1:])


def test_attention_is_the_models_attention(tiny_gpt, tok):
    s = CacheStepper(tiny_gpt, tok, "春风", temperature=0.9, seed=3)
    for n in range(6):
        expected, outputs = full_attention(tiny_gpt, s.tokens)
        view = s.view()
        torch.testing.assert_close(view.attention, expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(view.attention.sum(-1), torch.ones(view.attention.shape[:2]))
        # Weights times the cached values give what the attention layer passed to its projection.
        S = s.cache.length
        for layer, out in enumerate(outputs):
            y = view.attention[layer][:, None, :] @ s.cache.v[layer, 0, :, :S]  # (H, 1, D)
            torch.testing.assert_close(y.reshape(-1), out, atol=1e-5, rtol=0)
        assert view.query_position == S - 1 == len(s.tokens) - 1
        s.step()


def test_bars_show_the_distribution_the_token_came_from(tiny_gpt, tok):
    s = CacheStepper(tiny_gpt, tok, "春", temperature=1.0, top=10, seed=0)
    upcoming = probabilities(s.logits, 1.0)[0]
    before = s.view()
    assert before.top_probs == pytest.approx(upcoming.topk(10).values.tolist())
    chosen = s.step()
    view = s.view()
    assert view.chosen == chosen and view.chosen_label == tok.decode([chosen])
    assert view.top_probs[:10] == pytest.approx(before.top_probs)
    assert view.top_probs[:10] == sorted(view.top_probs[:10], reverse=True)
    assert view.chosen_label in view.top_labels  # appended after the ten when drawn from the tail
    assert len(view.top_labels) == (10 if chosen in upcoming.topk(10).indices.tolist() else 11)


def test_greedy_bars_are_one_bar_at_100_percent_for_the_argmax(tiny_gpt, tok):
    """At temperature 0 the bars are what the sampler draws from: the argmax, certain (as in notebook 2)."""
    s = CacheStepper(tiny_gpt, tok, "月", temperature=0.0)
    upcoming = s.view()
    assert upcoming.top_probs == [1.0] and upcoming.top_labels == [tok.decode([int(s.logits.argmax())])]
    drawn_from = probabilities(s.logits, 0.0)[0]  # the core's one function for "what the sampler draws from"
    s.step()
    view = s.view()
    assert view.top_probs == [1.0] and view.chosen == int(drawn_from.argmax()) == int(s.tokens[-1])
    assert view.top_labels == [view.chosen_label] and view.settings == (0.0, None, None)


@pytest.mark.parametrize("temperature, top_k, top_p", [(0.0, None, None), (0.7, None, None), (1.3, 4, None),
                                                       (1.0, None, 0.6)])
def test_bars_are_probabilities_of_the_sampler_settings(tiny_gpt, tok, temperature, top_k, top_p):
    s = CacheStepper(tiny_gpt, tok, "春", temperature=temperature, top_k=top_k, top_p=top_p, top=64)
    want = probabilities(s.logits, temperature, top_k, top_p)[0]
    view = s.view()
    kept = want[want > 0].sort(descending=True).values.tolist()
    assert view.top_probs == pytest.approx(kept)  # every token the sampler may draw, none it may not
    assert 0.0 not in view.top_probs


def test_new_settings_keep_the_steps_and_apply_from_the_next_step(tiny_gpt, tok):
    s = CacheStepper(tiny_gpt, tok, "白日", temperature=0.8, seed=5)
    s.run(8)
    tokens, text, length, last = list(s.tokens), s.text(), s.cache.length, s.view()
    s.set_sampling(temperature=1.4)
    assert (s.tokens, s.text(), s.cache.length, s.steps) == (tokens, text, length, 8)  # nothing wiped
    assert s.view().top_probs == last.top_probs and s.view().settings == (0.8, None, None)  # the last draw's bars
    g = torch.Generator()
    g.set_state(s.generator.get_state())
    expected, before = int(sample_next(s.logits, 1.4, None, None, g)), s.logits.clone()
    assert s.step() == expected and s.view().settings == (1.4, None, None)
    assert s.view().top_probs[:5] == pytest.approx(probabilities(before, 1.4)[0].topk(5).values.tolist())
    s.set_sampling(top_k=2)
    assert s.settings == (1.4, 2, None) and s.steps == 9
    s.set_sampling(temperature=0.0, top_k=None)
    assert s.settings == (0.0, None, None)
    with pytest.raises(ValueError, match="temperature"):
        s.set_sampling(temperature=-1.0)
    assert s.settings == (0.0, None, None) and s.steps == 9  # a refused setting changes nothing


def test_new_settings_before_the_first_step_redraw_the_upcoming_bars(tiny_gpt, tok):
    s = CacheStepper(tiny_gpt, tok, "白日", temperature=1.0)
    s.set_sampling(temperature=0.0)
    assert s.view().top_probs == [1.0] and s.view().settings == (0.0, None, None)
    reference = CacheStepper(tiny_gpt, tok, "白日", temperature=0.0)
    assert s.run(4) == reference.run(4)


def test_reset_after_new_settings_starts_again_with_them(tiny_gpt, tok):
    s = CacheStepper(tiny_gpt, tok, "春风", temperature=1.0, seed=2)
    s.run(3)
    s.set_sampling(temperature=0.5)
    s.reset()
    assert s.steps == 0 and s.run(5) == CacheStepper(tiny_gpt, tok, "春风", temperature=0.5, seed=2).run(5)


def test_full_cache_stops_stepping(tiny_gpt, tok):
    s = CacheStepper(tiny_gpt, tok, "白日依山尽", temperature=0.0, max_len=9)
    assert len(s.run(50)) == 3 and not s.can_step
    assert s.view().filled.all()
    with pytest.raises(ContextLimitError, match="full"):
        s.step()
    with pytest.raises(ContextLimitError):
        CacheStepper(tiny_gpt, tok, "白日依山尽黄河入海流", max_len=8)


def test_reset_repeats_and_global_rng_is_untouched(tiny_gpt, tok):
    state = torch.get_rng_state()
    s = CacheStepper(tiny_gpt, tok, "", temperature=1.0, seed=11)
    first = s.run(8)
    s.reset()
    assert s.steps == 0 and s.cache.length == 1
    assert s.run(8) == first
    assert torch.equal(torch.get_rng_state(), state)


def test_settings_are_checked(tiny_gpt, tok):
    with pytest.raises(ValueError):
        CacheStepper(tiny_gpt, tok, "春", temperature=-1)
    with pytest.raises(ValueError, match="not in the vocabulary"):
        CacheStepper(tiny_gpt, tok, "猫")


def test_token_label_shows_partial_utf8_as_hex(bpe_tokenizer):
    ids = bpe_tokenizer.encode("床")
    labels = [token_label(bpe_tokenizer, i) for i in ids]
    assert "".join(bpe_tokenizer.token_bytes(i).hex(" ") + " " for i in ids).split() == " ".join(labels).split()
    assert token_label(bpe_tokenizer, bpe_tokenizer.eos_id) == "\n"  # the stepper's pictures draw it as ⏎




def test_two_steppers_in_two_threads_see_their_own_attention(tiny_gpt, tok):
    """The query hooks live on the shared model: steppers of one model take turns and keep their own maps."""
    import threading

    alone = {}
    for prompt in ("春风", "白日依山"):
        s = CacheStepper(tiny_gpt, tok, prompt, temperature=0.0)
        s.run(6)
        alone[prompt] = s.view().attention
    together, errors = {}, []

    def run(prompt):
        try:
            s = CacheStepper(tiny_gpt, tok, prompt, temperature=0.0)
            for _ in range(6):
                s.step()
            together[prompt] = s.view().attention
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    for _ in range(3):
        threads = [threading.Thread(target=run, args=(p,)) for p in alone]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        for prompt in alone:
            assert torch.allclose(together[prompt], alone[prompt], atol=1e-6)


def test_an_interrupted_step_leaves_text_cache_and_generator_as_they_were(tiny_gpt, tok, monkeypatch):
    s = CacheStepper(tiny_gpt, tok, "春风", temperature=1.0, seed=3)
    s.run(2)
    text, length, tokens = s.text(), s.cache.length, list(s.tokens)
    real = CacheStepper._feed_locked

    def interrupted(self, ids):
        raise KeyboardInterrupt

    monkeypatch.setattr(CacheStepper, "_feed_locked", interrupted)
    with pytest.raises(KeyboardInterrupt):
        s.step()
    assert (s.text(), s.cache.length, s.tokens, s.steps) == (text, length, tokens, 2)
    monkeypatch.setattr(CacheStepper, "_feed_locked", real)
    again = CacheStepper(tiny_gpt, tok, "春风", temperature=1.0, seed=3)
    again.run(3)
    assert s.step() == again.tokens[-1]  # the generator was rewound: the same draw as without the interruption


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(top=-1), "top"), (dict(top=0), "top"), (dict(seed="abc"), "seed"), (dict(max_len=0), "max_len"),
    (dict(temperature="hot"), "temperature"),
])
def test_stepper_arguments_are_checked(tiny_gpt, tok, kwargs, fragment):
    with pytest.raises((TypeError, ValueError), match=fragment):
        CacheStepper(tiny_gpt, tok, "春", **kwargs)


def test_running_far_past_a_full_cache_stops_at_once(tiny_gpt, tok):
    s = CacheStepper(tiny_gpt, tok, "春风", max_len=8)
    room = s.cache.max_len - s.cache.length
    assert len(s.run(10**12)) == room and not s.can_step  # returned at once, not after 10**12 turns of nothing


def test_a_model_converted_after_the_stepper_was_made_is_named(tiny_gpt, tok):
    import copy

    model = copy.deepcopy(tiny_gpt)
    s = CacheStepper(model, tok, "春风")
    model.double()
    with pytest.raises(TypeError, match="the cache holds torch.float32.*model computes in torch.float64"):
        s.step()

"""Hostile inputs, third round, by class: silent conversions, names that lie, masks that are not masks, errors
that misname the mistake, sizes that would reach the allocator, a device that does not exist, two threads on
one paged cache. Each case asserts the exception class, that the message is one line naming the parameter (one
name, matched as a whole word and case-sensitively), and that nothing changed; never the wording, so a message can
be reworded freely."""
from __future__ import annotations

import shutil
import threading

import pytest
import torch

from kvlib import KVCache, compress, generate_uncached, load_pretrained, verify_cache
from kvlib.decoding import position_ids_from_mask
from kvlib.paged import PagedKVCache
from kvlib.poems import encode_prompt
from kvlib.tools import integrity
from kvlib.tools.integrity import DamagedFileError

from .test_hostile_newer import names


def refused(call, exc, param: str) -> str:
    with pytest.raises(exc) as info:
        call()
    message = str(info.value)
    assert names(message, param), f"the message does not name {param!r}: {message}"
    assert "\n" not in message.strip(), "one line"
    return message


# ---- silent conversions ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("convert", [lambda m: compress.grouped(m, 2), lambda m: compress.latent(m, 8)],
                         ids=["grouped", "latent"])
def test_a_converted_model_keeps_the_dtype_it_was_given(tiny_gpt, dtype, convert):
    import copy

    model = copy.deepcopy(tiny_gpt).to(dtype)  # a copy: the session's tiny model stays float32, bit for bit
    out = convert(model)
    assert out.lm_head.weight.dtype == dtype and all(p.dtype == dtype for p in out.parameters())


# ---- a name that loads another architecture -------------------------------------------------------------------

@pytest.mark.parametrize("name, impostor, field", [("tang-char-mqa", "tang-char-gqa2", "n_kv_head"),
                                                   ("tang-char", "tang-char-mla", "kv_latent"),
                                                   ("tang-char-draft", "tang-char", "n_layer")])
def test_a_shipped_name_holding_another_models_checkpoint_is_damaged(tmp_path, name, impostor, field):
    for f in (f"{impostor}.pt", "tang-char.tokenizer.json"):
        shutil.copyfile(integrity.DATA_DIR / f, tmp_path / f)
    (tmp_path / f"{impostor}.pt").rename(tmp_path / f"{name}.pt")
    integrity.record(tmp_path / f"{name}.pt", tmp_path / "tang-char.tokenizer.json", data_dir=tmp_path)
    before = sorted((p.name, p.read_bytes()) for p in tmp_path.iterdir())
    refused(lambda: load_pretrained(name, data_dir=tmp_path), DamagedFileError, field)
    assert sorted((p.name, p.read_bytes()) for p in tmp_path.iterdir()) == before


# ---- masks that are not masks -----------------------------------------------------------------------------------

@pytest.mark.parametrize("mask, exc", [(torch.tensor([[0.5, 0.5, 1.0]]), ValueError),
                                       (torch.ones(1, 2, 3, dtype=torch.bool), ValueError),
                                       (torch.tensor([[2, 1, 1]]), ValueError), ([[1, 1]], TypeError)])
def test_a_mask_is_true_false_in_two_dimensions(mask, exc):
    refused(lambda: position_ids_from_mask(mask), exc, "key_mask")


# ---- errors that name the mistake --------------------------------------------------------------------------------

@pytest.mark.parametrize("ids", [torch.ones(1, 20, dtype=torch.int32), torch.ones(1, 20)])
def test_verify_cache_names_a_wrong_dtype(shipped_char, ids):
    model, _ = shipped_char
    message = refused(lambda: verify_cache(model, ids, 4), TypeError, "idx")
    assert str(ids.dtype).removeprefix("torch.") in message


def test_a_negative_id_is_named_with_what_is_allowed(tiny_gpt):
    refused(lambda: generate_uncached(tiny_gpt, torch.tensor([[1, -3]]), 2, block_size=16), ValueError, "idx")


@pytest.mark.parametrize("tokenizer", [None, "tok", 3])
def test_a_prompt_needs_a_tokenizer(tokenizer):
    refused(lambda: encode_prompt(tokenizer, "春"), TypeError, "tokenizer")


# ---- sizes that would reach the allocator ----------------------------------------------------------------------------

@pytest.mark.parametrize("n", [10**12, 2**40])
def test_a_run_too_long_to_hold_is_refused_before_any_allocation(tiny_gpt, n):
    refused(lambda: generate_uncached(tiny_gpt, torch.tensor([[1, 2]]), n, block_size=16), ValueError,
            "max_new_tokens")


# ---- a device that does not exist ---------------------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: 'cuda' exists here")
@pytest.mark.parametrize("device", ["cuda", "cuda:3"])
def test_a_cache_on_a_device_this_build_lacks_is_refused(tiny_gpt, device):
    refused(lambda: KVCache(tiny_gpt.config, 1, device=device), ValueError, "device")


# ---- concurrency that would corrupt silently ---------------------------------------------------------------------------

def test_two_threads_on_one_paged_cache_are_refused(tiny_gpt):
    cache = PagedKVCache.for_model(tiny_gpt, 16, 4)
    cache.add_sequence("a", [1, 2, 3])
    cache.add_sequence("b", [4, 5])
    inside, release, errors = threading.Event(), threading.Event(), []
    original = cache.batch

    def slow(*args, **kwargs):
        inside.set()
        release.wait(5)
        return original(*args, **kwargs)

    cache.batch = slow
    first = threading.Thread(target=lambda: cache.forward(tiny_gpt, ["a"], [[1, 2, 3]]))
    first.start()
    assert inside.wait(5)
    tables = {sid: list(cache.table(sid).token_ids) for sid in ("a", "b")}
    try:
        refused(lambda: cache.forward(tiny_gpt, ["b"], [[4, 5]]), RuntimeError, "PagedKVCache.forward")
        assert {sid: list(cache.table(sid).token_ids) for sid in ("a", "b")} == tables
    finally:
        release.set()
        first.join(10)
    del cache.batch
    cache.forward(tiny_gpt, ["b"], [[4, 5]])  # one at a time works again


# ---- widgets and figures given nothing to show -------------------------------------------------------------------------

def test_a_memory_figure_of_no_shapes_is_refused():
    from kvlib.notebook.plots import plot_cache_memory

    refused(lambda: plot_cache_memory(shapes=[]), ValueError, "shapes")


# ---- the wrong object where a decoder or a hook is expected -------------------------------------------------------

def test_a_decoder_factory_that_returns_nothing_is_named(tiny_gpt):
    from kvlib import generate

    refused(lambda: generate(tiny_gpt, torch.tensor([[1, 2]]), 2, decoder=lambda m, b, n: None), TypeError, "decoder")


def test_a_hook_that_widens_the_logits_is_named_not_idx(tiny_gpt):
    wider = lambda step, tokens, logits: torch.cat([logits, logits[:, :1]], dim=1)  # noqa: E731
    message = refused(lambda: generate_uncached(tiny_gpt, torch.tensor([[1, 2]]), 2, block_size=16,
                                                logits_hook=wider), ValueError, "logits_hook")
    assert "idx" not in message


# ---- sizes that make no sense -------------------------------------------------------------------------------------

@pytest.mark.parametrize("lr", [1e300, 11.0])
def test_a_learning_rate_that_only_overflows_is_refused(lr):
    from kvlib.tools.training import TrainConfig

    refused(lambda: TrainConfig(lr=lr), ValueError, "lr")


@pytest.mark.parametrize("rate", [1e-300, 1e9])
def test_a_trace_rate_outside_any_class_is_refused(tiny_char_tokenizer, rate):
    from kvlib.tools.traces import make_trace

    refused(lambda: make_trace(tiny_char_tokenizer, ["春眠不觉晓，处处闻啼鸟。"] * 4, 2, rate=rate), ValueError, "rate")


# ---- a tool given a model it does not measure ---------------------------------------------------------------------

def test_the_shrink_table_says_which_model_it_measures(shipped_bpe):
    from kvlib.tools.shrink_bench import shrink_table

    model, tok = shipped_bpe
    message = refused(lambda: shrink_table(model, tok, n_texts=2, length=16), ValueError, "model")
    assert "tang-char" in message and "logits" not in message


# ---- widgets that show every refusal in place ------------------------------------------------------------------------

def test_the_explorer_shows_a_lone_surrogate_refused_by_name(shipped_char):
    from kvlib.notebook.sampling_explorer import SliderExplorer

    model, tok = shipped_char
    explorer = SliderExplorer(model, tok, "春风")
    explorer.prompt.value = "\ud800"
    assert explorer.update() is None and explorer.view is None
    assert names(explorer.poem.value, "prompt") and not explorer.chart.value


def test_the_speculative_view_shows_a_prompt_too_long_in_place(shipped_char):
    from kvlib import load_pretrained
    from kvlib.drafts import NeuralDraft
    from kvlib.notebook.speculative_view import SpeculativeView

    model, tok = shipped_char
    view = SpeculativeView(model, tok, {"neural": NeuralDraft(load_pretrained("tang-char-draft")[0])}, prompt="春" * 200)
    assert names(view.html(), "prompt") and "None" not in view.html()

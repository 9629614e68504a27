"""KV-cache memory arithmetic against published model sizes, our own cache, and a growing cache."""
from __future__ import annotations


import pytest
import torch

from kvlib.memory import (SHAPES, cat_bytes_copied, describe, format_table, gpt2_params, shape_of, table_rows)
from kvlib.model import GPT, GPTConfig, GrowingKVCache, KVCache

PUBLISHED_PARAMS = {  # totals reported for the released checkpoints
    "GPT-2 small": 124_439_808, "GPT-2 medium": 354_823_168, "GPT-2 large": 774_030_080,
    "GPT-2 XL": 1_557_611_200, "Llama 2 7B": 6_738_415_616, "Llama 3.2 1B": 1_235_814_400,
    "Llama 3 8B": 8_030_261_248, "Qwen2.5 7B": 7_615_616_512, "Llama 3 70B": 70_553_706_496,
}


def test_parameter_counts_match_the_published_totals():
    assert {name: s.n_params for name, s in SHAPES.items()} == PUBLISHED_PARAMS


@pytest.mark.parametrize("config", [GPTConfig(50257, 1024, 12, 12, 768), GPTConfig(7497), GPTConfig(512)])
def test_gpt2_formula_counts_our_own_model(config):
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        model = GPT(config)
    assert gpt2_params(config.n_layer, config.n_embd, config.vocab_size, config.block_size) == model.num_params()


def test_gpt2_small_cache_overtakes_its_weights_at_batch_7():
    s = SHAPES["GPT-2 small"]
    assert s.weight_bytes("bfloat16") == 248_879_616  # 249 MB
    assert s.kv_bytes_per_token("bfloat16") == 2 * 12 * 12 * 64 * 2 == 36_864
    assert s.kv_cache_bytes(1024, 6) == 226_492_416 < s.weight_bytes() < s.kv_cache_bytes(1024, 7) == 264_241_152
    assert s.crossover_batch(1024, "bfloat16") == 7
    assert s.crossover_batch(1024, "float32") == 7  # both sides scale with the dtype


@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float8"])
def test_crossover_is_the_first_batch_past_the_weights(shape, dtype):
    b = shape.crossover_batch(None, dtype)
    assert shape.kv_cache_bytes(None, b, dtype) > shape.weight_bytes(dtype)
    assert b == 1 or shape.kv_cache_bytes(None, b - 1, dtype) <= shape.weight_bytes(dtype)


def test_grouped_query_attention_shrinks_the_cache_by_the_group_size():
    mha, gqa = SHAPES["Llama 2 7B"], SHAPES["Llama 3 8B"]
    assert (mha.n_layer, mha.n_head, mha.head_dim) == (gqa.n_layer, gqa.n_head, gqa.head_dim)
    assert mha.kv_bytes_per_token() == 4 * gqa.kv_bytes_per_token() == 4 * 131_072
    assert (mha.attention, gqa.attention, SHAPES["Qwen2.5 7B"].attention) == ("MHA", "GQA 4:1", "GQA 7:1")


def test_our_model_agrees_with_kvcache():
    cfg = GPTConfig(vocab_size=7497)
    ours = shape_of("tang-char", cfg)
    assert ours.kv_bytes_per_token("float32") == KVCache(cfg, 1, 128).bytes_per_token == 4096
    assert ours.kv_cache_bytes(128, 1, "float32") == KVCache(cfg, 1, 128).nbytes == 524_288
    assert ours.kv_cache_bytes(64, 3, "float32") == KVCache(cfg, 3, 64).nbytes


@pytest.mark.parametrize("n_kv_head, attention", [(0, "MHA"), (2, "GQA 2:1"), (1, "MQA")])
def test_grouped_configs_count_their_own_heads_and_parameters(n_kv_head, attention):
    from kvlib.model import GPT

    cfg = GPTConfig(vocab_size=300, block_size=32, n_layer=2, n_head=4, n_embd=32, n_kv_head=n_kv_head)
    shape = shape_of("ours", cfg)
    assert shape.attention == attention and shape.n_kv_head == cfg.kv_heads
    assert shape.kv_bytes_per_token("float32") == KVCache(cfg, 1).bytes_per_token
    assert shape.n_params == sum(p.numel() for p in GPT(cfg).parameters())


def test_a_latent_config_is_refused_with_what_its_cache_holds():
    with pytest.raises(ValueError, match="latent of 8 numbers.*2 x 8 numbers per token"):
        shape_of("mla", GPTConfig(vocab_size=300, n_layer=2, kv_latent=8))


def test_the_table_lists_exactly_the_shapes_given():
    assert table_rows([]) == [] and len(table_rows()) == len(table_rows(SHAPES)) == len(SHAPES)
    assert [r["model"] for r in table_rows([SHAPES["Llama 3 8B"]])] == ["Llama 3 8B"]
    with pytest.raises(TypeError, match="ModelShapes.*got int at 0"):
        table_rows([1])


def test_bad_arguments_are_refused():
    s = SHAPES["GPT-2 small"]
    with pytest.raises(ValueError, match="dtype"):
        s.kv_bytes_per_token("int3")
    for bad in (0, -1, 2.5, True):
        with pytest.raises((ValueError, TypeError)):
            s.kv_cache_bytes(bad)
        with pytest.raises((ValueError, TypeError)):
            s.kv_cache_bytes(16, bad)


def test_table_and_description():
    rows = table_rows()
    assert [r["model"] for r in rows] == list(SHAPES)
    small = rows[0]
    assert small["cache > weights at batch"] == 7 and small["KiB per token"] == 36
    text = format_table(rows)
    assert "GPT-2 small" in text and "248.9 MB" in text
    assert "overtakes them from batch 7" in describe(SHAPES["GPT-2 small"], 7, 1024)


def test_growing_cache_gives_the_same_logits_and_copies_quadratically(tiny_gpt):
    cfg = tiny_gpt.config
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(cfg.vocab_size, (2, 12), generator=g)
    static, growing = KVCache(cfg, 2), GrowingKVCache(cfg, 2)
    with torch.no_grad():
        for t in range(12):
            a, _ = tiny_gpt(idx[:, t:t + 1], cache=static)
            b, _ = tiny_gpt(idx[:, t:t + 1], cache=growing)
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    per_token = 2 * 2 * cfg.n_embd * 4  # k and v, 2 rows, fp32; one layer
    assert growing.length == 12 and growing.nbytes == cfg.n_layer * 12 * per_token
    assert growing.bytes_copied == cfg.n_layer * cat_bytes_copied(per_token, 12)
    assert cat_bytes_copied(36_864, 1024) == 36_864 * 1024 * 1025 // 2


def test_growing_cache_drives_generate(tiny_gpt):
    from kvlib.decoding import CachedDecoder, generate

    def growing_decoder(model, batch_size, max_len):
        decoder = CachedDecoder(model, batch_size, max_len)
        decoder.cache = GrowingKVCache(model.config, batch_size, max_len)
        return decoder

    idx = torch.tensor([[1, 2, 3]])
    grown = generate(tiny_gpt, idx, 10, temperature=0.0, decoder=growing_decoder)
    plain = generate(tiny_gpt, idx, 10, temperature=0.0, decoder="model")
    assert torch.equal(grown.tokens, plain.tokens)
    growing = GrowingKVCache(tiny_gpt.config)
    growing.advance(3)
    growing.reset()
    assert growing.length == 0 and growing.bytes_copied == 0 and growing.nbytes == 0




def test_a_gpt2_shape_whose_heads_do_not_split_the_channels_is_refused():
    from kvlib.memory import gpt2_shape

    with pytest.raises(ValueError, match=r"n_embd \(770\) must be divisible by n_head \(12\)"):
        gpt2_shape("x", 12, 770, 12)


def test_a_teaching_cache_past_2_31_numbers_is_refused_before_allocating():
    with pytest.raises(ValueError, match=r"batch_size must be an int in \[1, \d+\] \(a cache of at most 2\*\*31"):
        KVCache(GPTConfig(vocab_size=10), 200_000)

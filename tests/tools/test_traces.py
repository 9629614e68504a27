"""Request traces from the corpus: seeded, fitting the model's block, a class sharing one couplet."""
import pytest

from kvlib.poems import encode_prompt
from kvlib.tools.traces import class_trace, make_trace

POEMS = ["床前明月光，疑是地上霜。举头望明月，低头思故乡。",
         "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。",
         "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。",
         "千山鸟飞绝，万径人踪灭。孤舟蓑笠翁，独钓寒江雪。",
         "红豆生南国，春来发几枝。愿君多采撷，此物最相思。"]


@pytest.fixture(scope="module")
def trace(shipped_char):
    _, tok = shipped_char
    return make_trace(tok, POEMS, 8, rate=200.0, seed=3, max_new_tokens=20)


def test_the_trace_is_seeded_and_fits_the_block(shipped_char, trace):
    _, tok = shipped_char
    again = make_trace(tok, POEMS, 8, rate=200.0, seed=3, max_new_tokens=20)
    assert [(r.prompt, r.max_new_tokens, r.arrival) for r in again] == [(r.prompt, r.max_new_tokens, r.arrival)
                                                                         for r in trace]
    assert all(r.prompt[0] == tok.eos_id and 5 <= len(r.prompt) <= 25 for r in trace)
    assert all(1 <= r.max_new_tokens <= 20 and len(r.prompt) + r.max_new_tokens <= 128 for r in trace)
    arrivals = [r.arrival for r in trace]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0
    with pytest.raises(ValueError, match="rate"):
        make_trace(tok, POEMS, 2, rate=0)
    with pytest.raises(ValueError, match="prompt_chars"):
        make_trace(tok, POEMS, 2, prompt_chars=(9, 4))
    with pytest.raises(ValueError, match="block holds 128"):
        make_trace(tok, POEMS, 2, prompt_chars=(4, 40), max_new_tokens=96)
    with pytest.raises(ValueError, match="max_new_tokens"):
        make_trace(tok, POEMS, 2, max_new_tokens=0)


def test_a_class_shares_the_couplet_and_differs_after_it(shipped_char):
    _, tok = shipped_char
    poems = POEMS[:4]  # the 13th characters: 举, 欲, 夜, 孤
    reqs = class_trace(tok, poems * 2, n_requests=3, answer_tokens=5, gap=0.5)
    prefix = encode_prompt(tok, "床前明月光，疑是地上霜。")
    assert all(r.prompt[:-1] == prefix for r in reqs) and len({r.prompt[-1] for r in reqs}) == 3
    assert [r.arrival for r in reqs] == [0.0, 0.5, 1.0] and all(r.max_new_tokens == 5 for r in reqs)

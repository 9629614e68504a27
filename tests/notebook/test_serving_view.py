"""Notebook 7's block-pool view: the picture follows the engine, the Step button steps it."""
from kvlib.notebook.serving_view import STATE_COLORS, ServingView, block_states, pool_html
from kvlib.serving import Request
from kvlib.poems import encode_prompt


def requests(tok):
    prefix = "床前明月光，疑是地上霜。"
    shared = [Request(i, encode_prompt(tok, prefix + c), 8, arrival=2 * i) for i, c in enumerate("举低")]
    other = [Request(2 + i, encode_prompt(tok, s), n, arrival=1 + i)
             for i, (s, n) in enumerate([("白日依山尽，", 40), ("春眠不觉晓，处处闻啼鸟。", 40), ("千山", 50)])]
    return shared + other


def test_the_default_picture_is_the_engine_before_any_step(char):
    model, tok = char
    view = ServingView(model, requests(tok), num_blocks=16, kv_block_size=8)
    assert view.record is None and "before the first step" in view.board.value
    assert all(state == "free" for state, _ in block_states(view.engine, None))
    assert view.picture().data == view.board.value


def test_step_button_steps_the_engine_and_colours_the_blocks(char):
    model, tok = char
    view = ServingView(model, requests(tok), num_blocks=16, kv_block_size=8, max_num_seqs=4)
    view.step_button.click()
    assert view.record.kind == "prefill" and view.record.admitted == [0]
    states = [s for s, _ in block_states(view.engine, view.record)]
    assert states.count("admitted") == 2  # 14 tokens + room for one more: two blocks of 8
    seen = set()
    while not view.step_button.disabled:
        view.step_button.click()
        seen |= {s for s, _ in block_states(view.engine, view.record)}
    assert {"decoding", "shared prefix", "finished", "preempted", "cached, free"} <= seen
    assert len(view.engine.finished) == 5 and "finished 5" in view.board.value
    view.reset_button.click()
    assert view.record is None and not view.engine.finished


def test_the_picture_has_a_legend_counters_and_the_queue(char):
    model, tok = char
    view = ServingView(model, requests(tok), num_blocks=16, kv_block_size=8, start_steps=3)
    text = pool_html(view.engine, view.record)
    assert all(state in text for state in STATE_COLORS)
    assert "reserved positions" in text and "waiting:" in text and "step 3" in text


def test_a_failed_step_shows_a_message_and_clears_the_pool(char, monkeypatch):
    from kvlib.serving import Engine

    model, tok = char
    view = ServingView(model, requests(tok), num_blocks=16, kv_block_size=8)

    def broken(self):
        raise RuntimeError("the pool ran dry")

    monkeypatch.setattr(Engine, "step", broken)
    view.step_button.click()
    assert "the pool ran dry" in view.board.value and "<svg" not in view.board.value and view.step_button.disabled
    view.step_button.click()  # reaches Python although disabled: nothing happens
    monkeypatch.undo()
    view.reset_button.click()
    assert "before the first step" in view.board.value and not view.step_button.disabled


def test_the_view_fits_any_width(char):
    import pytest

    from .widget_checks import assert_fits

    model, tok = char
    view = ServingView(model, requests(tok), num_blocks=16, kv_block_size=8, max_num_seqs=4)
    assert_fits(view)
    while not view.step_button.disabled:
        view.step_button.click()
        assert_fits(view)
    with pytest.raises(ValueError, match="start_steps"):
        ServingView(model, requests(tok), start_steps=-1)


def test_a_huge_number_of_start_steps_stops_when_the_work_is_done(char):
    model, tok = char
    view = ServingView(model, requests(tok)[:2], num_blocks=16, kv_block_size=8, start_steps=10**12)
    assert not view.engine.has_work and len(view.engine.finished) == 2

"""claim(): a sentence of the prose, checked against the run that shows its evidence."""
import pytest

from kvlib.notebook.claims import ClaimError, claim


def test_a_true_claim_prints_with_its_evidence(capsys):
    claim(3 > 2, "three is more than two", "3 vs 2")
    assert capsys.readouterr().out == "✓ three is more than two  (3 vs 2)\n"


def test_a_false_claim_fails_quoting_the_sentence():
    with pytest.raises(ClaimError, match="the notebook says “the lead grows”, but this run disagrees: 2.0x then 1.4x"):
        claim(False, "the lead grows", "2.0x then 1.4x")
    assert issubclass(ClaimError, AssertionError)


def test_a_claim_needs_its_sentence():
    with pytest.raises(TypeError, match="sentence"):
        claim(True, "")


def test_a_measurement_is_reported_either_way_and_never_raises(capsys):
    from kvlib.notebook.claims import measured

    measured(True, "two threads were faster", "1.2 ms against 1.9 ms")
    measured(False, "two threads were faster", "2.4 ms against 1.9 ms")
    assert capsys.readouterr().out.splitlines() == [
        "measured here: two threads were faster  (1.2 ms against 1.9 ms)",
        "measured here, not so this time: two threads were faster  (2.4 ms against 1.9 ms)"]
    with pytest.raises(TypeError, match="sentence"):
        measured(True, "")


def test_what_seeded_draws_showed_is_reported_either_way(capsys):
    from kvlib.notebook.claims import seen

    seen(True, "the poems begin alike", "中新岳 and 中新岳")
    seen(False, "the poems begin alike", "中新岳 and 万万春")
    assert capsys.readouterr().out.splitlines() == [
        "seen in this run: the poems begin alike  (中新岳 and 中新岳)",
        "not so in this run: the poems begin alike  (中新岳 and 万万春)"]
    with pytest.raises(TypeError, match="sentence"):
        seen(True, "")

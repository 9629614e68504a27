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


@pytest.mark.parametrize("name, yes, no", [("measured", "measured here: ", "measured here, not so this time: "),
                                           ("seen", "seen in this run: ", "not so in this run: ")])
def test_a_run_dependent_line_is_reported_either_way_and_never_raises(capsys, name, yes, no):
    """measured() for timings, seen() for a few seeded draws: both print what this run showed."""
    import kvlib.notebook.claims as claims

    report = getattr(claims, name)
    report(True, "two threads were faster", "1.2 ms against 1.9 ms")
    report(False, "two threads were faster", "2.4 ms against 1.9 ms")
    assert capsys.readouterr().out.splitlines() == [yes + "two threads were faster  (1.2 ms against 1.9 ms)",
                                                    no + "two threads were faster  (2.4 ms against 1.9 ms)"]
    with pytest.raises(TypeError, match="sentence"):
        report(True, "")


def test_a_measurement_within_noise_says_so_instead_of_either_answer(capsys):
    from kvlib.notebook.claims import measured

    measured(True, "two threads were faster", "1.2-1.9 ms against 1.5-2.0 ms", within_noise=True)
    assert capsys.readouterr().out == ("measured here, within noise this time: two threads were faster  "
                                       "(1.2-1.9 ms against 1.5-2.0 ms)\n")

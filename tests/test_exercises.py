"""The learner-written fixes: the verdict format and its hint tiers. (That every bug notebook has an exercise, its
check and a solution whose check asserts a PASS, and that the learner's copy runs with the stubs, is in
tests/test_edition.py; nbval re-executes every solution in CI.)"""
import math

import pytest

from fla_lab import exercises
from fla_lab.exercises import NotRevealed, Sealed, Verdict, seal


def test_verdict_prints_pass_or_not_yet_with_rounded_facts_and_no_hint_text():
    ok = exercises.verdict_from_errors("reference row", {"o": 1.234e-7}, tol=2e-5)
    tiers = exercises.hints(where="the pointer of gn", what="one row too late", line="gi + (i_start - 1) * HK")
    bad = exercises.verdict_from_errors("reference row", {"o": math.nan, "dq": 3e-3}, tol=2e-5, hint=tiers)
    assert ok and str(ok) == "PASS  reference row\n  - o: error 1.2e-07 <= 2.0e-05"
    assert not bad
    assert str(bad).splitlines() == [
        "NOT YET  reference row", "  - o: error nan > 2.0e-05", "  - dq: error 3.0e-03 > 2.0e-05",
        "  stuck? verdict.hint() prints a hint (3 in tiers: where to look, what is wrong, the line)"]
    assert "one row" not in str(bad)  # a printed verdict never gives the hint, let alone the line, away


def test_hint_prints_the_next_tier_on_each_call(capsys):
    bad = exercises.verdict("x", [(False, "o: wrong")], hint=exercises.hints("where", "what", "line"))
    for _ in range(4):
        bad.hint()
    assert capsys.readouterr().out.splitlines() == [
        "hint 1 of 3 (where to look): where", "hint 2 of 3 (what is wrong): what", "hint 3 of 3 (the line): line",
        "hint 3 of 3 (the line): line", "(that was the last hint)"]


def test_hint_tiers_that_are_missing_are_left_out(capsys):
    one = exercises.verdict("x", [(False, "o: wrong")], hint="decorate it")
    assert one.hints == ("decorate it",) and one.tier_names() == ("what is wrong",)
    one.hint()
    passed = exercises.verdict("x", [(True, "o: right")], hint=exercises.hints("where", "", "line"))
    passed.hint()
    assert capsys.readouterr().out.splitlines() == ["hint 1 of 1 (what is wrong): decorate it", "PASS: no hint needed"]


def test_extra_claims_decide_too():
    assert not exercises.verdict_from_errors("x", {"o": 0.0}, tol=1e-6, extra=[(False, "state finite: False")])


def test_a_plain_function_is_not_taken_for_a_triton_helper():
    import fla_lab  # noqa: F401  (the interpreter is on before anything is decorated)
    import triton

    @triton.jit
    def helper(x):
        return x

    def plain(x):
        return x

    assert exercises.not_a_jit_helper("x", helper) is None
    assert str(exercises.not_a_jit_helper("x", plain)).splitlines()[:2] == [
        "NOT YET  x", "  - plain is not a @triton.jit function"]



# ---------------------------------------------------------------------------------------- the shipped answers
# Each check run on the helper the package ships (PASS) and on the historical buggy helper beside it (NOT YET).
# 03b's check_padded_exponent is run both ways in test_lesson_gsa_padding.py, 06's hunts in
# test_lesson_hunting.py; the other lesson tests use their own copies of the helpers, not the shipped ones.


def _shipped(exercise):
    from fla_lab.layers.rwkv7 import log_decay_from_lora
    from fla_lab.lessons import amp, masks, overflow
    from fla_lab.ops.common import chunk as common_chunk
    from fla_lab.ops.common import fused_recurrent

    return {  # exercise: (check, shipped fix, historical bug)
        "03a reference row": (overflow.check_reference_row, common_chunk.reference_row,
                              common_chunk.reference_row_inclusive),
        "04 h0 mask": (masks.check_h0_mask, fused_recurrent.h0_mask, fused_recurrent.h0_mask_transposed),
        "05 log decay": (amp.check_log_decay, lambda w_raw: log_decay_from_lora(w_raw, None),
                         lambda w_raw: log_decay_from_lora(w_raw, "bf16_decay")),
    }[exercise]


@pytest.mark.parametrize("exercise", ["03a reference row", "04 h0 mask", "05 log decay"])
def test_check_passes_the_shipped_fix_and_not_the_historical_bug(exercise):
    check, fix, bug = _shipped(exercise)
    fixed, buggy = check(fix), check(bug)
    assert fixed.passed and str(fixed).startswith("PASS"), str(fixed)
    assert not buggy.passed and str(buggy).startswith("NOT YET"), str(buggy)


def test_reveal_waits_for_a_pass_or_the_last_hint(capsys):
    stub = Verdict("x", False, ["f"], ("where", "what", "the line"))
    with pytest.raises(NotRevealed, match="verdict.hint\\(\\) 3 more"):
        stub.reveal()
    stub.hint(), stub.hint()
    with pytest.raises(NotRevealed, match="1 more"):
        stub.reveal()
    stub.hint()
    stub.reveal()  # the line was printed: the fix may follow
    Verdict("x", True, ["f"]).reveal()
    with pytest.raises(NotRevealed):  # no hints to use up: only a PASS opens it
        Verdict("x", False, ["f"]).reveal()


def test_a_sealed_line_is_the_line_but_shows_nothing_in_the_source_or_repr():
    line = "return gi + (i_start - 1) * HK + o_k"
    sealed = Sealed(seal(line))
    assert sealed == line and str(sealed) == line and line not in repr(sealed)
    assert line not in seal(line) and "HK" not in seal(line)
    assert "hints" not in repr(Verdict("x", False, ["f"], ("a", "b", line))) and line not in repr(
        Verdict("x", False, ["f"], ("a", "b", line)))


def test_the_fix_in_words_displays_once_the_gate_opens(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj.data))
    with pytest.raises(NotRevealed):
        Verdict("x", False, ["f"], ("a",)).reveal(explain=seal("the **line**"))
    assert shown == []
    Verdict("x", True, []).reveal(explain=seal("the **line**"))
    assert shown == ["the **line**"]

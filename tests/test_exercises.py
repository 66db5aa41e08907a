"""The learner-written fixes: the verdict format and its hint tiers. (That every bug notebook has an exercise, its
check and a solution whose check asserts a PASS, and that the learner's copy runs with the stubs, is in
tests/test_edition.py; nbval re-executes every solution in CI.)"""
import math

from fla_lab import exercises


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


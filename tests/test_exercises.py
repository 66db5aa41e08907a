"""The learner-written fixes: the verdict format and its hint tiers. (That every bug notebook has an exercise, its
check and a solution whose check asserts a PASS, and that the learner's copy runs with the stubs, is in
tests/test_edition.py; nbval re-executes every solution in CI.)"""
import math

import pytest

from fla_lab.teaching import exercises
from fla_lab.teaching.exercises import NotRevealed, Sealed, Verdict, seal


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
    from fla_lab.teaching.lessons import amp, masks, overflow
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


LINE = "return gi + (i_start - 1) * HK + o_k"


@pytest.fixture
def record(monkeypatch):
    """This kernel's record of opened exercises, empty for the test (other tests' PASSes are in the real one)."""
    opened = set()
    monkeypatch.setattr(exercises, "_OPENED", opened)
    return opened


def test_reveal_waits_for_a_pass_or_the_last_hint(capsys, record):
    stub = Verdict("x", False, ["f"], ("where", "what", Sealed(seal("the line"))))
    with pytest.raises(NotRevealed, match="verdict.hint\\(\\) 3 more"):
        stub.reveal()
    stub.hint(), stub.hint()
    with pytest.raises(NotRevealed, match="1 more"):
        stub.reveal()
    assert not exercises.is_open("x")
    stub.hint()
    assert exercises.is_open("x")  # the line was printed: a recorded reveal
    stub.reveal()  # the fix may follow
    Verdict("y", True, ["f"]).reveal()
    with pytest.raises(NotRevealed):  # no hints to use up: only a PASS opens it
        Verdict("z", False, ["f"]).reveal()


def test_hints_that_stop_short_of_the_line_reveal_nothing(capsys, record):
    """A tier that is not the sealed line (e.g. "decorate the helper with @triton.jit"), printed, opens nothing: else
    a plain function submitted on purpose would be a way to the fix without an attempt."""
    for tiers in (("decorate the helper with @triton.jit",), ("where", "what")):
        stub = Verdict("x", False, ["f"], tiers)
        for _ in tiers:
            stub.hint()
        assert not stub.revealed() and not exercises.is_open("x")
        with pytest.raises(NotRevealed) as raised:
            stub.reveal()
        assert "verdict.hint()" not in str(raised.value)


def test_a_pass_is_recorded_for_the_kernel(record):
    assert not exercises.is_open("x")
    Verdict("x", False, ["f"], ("a",))
    assert not exercises.is_open("x")
    exercises.verdict("x", [(True, "o: right")])
    assert exercises.is_open("x") and not exercises.is_open("y")


def test_a_sealed_line_is_the_line_but_shows_nothing_in_the_source_or_repr():
    sealed = Sealed(seal(LINE))
    assert sealed == LINE and sealed.opened() == LINE and type(sealed.opened()) is str and LINE not in repr(sealed)
    assert LINE not in seal(LINE) and "HK" not in seal(LINE)
    assert "hints" not in repr(Verdict("x", False, ["f"], ("a", "b", LINE))) and LINE not in repr(
        Verdict("x", False, ["f"], ("a", "b", LINE)))


def _displays(x) -> dict[str, str]:
    """Every way a notebook shows a value: print, str, format and f-strings, %-formatting, repr, IPython's display
    (pretty printer), `x?` and `x??` (the inspector's "String form"), help(x)."""
    import contextlib
    import io
    import pydoc

    from IPython.core.interactiveshell import InteractiveShell
    from IPython.lib.pretty import pretty

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print(x)
    helped = io.StringIO()
    pydoc.Helper(output=helped).help(x)
    shell = InteractiveShell.instance()
    shell.user_ns["x"] = x
    return {"print": printed.getvalue(), "str": str(x), "f-string": f"{x}", "format spec": f"{x:>80}",
            "str.format": "{} {!s}".format(x, x), "%s": "%s" % x, "%r": "%r" % x, "repr": repr(x),
            "in a list": str([x]), "IPython display": pretty(x), "IPython pretty in a list": pretty([x]),
            "x?": shell.object_inspect_text("x", detail_level=0),
            "x??": shell.object_inspect_text("x", detail_level=1),
            "x? (JupyterLab's inspector)": str(shell.object_inspect_mime("x")),
            "help(x)": helped.getvalue(), "x.__str__()": x.__str__(), "x.strip()": str(x.strip())}


def test_no_display_path_shows_a_sealed_line():
    sealed = Sealed(seal(LINE))
    shown = _displays(sealed)
    assert not {how: text for how, text in shown.items() if "HK" in text or "i_start" in text}
    assert exercises.PLACEHOLDER in shown["print"] and exercises.PLACEHOLDER in shown["x?"]


def test_a_sealed_line_still_compares_hashes_and_searches_as_the_line():
    sealed = Sealed(seal(LINE))
    assert sealed == LINE and LINE == sealed and hash(sealed) == hash(LINE) and {LINE: 1}[sealed] == 1
    assert "HK" in sealed and sealed in {LINE} and sealed.split()[0] == "return" and len(sealed) == len(LINE)
    assert sealed.strip() == LINE and isinstance(sealed.strip(), Sealed)


def test_a_sealed_line_survives_copy_and_pickle():
    import copy
    import pickle

    sealed = Sealed(seal(LINE))
    for again in (copy.copy(sealed), copy.deepcopy(sealed), pickle.loads(pickle.dumps(sealed))):
        assert isinstance(again, Sealed) and again == LINE and LINE not in repr(again)


def test_the_last_hint_tier_and_a_composed_tier_print_the_line(capsys, record):
    composed = Sealed.of(f"move the reference row up one:  {Sealed(seal(LINE)).opened()}")
    assert LINE not in str(composed) and LINE not in f"{composed}" and LINE in composed
    stub = Verdict("x", False, ["f"], ("where", Sealed(seal("what is sealed too")), composed))
    assert LINE not in repr(stub.hints) and "what is sealed" not in repr(stub.hints)
    stub.hint()
    assert LINE not in capsys.readouterr().out
    stub.hint()
    assert capsys.readouterr().out == "hint 2 of 3 (what is wrong): what is sealed too\n"
    stub.hint()
    assert capsys.readouterr().out == f"hint 3 of 3 (the line): move the reference row up one:  {LINE}\n"
    assert stub.revealed() and exercises.is_open("x")


def test_the_fix_in_words_displays_once_the_gate_opens(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj.data))
    with pytest.raises(NotRevealed):
        Verdict("x", False, ["f"], ("a",)).reveal(explain=seal("the **line**"))
    assert shown == []
    Verdict("x", True, []).reveal(explain=seal("the **line**"))
    assert shown == ["the **line**"] and type(shown[0]) is str  # opened: the text itself, not a sealed str


def test_the_cheap_ways_back_to_a_plain_str_keep_a_sealed_line_sealed():
    """Slicing, `+` either side, `*` either side, `x % args` and iteration give sealed texts, not the line."""
    sealed = Sealed(seal(LINE))
    derived = {"x[:]": sealed[:], "x[:400]": sealed[:400], "x[0]": sealed[0], "x + ''": sealed + "",
               "'' + x": "" + sealed, "x * 1": sealed * 1, "1 * x": 1 * sealed, "x % ()": sealed % (),
               "next(iter(x))": next(iter(sealed)), "list(x)[0]": list(sealed)[0], "x + x": sealed + sealed}
    for how, value in derived.items():
        assert isinstance(value, Sealed), how
        assert "HK" not in str(value) and "i_start" not in f"{value}" and "HK" not in repr(value), how
    assert derived["x[:]"] == LINE and derived["x[:]"].opened() == LINE and derived["'' + x"] == LINE
    assert derived["x + x"] == LINE + LINE and sealed[7:9] == LINE[7:9]
    assert "%s" % sealed == exercises.PLACEHOLDER and "HK" not in "%.400s" % (sealed,)
    assert "".join(str(ch) for ch in sealed).count(exercises.PLACEHOLDER) == len(LINE)
    # what a str subclass must keep: compare, hash, search, split, len, bool
    assert sealed == LINE and hash(sealed) == hash(LINE) and "HK" in sealed and sealed.split()[0] == "return"
    assert len(sealed) == len(LINE) and sealed and not Sealed(seal(""))
    assert sealed.__add__(1) is NotImplemented and sealed.__radd__(1) is NotImplemented
    with pytest.raises(TypeError):
        sealed + 1


def test_a_locked_text_needs_the_package_to_open():
    """`lock` is not base64 of the text: decoding its base64 gives no word of it; `unlock` gives it back, and a
    plain `seal` (a learner's copy built before locking) still opens through `unlock`."""
    import base64

    text = "Mask the rows **past T**: `gi[start - 1]`, ünïcödé too"
    locked = exercises.lock(text)
    assert locked.startswith(exercises.LOCK_PREFIX) and exercises.unlock(locked) == text
    raw = base64.b64decode(locked[len(exercises.LOCK_PREFIX):])
    assert b"past" not in raw and b"Mask" not in raw and text.encode() not in raw
    assert exercises.lock(text) == locked and exercises.lock(text + " ") != locked  # stable; differs per text
    assert exercises.unlock(seal(text)) == text and exercises.unlock(exercises.lock("")) == ""


def test_the_locked_fix_in_words_displays_once_the_gate_opens(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj.data))
    with pytest.raises(NotRevealed):
        Verdict("x", False, ["f"], ("a",)).reveal(explain=exercises.lock("the **line**"))
    assert shown == []
    Verdict("x", True, []).reveal(explain=exercises.lock("the **line**"))
    assert shown == ["the **line**"] and type(shown[0]) is str

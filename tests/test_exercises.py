"""The learner-written fixes: the verdict format, and every bug notebook carries an exercise, a collapsed solution
and a check that passes on it (nbval then re-executes the solution in CI, so a broken one fails there)."""
import json
import math
from pathlib import Path

import pytest

from fla_lab import exercises

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
BUG_NOTEBOOKS = ("01_", "02_", "03a_", "03b_", "04_", "05_")


def test_verdict_prints_pass_or_not_yet_with_rounded_facts():
    ok = exercises.verdict_from_errors("reference row", {"o": 1.234e-7}, tol=2e-5)
    bad = exercises.verdict_from_errors("reference row", {"o": math.nan, "dq": 3e-3}, tol=2e-5, hint="one row up")
    assert ok and str(ok) == "PASS  reference row\n  - o: error 1.2e-07 <= 2.0e-05"
    assert not bad
    assert str(bad).splitlines() == ["NOT YET  reference row", "  - o: error nan > 2.0e-05",
                                     "  - dq: error 3.0e-03 > 2.0e-05", "  hint: one row up"]


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


def _cells(prefix):
    path, = [p for p in NOTEBOOKS.glob(f"{prefix}*.ipynb")]
    return json.loads(path.read_text())["cells"]


def _text(cell):
    return "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))


@pytest.mark.parametrize("prefix", BUG_NOTEBOOKS)
def test_bug_notebook_has_exercise_collapsed_solution_and_passing_check(prefix):
    cells = _cells(prefix)
    solutions = [i for i, c in enumerate(cells) if exercises.SOLUTION_TAG in c.get("metadata", {}).get("tags", [])]
    assert solutions, f"{prefix}: no cell tagged {exercises.SOLUTION_TAG!r}"
    for i in solutions:
        assert cells[i]["metadata"].get("jupyter", {}).get("source_hidden"), f"{prefix}: solution {i} not collapsed"
    outputs = [_text(c) for c in cells if c["cell_type"] == "code"]
    assert any(t.startswith("NOT YET") or "\nNOT YET" in t for t in outputs), f"{prefix}: the stub's check is missing"
    after = [_text(c) for c in cells[solutions[-1] + 1:] if c["cell_type"] == "code"]
    assert any("PASS  " in t for t in after), f"{prefix}: no passing check after the solution"

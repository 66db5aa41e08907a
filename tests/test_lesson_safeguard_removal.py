"""Notebook 06's "remove a safeguard" exercise (issue 37, item 4): the removal runs the real kernel with the line
changed, in a copy of the package that a subprocess imports; the installed package never changes; a line that changes
nothing or is not valid gives a message, not a crash; and the check rejects what the run did not find, in the style
of tests/test_checks_reject_wrong_answers.py (the stub, plausible wrong predictions and nonsense all get NOT YET with
hints; the notebook's solution gets PASS)."""
from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path

import pytest

from fla_lab.spec import safeguards
from fla_lab.teaching.lessons import safeguard_removal as removal

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "06_nan_hunting.ipynb"
SOLUTION_ID = "gsa_softmax_max_first"
SHIPPED = safeguards.shipped_line(safeguards.locate(safeguards.get(SOLUTION_ID)))  # its code and comment


def _cells(tag: str) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(NOTEBOOK.read_text())["cells"]
            if c["cell_type"] == "code" and tag in c["metadata"].get("tags", [])]


def _prediction(tag: str) -> dict:
    """The `prediction = {...}` that the notebook's cell with `tag` writes (the stub, or the solution)."""
    for source in _cells(tag):
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "prediction":
                return ast.literal_eval(node.value)
    raise LookupError(f"no cell tagged {tag!r} writes `prediction`")


@pytest.fixture(scope="module")
def solution_run():
    return removal.remove(SOLUTION_ID)


@pytest.fixture(autouse=True)
def fresh_process():
    """Each test predicts as a fresh kernel would: no prediction recorded, no removal shown (the module's
    `solution_run`, set up before this, ran `remove()`)."""
    removal._forget_predictions()
    yield
    removal._forget_predictions()


def test_the_choices_are_the_inventorys_kernel_lines(capsys):
    removal.choices()
    printed = capsys.readouterr().out
    for g in safeguards.REGISTRY:
        assert (re.search(rf"^{g.id}\s", printed, re.M) is not None) == (g.atlas is not None), g.id


def test_removing_the_slot_softmax_maximum_is_noticed_only_in_its_range(solution_run):
    run = solution_run
    assert not run.problem, run.problem
    assert (run.status("ordinary"), run.status("in_range"), run.status("shipped")) == ("right", "nonfinite", "right")
    assert "o" in run.side("in_range").tensors  # the forward's softmax: the output itself goes NaN
    assert run.noticed_by() == "the atlas in the safeguard's range only"
    text = str(run)
    assert "q scale 100" in text and "/tmp" not in text and "fla_lab_removal_" not in text


def test_the_installed_package_is_untouched(solution_run):
    entry = safeguards.locate(safeguards.get(SOLUTION_ID))
    assert safeguards.shipped_line(entry) == SHIPPED and entry.guard.naive not in safeguards.source(entry)


def test_a_padded_rows_mask_is_noticed_only_at_a_padded_length():
    """What the notebook's answer says: at T = 64 (one full chunk) no row is past T, so only T = 33 notices."""
    run = removal.remove("gsa_later_rows_masked")
    assert dict(run.side("in_range").statuses) == {"T=33": "nonfinite", "T=64": "right"}
    assert run.status("ordinary") == "right"


def test_the_learners_line_runs_in_the_copy_not_in_the_installed_package():
    """A name that exists nowhere in the installed package: the kernel that raises is the copy's."""
    run = removal.remove(SOLUTION_ID, 'b_x = tl.where(m, b_missing, float("-inf"))')
    assert "raises" in run.problem and "b_missing" in run.problem, run.problem


def test_the_worker_refuses_a_package_that_is_not_the_copy(tmp_path):
    """The subprocess asserts which fla_lab it imported: a folder without the copy falls back to the installed
    package, and the run says so instead of measuring the shipped kernel."""
    found = removal._run_copy(tmp_path, "chunk_gla", {"decays": (100.0,)})
    assert isinstance(found, str) and "not the copy" in found and str(tmp_path) not in found


@pytest.mark.parametrize("safeguard, naive, says", [
    (SOLUTION_ID, SHIPPED, "removes nothing"),
    (SOLUTION_ID, SHIPPED.replace(", ", ",  ") + "  # mine", "removes nothing"),
    (SOLUTION_ID, 'b_x = tl.where(m, b_x, float("-inf")', "not valid Python"),
    (SOLUTION_ID, 3, "must be a string"),
    ("gsa_write_expm1", None, "a layer's line"),
    ("banana", None, "no safeguard 'banana'"),
    (["not", "an", "id"], None, "no safeguard"),
], ids=["shipped code", "shipped code respaced", "syntax error", "not a string", "layer line", "unknown id",
        "id not a string"])
def test_a_line_that_cannot_run_gives_a_message_not_a_crash(safeguard, naive, says):
    run = removal.remove(safeguard, naive)
    assert says in run.problem and not run.sides, str(run)
    verdict = removal.check_removal({"safeguard": safeguard, "naive": naive, "ordinary": "right",
                                     "in_range": "nonfinite"})
    assert not verdict.passed and says in str(verdict) and verdict.hints


# --- the check: what it must reject (as tests/test_checks_reject_wrong_answers.py does for every exercise) -------

WRONG = {
    "the stub": lambda s: _prediction("exercise"),
    "the right safeguard, ordinary inputs noticing it too": lambda s: {**s, "ordinary": "nonfinite"},
    "the right safeguard, finite but wrong in its range": lambda s: {**s, "in_range": "wrong"},
    "the right safeguard, no check noticing it": lambda s: {**s, "in_range": "right"},
    "a layer's line, whose removal the atlas cannot see": lambda s: {**s, "safeguard": "gsa_gate_fp32"},
    "the shipped code as the naive line": lambda s: {**s, "naive": SHIPPED},
    "nonsense words": lambda s: {**s, "ordinary": "banana", "in_range": "apple"},
    "nonsense: not a dict": lambda s: "banana",
}


@pytest.mark.parametrize("label", WRONG)
def test_the_check_says_not_yet_with_a_hint(label):
    verdict = removal.check_removal(WRONG[label](_prediction("solution")))
    assert not verdict.passed and str(verdict).startswith("NOT YET"), str(verdict)
    assert verdict.hints and all(verdict.hints), str(verdict)


def test_the_stub_runs_nothing_before_the_prediction_is_written(monkeypatch):
    monkeypatch.setattr(removal, "_remove", lambda *a: pytest.fail("the removal ran before the prediction"))
    verdict = removal.check_removal(_prediction("exercise"))
    assert "runs once your prediction is written" in str(verdict)
    assert not removal.check_removal({**_prediction("solution"), "in_range": ""}).passed


def test_a_wrong_prediction_gets_the_found_status_in_its_last_hint(solution_run):
    verdict = removal.check_removal({**_prediction("solution"), "ordinary": "wrong"})
    assert verdict.hints[-1] == '"ordinary": "right"' and "the run: right" in str(verdict)


def test_the_notebooks_solution_passes(solution_run):
    prediction = _prediction("solution")
    assert prediction["safeguard"] == SOLUTION_ID
    verdict = removal.check_removal(prediction)
    assert verdict.passed, str(verdict)
    assert "noticed by: the atlas in the safeguard's range only" in str(verdict)


# --- item 2 of issue 44: a prediction made after the run does not count ------------------------------------------

def test_the_statuses_a_wrong_prediction_shows_do_not_pass_when_resubmitted(solution_run):
    """The run is cached, so resubmitting what a NOT YET printed would pass at once: the first prediction of a removal
    is the one graded, and a different one made after its statuses were shown gets NOT YET."""
    solution = _prediction("solution")
    first = removal.check_removal({**solution, "in_range": "wrong"})
    assert not first.passed and "the run: nonfinite" in str(first) and "recorded" in str(first), str(first)
    late = removal.check_removal(solution)  # the run's statuses, copied from the verdict above
    assert not late.passed and "does not count" in str(late) and "after the run" in str(late), str(late)
    assert "another safeguard" in late.hints[0] and all(late.hints)
    assert not removal.check_removal({**solution, "in_range": "wrong"}).passed  # the first one stays graded


def test_the_same_removal_respaced_is_not_a_new_prediction(solution_run, monkeypatch):
    """A naive line with a comment added, or respaced, is the same removal (no new run is needed to tell)."""
    monkeypatch.setattr(removal, "_removal",
                        lambda s, n: dataclasses.replace(solution_run, naive=n or solution_run.naive))
    solution = _prediction("solution")
    assert not removal.check_removal({**solution, "ordinary": "wrong"}).passed
    respaced = {**solution, "naive": solution["naive"].replace(", ", ",  ") + "  # mine"}
    late = removal.check_removal(respaced)
    assert not late.passed and "does not count" in str(late), str(late)


def test_a_removal_run_before_any_prediction_cannot_be_predicted(solution_run):
    """`remove()` prints the statuses: a prediction checked after it, even the right one, is not a prediction."""
    removal.remove(SOLUTION_ID)  # cached: the learner ran it by hand, before predicting
    late = removal.check_removal(_prediction("solution"))
    assert not late.passed and "remove() before any prediction" in str(late), str(late)
    assert late.hints and all(late.hints)


def test_the_right_first_prediction_passes_and_passes_again(solution_run):
    solution = _prediction("solution")
    assert removal.check_removal(solution).passed
    assert removal.check_removal(solution).passed  # the same prediction: still the first one


def _unnoticed(safeguard: str) -> removal.Removal:
    """A run in which no check notices the removal (as the interpreter finds for a GPU-only line)."""
    side = lambda name: removal.Side(name, "dtype fp32", (("T=33", "right"), ("T=64", "right")), (), 1e-7)
    return removal.Removal(safeguard, "return tl.dot(a, b)", "chunk_gla", "", tuple(map(side, [*removal.SIDES,
                                                                                               "shipped"])))


def test_a_tf32_safeguards_hint_is_about_precision_not_range():
    """Item 5: `dot_precision_ieee` keeps dots in IEEE fp32 against TF32; its hint must not say that the naive form
    differs once a value leaves fp32's range."""
    why = removal._prediction_hints(_unnoticed("dot_precision_ieee"), "in_range")[1]
    assert "TF32" in why and "interpreter" in why and "range" not in why, why
    overflow = removal._prediction_hints(_unnoticed("gsa_softmax_max_first"), "ordinary")[1]
    assert "fp32's range" in overflow

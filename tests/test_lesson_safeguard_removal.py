"""Notebook 06's "remove a safeguard" exercise (issue 37, item 4): the removal runs the real kernel with the line
changed, in a copy of the package that a subprocess imports; the installed package never changes; a line that changes
nothing or is not valid gives a message, not a crash; and the check rejects what the run did not find, in the style
of tests/test_checks_reject_wrong_answers.py (the stub, plausible wrong predictions and nonsense all get NOT YET with
hints; the notebook's solution gets PASS)."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from fla_lab import safeguards
from fla_lab.lessons import safeguard_removal as removal

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "06_nan_hunting.ipynb"
SOLUTION_ID = "gsa_softmax_max_first"
SHIPPED = next(g.code for g in safeguards.REGISTRY if g.id == SOLUTION_ID)


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
    guard = next(g for g in safeguards.REGISTRY if g.id == SOLUTION_ID)
    assert safeguards.source(guard.path).count(SHIPPED) == 1 and guard.naive not in safeguards.source(guard.path)


def test_a_padded_rows_mask_is_noticed_only_at_a_padded_length():
    """What the notebook's answer says: at T = 64 (one full chunk) no row is past T, so only T = 33 notices."""
    run = removal.remove("gsa_later_rows_masked")
    assert dict(run.side("in_range").statuses) == {"T=33": "nonfinite", "T=64": "right"}
    assert run.status("ordinary") == "right"


def test_the_learners_line_runs_in_the_copy_not_in_the_installed_package():
    """A name that exists nowhere in the installed package: the kernel that raises is the copy's."""
    run = removal.remove(SOLUTION_ID, 'b_missing, float("-inf"))')
    assert "raises" in run.problem and "b_missing" in run.problem, run.problem


def test_the_worker_refuses_a_package_that_is_not_the_copy(tmp_path):
    """The subprocess asserts which fla_lab it imported: a folder without the copy falls back to the installed
    package, and the run says so instead of measuring the shipped kernel."""
    found = removal._run_copy(tmp_path, "chunk_gla", {"decays": (100.0,)})
    assert isinstance(found, str) and "not the copy" in found and str(tmp_path) not in found


@pytest.mark.parametrize("safeguard, naive, says", [
    (SOLUTION_ID, SHIPPED, "removes nothing"),
    (SOLUTION_ID, 'b_x - tl.max(b_x,  axis=1)[:, None], float("-inf"))  # mine', "removes nothing"),
    (SOLUTION_ID, 'b_x, float("-inf")', "not valid Python"),
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

"""The learner's edition (fla_lab.teaching.edition): what a learner opens asks before it answers.

Properties asserted on the learner copy of every tracked notebook, and the build's promises: written on first use,
refreshed when the notebook changes, never overwritten once edited, reset on request with a backup.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from fla_lab.teaching import edition, exercises
from fla_lab import runtime
from fla_lab.teaching.exercises import CHECK_TAG, EXERCISE_TAG, PREDICT_TAG, REVEAL_TAG, SOLUTION_TAG

NOTEBOOKS = edition.sources()
MAIN_PATH_WORDS = 2600  # "at most about 2,500" words of markdown before `## Going further`
# What gives the fix away when it runs before the exercise: the catalogue entry (fix commit, switch lines).
ANSWER_CALLS = ("bugs.show(", "bugs.switch_lines(", "bugs.locate(")

def tags(cell) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def text(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


@pytest.fixture(scope="module")
def learner(tmp_path_factory) -> dict[str, dict]:
    dest = tmp_path_factory.mktemp("learner")
    edition.build(dest)
    return {p.name: json.loads((dest / p.name).read_text()) for p in NOTEBOOKS}


def test_every_tracked_notebook_has_a_learner_copy(learner):
    assert set(learner) == {p.name for p in NOTEBOOKS} and len(learner) >= 8


@pytest.mark.parametrize("name", [p.name for p in NOTEBOOKS])
def test_learner_copy_has_no_outputs_and_no_solutions(learner, name):
    nb = learner[name]
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and all(not c["outputs"] and c["execution_count"] is None for c in code)
    assert not [c for c in nb["cells"] if SOLUTION_TAG in tags(c)]
    assert not [c for c in nb["cells"] if "source_hidden" in json.dumps(c.get("metadata", {}))]
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            assert "<details>" not in text(cell), f"{name}: an answer folded into the learner's copy"
            assert not re.search(r"^#+ .*\bSolution", text(cell), re.M), f"{name}: a solution heading"
            assert "../shared" not in text(cell) and "shared/docs" not in text(cell)  # not in the repository
    assert tags(nb["cells"][0]) == [edition.BANNER_TAG] and "reset" in text(nb["cells"][0])
    assert "widgets" not in nb["metadata"]


@pytest.mark.parametrize("name", [p.name for p in NOTEBOOKS if not p.name.startswith("00_")])
def test_every_exercise_is_a_stub_then_its_check(learner, name):
    cells = [c for c in learner[name]["cells"] if c["cell_type"] == "code"]
    exercises = [i for i, c in enumerate(cells) if EXERCISE_TAG in tags(c)]
    assert exercises, f"{name}: no cell tagged {EXERCISE_TAG!r}"
    for i in exercises:
        assert i + 1 < len(cells) and CHECK_TAG in tags(cells[i + 1]), f"{name}: exercise without its check"


@pytest.mark.parametrize("name", [p.name for p in NOTEBOOKS if not p.name.startswith("00_")])
def test_nothing_that_gives_the_fix_away_comes_before_the_first_check(learner, name):
    """No catalogue entry runs before the first check, and neither the learner's copy nor the reference's saved
    outputs name the upstream fix commit of the notebook's bug before it."""
    from fla_lab.teaching import bugs

    cells = learner[name]["cells"]
    first_check = next(i for i, c in enumerate(cells) if CHECK_TAG in tags(c))
    early = [text(c) for c in cells[:first_check] if c["cell_type"] == "code"]
    leaks = [call for call in ANSWER_CALLS for source in early if call in source]
    assert not leaks, f"{name}: {leaks} before the first exercise check"
    reference = json.loads((edition.NOTEBOOKS / name).read_text())["cells"]
    ref_check = next(i for i, c in enumerate(reference) if CHECK_TAG in tags(c))
    seen = " ".join(text(c) + json.dumps(c.get("outputs", [])) for c in reference[:ref_check])
    fixes = [b.fix.split()[0] for b in bugs.CATALOGUE
             if b.notebook == name.removesuffix(".ipynb") and re.fullmatch(r"[0-9a-f]{8}", b.fix.split()[0])]
    assert not [f for f in fixes if f in seen], f"{name}: the fix commit {fixes} is named before the first check"


@pytest.mark.parametrize("name", [p.name for p in NOTEBOOKS])
def test_every_predict_comes_before_a_cell_that_runs(learner, name):
    cells = learner[name]["cells"]
    for i, cell in enumerate(cells):
        if PREDICT_TAG in tags(cell):
            assert cell["cell_type"] == "markdown"
            assert any(c["cell_type"] == "code" for c in cells[i + 1:]), f"{name}: a predict with nothing after it"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_notebook_imports_its_lesson_by_notebook_not_by_cause(path):
    """The lesson modules are named by mechanism (overflow, masks, gsa_padding...): a notebook's imports name
    only itself (`lessons.notebook("03a")`), and that prefix is this notebook's."""
    from fla_lab.teaching import lessons

    code = "".join(text(c) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")
    mechanisms = {m for m in lessons.BY_NOTEBOOK.values() if m not in ("start", "amp", "hunting")}
    named = set(re.findall(r"from fla_lab\.lessons import (\w+)", code)) | set(
        re.findall(r"fla_lab\.lessons\.(\w+)", code))
    assert not named & mechanisms, named
    for prefix in re.findall(r'lessons\.notebook\("(\w+)"\)', code):
        assert path.name.startswith(prefix + "_") and lessons.notebook(prefix).__name__.startswith("fla_lab.teaching.lessons.")


def test_every_notebook_prefix_has_a_lesson_module():
    from fla_lab.teaching import lessons

    prefixes = {p.name.split("_")[0] for p in NOTEBOOKS}
    assert prefixes == set(lessons.BY_NOTEBOOK)
    with pytest.raises(ValueError, match="no notebook '07'"):
        lessons.notebook("07")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_main_path_fits_the_agenda(path):
    words, _ = edition.markdown_words(path)
    assert words <= MAIN_PATH_WORDS, f"{path.name}: {words} words of markdown before `## Going further`"


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if not p.name.startswith("00_")], ids=lambda p: p.stem)
def test_tracked_notebook_checks_its_solution(path):
    """The reference keeps the solutions, and the check after each one asserts that it passes (CI runs it)."""
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    solutions = [i for i, c in enumerate(cells) if SOLUTION_TAG in tags(c)]
    assert solutions, f"{path.name}: no solution cell"
    assert any("assert" in text(cells[i]) for i in solutions), f"{path.name}: no solution check asserts a PASS"


def _one_notebook_folder(tmp_path: Path) -> tuple[Path, Path]:
    src = tmp_path / "notebooks"
    src.mkdir()
    nb = src / "07_example.ipynb"
    nb.write_text(json.dumps({
        "nbformat": 4, "nbformat_minor": 5, "metadata": {},
        "cells": [
            {"cell_type": "markdown", "id": "a", "metadata": {}, "source": "Predict: what prints?"},
            {"cell_type": "code", "id": "b", "metadata": {"tags": [EXERCISE_TAG]}, "execution_count": 1,
             "source": "x = 1", "outputs": [{"output_type": "stream", "name": "stdout", "text": "answer\n"}]},
            {"cell_type": "code", "id": "c", "metadata": {"tags": [SOLUTION_TAG], "jupyter": {"source_hidden": True}},
             "execution_count": 2, "source": "x = 2", "outputs": []},
        ]}))
    return src, nb


def test_build_writes_then_keeps_edits_and_reset_restores_with_a_backup(tmp_path):
    src, nb = _one_notebook_folder(tmp_path)
    dest = tmp_path / "learner"
    first = edition.build(dest, notebooks=[nb])
    assert [o.action for o in first] == ["written"] and (dest / "figures").is_dir()
    copy = json.loads((dest / nb.name).read_text())
    assert [text(c) for c in copy["cells"][1:]] == ["Predict: what prints?", "x = 1"]
    assert copy["cells"][2]["outputs"] == [] and copy["cells"][2]["execution_count"] is None
    assert [o.action for o in edition.build(dest, notebooks=[nb])] == ["unchanged"]

    edited = (dest / nb.name).read_text().replace("x = 1", "x = 3  # mine")
    (dest / nb.name).write_text(edited)
    nb.write_text(nb.read_text().replace("Predict: what prints?", "Predict: what does it print?"))
    assert [o.action for o in edition.build(dest, notebooks=[nb])] == ["kept (edited)"]
    assert (dest / nb.name).read_text() == edited  # the learner's work survives a refresh of the source

    assert [o.action for o in edition.build(dest, notebooks=[nb], reset=[nb.name])] == ["reset"]
    assert (dest / (nb.name + ".bak")).read_text() == edited
    assert "what does it print" in (dest / nb.name).read_text() and "# mine" not in (dest / nb.name).read_text()


def test_build_refreshes_an_unedited_copy_when_the_notebook_changes(tmp_path):
    src, nb = _one_notebook_folder(tmp_path)
    dest = tmp_path / "learner"
    edition.build(dest, notebooks=[nb])
    nb.write_text(nb.read_text().replace("x = 1", "x = 10"))
    assert [o.action for o in edition.build(dest, notebooks=[nb])] == ["refreshed"]
    assert "x = 10" in (dest / nb.name).read_text()


def test_resolve_names_one_notebook_by_prefix():
    assert edition.resolve("03a") == next(p.name for p in NOTEBOOKS if p.name.startswith("03a"))
    with pytest.raises(SystemExit, match="names 0 notebooks"):
        edition.resolve("99")
    with pytest.raises(SystemExit, match="names [2-9]"):
        edition.resolve("0")


def test_each_notebook_has_one_name():
    """notebooks/ holds no links: an old name would give away the cause that the symptom name hides."""
    assert not [p.name for p in edition.NOTEBOOKS.iterdir() if p.is_symlink()]


# On a GPU the notebooks-gpu phase runs every notebook, its stubs' checks included, top to bottom: the learner's
# copy adds nothing there but four minutes of the CUDA unit phase.
@pytest.mark.skipif(runtime.device() == "cuda", reason="CPU only: on a GPU the notebooks-gpu phase runs the stubs")
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_learner_copy_runs_top_to_bottom_with_the_stubs(path, tmp_path):
    """Run All in the learner's copy, stubs in place: every cell runs (only cells tagged raises-exception may
    raise), and each exercise check says NOT YET, never PASS, so a learner starts with work to do."""
    import nbformat

    edition.build(tmp_path, notebooks=[path])
    nb = edition.execute(nbformat.read(tmp_path / path.name, as_version=4), tmp_path)
    for cell in nb.cells:
        if CHECK_TAG in tags(cell):
            printed = "".join(o.get("text", "") for o in cell.outputs)
            assert "NOT YET" in printed and "PASS" not in printed, f"{path.name}: the stub's check printed {printed!r}"
        if REVEAL_TAG in tags(cell):  # the fix, in code or in words, stays hidden: the gate raised first
            assert cell.cell_type == "code", f"{path.name}: the fix in words is shown"
            assert [o.get("ename") for o in cell.outputs] == ["NotRevealed"], f"{path.name}: {cell.outputs}"


def test_every_fix_after_a_check_is_behind_the_gate():
    """In each notebook with an exercise, the cells tagged `reveal` come after a check, and each such code cell
    starts with `verdict.reveal()`; the reference run (solutions in place) passes the gate silently."""
    gated = 0
    for path in NOTEBOOKS:
        cells = json.loads(path.read_text())["cells"]
        for i, cell in enumerate(cells):
            if REVEAL_TAG not in cell["metadata"].get("tags", []):
                continue
            assert any(CHECK_TAG in c["metadata"].get("tags", []) for c in cells[:i]), f"{path.name} cell {i}"
            if cell["cell_type"] == "code":
                gated += 1
                assert text(cell).startswith("verdict.reveal()"), f"{path.name} cell {i}"
                assert not any(o.get("output_type") == "error" for o in cell["outputs"]), f"{path.name} cell {i}"
    assert gated >= 6


def test_execute_file_runs_a_widget_notebook_to_the_end(tmp_path):
    """An explorer cell, then a plain cell: the headless run reaches the last cell and saves what nbconvert saves
    (language_info, the widgets' state), well inside the cell timeout that a missed reply would wait out."""
    import time

    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import ipywidgets as w\nw.interactive(lambda x: print(x), x=(0, 3))"),
                nbformat.v4.new_code_cell("print('after the explorer')")]
    path = tmp_path / "explorer.ipynb"
    nbformat.write(nb, path)
    start = time.monotonic()
    edition.execute_file(path, timeout=60)
    saved = nbformat.read(path, as_version=4)
    assert saved.cells[1].outputs[0]["text"] == "after the explorer\n"
    assert "language_info" in saved.metadata and "widgets" in saved.metadata
    assert time.monotonic() - start < 50


def test_learner_copies_link_nothing_outside_the_edition(tmp_path):
    """`workbook.py lab` roots JupyterLab at the edition, where `../` is out of the server's reach: an image a
    notebook shows from the repository's figures/ is copied into the edition's figures/ and linked there."""
    shown = {p.name: edition.repo_figures(p) for p in NOTEBOOKS}
    assert any(shown.values()), "no notebook shows a figure of the repository: the copy below checks nothing"
    edition.build(tmp_path)
    for name, figures in shown.items():
        markdown = " ".join(text(c) for c in json.loads((tmp_path / name).read_text())["cells"]
                            if c["cell_type"] == "markdown")
        assert not re.search(r"\]\(\.\./|src=[\"']\.\./", markdown), f"{name}: a link out of the edition"
        for figure in figures:
            assert f"](figures/{figure.name})" in markdown, (name, figure.name)
            assert (tmp_path / "figures" / figure.name).read_bytes() == figure.read_bytes()


def test_readme_learner_part_links_no_answer():
    """README.md is what a learner reads first: its learner part (before `# For facilitators and maintainers`) links
    neither the guide with its answer keys nor the reference notebooks, shows no notebook's figure (00's lead figure
    states 00's answer) and does not say what each learner writes; the generated passages are in the other part."""
    readme = (edition.ROOT / "README.md").read_text(encoding="utf-8")
    heading = "\n# For facilitators and maintainers\n"
    assert readme.count(heading) == 1, "README.md has no facilitator part"
    learner_part, facilitator_part = readme.split(heading)
    for given_away in ("onboarding", "notebooks/", "| you write |", "figures/0", "figures/atlas"):
        assert given_away not in learner_part, f"README's learner part: {given_away!r}"
    assert "docs/onboarding.md" in facilitator_part and "](notebooks/" in facilitator_part
    assert not re.search(r"<!-- [\w:-]+:begin -->", learner_part), "a generated passage in the learner part"
    for path in NOTEBOOKS:
        assert path.stem in learner_part, f"README's learner part does not list {path.stem}"


def test_the_learners_lab_is_a_learners_session(monkeypatch, tmp_path):
    """`workbook.py lab` starts JupyterLab (and so its kernels) with FLA_LAB_EDITION=learner; without it, a kernel
    whose working directory holds the edition's manifest (a notebook of learner/, whatever started it) is one too;
    FLA_LAB_EDITION=reference (a facilitator) or any other folder is not."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("fla_lab_workbook_for_edition", edition.ROOT / "workbook.py")
    wb = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, wb)  # dataclasses look their module up there
    spec.loader.exec_module(wb)
    env = wb.lab_env({"PATH": "/usr/bin"}, root=tmp_path)
    assert env[edition.SESSION_ENV] == "learner"
    monkeypatch.setattr(edition, "_SESSION", None)  # unlatched here, and restored after the test
    monkeypatch.chdir(tmp_path)

    def session(**env) -> bool:  # a fresh process (kernel) in this environment and folder
        for name, value in env.items():
            monkeypatch.setenv(name, value) if value is not None else monkeypatch.delenv(name)
        edition.reset_session()
        return edition.learner_session()

    assert session(**{edition.SESSION_ENV: "learner"})
    assert not session(**{edition.SESSION_ENV: "reference"})
    assert not session(**{edition.SESSION_ENV: None})
    edition.build(tmp_path, notebooks=NOTEBOOKS[:1])  # the edition's folder: its manifest marks it
    assert (tmp_path / edition.MANIFEST).is_file() and session()
    assert not session(**{edition.SESSION_ENV: "reference"})


def test_a_learners_session_is_latched_at_its_first_answer(monkeypatch, tmp_path):
    """Inside a learner's kernel, `os.environ["FLA_LAB_EDITION"] = "reference"` (or a chdir) does not turn the session
    into a facilitator's: the first answer in the process holds until `reset_session()`."""
    monkeypatch.setattr(edition, "_SESSION", None)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(edition.SESSION_ENV, "learner")
    assert edition.learner_session()
    monkeypatch.setenv(edition.SESSION_ENV, "reference")
    monkeypatch.chdir("/")
    assert edition.learner_session()
    edition.reset_session()
    assert not edition.learner_session()
    monkeypatch.setenv(edition.SESSION_ENV, "learner")
    assert not edition.learner_session()  # latched the other way too


def test_the_fix_in_words_is_locked_in_the_learners_copy(tmp_path, monkeypatch):
    """A reveal cell's explanation is locked (`exercises.lock`), not plain base64: no base64 run in a learner's
    reveal cell decodes to the text, and `verdict.reveal(explain=...)` after a PASS displays it."""
    import base64
    import binascii

    import nbformat

    def decodes(source: str) -> list[str]:
        found = []
        for run in re.findall(r"[A-Za-z0-9+/=]{16,}", source):
            for start in range(4):  # the run may start off the 4-character grid (a prefix glued to it)
                chunk = run[start:]
                chunk = chunk[:len(chunk) - len(chunk) % 4]
                try:
                    found.append(base64.b64decode(chunk, validate=False).decode("utf-8", "replace"))
                except (binascii.Error, ValueError):
                    pass
        return found

    cell = nbformat.v4.new_markdown_cell("The fix: mask the **rows past T** (gi[start-1]).",
                                         metadata={"tags": [exercises.REVEAL_TAG]})
    gate = edition.behind_the_gate(cell)
    assert gate.cell_type == "code" and gate.source.startswith("verdict.reveal(explain=")
    assert not any("rows past T" in text or "The fix" in text for text in decodes(gate.source))
    assert "rows past T" not in gate.source
    locked = re.search(r'explain="([^"]+)"', gate.source).group(1)
    assert exercises.unlock(locked) == cell.source and edition.behind_the_gate(
        nbformat.v4.new_markdown_cell(cell.source, metadata={"tags": [exercises.REVEAL_TAG]})).source == gate.source
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj.data))
    with pytest.raises(exercises.NotRevealed):
        exercises.Verdict("x", False, ["f"], ("a",)).reveal(explain=locked)
    assert shown == []
    exercises.Verdict("x", True, []).reveal(explain=locked)
    assert shown == [cell.source]
    for path in NOTEBOOKS:  # every reveal markdown of the tracked notebooks, as the edition writes it
        for md in nbformat.read(path, as_version=4).cells:
            if md.cell_type == "markdown" and exercises.REVEAL_TAG in md.metadata.get("tags", []):
                source = edition.behind_the_gate(md).source
                words = [w for w in re.findall(r"[A-Za-z_]{6,}", md.source)][:5]
                assert not any(w in text for text in decodes(source) for w in words), (path.name, words)

"""The notebooks' prose against their own saved outputs (`fla_lab.teaching.prose`): run by the `notebooks` phase, beside
nbval, which compares only the outputs. A number the markdown quotes about a result must be one the notebook prints."""
import json
import shutil
from pathlib import Path

import pytest

from fla_lab.teaching import prose

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_prose_states_only_what_the_outputs_show(path):
    found = prose.check_notebook(path)
    assert not found, "\n".join(map(str, found))


def _notebook(tmp_path, markdown: str, printed: str, code: str = "print('x')") -> Path:
    cells = [
        {"cell_type": "code", "execution_count": 1, "id": "a", "metadata": {}, "source": [code],
         "outputs": [{"output_type": "stream", "name": "stdout", "text": [printed]}]},
        {"cell_type": "markdown", "id": "b", "metadata": {}, "source": [markdown]},
    ]
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def _flagged(tmp_path, markdown: str, printed: str, code: str = "print('x')") -> list[str]:
    return [f.text for f in prose.check_notebook(_notebook(tmp_path, markdown, printed, code))]


def test_a_broken_quote_is_named_with_its_cell(tmp_path):
    path = tmp_path / "03b.ipynb"
    shutil.copy(ROOT / "notebooks" / "03b_nan_gradients_that_come_and_go.ipynb", path)
    nb = json.loads(path.read_text())
    index = next(i for i, c in enumerate(nb["cells"])
                 if c["cell_type"] == "markdown" and "time steps **64..79** and nowhere else" in "".join(c["source"]))
    assert not [f for f in prose.check_notebook(path) if f.cell == index]
    source = "".join(nb["cells"][index]["source"]).replace("**64..79** and nowhere else", "**0..79** and nowhere else")
    nb["cells"][index]["source"] = [source]
    path.write_text(json.dumps(nb))
    found = [f for f in prose.check_notebook(path) if f.cell == index]
    assert [f.text for f in found] == ["0..79"] and "cell" in str(found[0])


@pytest.mark.parametrize("markdown, printed, flagged", [
    ("the error is 1.7e-3", "err 1.73e-03", []),                       # rounded at the prose's precision
    ("the error is 1.7e-3", "err 1.76e-03", ["1.7e-3"]),
    ("dg: 80/2560 non-finite", "dg: 80/2560 non-finite (3.1%)", []),
    ("dg: 79/2560 non-finite", "dg: 80/2560 non-finite (3.1%)", ["79/2560"]),
    ("steps 64–79", "'64..79'", []),                                   # a range however it is written
    ("steps 0..79", "'64..79'", ["0..79"]),
    ("clamps 23 % of them", "(23%)", []),
    ("a ratio of 1.37x", "1.17x", ["1.37x"]),
    ("see line 44 above", "line 44", ["line 44"]),                     # line numbers are never literals
    ("#150, FLA 0.6.0, notebook 03a, 2025-01-30, fp32 and bf16", "", []),  # not measurements
    ("about 30 minutes", "", []),                                      # times: the times file's own test
    ("the 2080 scores\n<!-- constants: 2080 (scores of a 64-row chunk) -->", "", []),
    ("e^{88.72} is fp32's largest value", "", []),                     # computed by workbook_facts
])
def test_rules(tmp_path, markdown, printed, flagged):
    assert _flagged(tmp_path, markdown, printed) == flagged


def test_a_parameter_set_in_code_backs_the_prose(tmp_path):
    assert _flagged(tmp_path, "with T = 100 steps", "", code="T = 100") == []
    assert _flagged(tmp_path, "with T = 101 steps", "", code="T = 100") == ["101"]


def test_answer_keys_quote_what_the_notebooks_print():
    """The facilitator's answer keys (docs/onboarding.md, `### NN ·` sections) against each notebook's outputs."""
    found = prose.check_guide(ROOT / "docs" / "onboarding.md", ROOT / "notebooks")
    assert not found, "\n".join(map(str, found))


def test_a_broken_answer_key_is_named_with_its_line(tmp_path):
    guide = (ROOT / "docs" / "onboarding.md").read_text()
    broken = guide.replace("on the same steps 64..79 of those slots", "on the same steps 0..79 of those slots")
    assert broken != guide
    (tmp_path / "guide.md").write_text(broken)
    found = prose.check_guide(tmp_path / "guide.md", ROOT / "notebooks")
    line = broken[:broken.index("steps 0..79")].count("\n") + 1
    assert [(f.text, f.cell) for f in found] == [("0..79", line)]

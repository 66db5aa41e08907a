"""The notebooks' text against their own saved outputs: run by the `notebooks` phase, beside nbval, which compares
only the outputs. A number the markdown or the facilitator's answer keys (docs/onboarding.md) quote about a result
must be one the notebook prints (`fla_lab.teaching.prose`, its rules in `RULES`); notebook 00, which every later
notebook builds on, keeps the promises of `NOTEBOOK_00`, one row each."""
import json
import re
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


def test_answer_keys_quote_what_the_notebooks_print():
    """The facilitator's answer keys (docs/onboarding.md, `### NN ·` sections) against each notebook's outputs."""
    found = prose.check_guide(ROOT / "docs" / "onboarding.md", ROOT / "notebooks")
    assert not found, "\n".join(map(str, found))


def _notebook(tmp_path, markdown: str, printed: str, code: str) -> Path:
    cells = [
        {"cell_type": "code", "execution_count": 1, "id": "a", "metadata": {}, "source": [code],
         "outputs": [{"output_type": "stream", "name": "stdout", "text": [printed]}]},
        {"cell_type": "markdown", "id": "b", "metadata": {}, "source": [markdown]},
    ]
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


RULES = [  # (markdown, what the code cell before it prints, its source, the numbers the checker flags)
    ("the error is 1.7e-3", "err 1.73e-03", "print('x')", []),  # rounded at the prose's precision
    ("the error is 1.7e-3", "err 1.76e-03", "print('x')", ["1.7e-3"]),
    ("dg: 80/2560 non-finite", "dg: 80/2560 non-finite (3.1%)", "print('x')", []),
    ("dg: 79/2560 non-finite", "dg: 80/2560 non-finite (3.1%)", "print('x')", ["79/2560"]),
    ("steps 64–79", "'64..79'", "print('x')", []),  # a range however it is written
    ("steps 0..79", "'64..79'", "print('x')", ["0..79"]),
    ("clamps 23 % of them", "(23%)", "print('x')", []),
    ("a ratio of 1.37x", "1.17x", "print('x')", ["1.37x"]),
    ("see line 44 above", "line 44", "print('x')", ["line 44"]),  # line numbers are never literals
    ("#150, FLA 0.6.0, notebook 03a, 2025-01-30, fp32 and bf16", "", "print('x')", []),  # not measurements
    ("about 30 minutes", "", "print('x')", []),  # times: the times file's own test
    ("the 2080 scores\n<!-- constants: 2080 (scores of a 64-row chunk) -->", "", "print('x')", []),
    ("e^{88.72} is fp32's largest value", "", "print('x')", []),  # computed by workbook_facts
    ("with T = 100 steps", "", "T = 100", []),  # a parameter set in code backs the prose
    ("with T = 101 steps", "", "T = 100", ["101"]),
]


@pytest.mark.parametrize("markdown, printed, code, flagged", RULES)
def test_rules(tmp_path, markdown, printed, code, flagged):
    assert [f.text for f in prose.check_notebook(_notebook(tmp_path, markdown, printed, code))] == flagged


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


def test_a_broken_answer_key_is_named_with_its_line(tmp_path):
    guide = (ROOT / "docs" / "onboarding.md").read_text()
    broken = guide.replace("on the same steps 64..79 of those slots", "on the same steps 0..79 of those slots")
    assert broken != guide
    (tmp_path / "guide.md").write_text(broken)
    found = prose.check_guide(tmp_path / "guide.md", ROOT / "notebooks")
    line = broken[:broken.index("steps 0..79")].count("\n") + 1
    assert [(f.text, f.cell) for f in found] == [("0..79", line)]


# ------------------------------------------------------------------------------------------ notebook 00's promises

def _source(cell) -> str:
    return "".join(cell["source"])


def _printed(cells) -> str:
    return "".join("".join(o.get("text", "")) for c in cells for o in c.get("outputs", []))


NOTATION = ("$g_t \\le 0$", "`w` (RWKV6, RWKV-7)", "$G_t = \\sum_{\\tau \\le t} g_\\tau$", "`gi`", "$G^e_t = G_{t-1}$",
            "`ge`", "`gn`", "(`BC`)", "-m \\cdot U(0.05, 1)", "$S_t \\in \\mathbb{R}^{K\\times V}$", "`h0`", "`ht`",
            "$\\alpha$ | `scale`", "$\\beta_t$", "$\\rho_t = a_t^\\top S_{t-1}$", "$\\varepsilon$")
GLOSSARY = ("e-fold", "LoRA", "WY representation", "varlen", "`k_a`", "GroupNorm", "zigzag", "TF32")
PRIMER = "programs: 2 | masked rows in the last chunk: 28 | matches torch: True"


def notation_missing(cells) -> list[str]:
    table = next(_source(c) for c in cells if _source(c).startswith("## Notation"))
    return [entry for entry in NOTATION if entry not in table]


def glossary_not_once(cells) -> list[str]:
    text = "\n".join(_source(c) for c in cells if c["cell_type"] == "markdown")
    glossary = text[text.index("### Glossary"):]
    rows = [line.split("|")[1].strip() for line in glossary.splitlines() if line.startswith("| ")][1:]
    return ([term for term in GLOSSARY if sum(term in row for row in rows) != 1]
            + (["the zigzag is"] if text.count("the zigzag is") != 1 else []))


def predict_after_its_answer(cells) -> list[str]:
    predict = [i for i, c in enumerate(cells) if "predict" in c.get("metadata", {}).get("tags", [])]
    answer = next(i for i, c in enumerate(cells) if "naive_split_census(magnitude=2.0" in _source(c))
    if not predict:
        return ["no cell tagged predict"]
    above = _printed(cells[:predict[0]])
    return ([f"predict cell {i} after its answer (cell {answer})" for i in predict if i >= answer]
            + (["the answer printed above the predict"] if "first key row inf: 44" in above else []))


def catalogue_entries_shown(cells) -> list[str]:
    code = "\n".join(_source(c) for c in cells if c["cell_type"] == "code")
    return ((["no bugs.index()"] if "bugs.index()" not in code else [])
            + (["bugs.show("] if "bugs.show(" in code else [])
            + [text for text in ("p_gn", "trigger:") if text in _printed(cells)])


def primer_output_differs(cells) -> list[str]:
    printed = _printed([next(c for c in cells if "chunk_cumsum_kernel" in _source(c))]).strip()
    return [] if printed == PRIMER else [printed]


def stuck_progress_bars(cells) -> list[str]:
    return re.findall(r"\b0/\d+\b", _printed(cells))


NOTEBOOK_00 = [  # (what notebook 00 must show, what in its cells breaks it)
    ("the one notation table: each symbol with its code name, as every later notebook uses them", notation_missing),
    ("a glossary that defines each term once, and the zigzag once (01 and 05 use it)", glossary_not_once),
    ("every predict before the cell that answers it, the answer nowhere above", predict_after_its_answer),
    ("the catalogue's index, not its entries (their lines are the later exercises' solutions)",
     catalogue_entries_shown),
    ("the primer's kernel on screen: one program per chunk, the masked rows, a match with torch",
     primer_output_differs),
    ("no saved output with a stuck progress bar", stuck_progress_bars),
]


@pytest.mark.parametrize("promise, broken_by", NOTEBOOK_00, ids=[f.__name__ for _, f in NOTEBOOK_00])
def test_notebook_00_shows(promise, broken_by):
    cells = json.loads((ROOT / "notebooks" / "00_start_here.ipynb").read_text())["cells"]
    found = broken_by(cells)
    assert not found, f"00_start_here: {promise}: {found}"

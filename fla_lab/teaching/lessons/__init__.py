"""One module per notebook: the sweeps, figures and explorers that notebook's story needs.

Notebooks import theirs by notebook, `lesson = lessons.notebook("03a")`, so that the first cell a learner reads
names the symptom they are about to investigate, not its cause (the modules are named by mechanism).
"""
from __future__ import annotations

import importlib

# notebook prefix -> module (the notebooks' files are named by symptom; see notebooks/)
BY_NOTEBOOK = {"00": "start", "01": "init", "02": "decay_contract", "03a": "overflow", "03b": "gsa_padding",
               "04": "masks", "05": "amp", "06": "hunting"}


def notebook(prefix: str):
    """The lesson module of notebook `prefix` ("00" ... "06", "03a", "03b")."""
    if prefix not in BY_NOTEBOOK:
        raise ValueError(f"no notebook {prefix!r}; the notebooks are {', '.join(BY_NOTEBOOK)}")
    return importlib.import_module(f"{__name__}.{BY_NOTEBOOK[prefix]}")

"""Thin ipywidgets front-ends: controls wired to a package function that draws a figure.

Each explorer re-runs a computation on change (continuous_update=False: under the CPU interpreter each update
runs kernels). Notebooks mark explorer cells NBVAL_IGNORE_OUTPUT and follow them with a static figure of the
default setting, so the notebook reads the same on GitHub, in nbval and in a browser.
"""
from __future__ import annotations

import importlib


def _w():
    """ipywidgets, imported on first use: the lessons (and the tests that use them) import without Jupyter."""
    return importlib.import_module("ipywidgets")


def log_slider(description: str, value: float, lo_exp: float, hi_exp: float, step: float = 0.25):
    return _w().FloatLogSlider(value=value, base=10, min=lo_exp, max=hi_exp, step=step, description=description,
                            continuous_update=False, readout_format=".3g", style={"description_width": "initial"})


def choice(description: str, options, value):
    return _w().Dropdown(options=options, value=value, description=description, style={"description_width": "initial"})


def int_slider(description: str, value: int, lo: int, hi: int, step: int = 1):
    return _w().IntSlider(value=value, min=lo, max=hi, step=step, description=description, continuous_update=False,
                       style={"description_width": "initial"})


def dtype_choice(value=None, dtypes=None, description: str = "dtype"):
    """A dropdown of dtypes by short name (fp32 / bf16 / fp16 unless `dtypes` says otherwise)."""
    import torch

    from fla_lab.tools import viz

    return choice(description, dtypes or viz.DTYPES, value or torch.float32)


def chunk_size_choice(value: int = 64):
    return choice("chunk size", [16, 32, 64], value)


def explorer(draw, **controls):
    """`interactive(draw, **controls)`: `draw(**values)` must build and show one figure."""
    import matplotlib.pyplot as plt

    def _draw(**values):
        draw(**values)
        plt.show()

    return _w().interactive(_draw, **controls)

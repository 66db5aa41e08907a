"""Figure helpers shared by every notebook: one style, one place where figures are saved."""
from __future__ import annotations

import os
from pathlib import Path

import matplotlib

import torch

DTYPE_COLORS = {torch.float32: "#1f77b4", torch.bfloat16: "#d62728", torch.float16: "#2ca02c",
                torch.float64: "#555555"}
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# The largest finite value's natural log: where exp() overflows in each dtype (bf16 shares fp32's exponent).
EXP_OVERFLOW = {dtype: float(torch.log(torch.tensor(torch.finfo(dtype).max, dtype=torch.float64)))
                for dtype in (torch.float32, torch.bfloat16, torch.float16)}

DPI = 110  # what `save` writes figures at
# A notebook's output column is about 900 px wide (JupyterLab, GitHub): a figure up to this many inches wide is shown
# at full size when saved at DPI (8 x 110 = 880 px) and inline (8 x 100 px), so a 9 pt label stays 9 pt. A wider
# one is scaled down to fit, and its text with it (2310 px of figure at 900 px: 9 pt reads as 3.5 pt).
NOTEBOOK_WIDTH = 8.0
NOTEBOOK_WIDTH_PX = 900


def figures_dir() -> Path | None:
    """FLA_LAB_FIGURES_DIR if set (the browser test points it at a temp dir), else `figures/` of the repository
    this package lives in (None when installed elsewhere)."""
    override = os.environ.get("FLA_LAB_FIGURES_DIR")
    candidate = Path(override) if override else Path(__file__).resolve().parents[2] / "figures"
    return candidate if candidate.is_dir() else None


def figure(ncols: int = 1, nrows: int = 1, width: float = 5.0, height: float = 3.4):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False,
                             layout="constrained")
    return fig, axes.ravel()


def legend_below(ax, ncol: int = 2, **kwargs) -> None:
    """The axes' legend under its x label, outside the data (constrained layout makes room for it)."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=ncol, fontsize=kwargs.pop("fontsize", 8),
              frameon=False, **kwargs)


def save(fig, name: str) -> Path | None:
    """Save into figures/<name>.png (deterministic metadata, so a re-run does not churn the repository)."""
    folder = figures_dir()
    if folder is None:
        return None
    path = folder / f"{name}.png"
    fig.savefig(path, dpi=DPI, metadata={"Software": None})
    return path


def use_headless_backend_if_needed() -> None:
    if matplotlib.get_backend().lower().startswith("qt") and not Path("/tmp/.X11-unix").exists():
        matplotlib.use("Agg")

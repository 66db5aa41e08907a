"""The atlas's figures: a heatmap of status and worst error over decay x ((h0, dht), T) per line (`plot_heatmap`,
`plot_atlas`), and worst error against decay per op (`plot_error_vs_decay`, `plot_errors`).
"""
from __future__ import annotations

import math

import torch

from fla_lab.spec import check
from fla_lab.tools import viz
from fla_lab.tools.atlas.measurement import (COMBINATIONS, DTYPES, STATUSES, _split, combination_name,
                                             combination_of, line_label, worst_error)

STATUS_COLORS = {"right": "#2ca02c", "wrong": "#ff7f0e", "nonfinite": "#d62728", "raises": "#7f7f7f"}
# the text on each status's colour: the one of black and white with the higher contrast (white on orange is 2.2:1)
TEXT_COLORS = {"right": "k", "wrong": "k", "nonfinite": "white", "raises": "k"}


def _select(records, **match):
    return [r for r in records if all(r[k] == v for k, v in match.items())]


def short_error(err: float) -> str:
    """Two significant digits in little room ("2.4e-2"): one digit cannot tell 0.018 (right in bf16) from 0.024."""
    if not math.isfinite(err) or err == 0:
        return f"{err:g}"
    exponent = math.floor(math.log10(err))
    mantissa = round(err / 10 ** exponent, 1)
    if mantissa >= 10:
        mantissa, exponent = mantissa / 10, exponent + 1
    return f"{mantissa:.1f}e{exponent}"


def _heatmap_rows(records: list[dict]) -> list[tuple]:
    """The y axis of a heatmap: one row per ((h0, dht) combination, T), grouped by combination."""
    keys = {(combination_of(r), r["T"]) for r in records}
    return sorted(keys, key=lambda k: (COMBINATIONS.index(k[0]), k[1]))


def plot_heatmap(records: list[dict], op: str, variant: str, dtype: str, chunk_size=None, ax=None, q_scale=1.0):
    """Status (colour) and worst error (text) over decay magnitude (x) and (h0, dht) combination x sequence length
    (y): a row "no-h0,dht T64" is T = 64 without an initial state, with a final-state cotangent."""
    from matplotlib.colors import ListedColormap

    chosen = [r for r in _select(records, op=op, variant=variant, dtype=dtype, chunk_size=chunk_size)
              if r.get("q_scale", 1.0) == q_scale]
    decays = sorted({r["decay"] for r in chosen})
    rows = _heatmap_rows(chosen)
    if ax is None:
        fig, (ax,) = viz.figure(width=0.6 * len(decays) + 3.0, height=0.45 * len(rows) + 1.4)
    grid = torch.full((len(rows), len(decays)), float("nan"))
    for r in chosen:
        i, j = rows.index((combination_of(r), r["T"])), decays.index(r["decay"])
        grid[i, j] = STATUSES.index(r["status"])
        err = worst_error(r)
        label = {"nonfinite": "NaN", "raises": "err"}.get(r["status"], short_error(err))
        ax.text(j, i, label, ha="center", va="center", fontsize=9, color=TEXT_COLORS[r["status"]])
    ax.imshow(grid.numpy(), cmap=ListedColormap([STATUS_COLORS[s] for s in STATUSES]), vmin=-0.5,
              vmax=len(STATUSES) - 0.5, aspect="auto", origin="lower")
    ax.set_xticks(range(len(decays)), [f"{d:g}" for d in decays], fontsize=9)
    ax.set_yticks(range(len(rows)), [f"{combination_name(*c)} T{t}" for c, t in rows], fontsize=9)
    for i in range(1, len(rows)):  # a line between combinations
        if rows[i][0] != rows[i - 1][0]:
            ax.axhline(i - 0.5, color="white", lw=2)
    ax.set_xlabel("per-step log-decay magnitude m")
    ax.set_ylabel("h0: initial state, dht: final-state\ncotangent (no-: absent); T", fontsize=9)
    chunk = f", c{chunk_size}" if chunk_size else ""
    ax.set_title(f"{op} [{line_label(chosen[0]) if chosen else variant}] {dtype}{chunk}", fontsize=9)
    return ax


def _furthest_from_right(rows: list[dict]) -> dict:
    """Of records that differ only in (h0, dht): non-finite before raised before the largest error."""
    rank = {"right": 0, "wrong": 1, "raises": 2, "nonfinite": 3}
    return max(rows, key=lambda r: (rank[r["status"]], 0.0 if r["status"] == "raises" else worst_error(r)))


def _worst_over_combinations(rows: list[dict]) -> list[dict]:
    by_decay = {}
    for r in rows:
        by_decay.setdefault(r["decay"], []).append(r)
    return [_furthest_from_right(group) for _, group in sorted(by_decay.items())]


def plot_error_vs_decay(records: list[dict], op: str, dtype: str, T: int, ax=None):
    """Worst error (over every (h0, dht) combination in the records) against decay magnitude for one op, one line
    per (library, variant): fla_lab's solid, an external library's dashed; non-finite results as crosses on the top
    edge, errors as squares."""
    if ax is None:
        fig, (ax,) = viz.figure(width=4.2, height=3.2)
    top = 1.0
    labels = sorted({(r["op"], r["variant"]) for r in records if _split(r["op"])[0] == op})
    for label, variant in labels:
        rows = _worst_over_combinations(_select(records, op=label, variant=variant, dtype=dtype, T=T))
        if not rows:
            continue
        xs, errs = [r["decay"] for r in rows], [worst_error(r) for r in rows]
        line, = ax.plot(xs, [min(e, top) if math.isfinite(e) else math.nan for e in errs],
                        "--" if ":" in label else "-", marker="o", ms=3, label=f"{label} [{variant}]")
        for x, r in zip(xs, rows):
            if r["status"] in ("nonfinite", "raises"):
                ax.plot([x], [top], "x" if r["status"] == "nonfinite" else "s", color=line.get_color(), ms=7)
    ax.axhline(check.tolerance(DTYPES[dtype]).grad, color="k", lw=0.8, ls=":", label=f"{dtype} tolerance")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("per-step log-decay magnitude m")
    ax.set_ylabel("worst relative error")
    combos = sorted({combination_of(r) for r in records}, key=COMBINATIONS.index)
    ax.set_title(f"{op}, {dtype}, T = {T}\nworst of {', '.join(combination_name(*c) for c in combos)}", fontsize=9)
    # below the axes, never over the curves
    ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=1, frameon=False)
    return ax


def plot_errors(records: list[dict], ops: list[str], dtype: str, T: int, ncols: int = 3):
    """`plot_error_vs_decay` for several ops, `ncols` to a row so the text stays readable at notebook width
    (worst of o, final state and every gradient)."""
    ncols = min(ncols, len(ops))
    nrows = math.ceil(len(ops) / ncols)
    fig, axes = viz.figure(ncols, nrows, width=4.0, height=4.4)
    for ax, op in zip(axes, ops):
        plot_error_vs_decay(records, op, dtype, T, ax=ax)
    for ax in axes[len(ops):]:
        ax.axis("off")
    fig.suptitle("worst scale-aware error against float64\nover the (initial state h0, final-state cotangent dht)"
                 " combinations\n(x on the top edge: non-finite; square: raised)", fontsize=9)
    return fig


def plot_atlas(records: list[dict]):
    """One heatmap per (op, variant, dtype, chunk size) in the records, in a grid; rows (h0, dht) x T."""
    keys = sorted({(r["op"], r["variant"], r["dtype"], r["chunk_size"] or 0, r.get("q_scale", 1.0))
                   for r in records})
    ncols = min(3, len(keys))
    nrows = math.ceil(len(keys) / ncols)
    decays = len({r["decay"] for r in records})
    rows = len(_heatmap_rows(records))
    fig, axes = viz.figure(ncols, nrows, width=max(4.2, 0.55 * decays + 2.6), height=0.4 * rows + 1.5)
    for ax, (op, variant, dtype, chunk, q_scale) in zip(axes, keys):
        plot_heatmap(records, op, variant, dtype, chunk or None, ax=ax, q_scale=q_scale)
    for ax in axes[len(keys):]:
        ax.axis("off")
    handles = [__import__("matplotlib.patches", fromlist=["Patch"]).Patch(color=STATUS_COLORS[s], label=s)
               for s in STATUSES]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(STATUSES), fontsize=9)
    fig.suptitle("status against float64 per (initial state h0, final-state cotangent dht) and T\n"
                 "(g = -m U(0.05, 1) per step; text: worst scale-aware relative error)",
                 fontsize=9)
    return fig

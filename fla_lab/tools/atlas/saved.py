"""A saved atlas: written as JSON and PNG (`write`), read back (`load`, by default the GPU run's), drawn a few lines at
a time at notebook width (`lines`, `plot_lines`, `plot_op`, `NAMED_LINES`) and browsed in a widget (`explorer`).
"""
from __future__ import annotations

import json
from pathlib import Path

from fla_lab.spec import registry
from fla_lab.tools import gpu_runs, viz
from fla_lab.tools.atlas.cache import _jsonable, environment
from fla_lab.tools.atlas.figures import STATUS_COLORS, _heatmap_rows, plot_atlas, plot_heatmap
from fla_lab.tools.atlas.measurement import STATUSES, _split


# `plot_atlas` draws every line of a sweep in a grid: the GPU run's thirteen lines make a 2310 px figure, which a
# notebook shrinks to its ~900 px column, 9 pt text to 3.5 pt. These draw chosen lines one under another, each at
# notebook width (`viz.NOTEBOOK_WIDTH`), so the figure is shown unscaled and its text stays 9 pt or more.

GPU_RESULTS = gpu_runs.path("atlas_gpu")  # the GPU run shipped with the package

# The GPU atlas's lines that notebook 06's "Going further" describes, in the order it names them: the three catalogued
# bugs the run swept, upstream's fused_recurrent_rwkv6, and fla_lab's chunk_gsa (where its worst error is).
# figures/atlas_gpu_lines.png is `viz.save(plot_lines(load(), NAMED_LINES), "atlas_gpu_lines")`.
NAMED_LINES = (("chunk_rwkv6", "exclusive_reference"), ("fused_recurrent_rwkv6", "transposed_h0_mask"),
               ("chunk_gsa", "unmasked_padding"), ("fla:fused_recurrent_rwkv6", "fixed"), ("chunk_gsa", "fixed"))


def load(path: str | Path = GPU_RESULTS) -> list[dict]:
    """The records of an atlas JSON that `write` wrote; by default the GPU run's (`python -m benchmarks.atlas_gpu`:
    bf16, B=1, H=4, K=V=M=64, T in {512, 4096}, fla_lab's ops and FLA 0.6.0's; its device is in the file). Nothing
    is recomputed."""
    return json.loads(Path(path).read_text())["records"]


def _line_of(record: dict) -> tuple:
    return record["op"], record["variant"], record["dtype"], record["chunk_size"], record.get("q_scale", 1.0)


def _line_order(line: tuple) -> tuple:
    name, library = _split(line[0])
    op, variant, dtype, chunk, q_scale = line
    return name, library != "fla_lab", library, variant != registry.FIXED, variant, dtype, chunk or 0, q_scale


def lines(records: list[dict], op: str | None = None) -> list[tuple]:
    """The atlas's lines in `records`, one heatmap each, as (op label, variant, dtype, chunk size, query scale).
    With `op` (a name without a library: "chunk_rwkv6"), that op's only: fla_lab's fixed op, its catalogued bugs,
    then each other library's ("fla:chunk_rwkv6"). Any prefix of a line, ("chunk_gsa", "fixed"), picks it for
    `plot_lines`."""
    found = {_line_of(r) for r in records if op is None or _split(r["op"])[0] == op}
    return sorted(found, key=_line_order)


def _matching(records: list[dict], line) -> list[tuple]:
    line = (line,) if isinstance(line, str) else tuple(line)
    every = lines(records)
    found = [k for k in every if k[:len(line)] == line]
    if not found:
        raise ValueError(f"no line {line!r} in the records; known: {[k[:2] for k in every]}")
    return found


def _bug_of(op: str, variant: str):
    from fla_lab import layers

    name, library = _split(op)
    return next((s for s in layers.SWITCHES if library == "fla_lab" and s.name == variant and s.op == name), None)


def plot_lines(records: list[dict], chosen, title: str | None = None):
    """One heatmap (`plot_heatmap`) per chosen line, one under another at notebook width: status colour and worst
    scale-aware error (two digits) over decay magnitude x (h0, dht) combination and T. `chosen`: lines or prefixes
    of them, ("chunk_rwkv6", "exclusive_reference") or ("chunk_gla",) (`lines` lists them); `title`: a first line
    for the figure's title (the device, say)."""
    keys = list(dict.fromkeys(k for line in chosen for k in _matching(records, line)))
    rows = max(len(_heatmap_rows([r for r in records if _line_of(r) == k])) for k in keys)
    fig, axes = viz.figure(1, len(keys), width=viz.NOTEBOOK_WIDTH, height=0.3 * rows + 1.35)
    for ax, (op, variant, dtype, chunk, q_scale) in zip(axes, keys):
        plot_heatmap(records, op, variant, dtype, chunk, ax=ax, q_scale=q_scale)
        bug = _bug_of(op, variant)
        if bug is not None:
            ax.set_title(f"{ax.get_title()}: upstream #{bug.issue}'s bug", fontsize=10)
        else:
            ax.set_title(ax.get_title(), fontsize=10)
    handles = [__import__("matplotlib.patches", fromlist=["Patch"]).Patch(color=STATUS_COLORS[s], label=s)
               for s in STATUSES]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(STATUSES), fontsize=9)
    fig.suptitle((f"{title}\n" if title else "") + "status against float64 (colour) and worst scale-aware relative "
                 "error (text)\nper initial state h0, final-state cotangent dht and T; g = -m U(0.05, 1) per step",
                 fontsize=10)
    return fig


def plot_op(records: list[dict], op: str, title: str | None = None):
    """`plot_lines` of every line of `op` in the records ("chunk_rwkv6": fla_lab's fixed op, its catalogued bugs,
    another library's op): one op of the atlas at a size the notebook shows unscaled."""
    found = lines(records, op)
    if not found:
        raise ValueError(f"no op {op!r} in the records; known: {sorted({_split(r['op'])[0] for r in records})}")
    return plot_lines(records, found, title)


def explorer(records: list[dict] | None = None, op: str | None = None):
    """A dropdown over the ops in `records` (default: the GPU run's, `load()`) that draws `plot_op` for the one
    chosen. Reads saved records only: it redraws at once, on any machine."""
    from fla_lab.tools import widgets

    records = load() if records is None else records
    ops = sorted({_split(r["op"])[0] for r in records})
    return widgets.explorer(lambda op: plot_op(records, op), op=widgets.choice("op", ops, op or ops[0]))


def write(records: list[dict], out: str | Path, name: str = "atlas") -> tuple[Path, Path]:
    """`<out>/<name>.json` (records + environment) and `<out>/<name>.png` (the heatmaps)."""
    import matplotlib.pyplot as plt

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / f"{name}.json", out / f"{name}.png"
    json_path.write_text(json.dumps({"environment": environment(), "records": records}, indent=1,
                                    default=_jsonable))
    fig = plot_atlas(records)
    fig.savefig(png_path, dpi=viz.DPI, metadata={"Software": None})
    plt.close(fig)
    return json_path, png_path

"""The stability atlas: where does an op stay right, go wrong but finite, go non-finite, or raise?

A sweep of op x variant (fixed, each catalogued bug, an external library's op) x dtype x per-step decay magnitude
x sequence length (x chunk size) x combination (initial state passed or not, random final-state cotangent or none)
(x query scale: the queries multiplied by it, which moves GSA's slot-softmax logits far from zero) gives one tidy
record per setting: the non-finite census of the output, the final state(s) and every gradient, relative errors
against the float64 reference (scale-aware for gradients, and unfloored), the largest state magnitude and a status
(`STATUSES`). The combinations matter: a truncated-BPTT segment starts from no state yet sends a
gradient into its final state, and a gradient path that only that case takes is invisible to the other three.

Records are cached on disk, keyed by the setting, the op's source hash, the torch/triton versions and the device:
a widget redraws at once, an interrupted sweep resumes. `python -m fla_lab atlas ...` writes a PNG and a JSON.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from fla_lab.spec import check, harness, registry
from fla_lab import runtime
from fla_lab.tools import viz

DECAYS = (1e-3, 1e-1, 1.0, 10.0, 30.0, 100.0, 1e3, 1e4)
STATUSES = ("right", "wrong", "nonfinite", "raises")  # finite and within tolerance / finite, beyond / NaN or inf / error
STATUS_COLORS = {"right": "#2ca02c", "wrong": "#ff7f0e", "nonfinite": "#d62728", "raises": "#7f7f7f"}
# the text on each status's colour: the one of black and white with the higher contrast (white on orange is 2.2:1)
TEXT_COLORS = {"right": "k", "wrong": "k", "nonfinite": "white", "raises": "k"}
DTYPES = viz.DTYPES

# (h0, dht): an initial state is passed / the final state gets a random cotangent (else zeros)
COMBINATIONS = ((True, True), (True, False), (False, True), (False, False))


def combination_name(h0: bool, dht: bool) -> str:
    """"h0,dht", "h0,no-dht", "no-h0,dht" or "no-h0,no-dht": the label of figures, the summary and the CLI."""
    return f"{'' if h0 else 'no-'}h0,{'' if dht else 'no-'}dht"


def parse_combination(name: str) -> tuple[bool, bool]:
    by_name = {combination_name(*c): c for c in COMBINATIONS}
    if name not in by_name:
        raise ValueError(f"no combination {name!r}; known: {list(by_name)}")
    return by_name[name]


def combination_of(record: dict) -> tuple[bool, bool]:
    """(h0, dht) of a record; records written before the atlas swept them always passed both."""
    return record.get("h0", True), record.get("dht", True)


@dataclass(frozen=True)
class Setting:
    op: str                 # registry label: "chunk_rwkv6" or "fla:chunk_rwkv6"
    variant: str            # "fixed" or a catalogue name
    dtype: str              # "fp32" | "bf16" | "fp16"
    decay: float            # per-step log-decay magnitude m: g = -m * U(0.05, 1)
    T: int
    chunk_size: int | None = None
    B: int = 1
    H: int = 2
    K: int = 32
    V: int = 32
    M: int = 32
    seed: int = 0
    h0: bool = True          # an initial state is passed (its gradient is then measured too)
    dht: bool = True         # the final state gets a random cotangent (False: zeros)
    q_scale: float = 1.0     # the queries (q, or RWKV-7's r) are multiplied by it: GSA's slot logits grow with it

    @property
    def shape(self) -> registry.Shape:
        return registry.Shape(self.B, self.T, self.H, self.K, self.V, self.M)


# --- one setting -------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=4)
def _exact(op: str, dtype: str, decay: float, shape: registry.Shape, seed: int, h0: bool = True, dht: bool = True,
           q_scale: float = 1.0):
    """The float64 reference on the rounded inputs (shared by every variant and chunk size of one setting)."""
    spec = registry.get(*_split(op))
    inputs = scale_queries(spec.inputs(shape, decay=decay, initial_state=h0, seed=seed), q_scale)
    rounded = harness.leaves(inputs, DTYPES[dtype], runtime.device())
    exact, cot = harness.exact_run(spec.reference, rounded, seed=seed, state_grad=dht, device=_reference_device())
    return rounded, exact, cot


def scale_queries(inputs: dict, q_scale: float) -> dict:
    """`inputs` with the queries (`q`, or RWKV-7's `r`) multiplied by `q_scale` before rounding to the dtype."""
    if q_scale == 1.0:
        return inputs
    name = "q" if "q" in inputs else "r"
    return inputs | {name: inputs[name] * q_scale}


def _reference_device() -> str:
    return "cuda" if runtime.device() == "cuda" else "cpu"  # float64 on the GPU: seconds, not minutes, at T = 4096


def _split(label: str) -> tuple[str, str]:
    library, _, name = label.rpartition(":")
    return name, library or "fla_lab"


def measure(setting: Setting) -> dict:
    """Run one setting: the op forward and backward against the float64 reference. Never raises."""
    spec = registry.get(*_split(setting.op))
    start = time.perf_counter()
    rounded, exact, cot = _exact(setting.op, setting.dtype, setting.decay, setting.shape, setting.seed,
                                 setting.h0, setting.dht, setting.q_scale)
    record = asdict(setting) | {"status": "right", "message": "", "nonfinite": {}, "errors": {},
                                "errors_unfloored": {}}
    try:
        with _quiet():
            got = harness.run(spec.op(setting.variant, setting.chunk_size), harness.leaves(rounded), cot)
    except Exception as exc:  # a kernel that fails to compile or launch is a result, not a crash of the sweep
        record.update(status="raises", message=f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200]}")
        return record | {"seconds": time.perf_counter() - start}
    record.update(_compare(got, exact, DTYPES[setting.dtype]))
    return record | {"seconds": time.perf_counter() - start}


def _compare(got: harness.Run, exact: harness.Run, dtype: torch.dtype) -> dict:
    pairs = {"o": (got.o, exact.o), **{n: (got.states[n], s) for n, s in exact.states.items()},
             **{f"d{n}": (got.grads[n], g) for n, g in exact.grads.items()}}
    nonfinite = {n: int((~torch.isfinite(x)).sum()) for n, (x, _) in pairs.items()}
    errors = {"o": check.rel_error(got.o, exact.o)}
    errors.update({n: check.rel_error(got.states[n], s) for n, s in exact.states.items()})
    errors.update({f"d{n}": e for n, e in check.grad_errors(exact.grads, got.grads).items()})
    unfloored = {n: check.rel_error(x, r) for n, (x, r) in pairs.items()}
    tol = check.tolerance(dtype)
    over = [n for n, e in errors.items() if not e <= (tol.grad if n.startswith("d") else tol.fwd)]
    status = "nonfinite" if any(nonfinite.values()) else ("wrong" if over else "right")
    first = next((check.nonfinite_census(x).first for n, (x, _) in pairs.items() if nonfinite[n] and x.dim() == 4),
                 None)
    state_max = max(float(s.abs().max()) for s in exact.states.values())
    return {"status": status, "nonfinite": {n: c for n, c in nonfinite.items() if c}, "errors": errors,
            "errors_unfloored": unfloored, "beyond_tolerance": over, "first_bad": first, "state_max": state_max}


def _quiet():
    import contextlib
    import warnings

    from fla_lab.ops import contract

    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    stack.enter_context(contract.value_checks(False))  # the atlas measures kernels, not the input contract
    return stack


def worst_error(record: dict) -> float:
    """The largest (scale-aware) error of a record; inf when non-finite, nan when it raised."""
    if record["status"] == "raises":
        return math.nan
    if record["status"] == "nonfinite":
        return math.inf
    return max(record["errors"].values())


# --- the disk cache ----------------------------------------------------------------------------------------------

@functools.cache
def source_hash(label: str) -> str:
    """fla_lab: a hash of the kernels, the reference and the harness; an external library: its version."""
    name, library = _split(label)
    if library != "fla_lab":
        return "flash-linear-attention " + _version("flash-linear-attention")
    package = Path(__file__).resolve().parents[1]
    files = sorted((package / "ops").rglob("*.py")) + [package / "spec" / n for n in ("reference.py", "harness.py", "check.py")]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def environment() -> dict:
    info = runtime.describe()
    return {"torch": info["torch"], "triton": info["triton"], "device": info.get("gpu", info["mode"])}


class Cache:
    """One JSON file per setting under `folder`, named by the hash of (setting, source hash, environment)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def path(self, setting: Setting) -> Path:
        fields = asdict(setting)
        if fields["q_scale"] == 1.0:  # the key of a setting from before the axis existed
            del fields["q_scale"]
        key = json.dumps([fields, source_hash(setting.op), environment()], sort_keys=True)
        return self.folder / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"

    def get(self, setting: Setting) -> dict | None:
        path = self.path(setting)
        return json.loads(path.read_text()) if path.exists() else None

    def put(self, setting: Setting, record: dict) -> None:
        self.path(setting).write_text(json.dumps(record, default=_jsonable))


def _jsonable(x):
    return float(x) if isinstance(x, (float, int)) else str(x)


def default_cache() -> Cache:
    return Cache(Path.home() / ".cache" / "fla_lab" / "atlas")


# --- sweeps ------------------------------------------------------------------------------------------------------

def settings(ops, variants=None, dtypes=("fp32",), decays=DECAYS, lengths=(64,), chunk_sizes=(None,),
             combinations=COMBINATIONS, q_scales=(1.0,), **shape):
    """Every setting of the grid, ordered so that settings sharing a float64 reference run back to back.
    `combinations`: the (h0, dht) pairs to sweep (`COMBINATIONS`), or their names (`combination_name`);
    `q_scales`: the queries' scales (`Setting.q_scale`)."""
    pairs = [parse_combination(c) if isinstance(c, str) else tuple(c) for c in combinations]
    out = []
    for op in ops:
        spec = registry.get(*_split(op))
        wanted = [v for v in (variants or spec.variants) if v in spec.variants]
        sizes = [c for c in chunk_sizes if c is None or c in spec.chunk_sizes] or [None]
        for dtype in dtypes:
            for T in lengths:
                for decay in decays:
                    for q_scale in q_scales:
                        for h0, dht in pairs:
                            out += [Setting(spec.label, v, dtype, float(decay), T, c, **shape, h0=h0, dht=dht,
                                            q_scale=float(q_scale)) for v in wanted for c in sizes]
    return out


def sweep(todo: list[Setting], cache: Cache | None = None, progress: bool = True) -> list[dict]:
    """Measure every setting (from the cache when it holds it), with a progress bar."""
    from tqdm.auto import tqdm

    records = []
    for setting in tqdm(todo, desc="atlas", disable=not progress, leave=False):
        record = cache.get(setting) if cache else None
        if record is None:
            record = measure(setting)
            if cache:
                cache.put(setting, record)
        records.append(record)
    return records


def table(records: list[dict]) -> list[tuple]:
    """(op, variant, dtype, T, chunk, first decay not right, status there, worst error where right, combinations not
    right): one row per line of the atlas over every (h0, dht) combination, the short form the README shows. The last
    item maps each combination that is not right at some decay to its statuses there, e.g. {"no-h0,dht": "wrong"}."""
    rows = {}
    for r in sorted(records, key=lambda r: r["decay"]):
        key = (r["op"], line_label(r), r["dtype"], r["T"], r["chunk_size"])
        first = rows.setdefault(key, {"bad": None, "status": "right", "worst": 0.0, "failing": {}})
        if r["status"] != "right" and first["bad"] is None:
            first.update(bad=r["decay"], status=r["status"])
        if r["status"] == "right":
            first["worst"] = max(first["worst"], worst_error(r))
        else:
            first["failing"].setdefault(combination_name(*combination_of(r)), set()).add(r["status"])
    return [(*k, v["bad"], v["status"], v["worst"], _statuses_by_combination(v["failing"])) for k, v in rows.items()]


def line_label(record: dict) -> str:
    """The record's variant, with its query scale when that is not 1 ("fixed, q x100")."""
    q_scale = record.get("q_scale", 1.0)
    return record["variant"] if q_scale == 1.0 else f"{record['variant']}, q x{q_scale:g}"


def _statuses_by_combination(failing: dict[str, set]) -> dict[str, str]:
    order = [combination_name(*c) for c in COMBINATIONS]
    return {name: "/".join(s for s in STATUSES if s in failing[name])
            for name in sorted(failing, key=lambda n: order.index(n) if n in order else len(order))}


def format_table(records: list[dict]) -> str:
    """`table` as aligned text; the last column names the (h0, dht) combinations that are not right somewhere."""
    lines = [f"{'op':<28} {'variant':<20} {'dtype':<5} {'T':>5} {'chunk':>5}  {'first m not right':<22} "
             f"{'worst error while right':>10}  combinations not right"]
    for op, variant, dtype, T, chunk, bad, status, worst, failing in table(records):
        where = "-" if bad is None else f"{bad:g} ({status})"
        which = ", ".join(f"{name} ({statuses})" for name, statuses in failing.items()) or "-"
        lines.append(f"{op:<28} {variant:<20} {dtype:<5} {T:>5} {chunk or '-':>5}  {where:<22} {worst:>23.1e}  "
                     f"{which}")
    return "\n".join(lines)


# --- figures -----------------------------------------------------------------------------------------------------

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


# --- a saved atlas, a few lines at a time -------------------------------------------------------------------------
# `plot_atlas` draws every line of a sweep in a grid: the GPU run's thirteen lines make a 2310 px figure, which a
# notebook shrinks to its ~900 px column, 9 pt text to 3.5 pt. These draw chosen lines one under another, each at
# notebook width (`viz.NOTEBOOK_WIDTH`), so the figure is shown unscaled and its text stays 9 pt or more.

GPU_RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "atlas_gpu.json"

# The GPU atlas's lines that notebook 06's "Going further" describes, in the order it names them: the three catalogued
# bugs the run swept, upstream's fused_recurrent_rwkv6, and fla_lab's chunk_gsa (where its worst error is).
# figures/atlas_gpu_lines.png is `viz.save(plot_lines(load(), NAMED_LINES), "atlas_gpu_lines")`.
NAMED_LINES = (("chunk_rwkv6", "exclusive_reference"), ("fused_recurrent_rwkv6", "transposed_h0_mask"),
               ("chunk_gsa", "unmasked_padding"), ("fla:fused_recurrent_rwkv6", "fixed"), ("chunk_gsa", "fixed"))


def load(path: str | Path = GPU_RESULTS) -> list[dict]:
    """The records of an atlas JSON that `write` wrote; by default the GPU run's (`benchmarks/atlas_gpu.py`: bf16,
    B=1, H=4, K=V=M=64, T in {512, 4096}, fla_lab's ops and FLA 0.6.0's; its device is in the file). Nothing is
    recomputed."""
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

"""Notebook 03: RWKV6's exclusive decay and the reference row that overflowed (upstream #77, the RWKV6 half).

The chunked kernel factorises the decay between a query row t and an earlier key row s around a reference row
gn: `exp(ge[t] - gi[s]) = exp(ge[t] - gn) * exp(gn - gi[s])`. RWKV6's queries read the *exclusive* cumulative
decay `ge[t] = gi[t-1]`; with the inclusive `gn = gi[start]` (de4235fd) the first query row of a sub-chunk gets
`exp(ge[start] - gi[start]) = exp(|g[start]|)`, which overflows fp32 once |g| > 88.72. The fix 0c1c0b65 moves the
reference row (the row is notebook 03a's exercise). Everything here runs the real kernel `chunk_rwkv6` with and
without `bug="exclusive_reference"`, against the float64 spec `reference.recurrent_rwkv6`.
"""
from __future__ import annotations

import functools
import math

import torch

from fla_lab.spec import check, harness, markers, reference
from fla_lab.teaching import exercises
from fla_lab import runtime
from fla_lab.tools import viz, widgets

BUG = "exclusive_reference"
NAMES = ("r", "k", "v", "w")
BC = 16  # rows per sub-chunk, as in fla_lab/ops/common/chunk.py
FP32_EXP_MAX = viz.EXP_OVERFLOW[torch.float32]  # log(float32 max) = 88.72: exp() of more is inf
GRADS = ("r", "k", "v", "w", "u", "initial_state")
# Measured on a GPU: the decay knob m at which the buggy forward first turns non-finite, `inputs(m, T=128, K=16)`,
# by bisection; tests/test_gpu_quoted_numbers.py bisects again on the GPU it runs on and fails where a value moved.
# On a GPU `tl.dot` takes fp16/bf16 operands (`launch.Precision.dot`): the query factor q * exp(|g|) passes fp16's
# 65504 at |g| ~ 11, bf16 has fp32's range. The fixed kernel stayed finite (and within tolerance) up to m = 1e4
# in every dtype and chunk size.
GPU_THRESHOLDS = {"fp32": {16: math.inf, 32: 89.64, 64: 89.64}, "fp16": {16: math.inf, 32: 10.84, 64: 10.84},
                  "bf16": {16: math.inf, 32: 89.66, 64: 89.66}}
SWEEP_DECAYS = (1e-3, 1e-1, 1.0, 10.0, 90.0, 100.0, 1e3, 1e4)  # 90 and 100 bracket T = 64's threshold, 92.7


def inputs(decay: float, T: int = 64, K: int = 16, V: int = 16, seed: int = 0,
           H: int = 1) -> dict[str, torch.Tensor]:
    """RWKV6 inputs (B = 1, H heads) with per-step log-decay `w = -decay * U(0.05, 1)` (`harness.gated_inputs`)."""
    return harness.gated_inputs(1, T, H, K, V, decay=decay, bonus=True, names=NAMES, seed=seed)


def chunk_op(bug: str | None, chunk_size: int = 64, row=None):
    """`chunk_rwkv6` with the bug switch and chunk size bound, in `harness.compare`'s call form; `row`: a
    `@triton.jit` helper `(gi, i_start, o_k, HK)` -> pointers of gn for the REFERENCE_ROW slot of its score and dq
    kernels (`chunk_rwkv6(..., helper=row)`), in place of the bug switch."""
    from fla_lab.ops import chunk_rwkv6

    if row is not None:
        return functools.partial(chunk_rwkv6, chunk_size=chunk_size, helper=row)
    return functools.partial(chunk_rwkv6, chunk_size=chunk_size, bug=bug)


def sub_chunk_starts(T: int, chunk_size: int) -> list[int]:
    """The rows that start a sub-chunk with an earlier sub-chunk in its chunk: where the reference row matters."""
    return [c + i for c in range(0, T, chunk_size) for i in range(BC, chunk_size, BC) if c + i < T]


def first_row_decays(decay: float, T: int = 64, chunk_size: int = 64, K: int = 16, seed: int = 0) -> dict[int, float]:
    """{first row of a later sub-chunk: the largest |w| over its channels} for `inputs(decay, T, K)`.

    The buggy query factor on that row is exp(|w|) per channel: the row turns non-finite iff this exceeds 88.72.
    """
    w = inputs(decay, T, K, K, seed)["w"][0, :, 0]
    return {s: float(-w[s].min()) for s in sub_chunk_starts(T, chunk_size)}


def first_row_miss_rate(decay: float = 100.0, T: int = 1024, draws: int = 200, K: int = 16) -> dict[str, float]:
    """How often a first row stays finite under the bug: no channel's |w| = decay * U passes 88.72.

    measured: over `draws` seeds of `inputs(decay, T)`; predicted: P(U <= 88.72 / decay)^K for U ~ U(0.05, 1)."""
    tops = [top for seed in range(draws) for top in first_row_decays(decay, T, K=K, seed=seed).values()]
    below = min(max((FP32_EXP_MAX / decay - 0.05) / 0.95, 0.0), 1.0)
    return {"measured": sum(top <= FP32_EXP_MAX for top in tops) / len(tops), "predicted": below ** K,
            "rows": len(tops)}


# ---------------------------------------------------------------------------------------------------- reproduce


def run_with_grads(x: dict[str, torch.Tensor], bug: str | None, chunk_size: int = 64,
                   dtype: torch.dtype = torch.float32, seed: int = 0, row=None) -> dict[str, torch.Tensor]:
    """The kernel's output `o`, final state `ht` and every input gradient (`d<name>`) under a random cotangent of
    `o`, in fp32 (`row`: see `chunk_op`)."""
    ours = harness.leaves(x, dtype, runtime.device())  # initial_state stays fp32; on the kernels' device
    o, ht = chunk_op(bug, chunk_size, row)(**ours, output_final_state=True)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(seed + 1)).to(o.device, o.dtype)  # CPU-seeded
    (o * do).sum().backward()
    return {"o": o.detach().float().cpu(), "ht": ht.detach().float().cpu(),
            **{f"d{n}": ours[n].grad.float().cpu() for n in GRADS}}


def census(tensors: dict[str, torch.Tensor]) -> dict[str, check.Census]:
    """`check.nonfinite_census` of each tensor (time-major ones `[B, T, H, D]` report the first time step)."""
    dims = {"du": ("h", "k"), "ht": ("b", "h", "k", "v"), "dinitial_state": ("b", "h", "k", "v")}
    return {n: check.nonfinite_census(t, dims.get(n, ("b", "t", "h", "d"))) for n, t in tensors.items()}


def bad_rows(x: torch.Tensor) -> list[int]:
    """Time steps of a `[B, T, H, D]` tensor that hold a non-finite value."""
    return torch.nonzero((~torch.isfinite(x)).flatten(2).any(-1).any(0)).flatten().tolist()


def scores(x: dict[str, torch.Tensor], bug: str | None, chunk_size: int = 64, row=None) -> torch.Tensor:
    """The intra-chunk scores A [T, chunk_size] (head 0) of the kernel's own score stage
    (`fla_lab.ops.gla.chunk.key_side_scores`), with the bug switch or `row` in its REFERENCE_ROW slot."""
    from fla_lab.ops.gla.chunk import key_side_scores

    r, k, w, u = harness.on_device((x["r"], x["k"], x["w"], x["u"]))
    return key_side_scores(r, k, w, u, chunk_size, bug=bug, helper=row)[0, :, 0].cpu()


def score_census(x: dict[str, torch.Tensor], bug: str | None, chunk_size: int = 64,
                 row=None) -> dict[int, list[int]]:
    """Which intra-chunk scores A[t, s] the forward produces non-finite: {row t: [columns s within the chunk]}."""
    bad = ~torch.isfinite(scores(x, bug, chunk_size, row))  # [T, BT]
    return {int(t): torch.nonzero(bad[t]).flatten().tolist() for t in torch.nonzero(bad.any(-1)).flatten()}


def spans(columns: list[int]) -> str:
    """[0, 1, 2, 5] -> '0..2, 5': compact print of index lists."""
    out, start = [], None
    for i, c in enumerate(columns):
        if start is None:
            start = c
        if i + 1 == len(columns) or columns[i + 1] != c + 1:
            out.append(f"{start}..{c}" if c > start else f"{c}")
            start = None
    return ", ".join(out)


def decade(x: float) -> str:
    """'< 1e-07' for 8.3e-08: how notebooks print kernel rounding errors, which move with every kernel tweak."""
    if not math.isfinite(x):
        return "non-finite"
    return "0" if x == 0 else f"< 1e{math.floor(math.log10(x)) + 1:+03d}"


def summary(comparison: harness.Comparison) -> str:
    """One stable line for a `harness.Comparison`: what was checked, the worst error's decade, pass/fail."""
    errors = comparison.errors
    bad = sorted(comparison.failures())
    return (f"{len(errors)} checks ({', '.join(errors)}): worst error {decade(max(errors.values()))}, "
            + ("all within tolerance" if not bad else f"failing: {', '.join(bad)}"))


# ---------------------------------------------------------------------------------------------------- explain


def exponents(log_decay: float = -100.0, reference_row: str = "buggy", chunk_size: int = 32) -> dict:
    """The exponents the kernel exponentiates for query sub-chunk 1 against key sub-chunk 0 (one channel,
    constant per-step log-decay, float64): query side `ge[t] - gn`, key side `gn - gi[s]`.

    `reference_row="buggy"`: gn = gi[start] (inclusive, de4235fd); "fixed": the reference row of 0c1c0b65.
    """
    gi = log_decay * torch.arange(1, chunk_size + 1, dtype=torch.float64)  # inclusive cumulative decay
    ge = torch.cat([gi.new_zeros(1), gi[:-1]])  # exclusive: ge[t] = gi[t - 1]
    start = BC
    gn = gi[start] if reference_row == "buggy" else gi[start - 1]
    keys, queries = torch.arange(0, start), torch.arange(start, 2 * BC)
    return {"key_rows": keys, "key_exp": gn - gi[keys], "query_rows": queries, "query_exp": ge[queries] - gn}


EXPONENT_FLOOR = -450.0  # the exponents figure's lower edge: points below it are drawn as a marker on the edge


EXPONENT_TITLES = {"buggy": "bug: gn = gi[start] (inclusive)", "fixed": "fix 0c1c0b65: every exponent <= 0"}


def plot_exponents(log_decay: float = -100.0, panels: tuple[str, ...] = ("buggy", "fixed")):
    """The exponents of each reference row in `panels` ("buggy", "fixed"), side by side. Exponents below
    EXPONENT_FLOOR (down to 16 * log_decay) are off scale: drawn as open triangles on the lower edge, so no row
    silently disappears."""
    fig, axes = viz.figure(ncols=len(panels), width=4.7, height=3.6)
    for ax, which in zip(axes, panels):
        title = EXPONENT_TITLES[which]
        e = exponents(log_decay, which)
        ax.axhspan(FP32_EXP_MAX, 1e9, color="#d62728", alpha=0.12)
        ax.axhline(FP32_EXP_MAX, color="#d62728", lw=0.8)
        ax.text(0.3, FP32_EXP_MAX + 12, "exp() = inf in fp32 (> 88.7)", fontsize=9, color="#d62728")
        ax.axhline(0, color="k", lw=0.6)
        for rows, exps, marker, color, label in ((e["key_rows"], e["key_exp"], "s", "#1f77b4", "key side gn - gi[s]"),
                                                 (e["query_rows"], e["query_exp"], "o", "#ff7f0e",
                                                  "query side ge[t] - gn")):
            shown = exps >= EXPONENT_FLOOR
            ax.plot(rows[shown], exps[shown], marker, ms=4, color=color, label=label)
            ax.plot(rows[~shown], torch.full((int((~shown).sum()),), EXPONENT_FLOOR + 12), "v", ms=4, mfc="none",
                    color=color)
        ax.plot([], [], "v", ms=4, mfc="none", color="grey", label=f"off scale (below {EXPONENT_FLOOR:g})")
        first = float(e["query_exp"][0])
        ax.annotate(f"first query row: {first:+.0f}", (BC, first), (BC + 2.5, first + 55), fontsize=9,
                    arrowprops=dict(arrowstyle="->", lw=0.8))
        ax.axvline(BC - 0.5, color="grey", ls=":", lw=0.8)
        ax.set(ylim=(EXPONENT_FLOOR, 220), xlabel="row in chunk (keys: sub-chunk 0, queries: sub-chunk 1)",
               ylabel="exponent", title=title)
        ax.title.set_fontsize(9)
        ax.legend(fontsize=9, loc="center right")
    what = "what each row exponentiates, " if len(panels) > 1 else ""  # a single panel has no room for it
    fig.suptitle(f"{what}per-step log-decay {log_decay:g} (one channel)", fontsize=10)
    return fig


# ---------------------------------------------------------------------------------------------------- thresholds


def predicted_threshold(chunk_size: int, T: int = 128, K: int = 16, seed: int = 0) -> float:
    """The decay knob above which some sub-chunk's first row has |g| > 88.72: 88.72 / max U over those rows.

    `inputs(decay)` draws w = -decay * U with the same U for every decay, so the first overflow is at the
    largest U on a sub-chunk start row (inf for chunk 16: no chunk holds two sub-chunks).
    """
    starts = sub_chunk_starts(T, chunk_size)
    if not starts:
        return math.inf
    U = -inputs(1.0, T, K, K, seed)["w"][0, starts, 0]
    return FP32_EXP_MAX / float(U.max())


def forward_finite(decay: float, chunk_size: int, bug: str | None = BUG, T: int = 128, K: int = 16,
                   seed: int = 0) -> bool:
    x = inputs(decay, T, K, K, seed)
    with torch.no_grad():
        o, _ = chunk_op(bug, chunk_size)(**harness.on_device(x))
    return bool(torch.isfinite(o).all())


def measured_threshold(chunk_size: int, lo: float = 1.0, hi: float = 1e4, steps: int = 14, T: int = 128,
                       K: int = 16, seed: int = 0) -> float:
    """Bisection (geometric) on the decay knob for the first non-finite output of the buggy forward.

    inf when the kernel is still finite at `hi`. The knob multiplies a fixed U, so finiteness is monotone.
    """
    if forward_finite(hi, chunk_size, T=T, K=K, seed=seed):
        return math.inf
    for _ in range(steps):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if forward_finite(mid, chunk_size, T=T, K=K, seed=seed) else (lo, mid)
    return hi


# ---------------------------------------------------------------------------------------------------- the clamp


def clamp_log_decay(w: torch.Tensor, level: float = 12.0) -> torch.Tensor:
    """The workaround of #77 / PR #78 (rejected): bound the per-step log-decay the kernel receives, w >= -level
    (|w| < 12 for RWKV6). With w = -exp(w_raw) that is the same as w_raw <= log(level) (2.48 for 12)."""
    return w.clamp(min=-level)


def clamp_cost(decay: float, level: float = 12.0, T: int = 64, K: int = 16, seed: int = 0) -> dict[str, float]:
    """What the clamp changes at per-step log-decay -decay * U(0.05, 1), float64 and the real buggy kernel.

    - model: rel. error of the exact recurrence run on clamped w against the exact recurrence on the true w;
    - buggy kernel on clamped w: the same comparison with the kernel users were running (finite now);
    - clamped: the fraction of decays the clamp changes, whose gradient it also sets to zero.
    """
    x = inputs(decay, T, K, K, seed)
    clamped = {**x, "w": clamp_log_decay(x["w"], level)}
    exact, _ = reference.recurrent_rwkv6(**x)
    model, _ = reference.recurrent_rwkv6(**clamped)
    with torch.no_grad():  # the kernels on their device; check.rel_error brings results to the CPU
        kernel, _ = chunk_op(BUG)(**harness.on_device(clamped))
        fixed, _ = chunk_op(None)(**harness.on_device(x))
    return {"model": check.rel_error(model, exact), "buggy kernel, clamped w": check.rel_error(kernel, exact),
            "fixed kernel, true w": check.rel_error(fixed, exact), "clamped": float((x["w"] < -level).double().mean())}


def clamp_model_errors(levels, decays, T: int = 64, K: int = 16, seed: int = 0) -> dict[float, list[float]]:
    """{decay: [rel. error of the clamped exact model vs the true one, per clamp level]} (float64 only)."""
    out = {}
    for decay in decays:
        x = inputs(decay, T, K, K, seed)
        exact, _ = reference.recurrent_rwkv6(**x)
        out[decay] = [check.rel_error(reference.recurrent_rwkv6(**{**x, "w": clamp_log_decay(x["w"], c)})[0], exact)
                      for c in levels]
    return out


def plot_clamp_cost(levels=(1, 2, 4, 6, 8, 10, 12, 16, 20, 24, 30), decays=(30.0, 100.0, 1e4)):
    import matplotlib
    import numpy as np

    errors = clamp_model_errors(levels, decays)
    fig, (ax,) = viz.figure(width=6.2, height=4.6)
    for i, decay in enumerate(decays):
        ys = np.array(errors[decay])
        ax.plot(levels, np.where(ys > 0, ys, np.nan), "o-", ms=3, lw=2.5 - 0.7 * i,
                color=matplotlib.colormaps["viridis"](i / len(decays)), label=f"true w = -{decay:g}·U(0.05, 1)")
    c = np.linspace(min(levels), max(levels), 200)
    ax.plot(c, np.exp(-c), "k:", lw=0.8, label="e^-level")
    for dtype in (torch.bfloat16, torch.float32):
        ax.axhline(check.tolerance(dtype).fwd, color=viz.DTYPE_COLORS[dtype], ls="--", lw=0.8,
                   label=f"{viz.DTYPE_NAMES[dtype]} forward tolerance")
    own = clamp_cost(100.0, 12.0)["fixed kernel, true w"]
    ax.axhline(own, color="k", ls="-.", lw=0.8, label="fixed kernel's own fp32 error (m = 100)")
    ax.axvline(12, color="grey", lw=0.8)
    ax.text(12.4, 1e-1, "|w| < 12 (#77)", fontsize=9, color="grey")
    ax.set(yscale="log", ylim=(1e-16, 3), xlabel="clamp level: w >= -level",
           ylabel="rel. error of o vs the exact model", title="the clamp changes the model by about e^-level")
    viz.legend_below(ax)
    return fig


# ---------------------------------------------------------------------------------------------------- fix


def verify(decay: float = 1e4, chunk_size: int = 64, bug: str | None = None, dtype=torch.float32, T: int = 64,
           K: int = 16) -> harness.Comparison:
    """`harness.compare` of `chunk_rwkv6` (forward, final state and every gradient) against the float64 spec."""
    return harness.compare(chunk_op(bug, chunk_size), reference.recurrent_rwkv6, inputs(decay, T, K, K),
                           dtype=dtype)


def gla_check(decay: float = 1e4, chunk_size: int = 64, T: int = 64, K: int = 16) -> harness.Comparison:
    """`chunk_gla` at the same decay: its queries are inclusive, gi[start] already lies between both sides."""
    from fla_lab.ops import chunk_gla

    x = harness.gated_inputs(1, T, 1, K, K, decay=decay, seed=0)
    ref = lambda q, k, v, g, **kw: reference.recurrent_gla(q, k, v, g, **kw)  # noqa: E731
    return harness.compare(functools.partial(chunk_gla, chunk_size=chunk_size), ref, x)


# ---------------------------------------------------------------------------------------------------- exercise
# The learner writes the reference-row helper and it runs in the shipped kernels: `chunk_rwkv6(..., helper=)`
# passes it into the REFERENCE_ROW slot of `gated_scores_kernel` (forward scores) and `chunk_bwd_dqk_kernel` (dq),
# where `reference_row` (fla_lab/ops/common/chunk.py) sits by default. The check compares output, final state and every gradient with the
# float64 recurrence; when it fails, a probe with a constant decay reads off which row the helper points at.

EXERCISE = "the reference row gn of chunk_rwkv6"
EXERCISE_DECAYS = {"strong": 100.0, "weak": 0.1}  # the decay knob m of `inputs`: per-step log-decay -m * U(0.05, 1)
# The check's cases: name -> (decay knob, heads, gradients too). One head of K = 16 channels puts gi's rows 16
# elements apart, so a helper with the stride written as 16 (or K) passes there: the last case has 2 heads, rows
# HK = 32 apart. It runs forward only, to keep the check quick under the interpreter: the forward's score kernel
# already reads gn through the helper. It keeps the check's T, so a fixed row of the first case stays in bounds.
EXERCISE_CASES = {"strong decay": (EXERCISE_DECAYS["strong"], 1, True),
                  "weak decay": (EXERCISE_DECAYS["weak"], 1, False),
                  "strong decay, 2 heads": (EXERCISE_DECAYS["strong"], 2, False)}
PROBE_START = 2 * BC  # the probe's query sub-chunk: rows 32..47 of a 64-row chunk, keys 0..31
_LINE = exercises.Sealed("cmV0dXJuIGdpICsgKGlfc3RhcnQgLSAxKSAqIEhLICsgb19r")
_LINE_NOTE = exercises.Sealed("Z24gPSBnaVtzdGFydCAtIDFdID0gZ2Vbc3RhcnRdOiB0aGUgZmlyc3QgcXVlcnkncyBnZSwgYW5kIHRo"
                              "ZSBsYXN0IGVhcmxpZXIga2V5J3MgZ2k=")
SPLIT_LINES = ("b_gq = load_query_decay(", "b_gn = load_reference_decay(", "b_qg = b_q * tl.exp(",
               "b_A += mma(b_qg")


def kernel_lines(fn, needles=SPLIT_LINES) -> str:
    """The lines of a shipped kernel's source that contain one of `needles`, dedented, up to the first line with the
    last needle: the exponent split of `gated_scores_kernel` (fla_lab/ops/gla/chunk.py), read from the code that runs
    (without its markers)."""
    source = markers.source_of(fn).splitlines()
    end = next(i for i, line in enumerate(source) if needles[-1] in line)
    return "\n".join(line.strip() for line in source[:end + 1] if any(n in line for n in needles))


def _answer_stages() -> dict[str, tuple[str, str]]:
    """Stages whose source states an exercise's answer: name -> (the exercise, the check that opens it)."""
    from fla_lab.teaching.lessons import gsa_padding  # here: gsa_padding imports this module

    gsa = (gsa_padding.EXERCISE, "lesson.check_padded_exponent (notebook 03b)")
    return {"reference_row": (EXERCISE, "lesson.check_reference_row (notebook 03a)"),
            "later_rows_exponent": gsa,
            "cols_from_later_subchunks": gsa}  # its loop holds the same row mask (`show_slot`)


def stage_source(*names: str) -> str:
    """The source of the shared chunk stages `names` (fla_lab/ops/common/chunk.py), as the kernels run them, without
    binding the stages module in the notebook's namespace (the shipped kernels hold every fix). A stage that is an
    exercise's answer raises `exercises.NotRevealed` until that exercise is open (its check said PASS, or its last
    hint tier was printed in this kernel)."""
    import importlib

    sealed = _answer_stages()
    for name in names:
        if name in sealed and not exercises.is_open(sealed[name][0]):
            raise exercises.NotRevealed(
                f"stage_source({name!r}): that stage is the answer of the exercise {sealed[name][0]!r}; its source "
                f"shows once {sealed[name][1]} says PASS, or after verdict.hint()'s last tier")
    stages = importlib.import_module("fla_lab.ops.common.chunk")
    return "\n".join(markers.source_of(getattr(stages, name)) for name in names)


def probe_inputs(decay: float = 100.0, T: int = 64, K: int = 16, H: int = 1) -> dict[str, torch.Tensor]:
    """One chunk with a constant per-step log-decay -decay; q = k = 1, u = 0; H heads (rows of gi H * K apart).

    One step already passes 88.72, so a reference row n overflows the query factor on every query row t <= n
    and the key factor on every key row s > n."""
    w = torch.full((1, T, H, K), -decay)
    ones = torch.ones(1, T, H, K)
    return {"r": ones, "k": ones, "w": w, "u": torch.zeros(H, K)}


def reference_row_offset(row, H: int = 1) -> float | None:
    """The row the helper `row` reads for query sub-chunk 32..47 (head 0 of `probe_inputs(H=H)`), relative to its
    first row (0 for the bug's, 15 for "15 or later", negative for a row above the sub-chunk, -1.0 when no score is
    non-finite), measured in the shipped score kernel; None when the non-finite scores fit no single row (a row
    outside the chunk, or no row at all)."""
    bad = ~torch.isfinite(scores(probe_inputs(H=H), None, 64, row)[PROBE_START:PROBE_START + BC, :PROBE_START])
    full_rows = [t for t in range(BC) if bool(bad[t].all())]  # query rows t <= n
    full_cols = [s for s in range(PROBE_START) if bool(bad[:, s].all())]  # key rows s > n
    if not bad.any():
        return -1.0
    if full_rows and full_rows == list(range(len(full_rows))):
        return float(full_rows[-1])  # n = PROBE_START + last broken query row (>= 15: at or past the last one)
    if full_cols and full_cols == list(range(full_cols[0], PROBE_START)) and full_cols[0] > 0:
        return float(full_cols[0] - 1 - PROBE_START)
    return None


def _row_name(offset: float) -> str:
    row = "i_start" if offset == 0 else f"i_start {'+' if offset > 0 else '-'} {abs(offset):g}"
    return row + (" or later" if offset >= BC - 1 else "")


def reference_row_hints(offset: float | None, offset_two_heads: float | None = -1.0) -> tuple[str, ...]:
    """Hint tiers for the row a helper reads: where to look, what is wrong, the line. `offset`: what
    `reference_row_offset` measured with one head (rows of gi 16 apart), `offset_two_heads` with 2 heads (rows 32
    apart): a helper right with one head and wrong with two has its row stride wrong."""
    line = exercises.Sealed.of(f"{_LINE.opened()}  # {exercises.opened(_LINE_NOTE)}")
    if offset == -1 and offset_two_heads != -1:
        lands = ("on no single row" if offset_two_heads is None else
                 f"on row {_row_name(offset_two_heads)} of head 0's rows")
        return exercises.hints(
            "With one head your helper reads a safe row (no score overflows on the probe), with 2 heads it does not. "
            "Rows of gi lie 16 elements apart with one head of 16 channels, 32 apart with 2 heads: look at how your "
            "pointer steps from one row to the next.",
            "The row stride: row t of gi starts at gi + t * HK, where HK = H * K (heads times channels) is the "
            "helper's constexpr argument. A stride written as K or 16 is right only for a single head of 16 "
            f"channels; with 2 heads (HK = 32) your helper lands {lands}. Multiply the row by HK.", line)
    if offset is None:
        return exercises.hints(
            "The non-finite scores follow no single row or column: your helper reads a row outside the chunk of "
            "the query sub-chunk (gi is chunk-local: it restarts at 0 on every chunk's first row).",
            "gn must come from the rows of the same chunk that lie between the earlier keys (rows before i_start) "
            "and the queries (rows from i_start on); rows lie HK elements apart (gi + row * HK + o_k).", line)
    row = _row_name(offset)
    if offset >= BC - 1:
        return exercises.hints(
            "o breaks on most rows of the later sub-chunks, not only near their first rows, and the probe finds why: "
            "every query row's own factor exp(ge[t] - gn) overflows, against every key. Look at the query side, "
            "down to the last row of the sub-chunk.",
            f"Your helper reads row {row}: at or past the last row of the query sub-chunk (a fixed row, such as "
            "the chunk's last, lies there for every sub-chunk before it; so does a row stride larger than HK). The "
            "cumulative decay only falls, so that row's gi lies below every query's ge[t]: ge[t] - gn > 0 on every "
            "query row, and exp overflows once the steps in between pass 88.72. gn must not lie below any query's "
            "ge[t] (and not above any earlier key's gi[s]), so it moves with i_start.", line)
    if offset >= 0:
        return exercises.hints(
            "o breaks only on the first row of a sub-chunk (and a few after it): one query at a time, so look at "
            "the factor a single query owns, exp(ge[t] - gn), on the first row of a sub-chunk.",
            f"Your helper reads row {row}. The cumulative decay only falls, so that row's gi lies below the first "
            "query's ge[start] = gi[start - 1]: ge[start] - gn > 0 there, and exp overflows once one step's |w| "
            "passes 88.72. gn must not lie below any query's ge[t] (and not above any earlier key's gi[s]).", line)
    if offset <= -2:
        return exercises.hints(
            "o breaks on every row of the later sub-chunks at once: a factor all their queries share broke. Look at "
            "the key factor exp(gn - gi[s]) of the last key rows before the sub-chunk.",
            f"Your helper reads row {row}, above the last earlier key's gi[start - 1]: gn - gi[start - 1] > 0 for "
            "that key, and exp overflows once the steps in between pass 88.72. gn must not lie above any earlier "
            "key's gi[s] (and not below any query's ge[t]). A row far from the one you meant points at the pointer "
            "itself: rows lie HK elements apart (gi + row * HK + o_k).", line)
    return exercises.hints(
        "Your helper reads the safe row with one head and with two, yet the results differ from float64: check the "
        "rest of the pointer (the channel offsets o_k).", "", line)


def check_reference_row(row, T: int = 64, chunk_size: int = 64) -> exercises.Verdict:
    """PASS when `chunk_rwkv6` with the learner's `row` helper in its REFERENCE_ROW slot matches the float64
    recurrence in every case of `EXERCISE_CASES`: output, final state and every gradient at strong decay (m = 100),
    the output and final state at weak decay (m = 0.1) and at strong decay with 2 heads (rows of gi HK = 32
    elements apart, not 16). The facts say which tensors fail and at which time steps; the hints follow the row the
    helper reads (`reference_row_offset`, with one head and with two)."""
    refused = exercises.not_a_jit_helper(EXERCISE, row)
    if refused is not None:
        return refused
    facts = []
    for name, (decay, H, grads) in EXERCISE_CASES.items():
        x = inputs(decay, T, H=H)
        comparison = harness.compare(chunk_op(None, chunk_size, row), reference.recurrent_rwkv6, x, grads=grads)
        failing = [n if n in ("o", "ht") else f"d{n}" for n in comparison.errors if n in comparison.failures()]
        checked = "o, ht and every gradient" if grads else "o and ht"
        said = "within tolerance" if not failing else f"failing: {', '.join(failing)}"
        rows = bad_rows(comparison.outputs["o"])
        where = f"; o non-finite at t = {spans(rows)}" if rows else ""
        setting = f"m = {decay:g}" + (f"; rows of gi {H * x['k'].shape[-1]} apart" if H > 1 else "")
        facts.append((not failing, f"{name} ({setting}): {checked} vs float64, worst error "
                                   f"{exercises.fmt(max(comparison.errors.values()))}, {said}{where}"))
    verdict = exercises.verdict(EXERCISE, facts)
    if not verdict.passed:
        offset = reference_row_offset(row)
        verdict.hints = reference_row_hints(offset, reference_row_offset(row, H=2) if offset == -1 else -1.0)
    return verdict


# ---------------------------------------------------------------------------------------------------- sweep


@functools.lru_cache(maxsize=8)
def sweep(decays: tuple[float, ...] = SWEEP_DECAYS, dtypes: tuple[str, ...] = ("fp32", "fp16", "bf16"),
          chunk_size: int = 64, T: int = 64, K: int = 16, progress: bool = True) -> dict:
    """{(dtype name, bug, decay): errors of o, ht and every gradient} (cached: treat the result as read-only)."""
    from tqdm.auto import tqdm

    cases = [(d, b, m) for d in dtypes for b in (BUG, None) for m in decays]
    out = {}
    for name, bug, decay in tqdm(cases, desc="sweep", leave=False, disable=not progress):
        out[(name, bug, decay)] = verify(decay, chunk_size, bug, viz.DTYPES[name], T, K).errors
    return out


def sweep_summary(results: dict) -> dict[str, dict[str, float]]:
    """Per dtype: the smallest decay at which each kernel has a non-finite value, and the fixed kernel's worst
    error (output or gradient) over the sweep."""
    out = {}
    for name in dict.fromkeys(d for d, _, _ in results):
        first = {tag: min((m for d, b, m in results if d == name and b == bug
                           and not math.isfinite(max(results[(d, b, m)].values()))), default=math.inf)
                 for bug, tag in ((BUG, "bug"), (None, "fixed"))}
        worst = max(max(e.values()) for (d, b, _), e in results.items() if d == name and b is None)
        out[name] = {"bug fires at": first["bug"], "fixed fires at": first["fixed"], "fixed worst error": worst}
    return out


def worst_grad(errors: dict[str, float]) -> float:
    grads = [e for n, e in errors.items() if n not in ("o", "ht")]
    return math.inf if any(not math.isfinite(e) for e in grads) else max(grads)


def plot_sweep(results: dict, chunk_size: int = 64, T: int = 64):
    import numpy as np

    dtypes = sorted({d for d, _, _ in results}, key=["fp32", "fp16", "bf16"].index)
    decays = sorted({m for _, _, m in results})
    fig, axes = viz.figure(ncols=len(dtypes), width=3.9, height=3.5)
    top = 10.0
    threshold = predicted_threshold(chunk_size, T)  # in knob units, for the sweep's inputs
    for ax, name in zip(axes, dtypes):
        for bug, color, label, lw in ((BUG, "#d62728", "bug", 3.5), (None, "#1f77b4", "fixed", 1.2)):
            for key, style, what in (("o", "-", "o"), ("grad", "--", "worst grad")):
                ys = np.array([results[(name, bug, m)]["o"] if key == "o" else worst_grad(results[(name, bug, m)])
                               for m in decays])
                ok = np.isfinite(ys)
                ax.plot(np.array(decays)[ok], ys[ok], style, marker=".", lw=lw, color=color, alpha=0.8,
                        label=f"{label}: {what}")
                if (~ok).any():
                    ax.plot(np.array(decays)[~ok], np.full((~ok).sum(), top), "x", ms=8, color=color,
                            label=f"{label}: non-finite" if key == "o" else None)
        ax.axhline(check.tolerance(viz.DTYPES[name]).grad, color="grey", ls=":", lw=0.8, label="gradient tolerance")
        ax.axvline(threshold, color="k", lw=0.6, alpha=0.5)
        ax.set(xscale="log", yscale="log", ylim=(1e-9, 40), xlabel="decay knob m: w = -m·U(0.05, 1)",
               ylabel="rel. error vs float64 reference", title=f"{name}, chunk {chunk_size}")
    axes[-1].legend(fontsize=9, loc="lower left", ncol=2)
    fig.suptitle(f"chunk_rwkv6 against the exact recurrence, T = {T}: x = NaN/inf; vertical line: the bug's "
                 f"threshold for these inputs, m = {threshold:.1f} (88.72 / max U on a first row)", fontsize=9)
    return fig


# ---------------------------------------------------------------------------------------------------- explorer


def plot_setting(decay: float = 100.0, dtype: torch.dtype = torch.float32, chunk_size: int = 64, T: int = 64,
                 K: int = 16):
    """Left: which time steps of o and of each gradient are non-finite, bug vs fixed. Right: their errors."""
    import matplotlib.colors as mcolors
    import numpy as np

    x = inputs(decay, T, K, K)
    rows, labels = [], []
    for bug, tag in ((BUG, "bug"), (None, "fixed")):
        got = run_with_grads(x, bug, chunk_size, dtype)
        for n in ("o", "dr", "dv", "dw"):
            bad = np.zeros(T)
            bad[bad_rows(got[n])] = 1
            rows.append(bad)
            labels.append(f"{tag}: {n}")
    fig, (left, right) = viz.figure(ncols=2, width=4.8, height=3.5)
    left.imshow(np.array(rows), aspect="auto", interpolation="nearest",
                cmap=mcolors.ListedColormap(["#e8e8e8", "#d62728"]), vmin=0, vmax=1)
    for s, top in first_row_decays(decay, T, chunk_size, K).items():
        left.axvline(s, color="k", lw=0.4, alpha=0.4)
        left.text(s + 0.5, -0.6, f"{top:.3g}", fontsize=9, va="bottom",
                  color="#d62728" if top > FP32_EXP_MAX else "k")
    left.set_yticks(range(len(labels)), labels, fontsize=9)
    left.set_ylim(len(labels) - 0.5, -1.3)
    left.set(xlabel="time step t (lines: first rows of later sub-chunks,\nlabelled with their largest |w|; red > 88.7)",
             title=f"non-finite rows (red), w = -{decay:g}·U(0.05, 1), T = {T}")
    left.title.set_fontsize(9)
    names = ["o", "ht", *GRADS]
    pos = np.arange(len(names))
    for offset, bug, color, tag in ((-0.2, BUG, "#d62728", "bug"), (0.2, None, "#1f77b4", "fixed")):
        errors = verify(decay, chunk_size, bug, dtype, T, K).errors
        vals = np.array([errors[n] for n in names])
        ok = np.isfinite(vals)
        right.bar(pos[ok] + offset, np.maximum(vals[ok], 1e-12), width=0.4, color=color, label=tag, log=True)
        right.plot(pos[~ok] + offset, np.full((~ok).sum(), 3.0), "x", color=color, ms=8)
    tol = check.tolerance(dtype)  # `harness.Comparison`: o and ht are held to the forward tolerance
    right.hlines(tol.fwd, -0.5, 1.5, color="k", ls="--", lw=0.8, label="output tolerance (o, ht)")
    right.hlines(tol.grad, 1.5, len(names) - 0.5, color="grey", ls=":", lw=0.8, label="gradient tolerance")
    right.set_xticks(pos, ["o", "ht", *(f"d{n}" for n in GRADS)], fontsize=9, rotation=30, ha="right")
    right.set(ylim=(1e-12, 1e5), ylabel="rel. error vs reference (x: non-finite)",
              title=f"{viz.DTYPE_NAMES[dtype]}, chunk {chunk_size}")
    right.title.set_fontsize(9)
    right.legend(fontsize=9, loc="upper right", ncol=2)  # above the bars and the x marks
    return fig


def explorer():
    return widgets.explorer(
        plot_setting,
        decay=widgets.log_slider("decay knob m (w = -m·U)", 100.0, -3, 4),
        dtype=widgets.dtype_choice(),
        chunk_size=widgets.chunk_size_choice(),
    )

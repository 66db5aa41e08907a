"""Notebook 03: RWKV6's exclusive decay and the reference row that overflowed (upstream #77, the RWKV6 half).

The chunked kernel factorises the decay between a query row t and an earlier key row s around a reference row
gn: `exp(ge[t] - gi[s]) = exp(ge[t] - gn) * exp(gn - gi[s])`. RWKV6's queries read the *exclusive* cumulative
decay `ge[t] = gi[t-1]`; with the inclusive `gn = gi[start]` (de4235fd) the first query row of a sub-chunk gets
`exp(ge[start] - gi[start]) = exp(|g[start]|)`, which overflows fp32 once |g| > 88.72. The fix 0c1c0b65 takes
`gn = gi[start - 1]`. Everything here runs the real kernel `chunk_rwkv6` with and without
`bug="exclusive_reference"`, against the float64 spec `reference.recurrent_rwkv6`.
"""
from __future__ import annotations

import functools
import math
import pathlib

import torch
import triton
import triton.language as tl

from fla_lab import bugs, check, exercises, harness, reference, viz, widgets

BUG = "exclusive_reference"
NAMES = ("r", "k", "v", "w")
BC = 16  # rows per sub-chunk, as in fla_lab.ops.common.chunk_stages
FP32_EXP_MAX = viz.EXP_OVERFLOW[torch.float32]  # log(float32 max) = 88.72: exp() of more is inf
GRADS = ("r", "k", "v", "w", "u", "initial_state")
# Measured on an NVIDIA H200 (torch 2.11, triton 3.6): the decay knob m at which the buggy forward first turns
# non-finite, `inputs(m, T=128, K=16)`, by bisection. On a GPU `tl.dot` takes fp16/bf16 operands
# (`common.dot_dtype`): the query factor q * exp(|g|) passes fp16's 65504 at |g| ~ 11, bf16 has fp32's range.
# The fixed kernel stayed finite (and within tolerance) up to m = 1e4 in every dtype and chunk size.
GPU_THRESHOLDS = {"fp32": {16: math.inf, 32: 89.64, 64: 89.64}, "fp16": {16: math.inf, 32: 10.84, 64: 10.84},
                  "bf16": {16: math.inf, 32: 89.66, 64: 89.66}}
SWEEP_DECAYS = (1e-3, 1e-1, 1.0, 10.0, 90.0, 100.0, 1e3, 1e4)  # 90 and 100 bracket T = 64's threshold, 92.7


def inputs(decay: float, T: int = 64, K: int = 16, V: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    """RWKV6 inputs (B = H = 1) with per-step log-decay `w = -decay * U(0.05, 1)` (`harness.gated_inputs`)."""
    return harness.gated_inputs(1, T, 1, K, V, decay=decay, bonus=True, names=NAMES, seed=seed)


def chunk_op(bug: str | None, chunk_size: int = 64):
    """`chunk_rwkv6` with the bug switch and chunk size bound, in `harness.compare`'s call form."""
    from fla_lab.ops import chunk_rwkv6

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
                   dtype: torch.dtype = torch.float32, seed: int = 0) -> dict[str, torch.Tensor]:
    """The kernel's output `o`, final state `ht` and every input gradient (`d<name>`) under a random cotangent of
    `o`, in fp32."""
    ours = {n: (t if n == "initial_state" else t.to(dtype)).detach().clone().requires_grad_(True)
            for n, t in x.items()}
    o, ht = chunk_op(bug, chunk_size)(**ours, output_final_state=True)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(seed + 1)).to(o.dtype)
    (o * do).sum().backward()
    return {"o": o.detach().float(), "ht": ht.detach().float(), **{f"d{n}": ours[n].grad.float() for n in GRADS}}


def census(tensors: dict[str, torch.Tensor]) -> dict[str, check.Census]:
    """`check.nonfinite_census` of each tensor (time-major ones `[B, T, H, D]` report the first time step)."""
    dims = {"du": ("h", "k"), "ht": ("b", "h", "k", "v"), "dinitial_state": ("b", "h", "k", "v")}
    return {n: check.nonfinite_census(t, dims.get(n, ("b", "t", "h", "d"))) for n, t in tensors.items()}


def bad_rows(x: torch.Tensor) -> list[int]:
    """Time steps of a `[B, T, H, D]` tensor that hold a non-finite value."""
    return torch.nonzero((~torch.isfinite(x)).flatten(2).any(-1).any(0)).flatten().tolist()


def score_census(x: dict[str, torch.Tensor], bug: str | None, chunk_size: int = 64) -> dict[int, list[int]]:
    """Which intra-chunk scores A[t, s] the forward produces non-finite: {row t: [columns s within the chunk]}.

    Runs the kernel's own score stage (`fla_lab.ops.common.chunk_pass.key_side_scores`) to read the matrix it builds.
    """
    from fla_lab.ops.common.chunk_pass import key_side_scores

    A = key_side_scores(x["r"], x["k"], x["w"], x["u"], chunk_size, bug_exclusive_reference=bug == BUG)
    bad = ~torch.isfinite(A[0, :, 0])  # [T, BT]
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

    `reference_row="buggy"`: gn = gi[start] (inclusive, de4235fd); "fixed": gn = gi[start - 1] (0c1c0b65).
    """
    gi = log_decay * torch.arange(1, chunk_size + 1, dtype=torch.float64)  # inclusive cumulative decay
    ge = torch.cat([gi.new_zeros(1), gi[:-1]])  # exclusive: ge[t] = gi[t - 1]
    start = BC
    gn = gi[start] if reference_row == "buggy" else gi[start - 1]
    keys, queries = torch.arange(0, start), torch.arange(start, 2 * BC)
    return {"key_rows": keys, "key_exp": gn - gi[keys], "query_rows": queries, "query_exp": ge[queries] - gn}


EXPONENT_FLOOR = -450.0  # the exponents figure's lower edge: points below it are drawn as a marker on the edge


def plot_exponents(log_decay: float = -100.0):
    """Both reference rows side by side. Exponents below EXPONENT_FLOOR (down to 16 * log_decay) are off scale:
    drawn as open triangles on the lower edge, so no row silently disappears."""
    fig, axes = viz.figure(ncols=2, width=4.7, height=3.6)
    for ax, which, title in ((axes[0], "buggy", "bug: gn = gi[start] (inclusive)"),
                             (axes[1], "fixed", "fix 0c1c0b65: every exponent <= 0")):
        e = exponents(log_decay, which)
        ax.axhspan(FP32_EXP_MAX, 1e9, color="#d62728", alpha=0.12)
        ax.axhline(FP32_EXP_MAX, color="#d62728", lw=0.8)
        ax.text(0.3, FP32_EXP_MAX + 12, "exp() = inf in fp32 (> 88.7)", fontsize=7, color="#d62728")
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
        ax.annotate(f"first query row: {first:+.0f}", (BC, first), (BC + 2.5, first + 55), fontsize=8,
                    arrowprops=dict(arrowstyle="->", lw=0.8))
        ax.axvline(BC - 0.5, color="grey", ls=":", lw=0.8)
        ax.set(ylim=(EXPONENT_FLOOR, 220), xlabel="row in chunk (keys: sub-chunk 0, queries: sub-chunk 1)",
               ylabel="exponent", title=title)
        ax.title.set_fontsize(9)
        ax.legend(fontsize=7, loc="center right")
    fig.suptitle(f"what each row exponentiates, per-step log-decay {log_decay:g} (one channel)", fontsize=10)
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
        o, _ = chunk_op(bug, chunk_size)(**x)
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
    with torch.no_grad():
        kernel, _ = chunk_op(BUG)(**clamped)
        fixed, _ = chunk_op(None)(**x)
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
    fig, (ax,) = viz.figure(width=6.2, height=3.6)
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
    ax.text(12.4, 1e-1, "|w| < 12 (#77)", fontsize=7, color="grey")
    ax.set(yscale="log", ylim=(1e-16, 3), xlabel="clamp level: w >= -level",
           ylabel="rel. error of o vs the exact model", title="the clamp changes the model by about e^-level")
    ax.legend(fontsize=7, loc="lower left")
    return fig


# ---------------------------------------------------------------------------------------------------- fix


def show_switch() -> None:
    """Where the switch is, and the one-row difference between the buggy and the fixed reference row."""
    where = bugs.locate(BUG)
    path, line = where.rsplit(":", 1)
    lines = (pathlib.Path(bugs.__file__).resolve().parent.parent / path).read_text().splitlines()
    i = int(line) - 1
    buggy, fixed = lines[i + 1], lines[i + 3]
    assert lines[i + 2].strip() == "else:", "the switch block changed shape: update show_switch"
    print(f"{path}, load_reference_decay (RWKV6 branch):")
    print("\n".join(lines[i - 1:i + 4]))
    code = lambda s: s.split("#")[0].strip()  # noqa: E731
    print(f"\n- {code(buggy)}    # gn = gi[start]\n+ {code(fixed)}    # gn = gi[start - 1] = ge[start]")


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
# The learner writes the reference row. `inter_subchunk_scores_kernel` is the part of the real score stage
# (`chunk_stages.gated_scores_kernel`, RWKV6 branch) that the reference row decides: the blocks of A pairing a query
# sub-chunk with each earlier key sub-chunk of its chunk, one `tl.dot` each. Same index and pointer maths as the
# real kernel, one sequence and one head, K = 16 channels in one block (every dot dimension is 16).

EXERCISE = "the reference row gn of an RWKV6 sub-chunk block"
EXERCISE_DECAYS = {"strong": 100.0, "weak": 0.1}  # the decay knob m of `inputs`: per-step log-decay -m * U(0.05, 1)


@triton.jit
def inter_subchunk_scores_kernel(q, k, gi, A, T, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                                 GN_POINTER: tl.constexpr):
    """`A[t, s] = sum_i q_t[i] k_s[i] exp(ge_t[i] - gi_s[i])` for the rows t of one query sub-chunk and the keys s of
    every earlier sub-chunk of its chunk. q, k, gi are [T, K] (gi: chunk-local inclusive cumulative log-decay,
    fp32), A is [T, BT] with chunk-local columns. `GN_POINTER(gi, i_start, o_k, HK)` is the learner's helper: the
    pointers to the reference row gn, as in `chunk_stages.load_reference_decay`."""
    NC: tl.constexpr = BT // BC
    i_tc = tl.program_id(0)
    i_t, i_i = i_tc // NC, i_tc % NC  # chunk, and sub-chunk within it
    t_first = i_t * BT
    i_start = t_first + i_i * BC  # this query sub-chunk's first row
    if i_i == 0:
        return  # a chunk's first sub-chunk has no earlier keys in the chunk (the state carries the past)
    o_c = tl.arange(0, BC)
    o_i = i_start + o_c
    m_i = o_i < T
    o_k = tl.arange(0, K)
    m_k = o_k < K
    m_ik = m_i[:, None] & m_k[None, :]
    b_q = tl.load(q + o_i[:, None] * K + o_k[None, :], mask=m_ik, other=0).to(tl.float32)
    # RWKV6's queries read the exclusive decay ge[t] = gi[t - 1] (0 on the chunk's first row)
    b_gq = tl.load(gi + (o_i[:, None] - 1) * K + o_k[None, :], mask=m_ik & (o_i[:, None] > t_first), other=0)
    b_gn = tl.load(GN_POINTER(gi, i_start, o_k, K), mask=m_k, other=0)
    for i_j in range(0, i_i):  # earlier key sub-chunks: one dot each around the reference row
        o_j = t_first + i_j * BC + o_c
        b_kt = tl.load(k + o_j[None, :] * K + o_k[:, None], mask=m_k[:, None], other=0).to(tl.float32)
        b_gkt = tl.load(gi + o_j[None, :] * K + o_k[:, None], mask=m_k[:, None], other=0)
        b_qg = b_q * tl.exp(tl.where(m_ik, b_gq - b_gn[None, :], 0))  # query factor exp(ge[t] - gn)
        b_kg = b_kt * tl.exp(b_gn[:, None] - b_gkt)  # key factor exp(gn - gi[s])
        tl.store(A + o_i[:, None] * BT + (i_j * BC + o_c)[None, :],
                 tl.dot(b_qg, b_kg, input_precision="ieee"), mask=m_i[:, None])


def chunk_cumsum(w: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Chunk-local inclusive cumulative sum of a [T, K] log-decay, in w's dtype (T a multiple of chunk_size)."""
    T, K = w.shape
    return w.reshape(T // chunk_size, chunk_size, K).cumsum(1).reshape(T, K)


def exercise_scores(gn_pointer, x: dict[str, torch.Tensor], chunk_size: int = 64) -> torch.Tensor:
    """`inter_subchunk_scores_kernel` with the learner's `gn_pointer` on `inputs(...)` (head 0): A [T, chunk_size],
    zero outside the blocks that pair a sub-chunk with an earlier one."""
    q, k = (x[n][0, :, 0].float().contiguous() for n in ("r", "k"))
    T, K = q.shape
    if T % chunk_size or chunk_size % BC or K < 16 or K & (K - 1):
        raise ValueError(f"T = {T} must be a multiple of chunk_size = {chunk_size} (a multiple of {BC}), "
                         f"K = {K} a power of two >= 16")
    gi = chunk_cumsum(x["w"][0, :, 0].float(), chunk_size).contiguous()  # fp32, as chunk_cumsum_kernel
    A = torch.zeros(T, chunk_size)
    inter_subchunk_scores_kernel[(T // BC,)](q, k, gi, A, T, K, chunk_size, BC, gn_pointer)
    return A


def exact_inter_subchunk_scores(x: dict[str, torch.Tensor], chunk_size: int = 64) -> torch.Tensor:
    """The same blocks in float64 without any split: `sum_i q_t[i] k_s[i] exp(ge_t[i] - gi_s[i])`."""
    q, k, w = (x[n][0, :, 0].double() for n in ("r", "k", "w"))
    T = q.shape[0]
    gi = chunk_cumsum(w, chunk_size)
    ge = gi - w  # exclusive: gi[t - 1] inside the chunk, 0 on its first row
    t = torch.arange(T)
    earlier = ((t[:, None] // chunk_size == t[None, :] // chunk_size)  # same chunk, earlier sub-chunk
               & (t[None, :] // BC < t[:, None] // BC))
    exponent = torch.where(earlier[:, :, None], ge[:, None, :] - gi[None, :, :], -math.inf)
    full = torch.einsum("tc,sc,tsc->ts", q, k, exponent.exp())  # [T, T]
    return torch.stack([full[i, (i // chunk_size) * chunk_size:][:chunk_size] for i in range(T)])


def scores_report(gn_pointer, decay: float, T: int = 64, chunk_size: int = 64) -> dict:
    """Run the learner's reference row at one decay knob: error vs float64, non-finite count, first bad row."""
    x = inputs(decay, T)
    got, exact = exercise_scores(gn_pointer, x, chunk_size), exact_inter_subchunk_scores(x, chunk_size)
    bad = ~torch.isfinite(got)
    rows = torch.nonzero(bad.any(-1)).flatten().tolist()
    n_scores = int(sum(BC * (i % (chunk_size // BC)) * BC for i in range(T // BC)))
    return {"error": check.rel_error(got, exact), "nonfinite": int(bad.sum()), "scores": n_scores,
            "bad rows": rows, "first bad row": rows[0] if rows else None}


@triton.jit
def reference_row_probe_kernel(rows, out, i_start, K: tl.constexpr, GN_POINTER: tl.constexpr):
    """Loads through the learner's helper from a [T, K] table whose row t holds the number t: which row it reads."""
    o_k = tl.arange(0, K)
    tl.store(out + o_k, tl.load(GN_POINTER(rows, i_start, o_k, K)))


def reference_row_offset(gn_pointer, i_start: int = 2 * BC, K: int = 16) -> float:
    """The row the learner's `gn_pointer` reads, relative to `i_start` (-1 for 0c1c0b65's row, 0 for the bug's).

    The table has 4 * BC rows of margin on each side, so a helper that points a few sub-chunks off still reads it."""
    margin = 4 * BC
    table = torch.arange(-margin, i_start + 2 * margin, dtype=torch.float32)[:, None].repeat(1, K)
    out = torch.full((K,), math.nan)
    reference_row_probe_kernel[(1,)](table[margin:], out, i_start, K, gn_pointer)
    return float(out[0]) - i_start


def reference_row_hint(offset: float) -> str:
    """Which factor overflows for a reference row `offset` rows from the sub-chunk's first row, and which way to
    move it (the cumulative decay falls row by row, so an earlier row has a larger value)."""
    row = "i_start" if offset == 0 else f"i_start {'+' if offset > 0 else '-'} {abs(offset):g}"
    where = f"your helper reads row {row}" if math.isfinite(offset) else "your helper reads no row of gi"
    if offset > -1:
        return (f"{where}. The QUERY side overflows: exp(ge[t] - gn) > 1 for a query whose ge[t] lies above gn. "
                "The first query row has the largest ge[t] of its sub-chunk: gn must not lie below it.")
    if offset < -1:
        return (f"{where}. The KEY side overflows: exp(gn - gi[s]) > 1 for an earlier key whose gi[s] lies below gn. "
                "The last key row before the sub-chunk has the smallest gi[s]: gn must not lie above it.")
    return (f"{where}. Pick the row whose cumulative decay lies between every query's ge[t] and every earlier "
            "key's gi[s], for every channel")


def check_reference_row(gn_pointer, T: int = 64, chunk_size: int = 64) -> exercises.Verdict:
    """PASS when the learner's `gn_pointer` gives finite scores within the fp32 tolerance of the float64
    computation at strong (m = 100) and weak (m = 0.1) decay. The hint says which factor overflows."""
    tol = check.tolerance(torch.float32).fwd
    errors, extra = {}, []
    for name, decay in EXERCISE_DECAYS.items():
        r = scores_report(gn_pointer, decay, T, chunk_size)
        errors[f"{name} decay (m = {decay:g})"] = r["error"]
        where = f", first bad row t = {r['first bad row']} (rows {spans(r['bad rows'])})" if r["nonfinite"] else ""
        extra.append((r["nonfinite"] == 0,
                      f"{name} decay (m = {decay:g}): {r['nonfinite']} of {r['scores']} scores non-finite{where}"))
    verdict = exercises.verdict_from_errors(EXERCISE, errors, tol, extra=extra)
    if verdict.passed:
        return verdict
    return exercises.verdict_from_errors(EXERCISE, errors, tol, extra=extra,
                                         hint=reference_row_hint(reference_row_offset(gn_pointer)))


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
    axes[-1].legend(fontsize=6, loc="lower left", ncol=2)
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
        left.text(s + 0.5, -0.6, f"{top:.3g}", fontsize=6, va="bottom",
                  color="#d62728" if top > FP32_EXP_MAX else "k")
    left.set_yticks(range(len(labels)), labels, fontsize=7)
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
    right.set_xticks(pos, ["o", "ht", *(f"d{n}" for n in GRADS)], fontsize=7, rotation=30, ha="right")
    right.set(ylim=(1e-12, 1e5), ylabel="rel. error vs reference (x: non-finite)",
              title=f"{viz.DTYPE_NAMES[dtype]}, chunk {chunk_size}")
    right.title.set_fontsize(9)
    right.legend(fontsize=6, loc="upper right", ncol=2)  # above the bars and the x marks
    return fig


def explorer():
    return widgets.explorer(
        plot_setting,
        decay=widgets.log_slider("decay knob m (w = -m·U)", 100.0, -3, 4),
        dtype=widgets.dtype_choice(),
        chunk_size=widgets.chunk_size_choice(),
    )

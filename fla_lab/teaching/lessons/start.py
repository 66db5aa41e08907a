"""Notebook 00: the four recurrences, spec -> kernel -> check, the chunked form, why chunking needs cumulative
decays, and how sub-chunks and reference rows keep every decay factor <= 1."""
from __future__ import annotations

import torch

from fla_lab.spec import harness, reference
from fla_lab.tools import viz, widgets


def kernel_health() -> dict[str, dict[str, float]]:
    """The two fused recurrent kernels against their float64 references on a small problem (fp32)."""
    from fla_lab.ops import fused_recurrent_gla, fused_recurrent_rwkv6

    gla = harness.gated_inputs(1, 20, 2, 16, 32, names=("q", "k", "v", "gk"), seed=1)
    rwkv6 = harness.gated_inputs(1, 20, 2, 16, 32, bonus=True, names=("r", "k", "v", "w"), seed=2)
    rename = lambda fn: (lambda q, k, v, gk, **kw: fn(q, k, v, gk, **kw))  # noqa: E731  (gk vs g)
    return {
        "fused_recurrent_gla": harness.compare(fused_recurrent_gla, rename(reference.recurrent_gla), gla).errors,
        "fused_recurrent_rwkv6": harness.compare(fused_recurrent_rwkv6, reference.recurrent_rwkv6, rwkv6).errors,
    }


def decay_weights(T: int, log_decay: float, exclusive: bool, bonus: float = 0.0) -> torch.Tensor:
    """How much of key s reaches query t through the state, for a constant per-step log-decay (one channel).

    GLA (inclusive): exp(G_t - G_s) for s <= t.  RWKV6 (exclusive): exp(G_{t-1} - G_s) for s < t, and the
    bonus `u` on the diagonal instead of an undecayed write.
    """
    t = torch.arange(T, dtype=torch.float64)
    steps = (t[:, None] - t[None, :]) - (1.0 if exclusive else 0.0)
    weights = torch.where(steps >= 0, torch.exp(log_decay * steps.clamp(min=0)), torch.zeros(()))
    if exclusive:
        weights = weights + torch.diag(torch.full((T,), bonus, dtype=torch.float64))
    return weights


def plot_decay_weights(T: int = 10, log_decay: float = -0.4, bonus: float = 0.5):
    fig, axes = viz.figure(ncols=2, width=4.0, height=3.6)
    for ax, exclusive, title in ((axes[0], False, "GLA, GSA, RWKV-7 (decay part): read $S_t$"),
                                 (axes[1], True, f"RWKV6: reads $S_{{t-1}}$ + bonus u={bonus}")):
        image = ax.imshow(decay_weights(T, log_decay, exclusive, bonus).numpy(), cmap="viridis", vmin=0, vmax=1)
        ax.set(title=title, xlabel="key step s", ylabel="query step t")
    fig.colorbar(image, ax=axes, shrink=0.8, label="weight of key s at query t")
    fig.suptitle(f"decay from key to query, per-step log-decay g = {log_decay}")
    return fig


SUBCHUNK = 16  # rows per sub-chunk in the gated chunk kernels (GLA, RWKV6, GSA): `BC` in ops/common/chunk.py


def cumulative_log_decay(magnitude: float, chunk_size: int) -> torch.Tensor:
    """G_t = sum_{tau <= t} g_tau inside one chunk (inclusive, float64) for a constant per-step log-decay -magnitude."""
    return -magnitude * torch.arange(1, chunk_size + 1, dtype=torch.float64)


def query_reference_rows(chunk_size: int) -> torch.Tensor:
    """For each query row t: the first row of its sub-chunk, GLA's reference row n for keys in earlier sub-chunks."""
    return (torch.arange(chunk_size) // SUBCHUNK) * SUBCHUNK


def key_reference_rows(chunk_size: int) -> torch.Tensor:
    """For each key row s: the nearest reference row at or after it (the first row of the next sub-chunk), or the
    chunk's last row for the last sub-chunk (the row the state update decays every key to)."""
    return torch.clamp((torch.arange(chunk_size) // SUBCHUNK + 1) * SUBCHUNK, max=chunk_size - 1)


def chunk_factors(magnitude: float, chunk_size: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Per-row factors of the decay exp(G_t - G_s) across one chunk, each computed in `dtype`.

    Naive split around the chunk's start: exp(G_t) for query rows and exp(-G_s) for key rows; the key factor
    overflows once magnitude * (s + 1) passes log(max) of the dtype. Split around reference rows n inside the
    chunk: exp(G_t - G_n) with n the first row of t's sub-chunk, and exp(G_n - G_s) with n the next reference
    row at or after s. n sits between them, so both exponents are <= 0 (no clamp: they are <= 0 by construction).
    """
    G = cumulative_log_decay(magnitude, chunk_size)
    n_query, n_key = query_reference_rows(chunk_size), key_reference_rows(chunk_size)
    return {
        "query_naive": torch.exp(G.to(dtype)),
        "key_naive": torch.exp((-G).to(dtype)),
        "query_with_reference": torch.exp((G - G[n_query]).to(dtype)),
        "key_with_reference": torch.exp((G[n_key] - G).to(dtype)),
    }


def naive_scores(magnitude: float, chunk_size: int, dtype: torch.dtype, K: int = 16, seed: int = 0):
    """The chunk's score matrix from the naive split, in `dtype`, and the exact one in float64.

    Entries above the diagonal (s > t) are not scores of a causal chunk: both matrices hold 0 there."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(chunk_size, K, generator=gen, dtype=torch.float64)
    k = torch.randn(chunk_size, K, generator=gen, dtype=torch.float64)
    f = chunk_factors(magnitude, chunk_size, dtype)
    qd, kd = (q.to(dtype) * f["query_naive"][:, None]), (k.to(dtype) * f["key_naive"][:, None])
    causal = torch.tril(torch.ones(chunk_size, chunk_size, dtype=torch.bool))
    naive = (qd.float() @ kd.float().T).masked_fill(~causal, 0.0)
    G = cumulative_log_decay(magnitude, chunk_size)
    exact = (q @ k.T) * torch.exp((G[:, None] - G[None, :]).clamp(max=0)) * causal
    return naive, exact


def naive_split_census(magnitude: float, chunk_size: int, dtype: torch.dtype) -> dict[str, int | None]:
    """Where the naive split breaks: the first key row whose factor is inf, the first query row whose factor is 0,
    and how many of the chunk's causal scores come out inf or NaN."""
    f = chunk_factors(magnitude, chunk_size, dtype)
    naive, _ = naive_scores(magnitude, chunk_size, dtype)
    first = lambda mask: int(mask.nonzero()[0]) if bool(mask.any()) else None  # noqa: E731
    return {
        "first key row inf": first(torch.isinf(f["key_naive"])),
        "first query row 0": first(f["query_naive"] == 0),
        "inf scores": int(torch.isinf(naive).sum()),
        "NaN scores": int(torch.isnan(naive).sum()),
        "causal scores": chunk_size * (chunk_size + 1) // 2,
    }


CHUNK_SIZES = (16, 32, 64)  # the explorer's choices (widgets.chunk_size_choice): table, figure and explorer agree


def overflow_threshold(chunk_size: int, dtype: torch.dtype) -> float:
    """The per-step decay magnitude above which the naive split overflows in `dtype`."""
    return viz.EXP_OVERFLOW[dtype] / chunk_size


def overflow_thresholds(dtype: torch.dtype, chunk_sizes=CHUNK_SIZES) -> dict[int, float]:
    """`overflow_threshold` for each chunk size, rounded to 2 decimals: the table the threshold figure draws."""
    return {int(c): round(overflow_threshold(int(c), dtype), 2) for c in chunk_sizes}


def smallest_subnormal(dtype: torch.dtype) -> float:
    """The smallest positive value of `dtype`: below it exp() underflows to exactly 0."""
    info = torch.finfo(dtype)
    return info.smallest_normal * info.eps


def plot_chunk_factors(magnitude: float = 2.0, dtype: torch.dtype = torch.float32, chunk_size: int = 64):
    """Left: log10 of each row's decay factor, naive split vs reference rows (x: inf, v: 0). Right: which causal
    scores of the chunk the naive split makes inf or NaN. The title says where, and how many."""
    import matplotlib.colors as mcolors
    import numpy as np

    f = chunk_factors(magnitude, chunk_size, dtype)
    census = naive_split_census(magnitude, chunk_size, dtype)
    fig, (left, right) = viz.figure(ncols=2, width=4.8, height=4.6)
    pos = np.arange(chunk_size)
    top = viz.EXP_OVERFLOW[dtype] / np.log(10)
    bottom = np.log10(smallest_subnormal(dtype))
    lines = (("key_naive", "-", "C0", "naive: key exp(-G_s)"), ("query_naive", "--", "C1", "naive: query exp(G_t)"),
             ("key_with_reference", ":", "C2", "reference row: key exp(G_n - G_s)"),
             ("query_with_reference", "-.", "C4", "reference row: query exp(G_t - G_n)"))
    flagged = set()
    for key, style, color, label in lines:
        values = f[key].double()
        logs = torch.log10(values.clamp(min=1e-300)).numpy()
        ok = (torch.isfinite(values) & (values > 0)).numpy()
        sparse = ok.sum() < chunk_size // 2  # mostly inf or 0: dots, so the few finite rows stay visible
        left.plot(pos, np.where(ok, logs, np.nan), style, color=color, label=label, marker="." if sparse else None,
                  ms=3)  # NaN breaks the line where the factor is inf or 0
        for bad, level, marker, name in ((torch.isinf(values).numpy(), top, "x", "overflow: inf"),
                                         ((values == 0).numpy(), bottom, "v", "underflow: 0")):
            if bad.any():
                left.plot(pos[bad], np.full(bad.sum(), level), marker, color="red" if marker == "x" else "k",
                          ms=4, label=None if name in flagged else name)
                flagged.add(name)
    left.axhline(top, color="red", lw=0.8)
    left.axhline(bottom, color="k", lw=0.6)
    left.set(xlabel="row in chunk (t for queries, s for keys)", ylabel="log10(factor)",
             ylim=(bottom - 0.12 * (top - bottom), top + 0.12 * (top - bottom)),
             title=f"factors per row (lines: largest and smallest {viz.DTYPE_NAMES[dtype]})")
    viz.legend_below(left)
    naive, _ = naive_scores(magnitude, chunk_size, dtype)
    causal = torch.tril(torch.ones(chunk_size, chunk_size, dtype=torch.bool))
    state = torch.ones(naive.shape, dtype=torch.int64)
    state[~causal] = 0
    state[torch.isinf(naive)] = 2
    state[torch.isnan(naive)] = 3
    cmap = mcolors.ListedColormap(["white", "#cccccc", "#ff7f0e", "#d62728"])
    right.imshow(state.numpy(), cmap=cmap, vmin=0, vmax=3, interpolation="nearest")
    from matplotlib.patches import Patch
    right.legend(handles=[Patch(color=c, label=n) for c, n in zip(cmap.colors[1:], ("finite", "inf", "NaN"))],
                 fontsize=9, loc="upper right")
    right.set(title=f"naive scores: {census['inf scores']} inf + {census['NaN scores']} NaN "
                    f"of {census['causal scores']}", xlabel="key row s", ylabel="query row t")
    if census["first key row inf"] is None:
        verdict = f"nothing overflows ({magnitude:g} x {chunk_size} = {magnitude * chunk_size:g} < " \
                  f"{viz.EXP_OVERFLOW[dtype]:.1f})"
    else:
        verdict = f"key factor inf from row {census['first key row inf']}"
    fig.suptitle(f"naive split, {viz.DTYPE_NAMES[dtype]}, per-step log-decay -{magnitude:g}, "
                 f"{chunk_size}-row chunk: {verdict}", fontsize=10)
    return fig


def plot_overflow_thresholds(chunk_sizes=CHUNK_SIZES):
    """Which per-step decay magnitudes the naive split survives, per dtype and chunk size (the printed table)."""
    fig, (ax,) = viz.figure(width=6.0, height=3.4)
    for dtype, style in ((torch.float16, "o-"), (torch.bfloat16, "s-"), (torch.float32, "x--")):
        same = " (fp32's exponent range)" if dtype == torch.bfloat16 else ""
        limits = overflow_thresholds(dtype, chunk_sizes)
        ax.plot(list(limits), list(limits.values()), style, color=viz.DTYPE_COLORS[dtype],
                label=f"naive split, {viz.DTYPE_NAMES[dtype]}{same}")
        if dtype != torch.bfloat16:  # bf16's values lie on fp32's (5.54 against 5.55 at C = 16)
            below = dtype == torch.float16
            for c, limit in limits.items():
                ax.annotate(f"{limit:g}", (c, limit), xytext=(0, -12 if below else 7), textcoords="offset points",
                            ha="center", fontsize=9, color=viz.DTYPE_COLORS[dtype])
    ax.set(xscale="log", yscale="log", xlabel="chunk size C", ylabel="largest per-step |log-decay|",
           ylim=(0.1, 10), title="the naive split exp(G_t)*exp(-G_s) overflows above these lines")
    ax.minorticks_off()
    ax.set_xticks(list(chunk_sizes), [str(c) for c in chunk_sizes])
    ax.legend(fontsize=9, loc="upper right")
    return fig


# ---------------------------------------------------------------------------------------------------------
# Sub-chunks and reference rows (notebook 03a builds on this picture)


def example_decays(chunk_size: int = 64, magnitude: float = 1.0, seed: int = 0) -> torch.Tensor:
    """Per-step log-decays -magnitude * U(0.2, 1) for one channel of one chunk (float64)."""
    gen = torch.Generator().manual_seed(seed)
    return -magnitude * (0.2 + 0.8 * torch.rand(chunk_size, generator=gen, dtype=torch.float64))


def split_around(G: torch.Tensor, t: int, s: int, n: int) -> dict[str, float]:
    """exp(G_t - G_s) = exp(G_t - G_n) * exp(G_n - G_s): the two exponents and whether each factor is <= 1."""
    query, key = float(G[t] - G[n]), float(G[n] - G[s])
    return {"query exponent G_t - G_n": query, "key exponent G_n - G_s": key,
            "exact exponent G_t - G_s": float(G[t] - G[s]),
            "query factor <= 1": query <= 0, "key factor <= 1": key <= 0}


def describe_split(G: torch.Tensor, t: int, s: int, n: int) -> str:
    """One line: both exponents of the split around row n, whether each factor is <= 1, and their exact sum."""
    split = split_around(G, t, s, n)
    q, k = split["query exponent G_t - G_n"], split["key exponent G_n - G_s"]
    return (f"t={t}, s={s}, n={n}: query G_t - G_n = {q:+.1f} (factor <= 1: {split['query factor <= 1']}), "
            f"key G_n - G_s = {k:+.1f} (factor <= 1: {split['key factor <= 1']}), "
            f"sum {q + k:+.1f} = exact G_t - G_s {split['exact exponent G_t - G_s']:+.1f}")


def block_kinds(chunk_size: int = 64) -> torch.Tensor:
    """Per (query row t, key row s): 0 = not computed (s > t), 1 = diagonal sub-chunk block (pair by pair),
    2 = block against an earlier sub-chunk (one matrix product, split around a reference row)."""
    rows = torch.arange(chunk_size)
    sub_t, sub_s = (rows // SUBCHUNK)[:, None], (rows // SUBCHUNK)[None, :]
    kinds = torch.where(sub_t > sub_s, 2, 1)
    return torch.where(rows[:, None] >= rows[None, :], kinds, 0)


def _draw_split(ax, G, t, s, n, title, strong: float = 100.0):
    """G over the chunk, the rows s, n, t, one arrow per factor's exponent (green: <= 0, red: > 0) and a box with
    the numbers, and what the same split gives at `strong` times the decay in fp32."""
    import numpy as np

    rows = np.arange(len(G))
    ax.plot(rows, G.numpy(), color="0.3", lw=1.2)
    for i in range(SUBCHUNK, len(G), SUBCHUNK):
        ax.axvline(i - 0.5, color="0.85", lw=0.8, zorder=0)
    for row, name, color in ((s, "s", "C0"), (n, "n", "C3"), (t, "t", "C1")):
        ax.plot([row], [float(G[row])], "o", color=color, ms=6, zorder=3)
        ax.annotate(name, (row, float(G[row])), xytext=(-12, -3), textcoords="offset points", color=color,
                    fontsize=10, weight="bold")
    for a, b, label in ((s, n, "key"), (n, t, "query")):
        x = (n if label == "key" else t) + 2.0  # each arrow beside its row: the key's at n, the query's at t
        up = float(G[b]) > float(G[a])
        color = "red" if up else "green"
        ax.annotate("", xy=(x, float(G[b])), xytext=(x, float(G[a])),
                    arrowprops=dict(arrowstyle="->", color=color, lw=1.6))
        ax.hlines([float(G[a]), float(G[b])], [a, b], x, colors="0.6", lw=0.6, linestyles=":")
        ax.annotate(label, (x, (float(G[a]) + float(G[b])) / 2), xytext=(3, 0), textcoords="offset points",
                    fontsize=9, va="center", color=color)
    split = split_around(G, t, s, n)
    q, k = split["query exponent G_t - G_n"], split["key exponent G_n - G_s"]
    mark = lambda e: "<= 1" if e <= 0 else "> 1"  # noqa: E731
    lines = [f"query: G_t - G_n = {q:+.1f}, factor {mark(q)}", f"key:   G_n - G_s = {k:+.1f}, factor {mark(k)}",
             f"exact: G_t - G_s = {q + k:+.1f}"]
    if max(q, k) > 0:
        big, small = strong * max(q, k), strong * min(q, k)
        lines.append(f"at {strong:g}x the decay (fp32): exp({big:+.0f}) = inf,\nexp({small:+.0f}) = 0: inf*0 = NaN")
    else:
        lines.append(f"at {strong:g}x the decay: both factors\nunderflow at worst (the exact answer ~ 0)")
    ax.text(0.03, 0.03, "\n".join(lines), transform=ax.transAxes, fontsize=9, family="monospace", va="bottom",
            bbox=dict(boxstyle="round", fc="white", ec="0.7"))
    low = float(G.min())
    ax.set(xlabel="row in chunk", ylabel="G (natural log)", title=title, xlim=(-1, len(G) + 6),
           ylim=(1.6 * low, 0.05 * abs(low)))  # room below the curve for the box
    return split


def plot_subchunk_reference(chunk_size: int = 64, t: int = 40, s: int = 10, bad_n: int = 56):
    """Left: a chunk's score blocks (16-row sub-chunks), GLA's reference rows and the pair (t, s). Middle: G over
    the chunk, the split around n = first row of t's sub-chunk (between s and t: both exponents <= 0). Right: the
    same pair split around a row after t: the query exponent turns positive."""
    import matplotlib.colors as mcolors
    from matplotlib.patches import Patch

    fig, (blocks, good, bad) = viz.figure(ncols=3, width=4.3, height=3.9)
    cmap = mcolors.ListedColormap(["white", "#9ecae1", "#fdd0a2"])
    blocks.imshow(block_kinds(chunk_size).numpy(), cmap=cmap, vmin=0, vmax=2, interpolation="nearest")
    for i in range(SUBCHUNK, chunk_size, SUBCHUNK):
        blocks.axhline(i - 0.5, color="0.5", lw=0.6)
        blocks.axvline(i - 0.5, color="0.5", lw=0.6)
        blocks.hlines(i, -0.5, i - 0.5, colors="C3", lw=1.8)  # the reference row of query sub-chunk i
    n = int(query_reference_rows(chunk_size)[t])
    blocks.plot([s], [t], "*", color="k", ms=10)
    blocks.annotate(f"(t={t}, s={s})", (s, t), xytext=(6, 8), textcoords="offset points", fontsize=9)
    ticks = list(range(0, chunk_size, SUBCHUNK))
    blocks.set_xticks(ticks)
    blocks.set_yticks(ticks)
    blocks.set(xlabel="key row s", ylabel="query row t", title=f"{chunk_size}-row chunk, {SUBCHUNK}-row sub-chunks")
    blocks.legend(handles=[Patch(color=cmap.colors[1], label="diagonal block: pair by pair"),
                           Patch(color=cmap.colors[2], label="earlier sub-chunk: one matmul"),
                           Patch(color="C3", label="reference row n (GLA, GSA)")],
                  fontsize=9, loc="upper right")
    G = torch.cumsum(example_decays(chunk_size), 0)
    _draw_split(good, G, t, s, n, f"n = {n} between s and t: both <= 1")
    _draw_split(bad, G, t, s, bad_n, f"n = {bad_n} after t: one factor > 1")
    fig.suptitle(f"exp(G_t - G_s) = exp(G_t - G_n) * exp(G_n - G_s), per-step log-decay -U(0.2, 1); "
                 f"gray lines: sub-chunk borders", fontsize=10)
    return fig


def chunk_factor_explorer():
    return widgets.explorer(
        plot_chunk_factors,
        magnitude=widgets.log_slider("|log-decay| per step", 2.0, -3, 4),  # the defaults: notebook 00's lead figure
        dtype=widgets.dtype_choice(),
        chunk_size=widgets.chunk_size_choice(),
    )

"""Notebook 00: the four recurrences, the chunked form, and why chunking needs cumulative decays."""
from __future__ import annotations

import torch

from fla_lab import harness, reference, viz, widgets


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
    for ax, exclusive, title in ((axes[0], False, "GLA / RWKV7 / GSA: reads $S_t$"),
                                 (axes[1], True, f"RWKV6: reads $S_{{t-1}}$ + bonus u={bonus}")):
        image = ax.imshow(decay_weights(T, log_decay, exclusive, bonus), cmap="viridis", vmin=0, vmax=1)
        ax.set(title=title, xlabel="key step s", ylabel="query step t")
    fig.colorbar(image, ax=axes, shrink=0.8, label="weight of key s at query t")
    fig.suptitle(f"decay from key to query, per-step log-decay g = {log_decay}")
    return fig


def chunk_factors(magnitude: float, chunk_size: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The two factors of exp(G_t - G_s) = exp(G_t) * exp(-G_s) across one chunk, computed in `dtype`.

    G is the chunk-local cumulative log-decay (per-step log-decay -magnitude). The naive split needs
    exp(-G_s) = exp(magnitude * (s+1)), which overflows once magnitude * chunk_size passes log(max) of the
    dtype; a reference row inside the chunk (the first row of a 16-row sub-chunk) keeps both factors <= 1.
    """
    G = -magnitude * torch.arange(1, chunk_size + 1, dtype=torch.float64)
    ref_row = (torch.arange(chunk_size) // 16) * 16  # first row of each 16-row sub-chunk
    return {
        "query_naive": torch.exp(G.to(dtype)),
        "key_naive": torch.exp((-G).to(dtype)),
        "key_with_reference": torch.exp((G[ref_row] - G).clamp(max=0).to(dtype)),
    }


def naive_scores(magnitude: float, chunk_size: int, dtype: torch.dtype, K: int = 16, seed: int = 0):
    """The chunk's score matrix from the naive split, in `dtype`, and the exact one in float64."""
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(chunk_size, K, generator=gen, dtype=torch.float64), torch.randn(chunk_size, K, generator=gen, dtype=torch.float64)
    f = chunk_factors(magnitude, chunk_size, dtype)
    qd, kd = (q.to(dtype) * f["query_naive"][:, None]), (k.to(dtype) * f["key_naive"][:, None])
    causal = torch.tril(torch.ones(chunk_size, chunk_size, dtype=torch.bool))
    naive = (qd.float() @ kd.float().T).masked_fill(~causal, 0.0)
    G = -magnitude * torch.arange(1, chunk_size + 1, dtype=torch.float64)
    exact = (q @ k.T) * torch.exp((G[:, None] - G[None, :]).clamp(max=0)) * causal
    return naive, exact


def overflow_threshold(chunk_size: int, dtype: torch.dtype) -> float:
    """The per-step decay magnitude above which the naive split overflows in `dtype`."""
    return viz.EXP_OVERFLOW[dtype] / chunk_size


def plot_chunk_factors(magnitude: float = 2.0, dtype: torch.dtype = torch.float32, chunk_size: int = 64):
    import matplotlib.colors as mcolors
    import numpy as np

    f = chunk_factors(magnitude, chunk_size, dtype)
    fig, (left, right) = viz.figure(ncols=2, width=4.6, height=3.5)
    pos = np.arange(chunk_size)
    top = viz.EXP_OVERFLOW[dtype] / np.log(10)
    for key, style in (("key_naive", "-"), ("query_naive", "--"), ("key_with_reference", ":")):
        values = f[key].double()
        logs = torch.log10(values.clamp(min=1e-300)).numpy()
        finite = torch.isfinite(values).numpy()
        left.plot(pos[finite], logs[finite], style, label=key.replace("_", " "))
        if (~finite).any():
            left.plot(pos[~finite], np.full((~finite).sum(), top), "x", color="red", label="overflow (inf)")
    left.axhline(top, color="red", lw=0.8)
    left.set(xlabel="row in chunk", ylabel="log10(factor)", ylim=(-45, top + 5),
             title=f"{viz.DTYPE_NAMES[dtype]}: factors at |g| = {magnitude:g}")
    left.legend(fontsize=7, loc="lower left")
    naive, exact = naive_scores(magnitude, chunk_size, dtype)
    state = torch.zeros(naive.shape, dtype=torch.int64)
    state[torch.isinf(naive)] = 1
    state[torch.isnan(naive)] = 2
    cmap = mcolors.ListedColormap(["#dddddd", "#ff7f0e", "#d62728"])
    right.imshow(state.numpy(), cmap=cmap, vmin=0, vmax=2, interpolation="nearest")
    bad = int((state > 0).sum())
    right.set(title=f"naive scores: {bad} inf/NaN of {chunk_size * (chunk_size + 1) // 2}",
              xlabel="key s", ylabel="query t")
    return fig


def plot_overflow_thresholds():
    """Which per-step decay magnitudes each split survives, per dtype."""
    import numpy as np

    fig, (ax,) = viz.figure(width=6.0, height=3.4)
    sizes = np.array([16, 32, 64, 128])
    for dtype, style in ((torch.float16, "o-"), (torch.bfloat16, "s-"), (torch.float32, "x--")):
        same = " (fp32's exponent range)" if dtype == torch.bfloat16 else ""
        ax.plot(sizes, [overflow_threshold(int(c), dtype) for c in sizes], style, color=viz.DTYPE_COLORS[dtype],
                label=f"naive split, {viz.DTYPE_NAMES[dtype]}{same}")
    ax.axhline(90, color="k", ls=":", label="RWKV6 with w_raw = 4.5 (bug #77)")
    ax.set(xscale="log", yscale="log", xlabel="chunk size", ylabel="largest per-step |log-decay|",
           title="the naive split exp(G_t)*exp(-G_s) overflows above these")
    ax.minorticks_off()
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.legend(fontsize=7, loc="center right")
    return fig


def chunk_factor_explorer():
    return widgets.explorer(
        plot_chunk_factors,
        magnitude=widgets.log_slider("|log-decay| per step", 2.0, -3, 4),
        dtype=widgets.dtype_choice(),
        chunk_size=widgets.chunk_size_choice(),
    )

"""Notebook 02: the contract of the decay argument, through the misuses reported upstream.

- `log` of something that is already a log-decay (NaN) or of a decay that holds an exact 0 (-inf);
- `sigmoid(x)` passed as a log-decay to `fused_recurrent_rwkv6` (upstream #11): every step multiplies the
  state by exp(w) > 1, the output and every gradient except `du` turn non-finite;
- `chunk_rwkv7`-style calls with `a, b ~ U(0, 1)` (upstream #150): `diag(exp w) + b a^T` has an eigenvalue near
  1 + K/4, the state grows like 17^t at K = 64 and overflows fp32 around t = 31;
- the `[B, H, T, D]` layout mix-up and the removed `head_first` keyword (#457, #853).

Kernels run in fla_lab's Triton ops; state trajectories come from the float64 references
(`fla_lab.spec.reference`), stepped one token at a time, so they show the exact growth past fp32's range.
"""
from __future__ import annotations

import contextlib
import functools
import math
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from fla_lab.spec import check, harness, markers, reference
from fla_lab.teaching import exercises
from fla_lab import runtime
from fla_lab.tools import viz, widgets
from fla_lab.ops import contract

FP32_MAX = torch.finfo(torch.float32).max

# Decay parametrisations: raw activations x -> what is passed as the kernel's `w`. Only the last three are
# log-space decays (<= 0); `sigmoid` is upstream #11's mistake (a decay in (0, 1), used as a log-decay).
PARAMETRISATIONS = {
    "sigmoid": torch.sigmoid,
    "logsigmoid": F.logsigmoid,
    "-exp": lambda x: -torch.exp(x),
    "rwkv7": lambda x: harness.RWKV7_W_SCALE * torch.sigmoid(x),  # RWKV-7: (-e^-0.5, 0)
}
STYLES = {"sigmoid": ("#d62728", "-"), "logsigmoid": ("#1f77b4", "-"), "-exp": ("#2ca02c", "--"),
          "rwkv7": ("#9467bd", ":"), "rand a, b; w = log(rand)": ("#d62728", "-"),
          "rand a, b; raw w = rand": ("#ff7f0e", "--"), "RWKV-7 contract": ("#1f77b4", "-")}


@contextlib.contextmanager
def quiet_overflow():
    """Hide numpy's overflow RuntimeWarnings: under the Triton interpreter an overflowing kernel emits them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


# ----------------------------------------------------------------------------------------------------------
# 1. log of a decay


def log_misuses() -> dict[str, tuple[float, float]]:
    """`torch.log` of what a caller may hold: (value, log(value)) for a decay, a zero, a log-decay."""
    values = {"a decay in (0, 1)": 0.9, "a decay that is exactly 0": 0.0,
              "a log-decay (already <= 0)": math.log(0.9), "a decay > 1": 1.5}
    logs = torch.log(torch.tensor(list(values.values()), dtype=torch.float32))
    return {name: (value, float(lv)) for (name, value), lv in zip(values.items(), logs)}


on_device = harness.on_device  # inputs made seeded on the CPU, moved to where the kernels run (fla_lab.device())


def verdict(op, *args, brief: bool = False, **kwargs) -> str:
    """What the op's contract says about a call: 'accepted', the warning it raised, or the error it raised.

    The call runs forward only, value checks on (as on the CPU), numpy overflow warnings hidden; tensor arguments
    are moved to the kernels' device first. `brief`: each message up to its first sentence's end (what is wrong,
    without the advice after it; the advice says where to look, never an exercise's line).
    """
    args, kwargs = on_device(list(args)), on_device(kwargs)
    said = []
    with warnings.catch_warnings(record=True) as caught, contract.value_checks(True):
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=RuntimeWarning)
        runtime.hide_interpreter_noise()  # Triton's own deprecation notes are not what the contract said
        try:
            with torch.no_grad():
                op(*args, **kwargs)
        except (TypeError, ValueError) as error:
            said = [(type(error).__name__, str(error))]
    said = said or [(w.category.__name__, str(w.message)) for w in caught]
    first = lambda text: text.split(". ")[0].rstrip(".") if brief else text  # noqa: E731
    return "; ".join(f"{kind}: {first(text)}" for kind, text in said) or "accepted"


# ----------------------------------------------------------------------------------------------------------
# 2. sigmoid(x) as a log-decay (upstream #11)


def rwkv6_inputs(parametrisation: str = "sigmoid", T: int = 256, K: int = 16, seed: int = 0,
                 x_scale: float = 1.0) -> dict:
    """#11's call at a small size: r, k, v, x ~ randn, `w = parametrisation(x_scale * x)`, u ~ randn; B = H = 1,
    V = K. `parametrisation=None` returns the raw activations `x_scale * x` as `w` (the exercise converts them)."""
    gen = torch.Generator().manual_seed(seed)
    r, k, v, x = (torch.randn(1, T, 1, K, generator=gen) for _ in range(4))
    x = x_scale * x
    w = x if parametrisation is None else PARAMETRISATIONS[parametrisation](x)
    return {"r": r, "k": k, "v": v, "w": w, "u": torch.randn(1, K, generator=gen)}


def bonus_gradient(r, k, v, do, scale: float) -> torch.Tensor:
    """`du = scale * sum_t (r_t * k_t)(do_t . v_t)`: the bonus only touches the current token, never the state."""
    return scale * torch.einsum("bthk,bthk,bth->hk", r.double(), k.double(), (do.double() * v.double()).sum(-1))


@dataclass
class RWKV6Run:
    parametrisation: str
    output: check.Census
    grads: dict[str, check.Census]
    du_formula_error: float  # kernel du against `bonus_gradient`
    state: torch.Tensor = field(repr=False)  # largest |entry| of the exact (float64) state after each step
    bad_steps: dict[str, torch.Tensor] = field(repr=False)  # per tensor with a time axis: step has a NaN/inf

    @property
    def finite(self) -> bool:
        return self.output.count == 0 and all(c.count == 0 for c in self.grads.values())


def run_rwkv6(parametrisation: str = "sigmoid", T: int = 256, K: int = 16, seed: int = 0) -> RWKV6Run:
    """#11 with the real kernel: `fused_recurrent_rwkv6(r, k, v, w, u)`, then `o.mean().backward()`.

    Value checks are off so that a positive `w` reaches the kernel, as it did upstream.
    """
    from fla_lab.ops import fused_recurrent_rwkv6

    made = rwkv6_inputs(parametrisation, T, K, seed)  # on the CPU: the exact trajectory below runs there
    inputs = {n: x.requires_grad_() for n, x in on_device(made).items()}
    with contract.value_checks(False), quiet_overflow():
        o, _ = fused_recurrent_rwkv6(**inputs)
        o.mean().backward()
    do = torch.full_like(o, 1.0 / o.numel())
    du = bonus_gradient(inputs["r"], inputs["k"], inputs["v"], do, scale=K ** -0.5)
    dims = {"u": ("h", "d")}
    grads = {n: check.nonfinite_census(x.grad, dims.get(n, ("b", "t", "h", "d"))) for n, x in inputs.items()}
    timed = {"o": o.detach(), **{f"d{n}": x.grad for n, x in inputs.items() if n != "u"}}
    bad_steps = {n: (~torch.isfinite(x).flatten(2).all(-1).all(0)).cpu() for n, x in timed.items()}
    return RWKV6Run(parametrisation, check.nonfinite_census(o), grads, check.rel_error(inputs["u"].grad, du),
                    rwkv6_state_trajectory(**{n: x.detach() for n, x in made.items()}), bad_steps)


def _trajectory(step, T: int) -> torch.Tensor:
    """Largest |entry| of the state after each step, from a reference called one step at a time."""
    state, sizes = None, []
    with torch.no_grad():
        for t in range(T):
            state = step(slice(t, t + 1), state)
            sizes.append(float(state.abs().max()))
    return torch.tensor(sizes, dtype=torch.float64)


def rwkv6_state_trajectory(r, k, v, w, u) -> torch.Tensor:
    step = lambda s, h0: reference.recurrent_rwkv6(r[:, s], k[:, s], v[:, s], w[:, s], u,  # noqa: E731
                                                   initial_state=h0, output_final_state=True)[1]
    return _trajectory(step, r.shape[1])


def rwkv7_state_trajectory(r, w, k, v, a, b) -> torch.Tensor:
    step = lambda s, h0: reference.recurrent_rwkv7(r[:, s], w[:, s], k[:, s], v[:, s], a[:, s], b[:, s],  # noqa: E731
                                                   initial_state=h0, output_final_state=True)[1]
    return _trajectory(step, r.shape[1])


def first_step_above(sizes: torch.Tensor, limit: float = FP32_MAX) -> int | None:
    """The first step whose size passes `limit` (or is not finite); None if there is none."""
    above = (~(sizes.double() <= limit)).nonzero()
    return int(above[0]) if len(above) else None


def layer_output(bug: str | None, T: int = 360, hidden_size: int = 16, seed: int = 0) -> check.Census:
    """`RWKV6Attention` (official init, one head, fused recurrent) on randn input: where its output is non-finite.

    At the official init the decay speeds keep `w_raw <= -1`, so `sigmoid(w_raw) <= 0.27`: the buggy layer needs
    a few hundred steps before its state passes fp32's range.
    """
    from fla_lab.layers import RWKV6Attention

    with torch.random.fork_rng():  # the layer's init draws from the global generator: seed it, then restore it
        torch.manual_seed(seed)
        layer = RWKV6Attention("fused_recurrent", hidden_size=hidden_size, num_heads=1, expand_k=1.0,
                               layer_idx=0, num_hidden_layers=2, bug=bug)
    x = torch.randn(1, T, hidden_size, generator=torch.Generator().manual_seed(seed))
    with quiet_overflow(), torch.no_grad():
        return check.nonfinite_census(layer.to(runtime.device())(on_device(x))[0], dims=("b", "t", "d"))


def decay_factors(T: int = 256, K: int = 16, seed: int = 0) -> dict[str, float]:
    """Mean per-step factor exp(w) each parametrisation multiplies the state by (on #11's inputs)."""
    return {p: float(rwkv6_inputs(p, T, K, seed)["w"].exp().mean()) for p in ("sigmoid", "logsigmoid", "-exp")}


SATURATION_CASES = (("sigmoid", 0.1), ("sigmoid", 1.0), ("sigmoid", 10.0), ("logsigmoid", 10.0))


def saturation_table(T: int = 256, K: int = 16, seed: int = 0) -> list[dict]:
    """Is #11 about a saturated sigmoid? #11's inputs with x scaled by 0.1, 1 and 10 (the same draws), w =
    sigmoid(x) and, for contrast, logsigmoid(10 x). Per case: the share of gates sigma(x) outside [0.01, 0.99]
    (saturated), the mean per-step factor exp(w), the step at which the exact (float64) state passes fp32's largest
    value, and the kernel's first non-finite output (forward only)."""
    from fla_lab.ops import fused_recurrent_rwkv6

    rows = []
    for name, scale in SATURATION_CASES:
        x = rwkv6_inputs(name, T, K, seed, x_scale=scale)
        gate = torch.sigmoid(rwkv6_inputs(None, T, K, seed, x_scale=scale)["w"])
        with contract.value_checks(False), quiet_overflow(), torch.no_grad():
            o, _ = fused_recurrent_rwkv6(**on_device(x))
        census = check.nonfinite_census(o)
        rows.append({"w": f"{name}({scale:g} x)", "saturated": float(((gate < 0.01) | (gate > 0.99)).float().mean()),
                     "factor": float(x["w"].exp().mean()), "state passes fp32 max": first_step_above(
                         rwkv6_state_trajectory(**x)),
                     "first non-finite o": census.first["t"] if census.count else None})
    return rows


def print_saturation_table(rows: list[dict]) -> None:
    print(f"{'w':<20}{'gates saturated':>16}{'mean exp(w)':>13}{'state > fp32 max':>18}{'first bad o':>13}")
    for row in rows:
        step = lambda t: "never" if t is None else f"t = {t}"  # noqa: E731
        print(f"{row['w']:<20}{row['saturated']:>16.0%}{row['factor']:>13.2f}"
              f"{step(row['state passes fp32 max']):>18}{step(row['first non-finite o']):>13}")


def plot_rwkv6_states(runs: list[RWKV6Run]):
    """Left: the exact state's largest entry over time per parametrisation, fp32's limit and the kernel's first
    non-finite output. Right: which steps of the output and of each gradient hold a NaN/inf (first run)."""
    fig, (ax, census) = viz.figure(ncols=2, width=5.2, height=3.8)
    for run in runs:
        color, style = STYLES[run.parametrisation]
        ax.plot(run.state.numpy(), style, color=color, label=f"w = {run.parametrisation}(x)")
        if run.output.count:
            t = run.output.first["t"]
            ax.plot([t], [FP32_MAX], "x", color=color, ms=9, mew=2,
                    label=f"kernel output: first non-finite at t={t}")
    ax.axhline(FP32_MAX, color="k", lw=0.8, ls=":")
    ax.text(2, FP32_MAX * 4, "fp32 max 3.4e38", fontsize=9)
    ax.set(yscale="log", xlabel="step t", ylabel="largest |entry| of the state $S_t$ (float64)",
           title="the state under three decay parametrisations")
    ax.legend(fontsize=9, loc="upper left")  # the top left is empty: the growing state starts at the bottom
    plot_bad_steps(census, runs[0])
    return fig


def plot_bad_steps(ax, run: RWKV6Run) -> None:
    """One row per tensor, red where a time step holds a NaN/inf; du has no time axis: its verdict in the label."""
    import matplotlib.colors as mcolors

    names = list(run.bad_steps)
    grid = torch.stack([run.bad_steps[n] for n in names]).int().numpy()
    ax.imshow(grid, aspect="auto", cmap=mcolors.ListedColormap(["#dddddd", "#d62728"]), vmin=0, vmax=1,
              interpolation="nearest")
    du = "finite" if run.grads["u"].count == 0 else "non-finite"
    ax.set_yticks(range(len(names)), names)
    ax.set(xlabel="step t", title=f"w = {run.parametrisation}(x): steps holding NaN/inf in red (du: {du})")


# ----------------------------------------------------------------------------------------------------------
# 3. RWKV-7: the transition diag(exp w) + b a^T (upstream #150)

RWKV7_CASES = ("rand a, b; w = log(rand)", "rand a, b; raw w = rand", "RWKV-7 contract")


def rwkv7_case(name: str, T: int = 64, K: int = 64, seed: int = 0) -> dict[str, torch.Tensor]:
    """#150's direct call (all six inputs `torch.rand`, [B, T, H, K], w logged or not) or RWKV-7's contract."""
    if name == "RWKV-7 contract":
        return harness.rwkv7_inputs(1, T, 1, K, K, initial_state=False, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    r, w, k, v, a, b = (torch.rand(1, T, 1, K, generator=gen) for _ in range(6))
    return {"r": r, "w": w.log() if "log" in name else w, "k": k, "v": v, "a": a, "b": b}


def step_radii(w, a, b) -> torch.Tensor:
    """Largest |eigenvalue| of each step's transition `diag(exp w_t) + b_t a_t^T` (B = H = 1), float64, all steps in
    one batched `eigvals` (what `contract.transition_radius` computes for one step)."""
    w, a, b = (x.detach()[0, :, 0].cpu().double() for x in (w, a, b))
    return torch.linalg.eigvals(torch.diag_embed(w.exp()) + b[:, :, None] * a[:, None, :]).abs().amax(-1)


@dataclass
class RWKV7Run:
    case: str
    K: int
    output: check.Census
    radii: torch.Tensor = field(repr=False)
    state: torch.Tensor = field(repr=False)


def run_rwkv7(case: str, T: int = 64, K: int = 64, seed: int = 0) -> RWKV7Run:
    """The real `fused_recurrent_rwkv7` on one case, value checks off (the raw-w case has w > 0)."""
    from fla_lab.ops import fused_recurrent_rwkv7

    x = rwkv7_case(case, T, K, seed)
    with contract.value_checks(False), quiet_overflow(), torch.no_grad():
        o, _ = fused_recurrent_rwkv7(**on_device(x))
    return RWKV7Run(case, K, check.nonfinite_census(o), step_radii(x["w"], x["a"], x["b"]),
                    rwkv7_state_trajectory(**x))


@dataclass
class RWKV7Trace:
    """First bad step of #150's call in the float64 reference, the recurrent kernel and the chunk kernel."""
    case: str
    first: dict[str, int | None]
    chunk_row: int | None  # the chunk kernel's first non-finite output row
    exact_there: float  # largest |o| of the float64 reference at that row
    u_later: int | None  # first non-finite u in the same chunk, after that row

    def __str__(self) -> str:
        lines = [f"{self.case}:"] + [f"  {where:<44} {'-' if t is None else f't = {t}'}"
                                     for where, t in self.first.items()]
        if self.u_later is not None:
            lines.append(f"  -> the chunk kernel's o[{self.chunk_row}] is NaN though its exact value is "
                         f"{self.exact_there:.1e} (finite in fp32): rho = a^T S overflowed at t = {self.u_later}, "
                         f"later in the same 16-row chunk, and the chunk's product A_rb @ R (R: the rows rho) "
                         f"multiplies A_rb[t, s] = 0 (s > t) by inf: 0 * inf = NaN")
        return "\n".join(lines)


def _first_row(x: torch.Tensor) -> int | None:
    census = check.nonfinite_census(x)
    return None if census.count == 0 else census.first["t"]


def trace_rwkv7(case: str, T: int = 64, K: int = 64, seed: int = 0) -> RWKV7Trace:
    """Where #150's call first goes bad: exact values (float64 reference) against fp32's range, the recurrent
    kernel's output, and the chunk kernel's intermediates (`chunk_rwkv7_intermediates`), step by step."""
    from fla_lab.ops import fused_recurrent_rwkv7
    from fla_lab.ops.rwkv7.chunk import CHUNK, chunk_rwkv7_intermediates

    x = rwkv7_case(case, T, K, seed)
    with contract.value_checks(False), quiet_overflow(), torch.no_grad():
        o_rec, _ = fused_recurrent_rwkv7(**on_device(x))
        mid = {n: t.cpu() for n, t in chunk_rwkv7_intermediates(**on_device(x)).items()}
    o_ref = reference.recurrent_rwkv7(**x)[0].abs().amax((0, 2, 3))
    h_bad = (~torch.isfinite(mid["h"])).flatten(2).any(-1)[0].nonzero()
    first = {"reference (float64): largest |S_t| > fp32 max": first_step_above(rwkv7_state_trajectory(**x)),
             "reference (float64): largest |o_t| > fp32 max": first_step_above(o_ref),
             "fused_recurrent_rwkv7: first non-finite o": _first_row(o_rec),
             "chunk_rwkv7: first non-finite rho = a^T S": _first_row(mid["u"]),
             "chunk_rwkv7: first non-finite chunk state h": int(h_bad[0]) * CHUNK if len(h_bad) else None,
             "chunk_rwkv7: first non-finite o": _first_row(mid["o"])}
    row, u_later = first["chunk_rwkv7: first non-finite o"], None
    if row is not None:
        end = (row // CHUNK + 1) * CHUNK
        later = _first_row(mid["u"][:, row + 1:end])
        u_later = None if later is None or not o_ref[row] < FP32_MAX else row + 1 + later
    return RWKV7Trace(case, first, row, float(o_ref[row]) if row is not None else float("nan"), u_later)


def rand_radius_estimate(K):
    """#150's largest |eigenvalue| (a, b, exp w ~ U(0, 1)^K): b.a plus the a_i b_i-weighted mean of exp w, about
    E[b.a] + E[exp w] = K/4 + 1/2 (median over 32 steps at K = 64: 16.7). I + b a^T's 1 + K/4 bounds it above."""
    return K / 4 + 0.5


def radius_by_width(widths=(4, 8, 16, 32, 64, 128), T: int = 32, seed: int = 0) -> dict[str, list[float]]:
    """Median transition radius per key width: rand a, b (log-rand w) against the RWKV-7 contract."""
    out = {"rand a, b": [], "RWKV-7 contract": []}
    for K in widths:
        for name, case in (("rand a, b", RWKV7_CASES[0]), ("RWKV-7 contract", RWKV7_CASES[2])):
            x = rwkv7_case(case, T, K, seed)
            out[name].append(float(step_radii(x["w"], x["a"], x["b"]).median()))
    return out


def plot_rwkv7(runs: list[RWKV7Run], widths=(4, 8, 16, 32, 64, 128)):
    """Left: the exact state over time per case, with the kernel's first non-finite step. Right: eigenvalues."""
    import numpy as np

    fig, (left, right) = viz.figure(ncols=2, width=5.0, height=3.8)
    for run in runs:
        color, style = STYLES[run.case]
        left.plot(run.state.numpy(), style, color=color, label=run.case)
        if run.output.count:
            t = run.output.first["t"]
            left.plot([t], [FP32_MAX], "x", color=color, ms=9, mew=2, label=f"kernel: first non-finite t={t}")
    left.axhline(FP32_MAX, color="k", lw=0.8, ls=":")
    left.text(1, FP32_MAX * 1e3, "fp32 max 3.4e38", fontsize=9)
    left.set(yscale="log", xlabel="step t", ylabel="largest |entry| of $S_t$ (float64)",
             title=f"K = {runs[0].K}: exact state; x: fused_recurrent_rwkv7's first bad o")
    left.legend(fontsize=9, loc="upper left")  # clear of the curves: they all start near 1
    by_width = radius_by_width(widths)
    for name, radii in by_width.items():
        case = RWKV7_CASES[0] if name == "rand a, b" else name
        right.plot(widths, radii, "o-", color=STYLES[case][0], label=f"{case} (median over steps)")
    right.plot(widths, rand_radius_estimate(np.array(widths)), "k:", label="K/4 + 1/2 (E[b.a] + E[exp w])")
    right.axhline(1.0, color="grey", lw=0.8)
    right.set(xscale="log", yscale="log", xlabel="key width K",
              ylabel="largest |eigenvalue| of diag(exp w) + b a^T", title="one step's growth factor")
    right.set_xticks(widths, [str(k) for k in widths])
    right.legend(fontsize=9)
    return fig


# ----------------------------------------------------------------------------------------------------------
# 4. The contract checks, on good and bad calls


def with_zero(decay: torch.Tensor) -> torch.Tensor:
    """`decay` with its first entry set to exactly 0 (a gate that closed completely, or an underflow)."""
    out = decay.clone()
    out.view(-1)[0] = 0.0
    return out


def contract_cases(T: int = 16, K: int = 16, seed: int = 0) -> dict[str, tuple[str, object]]:
    """Each case: (the verdict it should get, a call). Small shapes: every accepted call runs its kernel."""
    from fla_lab import ops

    r, k, v, w, u = on_device(list(rwkv6_inputs("logsigmoid", T, K, seed).values()))
    x = on_device(rwkv6_inputs("sigmoid", T, K, seed)["w"])  # a decay in (0, 1)
    rwkv6 = lambda w, **kw: (lambda: ops.fused_recurrent_rwkv6(r, k, v, w, u, **kw))  # noqa: E731
    rwkv7 = lambda case: (lambda: ops.fused_recurrent_rwkv7(**on_device(rwkv7_case(case, T, K, seed))))  # noqa: E731
    gla = on_device(harness.gated_inputs(1, 32, 4, K, K, initial_state=False, seed=seed, names=("q", "k", "v", "gk")))
    bhtd = {n: t.transpose(1, 2) for n, t in gla.items()}
    return {
        "rwkv6, w = logsigmoid(x)": ("accepted", rwkv6(w)),
        "rwkv6, w = -exp(x)": ("accepted", rwkv6(-torch.exp(x))),
        "rwkv6, w = sigmoid(x) (#11)": ("ValueError", rwkv6(x)),
        "rwkv6, w = log(log-decay)": ("ValueError", rwkv6(torch.log(w))),
        "rwkv6, w = log(decay holding a 0)": ("ValueError", rwkv6(torch.log(with_zero(x)))),
        "rwkv6, head_first=False": ("TypeError", rwkv6(w, head_first=False)),
        "gla, [B, T, H, D] = (1, 32, 4, 16)": ("accepted", lambda: ops.fused_recurrent_gla(**gla)),
        "gla, [B, H, T, D] = (1, 4, 32, 16)": ("LayoutWarning", lambda: ops.fused_recurrent_gla(**bhtd)),
        "rwkv7, RWKV-7 contract": ("accepted", rwkv7(RWKV7_CASES[2])),
        "rwkv7, a, b ~ rand (#150)": ("TransitionWarning", rwkv7(RWKV7_CASES[0])),
        "rwkv7, a, b ~ rand, raw w = rand": ("ValueError", rwkv7(RWKV7_CASES[1])),
    }


def contract_table(**kwargs) -> dict[str, tuple[str, str]]:
    """{case: (expected verdict kind, verdict)} for `contract_cases`."""
    return {name: (expected, verdict(call)) for name, (expected, call) in contract_cases(**kwargs).items()}


def print_contract_table(table: dict[str, tuple[str, str]]) -> None:
    width = max(map(len, table))
    for name, (expected, got) in table.items():
        kind = got.split(":")[0]
        print(f"{'ok  ' if kind == expected else 'FAIL'}  {name:<{width}}  ->  {kind}")


# ----------------------------------------------------------------------------------------------------------
# 5. Explorer: decay and a.b against the state, per dtype

SIGNS = {"log-space (w <= 0)": -1.0, "raw positive (w > 0)": 1.0}


def explorer_inputs(decay: float, sign: float, ab: float, T: int = 128, K: int = 16, seed: int = 0) -> dict:
    """RWKV-7 inputs with `w = sign * decay * U(0.05, 1)`, `a` a unit vector u and `b = ab * u`, so that
    `b . a = ab` at every step.

    u has positive entries (U(0, 1), scaled to length 1), so successive steps point the same way, as #150's
    a, b ~ U(0, 1) do. RWKV-7's own a, b keep ab in [-1, 0]; #150 had ab near K / 4.
    """
    gen = torch.Generator().manual_seed(seed)
    shape = (1, T, 1, K)
    u = torch.rand(shape, generator=gen)
    u = u / u.norm(dim=-1, keepdim=True)
    w = sign * -harness.log_decay(shape, decay, gen)
    r, k, v = (torch.randn(shape, generator=gen) for _ in range(3))
    return {"r": r, "w": w, "k": k, "v": v, "a": u, "b": ab * u}


def growth_by_dtype(decay: float = 0.1, sign: float = -1.0, ab: float = 1.0, T: int = 128, K: int = 16,
                    seed: int = 0) -> dict[str, torch.Tensor]:
    """Largest |o_t| per step from the kernel in each dtype (inf/NaN kept), and the exact state's largest entry."""
    from fla_lab.ops import fused_recurrent_rwkv7

    x = explorer_inputs(decay, sign, ab, T, K, seed)
    out = {"exact state (fp64)": rwkv7_state_trajectory(**x)}
    for name, dtype in viz.DTYPES.items():
        with contract.value_checks(False), quiet_overflow(), torch.no_grad():
            o, _ = fused_recurrent_rwkv7(**on_device({n: t.to(dtype) for n, t in x.items()}))
        o = o.cpu()  # beside the exact state (CPU), and drawn with numpy
        size = o.float().abs().amax(dim=(0, 2, 3))
        out[name] = torch.where(torch.isfinite(o.float()).all(-1).all(-1).all(0), size, torch.full_like(size, math.inf))
    return out


# The explorer's initial setting: the static figure beside it is drawn with the same values
EXPLORER_DEFAULTS = {"decay": 0.1, "sign": -1.0, "ab": 1.0}


def growth_summary(curves: dict[str, torch.Tensor]) -> dict[str, int | float | None]:
    """From `growth_by_dtype`: each dtype's first step with a non-finite output (None: finite throughout), and
    the exact state's largest entry at the last step."""
    out = {name: first_step_above(size, torch.finfo(viz.DTYPES[name]).max)
           for name, size in curves.items() if name in viz.DTYPES}
    out["exact state at the last step"] = float(curves["exact state (fp64)"][-1])
    return out


def plot_growth(decay: float = 0.1, sign: float = -1.0, ab: float = 1.0, T: int = 128, K: int = 16,
                curves: dict[str, torch.Tensor] | None = None):
    """The explorer's figure; `curves` (from `growth_by_dtype` at the same setting) saves recomputing them."""
    import numpy as np

    curves = dict(growth_by_dtype(decay, sign, ab, T, K) if curves is None else curves)
    fig, (ax,) = viz.figure(width=6.4, height=3.8)
    state = curves.pop("exact state (fp64)")
    ax.plot(state.numpy(), "k--", label="exact state, largest |entry| (fp64)")
    for name, size in curves.items():
        dtype = viz.DTYPES[name]
        bad = ~torch.isfinite(size)
        finite = np.where(bad.numpy(), np.nan, size.numpy())
        first = int(bad.nonzero()[0]) if bad.any() else None
        label = f"kernel |o_t|, {name}" + (f": inf/NaN from t={first}" if first is not None else ": finite")
        width = {"fp32": 3.0, "bf16": 1.5, "fp16": 1.5}[name]  # fp32 widest: bf16 lies on top of it
        line, = ax.plot(finite, color=viz.DTYPE_COLORS[dtype], lw=width, label=label)
        if first is not None:
            ax.plot([first], [torch.finfo(dtype).max], "x", color=line.get_color(), ms=9, mew=2)
    for dtype, text in ((torch.float16, "fp16 max"), (torch.float32, "fp32 / bf16 max")):
        ax.axhline(torch.finfo(dtype).max, color=viz.DTYPE_COLORS[dtype], lw=0.8, ls=":")
        ax.text(T - 1, torch.finfo(dtype).max / 4, text, fontsize=9, ha="right", va="top",  # below: inside the axes
                color=viz.DTYPE_COLORS[dtype])
    kind = "log-space" if sign < 0 else "raw positive"
    ax.set(yscale="log", xlabel="step t", ylabel="magnitude",
           title=f"RWKV-7, K={K}: |w| ~ {decay:g} ({kind}), b.a = {ab:g}")
    ax.legend(fontsize=9, loc="upper left")
    return fig


def growth_explorer():
    return widgets.explorer(
        plot_growth,
        decay=widgets.log_slider("|w| per step", EXPLORER_DEFAULTS["decay"], -2, 1),
        sign=widgets.choice("sign of w", SIGNS, EXPLORER_DEFAULTS["sign"]),
        ab=widgets.choice("b . a", [-2.5, -1.0, -0.5, 0.0, 0.5, 1.0, 4.0, 16.0], EXPLORER_DEFAULTS["ab"]),
    )


# ----------------------------------------------------------------------------------------------------------
# 6. The central lines, on screen


def source_lines(module, starts: tuple[str, ...], first: int = 1) -> str:
    """For each of `starts`, the first line of `module` at or after line `first` that starts with it, with its
    file:line, in file order."""
    import inspect

    lines, _ = inspect.getsourcelines(module)  # a module's source starts at line 1
    path = "fla_lab/" + module.__name__.split(".", 1)[1].replace(".", "/") + ".py"
    found = sorted(next(i for i in range(first, len(lines) + 1) if lines[i - 1].lstrip().startswith(start))
                   for start in starts)
    return "\n".join(f"{path}:{i}  {markers.strip_line(lines[i - 1]).strip()}" for i in found)


def decay_lines() -> str:
    """Where the RWKV-6 step kernel uses `w` (`b_g`): it exponentiates it and multiplies the state, unchecked."""
    import inspect

    from fla_lab.ops.common import fused_recurrent

    first = inspect.getsourcelines(fused_recurrent.fused_recurrent_fwd_kernel.fn)[1]
    return source_lines(fused_recurrent, ("b_g = tl.load", "if RWKV6:  # read", "b_o = tl.sum((b_h + b_u",
                                          "b_h = b_h * tl.exp(b_g)[:, None]"), first)


def rwkv7_step_lines() -> str:
    """One step of RWKV-7 in the float64 reference: read along a, decay, write back along b, add k v^T."""
    import inspect

    first = inspect.getsourcelines(reference.recurrent_rwkv7)[1]
    return source_lines(reference, ("removed = ", "S = S * w", "S = S + k"), first)


def removal_lines() -> str:
    """The lines of `fla_lab/layers/rwkv7.py` that build kk, a and b, with their file:line, once exercise 2 is
    solved or revealed (`exercises.is_open`): before that they would be its answer."""
    import inspect

    from fla_lab.layers import rwkv7

    if not exercises.is_open(EXERCISE_REMOVAL):
        return (f"(the layer's lines that build a and b show once check_removal says PASS, or after verdict.hint()'s "
                f"last tier: {EXERCISE_REMOVAL})")
    body, start = inspect.getsourcelines(rwkv7.state_removal)  # its last line builds (a, b)
    return (source_lines(rwkv7, ("a = self.a_lora", "kk = ", "o = self.attend(")) +
            f"\nfla_lab/layers/rwkv7.py:{start + len(body) - 1}  {markers.strip_line(body[-1]).strip()}")


# ----------------------------------------------------------------------------------------------------------
# 7. Exercises: the learner writes the conversion the reports were missing
#
# A (#11, Triton). The fix of #11 is in the caller: turn the gate it meant, a decay sigma(x) in (0, 1), into the
# log-decay the kernel wants. No shipped kernel does this (fla_lab's and FLA's layers call F.logsigmoid or
# -torch.exp in PyTorch), so `gate_to_log_decay_kernel` is the caller's elementwise step written as a Triton kernel:
# the rows (b, t, h) of a [B, T, H, K] tensor with the recurrent kernels' pointer maths, loaded and upcast to fp32;
# the learner's `@triton.jit` helper, passed in the `tl.constexpr` slot TO_LOG_DECAY, maps a block of x to w.

EXERCISE_LOG_DECAY = "#11: the log of a sigmoid gate, as a @triton.jit helper"
EXERCISE_REMOVAL = "#150: RWKV-7's a and b, from the key and the gate"
SATURATED_X = (-200.0, 200.0)  # sigma(x) rounds to 0 below x ~ -88.7 (exp(-x) overflows) in fp32, to 1 above x ~ 17
GATE_BT = 64  # rows per program
# the solution lines: sealed (base64 in this source; Tab, `??` and help() do not show them), opened by the last
# hint tier only
_LOG_DECAY_LINE = exercises.Sealed("cmV0dXJuIHRsLm1pbmltdW0oeCwgMC4wKSAtIHRsLmxvZygxLjAgKyB0bC5leHAoLXRsLmFicyh4KSkp")
_REMOVAL_LINE = exercises.Sealed("a2sgPSBGLm5vcm1hbGl6ZShrLCBkaW09LTEpOyByZXR1cm4gLWtrLCBrayAqIGE=")
# hint tiers that state a fix in words, sealed like the lines (`verdict.hint()` opens them; a Sealed last tier counts
# as the line, and printing it opens the fix, so a last tier that is not the line stays plain). Exercise 1: why a
# log of a rounded gate is not finite, why a clamp is off, and the line
_WHY_NOT_FINITE = exercises.Sealed(
    "aW4gZnAzMiwgc2lnbW9pZCh4KSA9IDEgLyAoMSArIGV4cCgteCkpIHJvdW5kcyB0byBleGFjdGx5IDAgb25jZSBleHAoLXgpIG92ZXJmbG93cyAoeC"
    "BiZWxvdyBhYm91dCAtODguNzsgYSBHUFUncyBzaWdtb2lkIG1heSBob2xkIG9uIHRvIGFib3V0IC0xMDMgd2l0aCBzdWJub3JtYWxzKSwgYW5kIGxv"
    "ZygwKSA9IC1pbmYgKGxvZyhpbmYpID0gaW5mIGlmIHlvdSB3cm90ZSBsb2coMSArIGV4cCgteCkpKTogbmV2ZXIgdGFrZSB0aGUgbG9nIG9mIGEgZ2"
    "F0ZSB0aGF0IGhhcyBhbHJlYWR5IHJvdW5kZWQsIG5vciB0aGUgZXhwIG9mIGEgbGFyZ2UgcG9zaXRpdmUgbnVtYmVyLiBXaGljaCBleHAgYXJndW1l"
    "bnQgc3RheXMgPD0gMCBmb3IgZXZlcnkgeD8=")
_WHY_OFF = exercises.Sealed(
    "bG9nKHNpZ21vaWQoeCkpIGlzIGFib3V0IHggZm9yIHZlcnkgbmVnYXRpdmUgeCBhbmQgYWJvdXQgLWV4cCgteCkgZm9yIGxhcmdlIHg6IGEgY2xhbX"
    "Agb24gdGhlIGdhdGUgb3Igb24geCBrZWVwcyB3IGZpbml0ZSBidXQgY2FwcyBpdDsgd3JpdGUgbG9nKHNpZ21vaWQoeCkpID0gLWxvZygxICsgZXhw"
    "KC14KSkgc28gdGhhdCBubyBleHAgb3ZlcmZsb3dz")
_LOG_DECAY_TIER = exercises.Sealed(
    "c3BsaXQgbG9nKHNpZ21vaWQoeCkpID0gLWxvZygxICsgZXhwKC14KSkgb24gdGhlIHNpZ24gb2YgeDogIHJldHVybiB0bC5taW5pbXVtKHgsIDAuMC"
    "kgLSB0bC5sb2coMS4wICsgdGwuZXhwKC10bC5hYnMoeCkpKQ==")
# exercise 2: one per mistake of removal_hints (a sign, an adding step, no key, the key's length, the transposed
# step, anything else), and the line with what each half does
_WHAT_SIGN = exercises.Sealed(
    "YSBhbmQgYiBwb2ludCB0aGUgc2FtZSB3YXksIHNvIHRoZSBzdGVwIGFkZHMgYWxvbmcgdGhlIGtleSBpbnN0ZWFkIG9mIHJlbW92aW5nOiBvbmUgb2"
    "YgdGhlIHR3byB0YWtlcyBhIG1pbnVzIHNpZ24=")
_WHAT_ADDS = exercises.Sealed(
    "YSBpcyB3aGF0IHRoZSBzdGVwIHJlYWRzIChyaG8gPSBhXlQgUyksIGIgaXMgd2hlcmUgaXQgd3JpdGVzIHJobyBiYWNrOiB0byByZW1vdmUsIGIgbX"
    "VzdCBwb2ludCBhZ2FpbnN0IGEgKGIgLiBhIDwgMCksIGJvdGggYWxvbmcgdGhlIGtleSdzIGRpcmVjdGlvbiwgYW5kIHRoZSByZXBvcnQncyBiLCBk"
    "cmF3biBhdCByYW5kb20sIGhhcyBubyBwbGFjZQ==")
_WHAT_NO_KEY = exercises.Sealed(
    "dGhlIHN0ZXAgcmVhZHMgdGhlIHN0YXRlIGFsb25nIGEgKHJobyA9IGFeVCBTKSBhbmQgd3JpdGVzIHJobyBiYWNrIGFsb25nIGIsIGFuZCBSV0tWLT"
    "cgcmVhZHMgYW5kIHdyaXRlcyBhbG9uZyB0aGUga2V5J3MgZGlyZWN0aW9uLCBvbmUgdW5pdCB2ZWN0b3IgcGVyIGhlYWQgYW5kIHRva2VuOiBhIGFu"
    "ZCBiIGFyZSBidWlsdCBmcm9tIGsuIFRoZSByZXBvcnQncyBhIGVudGVycyBvbmx5IGFzIHRoZSBnYXRlIGFfZ2F0ZSwgc2NhbGluZyB3aGF0IGlzIH"
    "dyaXR0ZW4gYmFjayBwZXIgY2hhbm5lbDsgdGhlIHJlcG9ydCdzIGIgaGFzIG5vIHBsYWNl")
_WHAT_NO_KEY_BELOW = exercises.Sealed(
    "dGhlIHN0ZXAgcmVhZHMgdGhlIHN0YXRlIGFsb25nIGEgKHJobyA9IGFeVCBTKSBhbmQgd3JpdGVzIHJobyBiYWNrIGFsb25nIGIsIGFuZCBSV0tWLT"
    "cgcmVhZHMgYW5kIHdyaXRlcyBhbG9uZyB0aGUga2V5J3MgZGlyZWN0aW9uLCBvbmUgdW5pdCB2ZWN0b3IgcGVyIGhlYWQgYW5kIHRva2VuOiBhIGFu"
    "ZCBiIGFyZSBidWlsdCBmcm9tIGsuIFRoZSByZXBvcnQncyBhIGVudGVycyBvbmx5IGFzIHRoZSBnYXRlIGFfZ2F0ZSwgc2NhbGluZyB3aGF0IGlzIH"
    "dyaXR0ZW4gYmFjayBwZXIgY2hhbm5lbDsgdGhlIHJlcG9ydCdzIGIgaGFzIG5vIHBsYWNlLiBUd28gVSgwLCAxKSB2ZWN0b3JzLCBzaWducyBjaGFu"
    "Z2VkIG9yIG5vdCwgaGF2ZSB8YiAuIGF8IGFib3V0IEsvNCwgc28gYSBzdGVwIGFsb25nIHRoZW0gcmVtb3ZlcyBzZXZlcmFsIHRpbWVzIHdoYXQgdG"
    "hlIHN0YXRlIGhvbGRz")
_WHAT_KEY_LENGTH = exercises.Sealed(
    "YiAuIGEgY2FycmllcyB0aGUga2V5J3Mgc3F1YXJlZCBsZW5ndGggKHxrfF4yIGlzIGFib3V0IEsvMyBmb3IgcmFuZCBrZXlzKSwgc28gdGhlIHN0ZX"
    "AgcmVtb3ZlcyBtb3JlIHRoYW4gdGhlIHN0YXRlIGhvbGRzOiByZWFkIGFsb25nIGEgdW5pdCB2ZWN0b3IsIHRoZSBrZXkgbm9ybWFsaXNlZCBwZXIg"
    "aGVhZCAob3ZlciB0aGUgbGFzdCBkaW1lbnNpb24sIEsp")
_WHAT_TRANSPOSED = exercises.Sealed(
    "YSBpcyByZWFkIChyaG8gPSBhXlQgUyksIGIgaXMgd3JpdHRlbiAoY2hhbm5lbCBpIGdldHMgYl9pIHJobyk6IHRoZSBnYXRlIGFfZ2F0ZVtpXSBzYX"
    "lzIGhvdyBtdWNoIGtleSBjaGFubmVsIGkgbG9zZXMsIHNvIGl0IHNjYWxlcyBiOyBhIGlzIHRoZSB1bml0IGtleSBhbG9uZQ==")
_WHAT_REMOVAL = exercises.Sealed(
    "cmVhZCBhbG9uZyB0aGUgdW5pdCBrZXkgKGEpLCB3cml0ZSBiYWNrIGFnYWluc3QgaXQgKGIpLCBzY2FsZWQgcGVyIGNoYW5uZWwgYnkgdGhlIGdhdG"
    "UgYV9nYXRl")
_REMOVAL_TIER = exercises.Sealed(
    "a2sgPSBGLm5vcm1hbGl6ZShrLCBkaW09LTEpOyByZXR1cm4gLWtrLCBrayAqIGEgICAoYSB1bml0IGtleSByZWFkLCB0aGUgZ2F0ZSBvbiB3aGF0IG"
    "lzIHdyaXR0ZW4gYmFjazsgdGhlIHJlcG9ydCdzIGIgaXMgbm90IHVzZWQp")

_WHAT_PER_HEAD = exercises.Sealed(
    "dGhlIGtleSBpcyBub3JtYWxpc2VkIHBlciBoZWFkOiBpdHMgbGVuZ3RoIGlzIHRha2VuIG92ZXIgdGhlIEsgY2hhbm5lbHMgb2Ygb25lIGhlYW"
    "QgKHRoZSBsYXN0IGRpbWVuc2lvbiksIG5ldmVyIG92ZXIgdGhlIGhlYWRzIHRvZ2V0aGVyOyB3aXRoIG9uZSBoZWFkIChIID0gMSkgdGhlIHR3"
    "byBhcmUgdGhlIHNhbWUsIHdpdGggSCA9IDIgZWFjaCBoZWFkJ3Mga2V5IGlzIHRoZW4gc2hvcnRlciB0aGFuIGEgdW5pdCB2ZWN0b3IgYW5kIH"
    "JlbW92ZXMgdG9vIGxpdHRsZQ==")
HEADS_CASE = (16, 2, 16)  # (T, H, K) of check_removal's second case: two heads, where #150's case has H = 1


@triton.jit
def gate_to_log_decay_kernel(x, w, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                             TO_LOG_DECAY: tl.constexpr):
    """w[b, t, h, :] = TO_LOG_DECAY(x[b, t, h, :]) for the BT steps of block i_t of sequence b, head h."""
    i_t, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    m_tk = (o_t < T)[:, None] & (o_k < K)[None, :]
    row = (i_b * T + o_t) * H + i_h  # as in the recurrent kernels: step t of sequence b, head h
    p = row[:, None] * K + o_k[None, :]
    b_x = tl.load(x + p, mask=m_tk, other=0).to(tl.float32)
    tl.store(w + p, TO_LOG_DECAY(b_x).to(w.dtype.element_ty), mask=m_tk)


def gate_to_log_decay(helper, x: torch.Tensor) -> torch.Tensor:
    """Run `gate_to_log_decay_kernel` with the learner's `helper` on raw activations x [B, T, H, K]: w, fp32."""
    B, T, H, K = x.shape
    x = x.to(device=runtime.device(), dtype=torch.float32).contiguous()
    w = torch.empty_like(x)
    grid = (triton.cdiv(T, GATE_BT), B * H)
    gate_to_log_decay_kernel[grid](x, w, T, H, K, GATE_BT, triton.next_power_of_2(K), helper)
    return w.cpu()


def saturated_activations(K: int = 16, steps: int = 64) -> torch.Tensor:
    """[1, steps, 1, K] activations spread evenly over SATURATED_X: where sigma(x) sits at 0 or 1 in fp32."""
    return torch.linspace(*SATURATED_X, steps * K).reshape(1, steps, 1, K)


def log_decay_hints(x: torch.Tensor, w: torch.Tensor) -> tuple[str, ...]:
    """Hint tiers that follow what the learner's helper did wrong on activations x (randn and saturated, flat):
    a positive w (the gate itself), non-finite w (a log of a rounded sigmoid or of an overflowed exp), or a
    finite w that is off (a clamp, a branch)."""
    x, w = x.flatten().double(), w.flatten().double()
    ref = F.logsigmoid(x)
    bad = ~torch.isfinite(w)
    if (w[~bad] > 0).any():
        return exercises.hints(
            where=f"w is positive (up to {float(w[~bad].max()):.2f}): the contract refuses it, and the exact state "
                  "above grows past fp32's range",
            what="the kernel multiplies the state by exp(w) every step (the line `b_h * tl.exp(b_g)` of section 2): "
                 "w must be the natural log of the gate, log(sigmoid(x)) <= 0, not the gate",
            line="start from the direct form, return tl.log(tl.sigmoid(x)), and run the check again")
    if bad.any():
        lo, hi = float(x[bad].min()), float(x[bad].max())
        fine = "every other x matches float64" if (~bad).any() and bool(
            ((w[~bad] - ref[~bad]).abs() <= 1e-5 * ref[~bad].abs().clamp(min=1)).all()) else "other x are off too"
        return exercises.hints(
            where=f"w is non-finite ({int(bad.sum())} values) at every x from {lo:.1f} to {hi:.1f} that the check "
                  f"tried; {fine}",
            what=_WHY_NOT_FINITE, line=_LOG_DECAY_TIER)
    err = (w - ref).abs() / ref.abs().clamp(min=1)
    worst = int(err.argmax())
    return exercises.hints(
        where=f"w is finite but off: worst at x = {float(x[worst]):.2f}, {float(w[worst]):.4g} against float64's "
              f"{float(ref[worst]):.4g}",
        what=_WHY_OFF, line=_LOG_DECAY_TIER)


def check_log_decay(helper, T: int = 256, K: int = 16, seed: int = 0) -> exercises.Verdict:
    """PASS when the learner's `@triton.jit` helper `(x) -> w` gives log(sigmoid(x)) within the fp32 tolerance of
    float64, finite even where the sigmoid saturates, and `fused_recurrent_rwkv6` on #11's inputs with that w is
    accepted by the contract and matches the float64 reference (output, final state, every gradient)."""
    from fla_lab.ops import fused_recurrent_rwkv6

    if rejected := exercises.not_a_jit_helper(EXERCISE_LOG_DECAY, helper):
        return rejected
    tol = check.tolerance(torch.float32)
    x = rwkv6_inputs(None, T, K, seed)  # #11's inputs, w still the raw activations x ~ randn
    sat = saturated_activations(K)
    w, w_sat = gate_to_log_decay(helper, x["w"]), gate_to_log_decay(helper, sat)
    facts = [exercises.error_fact(f"w on #11's x ~ randn (T = {T}, K = {K}) vs float64 log(sigmoid(x))",
                                  check.rel_error(w, F.logsigmoid(x["w"].double())), tol.fwd),
             exercises.error_fact(f"w on saturated x in [{SATURATED_X[0]:g}, {SATURATED_X[1]:g}] vs float64",
                                  check.rel_error(w_sat, F.logsigmoid(sat.double())), tol.fwd)]
    nonfinite = int((~torch.isfinite(w_sat)).sum())
    facts.append((nonfinite == 0, f"non-finite w on saturated x: {nonfinite} of {w_sat.numel()}"))
    hint = log_decay_hints(torch.cat([x["w"].flatten(), sat.flatten()]), torch.cat([w.flatten(), w_sat.flatten()]))
    x["w"] = w
    said = verdict(fused_recurrent_rwkv6, **x)
    facts.append((said == "accepted", f"contract checks on fused_recurrent_rwkv6: {said.split(':')[0]}"))
    with contract.value_checks(False), quiet_overflow():
        result = harness.compare(fused_recurrent_rwkv6, reference.recurrent_rwkv6, x)
    forward = {n: e for n, e in result.errors.items() if n in ("o", "ht")}
    grads = {n: e for n, e in result.errors.items() if n not in forward}
    facts += [exercises.error_fact(f"fused_recurrent_rwkv6 {n} vs float64", e, tol.fwd) for n, e in forward.items()]
    worst = max(grads, key=lambda n: grads[n] if math.isfinite(grads[n]) else math.inf)
    facts.append(exercises.error_fact(f"worst gradient (d{worst}) vs float64", grads[worst], tol.grad))
    largest = float(rwkv6_state_trajectory(**x).max())
    facts.append((largest < FP32_MAX, f"largest |entry| of the exact state over {T} steps: "
                                      f"{exercises.fmt(largest)} (fp32 max 3.4e+38)"))
    return exercises.verdict(EXERCISE_LOG_DECAY, facts, hint)


# B (#150, PyTorch). The report passed a, b ~ U(0, 1) as if they were free inputs. RWKV-7 derives both from the key
# and the in-context learning rate a_gate in (0, 1), as its layer does (`removal_lines()` prints those lines; the
# layer's per-channel key scale k_k is 1 here). The learner derives them from the step (read along a, write back
# along b) with the eigenvalue probe, and writes `removal(k, a, b) -> (a, b)`, reading the report's `a` as a_gate.
# Only the product b a^T enters the recurrence, so either sign convention of the pair passes.

PROBE_WIDTHS = (8, 64)


def _removal_reference(k: torch.Tensor, a_gate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """RWKV-7's removal vectors from a key and a gate, as `fla_lab.layers.RWKV7Attention` builds them (k_k = 1)."""
    return _sealed_removal()(k, a_gate, None)


@functools.cache
def _sealed_removal():
    """The exercise's sealed line as a function `(k, a, b) -> (a, b)`: compiled from the seal, so that this source
    (`lesson??`) never spells the answer out, and the check grades against the very line the last hint prints."""
    scope = {"F": F}
    exec(f"def removal(k, a, b):\n    {_REMOVAL_LINE.opened()}\n", scope)  # noqa: S102  (our own sealed text)
    return scope["removal"]


def _rank_one(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """b a^T per (batch, step, head), float64: the only way a and b enter the recurrence."""
    return b.double()[..., :, None] * a.double()[..., None, :]


@dataclass
class Probe:
    """What one step's transition diag(exp w) + b a^T does, over a sequence: b . a and the largest |eigenvalue|."""
    K: int
    ba: tuple[float, float]  # min and max of b . a over the steps
    radius: float  # largest |eigenvalue| over the steps
    state: float  # largest |entry| of the exact state over the steps

    def __str__(self) -> str:
        return (f"K = {self.K:>3}: b . a from {self.ba[0]:+.2f} to {self.ba[1]:+.2f};  largest |eigenvalue| "
                f"{self.radius:.3f};  exact state's largest entry {exercises.fmt(self.state)}")


def probe(w, a, b, r=None, k=None, v=None) -> Probe:
    """The eigenvalue probe: b . a, the largest |eigenvalue| of every step's transition, and (with r, k, v) the
    exact state's largest entry. Tensors [1, T, 1, K]."""
    ba = (a.double() * b.double()).sum(-1)
    state = float(rwkv7_state_trajectory(r, w, k, v, a, b).max()) if r is not None else math.nan
    return Probe(a.shape[-1], (float(ba.min()), float(ba.max())), float(step_radii(w, a, b).max()), state)


def probe_removal(removal, widths=PROBE_WIDTHS, T: int = 64, seed: int = 0) -> list[Probe]:
    """Run the learner's `removal(k, a, b)` on #150's inputs at each key width and probe the transitions it gives."""
    out = []
    for K in widths:
        x = rwkv7_case(RWKV7_CASES[0], T, K, seed)
        a, b = removal(x["k"].clone(), x["a"].clone(), x["b"].clone())
        out.append(probe(x["w"], a.float(), b.float(), x["r"], x["k"], x["v"]))
    return out


def uses_key(removal, k: torch.Tensor, a_gate: torch.Tensor, b: torch.Tensor, a_out, b_out) -> bool:
    """Whether the learner's `removal(k, a, b)` depends on the key: called again with another rand key (the gate and
    the report's b kept), does it return other vectors than `(a_out, b_out)`? A removal that raises counts as one
    that does (the check's facts already say what went wrong)."""
    other = torch.rand(k.shape, generator=torch.Generator().manual_seed(12345), dtype=k.dtype)
    try:
        a2, b2 = removal(other, a_gate.clone(), b.clone())
        return not (torch.equal(torch.as_tensor(a2), torch.as_tensor(a_out)) and
                    torch.equal(torch.as_tensor(b2), torch.as_tensor(b_out)))
    except Exception:  # noqa: BLE001  (a hint, not a traceback)
        return True


def removal_hints(k, a_gate, a, b, probes: list[Probe], key_used: bool = True) -> tuple[str, ...]:
    """Hint tiers that follow the learner's a, b: adding (b . a > 0), removing nothing (b . a = 0), a step that
    ignores the key (`key_used` False: the report's vectors, negated or otherwise), removing more than everything
    (b . a < -1, growing with K: the key's length), or the gate on the read side (the transposed step)."""
    a_ref, b_ref = _removal_reference(k.double(), a_gate.double())
    R, R_ref = _rank_one(a, b), _rank_one(a_ref, b_ref)
    close = lambda X, Y: float((X - Y).abs().max()) <= 1e-5 * float(Y.abs().max())  # noqa: E731
    seen = "; ".join(f"K = {p.K}: b . a up to {p.ba[1]:+.2f}, down to {p.ba[0]:+.2f}, |eigenvalue| {p.radius:.2f}"
                     for p in probes)
    if close(R, -R_ref):
        return exercises.hints(
            where=f"the probe: {seen}. Right size, wrong sign",
            what=_WHAT_SIGN, line=_REMOVAL_TIER)
    if max(p.ba[1] for p in probes) > 1e-6:
        return exercises.hints(
            where=f"the probe: {seen}. b . a > 0: along a, one step keeps about exp(w) + b . a of the state, more than "
                  "all of it",
            what=_WHAT_ADDS, line=_REMOVAL_TIER)
    if max(abs(p.ba[0]) for p in probes) < 1e-6:
        return exercises.hints(
            where=f"the probe: {seen}. b . a = 0: the transition is diag(exp w), it never grows, but it never removes",
            what="RWKV-7 removes, at each step, a fraction a_gate of what the state holds along the key's direction",
            line=_REMOVAL_TIER)
    below = min(p.ba[0] for p in probes) < -1 - 1e-6
    if not key_used:
        return exercises.hints(
            where=f"the probe: {seen}." + (" b . a below -1, lower at the larger K: a negative eigenvalue beyond -1, "
                                           "the state flips sign and grows." if below else "") +
                  " And your a, b do not depend on k: called again with another key, removal returned the same "
                  "vectors",
            what=_WHAT_NO_KEY_BELOW if below else _WHAT_NO_KEY, line=_REMOVAL_TIER)
    if below:
        return exercises.hints(
            where=f"the probe: {seen}. b . a below -1, lower at the larger K: a negative eigenvalue beyond -1, the "
                  "state flips sign and grows",
            what=_WHAT_KEY_LENGTH, line=_REMOVAL_TIER)
    if close(R, R_ref.transpose(-1, -2)):
        return exercises.hints(
            where="the eigenvalues are right but the step is the transpose of RWKV-7's (same eigenvalues, other output)",
            what=_WHAT_TRANSPOSED, line=_REMOVAL_TIER)
    return exercises.hints(
        where=f"the probe: {seen}; the step differs from RWKV-7's removal",
        what=_WHAT_REMOVAL, line=_REMOVAL_TIER)


def heads_case(T: int = 16, H: int = 2, K: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    """#150's inputs (all six `torch.rand`, w logged) with `H` heads: [1, T, H, K]."""
    gen = torch.Generator().manual_seed(seed)
    r, w, k, v, a, b = (torch.rand(1, T, H, K, generator=gen) for _ in range(6))
    return {"r": r, "w": w.log(), "k": k, "v": v, "a": a, "b": b}


def heads_fact(removal, tol: float, seed: int = 0) -> tuple[bool, str]:
    """The float64 recurrence with the learner's a, b vs RWKV-7's on `HEADS_CASE` (H = 2: a key normalised over
    the heads together passes with H = 1 and fails here)."""
    T, H, K = HEADS_CASE
    x = heads_case(T, H, K, seed)
    label = f"with H = {H} heads: float64 recurrence with your a, b vs with RWKV-7's (o)"
    try:
        a, b = removal(x["k"].clone(), x["a"].clone(), x["b"].clone())
        a_ref, b_ref = _removal_reference(x["k"].double(), x["a"].double())
        mine = reference.recurrent_rwkv7(**{**x, "a": a, "b": b})[0]
    except Exception as error:  # noqa: BLE001  (the learner's code: a fact, not a traceback)
        return False, f"{label}: raised {type(error).__name__}: {error}"
    theirs = reference.recurrent_rwkv7(**{**x, "a": a_ref, "b": b_ref})[0]
    return exercises.error_fact(label, check.rel_error(mine, theirs), tol)


def check_removal(removal, T: int = 64, K: int = 64, seed: int = 0) -> exercises.Verdict:
    """PASS when `removal(k, a, b)` on #150's inputs (all six ~ torch.rand, w = log(rand), the report's a read as
    the gate) gives RWKV-7's step: b . a in [-1, 0], every transition eigenvalue <= 1, the same recurrence as the
    layer's a, b (float64), no contract warning, and `chunk_rwkv7` (the report's op) within tolerance of float64;
    and, on the same kind of inputs with two heads (`HEADS_CASE`), the same float64 recurrence as RWKV-7's."""
    from fla_lab.ops import chunk_rwkv7

    tol = check.tolerance(torch.float32).fwd
    x = rwkv7_case(RWKV7_CASES[0], T, K, seed)
    k, a_gate, b_report = x["k"].clone(), x["a"].clone(), x["b"].clone()
    a, b = removal(x["k"].clone(), x["a"].clone(), x["b"].clone())
    x["a"], x["b"] = a.float(), b.float()
    seen = probe(x["w"], x["a"], x["b"], x["r"], x["k"], x["v"])
    facts = [(-1 - 1e-6 <= seen.ba[0] and seen.ba[1] <= 1e-6,
              f"b . a over the {T} steps: from {seen.ba[0]:+.3f} to {seen.ba[1]:+.3f}"),
             (seen.radius <= 1.0 + 1e-6,
              f"largest |eigenvalue| of diag(exp w) + b a^T over {T} steps: {seen.radius:.3f}")]
    a_ref, b_ref = _removal_reference(k.double(), a_gate.double())
    mine = reference.recurrent_rwkv7(**x)[0]
    theirs = reference.recurrent_rwkv7(**{**x, "a": a_ref, "b": b_ref})[0]
    facts.append(exercises.error_fact("float64 recurrence with your a, b vs with RWKV-7's (o)",
                                      check.rel_error(mine, theirs), tol))
    said = verdict(chunk_rwkv7, **x)
    facts.append((said == "accepted", f"contract checks on chunk_rwkv7: {said.split(':')[0]}"))
    with contract.value_checks(False), quiet_overflow():
        result = harness.compare(chunk_rwkv7, reference.recurrent_rwkv7, x, grads=False)
    facts += [exercises.error_fact(f"chunk_rwkv7 {n} vs float64", e, tol) for n, e in result.errors.items()]
    facts.append((seen.state < FP32_MAX, f"largest |entry| of the exact state over {T} steps: "
                                         f"{exercises.fmt(seen.state)}"))
    one_head = all(ok for ok, _ in facts)
    facts.append(heads_fact(removal, tol, seed))
    if all(ok for ok, _ in facts):
        return exercises.verdict(EXERCISE_REMOVAL, facts)
    if one_head:  # right with one head, wrong with two: the key normalised over more than one head's channels
        return exercises.verdict(EXERCISE_REMOVAL, facts, exercises.hints(
            where=f"every fact holds with one head (H = 1), not with two: {facts[-1][1]}",
            what=_WHAT_PER_HEAD, line=_REMOVAL_TIER))
    key_used = uses_key(removal, k, a_gate, b_report, a, b)
    return exercises.verdict(EXERCISE_REMOVAL, facts, removal_hints(k, a_gate, a, b, probe_removal(removal), key_used))

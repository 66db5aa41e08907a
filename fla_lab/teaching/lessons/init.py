"""Notebook 01: RWKV7Attention's uninitialised parameters (upstream #150) and the official RWKV-7 init.

Everything runs the real layer (`fla_lab.layers.RWKV7Attention`): `bug="uninitialized_params"` rebuilds it as it was
before d49c52f6 (x_r..x_g, k_k, k_a, r_k from `torch.empty`, emulated by reproducible garbage), the default is
the official initialisation of `fla_lab.layers.init`. The notebook's exercise has the learner find which parameters
the historical routine (run through `Module.apply`) never reached, and why, and set them to the official values;
`check_initialisation` compares them with the layer's fixed path, runs the layer against its float64 twin, and
chooses its hint tiers from the mistake it measured.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import matplotlib
import torch
from torch import nn

from fla_lab.spec import check, harness, reference
from fla_lab import runtime
from fla_lab.tools import viz, widgets
from fla_lab.teaching.exercises import Sealed, Verdict, error_fact, verdict
from fla_lab.layers import RWKV7Attention
from fla_lab.layers import init as official

DEPTH = 12  # the 12-layer model of the figures and of every official layer built here
HUGE = 1e4  # no initialised RWKV-7 parameter comes near this; uninitialised memory often does


def vector_parameters() -> tuple[str, ...]:
    """The parameters upstream created with `torch.empty` (x_x split into its six rows, k_k, k_a, r_k)."""
    return (*RWKV7Attention.MIX, "k_k", "k_a", "r_k")


def reported_layer(hidden_size: int = 128, dtype: torch.dtype = torch.bfloat16) -> RWKV7Attention:
    """Upstream's call `RWKV7Attention("chunk", hidden_size=768, layer_idx=0)` as it behaved before d49c52f6."""
    layer = RWKV7Attention("chunk", hidden_size=hidden_size, layer_idx=0, bug="uninitialized_params")
    return layer.to(runtime.device(), dtype)


def official_layer(hidden_size: int = 128, layer_idx: int = 0, dtype: torch.dtype = torch.bfloat16,
                   seed: int = 0) -> RWKV7Attention:
    """The same layer with the official init, as one layer of a `DEPTH`-layer model."""
    torch.manual_seed(seed)
    layer = RWKV7Attention("chunk", hidden_size=hidden_size, layer_idx=layer_idx, num_hidden_layers=DEPTH)
    return layer.to(runtime.device(), dtype)


def layer_input(T: int = 32, hidden_size: int = 128, dtype: torch.dtype = torch.bfloat16, B: int = 2,
                seed: int = 0) -> torch.Tensor:
    """`randn(B, T, C)` as in the report (which used B=2, T=1024, C=768)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, hidden_size, generator=gen).to(runtime.device(), dtype)


@dataclass(frozen=True)
class ParameterRow:
    name: str
    shape: tuple[int, ...]
    nonfinite: int  # NaN or inf
    huge: int       # finite but |x| > HUGE: garbage just as much
    total: int

    @property
    def garbage(self) -> bool:
        return self.nonfinite + self.huge > 0


def parameter_census(module: nn.Module) -> list[ParameterRow]:
    """One row per parameter: how many values are non-finite (`check.nonfinite_census`) or absurdly large."""
    rows = []
    for name, p in module.named_parameters():
        values = p.detach().float()
        nonfinite = check.nonfinite_census(values).count
        huge = int((values.abs() > HUGE).logical_and(torch.isfinite(values)).sum())
        rows.append(ParameterRow(name, tuple(p.shape), nonfinite, huge, p.numel()))
    return rows


def format_census(rows: list[ParameterRow], only_garbage: bool = True) -> str:
    shown = [r for r in rows if r.garbage or not only_garbage]
    lines = [f"{'parameter':<22}{'shape':<15}{'non-finite':>11}{f'|x|>{HUGE:g}':>10}{'of':>6}"]
    lines += [f"{r.name:<22}{str(r.shape):<15}{r.nonfinite:>11}{r.huge:>10}{r.total:>6}" for r in shown]
    clean = len(rows) - len(shown)
    if only_garbage:
        lines.append(f"({clean} other parameters: all values finite and |x| <= {HUGE:g})")
    return "\n".join(lines)


def apply_visits(module: nn.Module) -> list[tuple[str, str]]:
    """What `module.apply(fn)` passes to `fn`: (qualified name, type), in call order. Modules only."""
    names = {id(m): name or "(the layer itself)" for name, m in module.named_modules()}
    visited = []
    module.apply(lambda m: visited.append((names[id(m)], type(m).__name__)))
    return visited


def parameter_owners(module: nn.Module, names: tuple[str, ...]) -> dict[str, str]:
    """Which module each parameter is registered on (apply hands `fn` that module, never the parameter)."""
    owners = {}
    for name in names:
        owner, _, _ = name.rpartition(".")
        owners[name] = type(module.get_submodule(owner)).__name__
    return owners


# ---------------------------------------------------------------- following the NaN through the forward pass

_MODULE_STAGES = {  # submodule: (label of its input, label of its output), in forward order
    "r_proj": ("mix x_r", "r = r_proj"), "w_lora": ("mix x_w", "w_lora(x_w)"),
    "k_proj": ("mix x_k", "k = k_proj"), "v_proj": ("mix x_v", "v = v_proj"),
    "a_lora": ("mix x_a", "a_lora(x_a)"), "g_lora": ("mix x_g", "gate g"),
    "g_norm": (None, "GroupNorm"), "o_proj": ("(o + bonus) * g", "output"),
}


def trace(layer: RWKV7Attention, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every intermediate of one real forward pass, in the order it is computed.

    Forward hooks read the inputs/outputs of the submodules; the decay and the kernel's arguments are read by
    wrapping `layer.log_decay` and setting `layer.attention_op` to a recording wrapper of the layer's own kernel for
    the duration of the call (nothing is recomputed here).
    """
    seen: dict[str, torch.Tensor] = {"input x": x}

    def hook(name):
        def record(_module, args, output):
            before, after = _MODULE_STAGES[name]
            if before:
                seen[before] = args[0].detach()
            seen[after] = output.detach()
        return record

    def log_decay(xw):
        seen["log-decay w"] = w = RWKV7Attention.log_decay(layer, xw).detach()
        return w

    kernel = layer.default_op()

    def record_kernel(r, w, k, v, a, b, **kwargs):
        seen.update({"k after k_a": k, "a, into the kernel": a, "b, into the kernel": b})
        o, state = kernel(r, w, k, v, a, b, **kwargs)
        seen["kernel output"] = o.detach()
        return o, state

    handles = [getattr(layer, name).register_forward_hook(hook(name)) for name in _MODULE_STAGES]
    layer.log_decay, layer.attention_op = log_decay, record_kernel
    try:
        with torch.no_grad():
            layer(x)
    finally:
        for h in handles:
            h.remove()
        del layer.log_decay
        layer.attention_op = None
    return seen


def trace_census(stages: dict[str, torch.Tensor]) -> dict[str, check.Census]:
    return {name: check.nonfinite_census(t.float().flatten()) for name, t in stages.items()}


def first_nonfinite(stages: dict[str, torch.Tensor]) -> str | None:
    for name, census in trace_census(stages).items():
        if census.count:
            return name
    return None


def layer_with_uninitialized(names=None, dtype: torch.dtype = torch.bfloat16,
                             hidden_size: int = 128) -> RWKV7Attention:
    """The official layer (with an open output, see `open_output`), except that `names` keep #150's garbage
    (the same bit patterns as the bug layer). The layer keeps `bug="uninitialized_params"`, so the garbage
    reaches the kernel unchecked, as upstream.
    """
    names = vector_parameters() if names is None else tuple(names)
    unknown = set(names) - set(vector_parameters())
    if unknown:
        raise ValueError(f"only {vector_parameters()} were uninitialised upstream, not {sorted(unknown)}")
    layer = RWKV7Attention("chunk", hidden_size=hidden_size, layer_idx=0, bug="uninitialized_params")
    garbage = {name: getattr(layer, name).detach().clone() for name in names}
    layer.load_state_dict(open_output(official_layer(hidden_size, dtype=torch.float32)).state_dict())
    with torch.no_grad():
        for name, value in garbage.items():
            getattr(layer, name).copy_(value)
    return layer.to(runtime.device(), dtype)


def huge_fraction(t: torch.Tensor) -> float:
    """Share of finite values with |x| > HUGE: garbage that has not (yet) turned into NaN."""
    t = t.detach().float()
    return float((t.abs() > HUGE).logical_and(torch.isfinite(t)).float().mean())


def plot_trace(names=None, dtype: torch.dtype = torch.bfloat16, hidden_size: int = 128,
               T: int = 16):
    """Share of NaN/inf and of absurd values at every stage of the forward pass, for a choice of
    uninitialised parameters."""
    names = vector_parameters() if names is None else tuple(names)
    layer = layer_with_uninitialized(names, dtype, hidden_size)
    stages = trace(layer, layer_input(T, hidden_size, dtype))
    labels = list(stages)
    nonfinite = [100 * c.fraction for c in trace_census(stages).values()]
    huge = [100 * huge_fraction(t) for t in stages.values()]
    fig, (ax,) = viz.figure(width=6.4, height=4.4)
    rows = range(len(labels))
    ax.barh(rows, nonfinite, color="#d62728", label="NaN or inf")
    ax.barh(rows, huge, left=nonfinite, color="#ff7f0e", label=f"finite but |x| > {HUGE:g}")
    ax.set_yticks(rows, labels, fontsize=9)
    ax.invert_yaxis()
    ax.set(xlim=(0, 118), xlabel="% of values")
    chosen = ", ".join(names) if names else "none"
    ax.set_title(f"{viz.DTYPE_NAMES[dtype]}, uninitialised: {chosen}", fontsize=9)
    for i, (n, h) in enumerate(zip(nonfinite, huge)):
        ax.text(n + h + 1, i, f"{n:.0f}% / {h:.0f}%", va="center", fontsize=9)
    ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    return fig


def trace_explorer():
    import ipywidgets as w

    return widgets.explorer(
        plot_trace,
        names=w.SelectMultiple(options=vector_parameters(), value=vector_parameters(), rows=9,
                               description="uninitialised", style={"description_width": "initial"}),
        dtype=widgets.dtype_choice(torch.bfloat16, {"fp32": torch.float32, "bf16": torch.bfloat16}),
    )


# ---------------------------------------------------------------- the official initialisation, as figures

def official_vectors(layer_idx: int, hidden_size: int = 768, head_dim: int = 64) -> dict[str, torch.Tensor]:
    return official.rwkv7_vectors(hidden_size, head_dim, layer_idx, DEPTH)


def decay_per_step(w0: torch.Tensor) -> torch.Tensor:
    """The decay a channel applies per step at init (LoRA down-projection 0): exp(-e^-0.5 * sigmoid(w0))."""
    return torch.exp(-math.exp(-0.5) * torch.sigmoid(w0.double()))


def half_life(w0: torch.Tensor) -> torch.Tensor:
    """Steps until a channel's state has decayed to half: ln 2 / (e^-0.5 * sigmoid(w0))."""
    return math.log(2) / (-torch.log(decay_per_step(w0)))


def plot_decay_speeds(layers=(0, 3, 6, 9, 11), hidden_size: int = 768, head_dim: int = 64):
    import numpy as np

    fig, (left, right) = viz.figure(ncols=2, width=4.8, height=3.6)
    cmap = matplotlib.colormaps["viridis"]
    for l in layers:
        steps = half_life(official_vectors(l, hidden_size, head_dim)["w0"]).numpy()
        color = cmap(l / (DEPTH - 1))
        left.plot(steps, lw=0.8, color=color, label=f"layer {l}")
        right.plot(np.sort(steps), np.linspace(0, 100, hidden_size), color=color, label=f"layer {l}")
    left.set(yscale="log", xlabel="channel", ylabel="half-life (steps)")
    left.set_title(f"per-channel decay at init (C={hidden_size}, heads of {head_dim})", fontsize=9)
    for h in range(0, hidden_size + 1, head_dim):
        left.axvline(h, color="#bbbbbb", lw=0.4, zorder=0)
    right.set(xscale="log", xlabel="half-life (steps)", ylabel="% of channels with a shorter half-life")
    right.set_title(f"{DEPTH}-layer model: deeper layers keep more slow channels", fontsize=9)
    right.legend(fontsize=9)
    return fig


def plot_mix_coefficients(layers=(0, 3, 6, 9, 11), hidden_size: int = 768, head_dim: int = 64):
    fig, axes = viz.figure(ncols=3, nrows=2, width=3.2, height=2.4)
    cmap = matplotlib.colormaps["viridis"]
    for ax, (name, power) in zip(axes, official.RWKV7_MIX_POWERS.items()):
        for l in layers:
            ax.plot(official_vectors(l, hidden_size, head_dim)[name].numpy(), color=cmap(l / (DEPTH - 1)),
                    label=f"layer {l}")
        ax.set(title=f"{name} = 1 - (c/C)^({power} (1 - l/L))", ylim=(-0.05, 1.05), xlabel="channel c")
        ax.title.set_fontsize(8)
    axes[0].set_ylabel("share of the previous token")
    axes[3].set_ylabel("share of the previous token")
    axes[0].legend(fontsize=9)
    fig.suptitle("token-shift mixes x_r..x_g: x + (shift(x) - x) * x_*, per channel and layer", fontsize=10)
    return fig


def plot_other_vectors(layer_idx: int = 0, hidden_size: int = 768, head_dim: int = 64):
    vec = official_vectors(layer_idx, hidden_size, head_dim)
    fig, axes = viz.figure(ncols=3, width=3.3, height=2.8)
    panels = (("sigmoid(a0): in-context learning rate a", torch.sigmoid(vec["a0"])),
              ("sigmoid(v0): value-residual mix (layers > 0)", torch.sigmoid(vec["v0"])),
              ("k_k: removal-key scale", vec["k_k"]))
    for ax, (title, values) in zip(axes, panels):
        ax.plot(values.numpy(), lw=0.8)
        ax.set(title=title, xlabel="channel")
        ax.title.set_fontsize(8)
    fig.suptitle(f"layer {layer_idx} of {DEPTH}: the other per-channel vectors at init "
                 f"(k_a = 1.02, r_k = -0.04 everywhere)", fontsize=9)
    return fig


# ---------------------------------------------------------------- verification

def init_mismatch(layer: RWKV7Attention) -> dict[str, float]:
    """Largest |parameter - official formula| per vector (biases of the LoRAs included)."""
    vec = official.rwkv7_vectors(layer.hidden_size, layer.head_dim, layer.layer_idx, layer.num_hidden_layers)
    got = {name: getattr(layer, name) for name in vector_parameters()}
    got.update(w0=layer.w_lora.lora[2].bias, a0=layer.a_lora.lora[2].bias)
    if layer.layer_idx != 0:
        got["v0"] = layer.v_lora.lora[2].bias
    got["g_norm"] = layer.g_norm.weight
    return {name: float((p.detach().float().cpu().flatten() - vec[name].flatten()).abs().max())
            for name, p in got.items()}


def open_output(layer: RWKV7Attention, seed: int = 0) -> RWKV7Attention:
    """Give `o_proj` an orthogonal weight, as training soon does: at init it is 0 (every block starts as the
    identity of its residual branch), so the output is 0 and no gradient reaches the other parameters."""
    torch.manual_seed(seed)
    official.orthogonal_(layer.o_proj.weight, 1.0)
    return layer


def forward_backward_census(layer: RWKV7Attention, x: torch.Tensor) -> dict[str, check.Census]:
    """Census of the output and of the gradient of every parameter after `output.float().sum().backward()`."""
    layer.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(True)
    o, *_ = layer(x)
    o.float().sum().backward()
    result = {"output": check.nonfinite_census(o.detach()), "d input": check.nonfinite_census(x.grad)}
    for name, p in layer.named_parameters():
        result[f"d {name}"] = check.nonfinite_census(p.grad if p.grad is not None else torch.zeros(1))
    return result


# ---------------------------------------------------------------- exercise: write the initialisation #150 skipped

MIX_POWERS = dict(official.RWKV7_MIX_POWERS)  # x_r..x_g: mu = 1 - (c/C)^(power * rho1)
EXERCISE_LAYERS = (0, 7)  # layer 0 has rho1 = 1; a deeper layer checks that the depth is used
OTHER_SIZES = (5, 64, 24)  # (layer_idx, hidden_size, num_hidden_layers): a layer unlike the notebook's, so that
# sizes written into the function as numbers (C = 128, 12 layers) fail where reading them from the layer passes
VECTOR_TOL = 1e-6  # fp32 formulas vs the fixed path's float64-then-rounded values differ by a few ulps at most


def exercise_layer(layer_idx: int = 0, hidden_size: int = 128, seed: int = 0,
                   num_hidden_layers: int = DEPTH) -> RWKV7Attention:
    """The layer as #150 met it (the nine vectors hold the garbage, the rest the historical init), in fp32 on the
    kernels' device, told its depth so that an init function can read `layer_idx` and `num_hidden_layers`.
    Seeded: the same weights in every call."""
    with torch.random.fork_rng(devices=[]):  # the caller's random state stays as it was
        torch.default_generator.manual_seed(seed)  # the CPU generator, which builds the weights
        layer = RWKV7Attention("chunk", hidden_size=hidden_size, layer_idx=layer_idx,
                               num_hidden_layers=num_hidden_layers, bug="uninitialized_params")
    return layer.to(runtime.device())


def fixed_path_vectors(layer_idx: int = 0, hidden_size: int = 128,
                       num_hidden_layers: int = DEPTH) -> dict[str, torch.Tensor]:
    """The nine vectors as the layer's fixed path (`RWKV7Attention.reset_official`) sets them."""
    with torch.random.fork_rng(devices=[]):
        fixed = RWKV7Attention("chunk", hidden_size=hidden_size, layer_idx=layer_idx,
                               num_hidden_layers=num_hidden_layers)
    return {name: getattr(fixed, name).detach() for name in vector_parameters()}


def float64_twin(layer: RWKV7Attention) -> RWKV7Attention:
    """A float64 copy of `layer` whose recurrence runs in `reference.recurrent_rwkv7`: the exact answer for the
    same weights (the layer's own PyTorch code around it, in float64)."""
    twin = copy.deepcopy(layer).double()
    twin.attention_op = reference.recurrent_rwkv7
    return twin


def forward_backward(layer: RWKV7Attention, x: torch.Tensor, seed: int = 0):
    """Output and gradients (input and every parameter, by name) of `sum(o * do)`, `do` a seeded random
    cotangent (`harness.cotangents`), so that every gradient is exercised."""
    layer.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(True)
    o, *_ = layer(x)
    do, _ = harness.cotangents(o.shape, {}, seed)
    (o * do.to(o.device, o.dtype)).sum().backward()  # cotangents are made on the CPU (seeded alike everywhere)
    grads = {"input": x.grad}
    grads.update({name: p.grad if p.grad is not None else torch.zeros_like(p) for name, p in layer.named_parameters()})
    return o.detach(), grads


def _worst(errors: dict[str, float]) -> float:
    """The largest error, NaN counting as the worst."""
    values = list(errors.values())
    return math.nan if any(math.isnan(e) for e in values) else max(values)


def _within(err: float) -> bool:
    return math.isfinite(err) and err <= VECTOR_TOL


def case_label(layer_idx: int, hidden_size: int, num_hidden_layers: int, notebook_size: int = 128) -> str:
    """"layer 7" for the notebook's model, "layer 5 of 24 (C=64)" for the layer of other sizes."""
    if (hidden_size, num_hidden_layers) == (notebook_size, DEPTH):
        return f"layer {layer_idx}"
    return f"layer {layer_idx} of {num_hidden_layers} (C={hidden_size})"


def vector_fact(name: str, errors: dict[str, float]) -> tuple[bool, str]:
    """One line per vector, its error at each exercise layer (a vector right at layer 0 and wrong at layer 7 is
    missing the depth, which layer 0 cannot show since rho1 = 1 there; right at both and wrong at the layer of
    other sizes: sizes written in as numbers)."""
    parts = [error_fact(label, err, VECTOR_TOL) for label, err in errors.items()]
    return all(ok for ok, _ in parts), f"{name} vs the fixed path, " + "; ".join(line for _, line in parts)


_LINE = Sealed(
    "dmVjID0gcndrdjdfdmVjdG9ycyhsYXllci5oaWRkZW5fc2l6ZSwgbGF5ZXIuaGVhZF9kaW0sIGxheWVyLmxheWVyX2lkeCwgbGF5"
    "ZXIubnVtX2hpZGRlbl9sYXllcnMpOyBmb3IgbmFtZSwgcCBpbiBsYXllci5uYW1lZF9wYXJhbWV0ZXJzKHJlY3Vyc2U9RmFsc2Up"
    "OiBwLmNvcHlfKHZlY1tuYW1lXS52aWV3X2FzKHApKQ=="
)  # the solution, sealed: a hint's last tier prints it


def _names(names) -> str:
    return ", ".join(sorted(names, key=lambda n: vector_parameters().index(n) if n in vector_parameters() else 99))


def raised_hints(error: Exception, other_sizes: str | None = None) -> tuple[str, ...]:
    """Hint tiers for a candidate that raised: where (the message), what (the usual cause of that message).
    `other_sizes`: the label of the layer of other sizes when it raised only there (the notebook's layers ran)."""
    message = f"{type(error).__name__}: {error}"
    if other_sizes is not None:
        return (f"init_skipped ran on the notebook's layers (C=128, {DEPTH} layers) and raised {message} on "
                f"{other_sizes}",
                "rwkv7_vectors' arguments must be the layer's own sizes (layer.hidden_size, layer.head_dim, "
                "layer.layer_idx, layer.num_hidden_layers): numbers written into the function fit only the layer "
                "they were read from",
                _LINE)
    if "fewer than 2 dimensions" in str(error):  # xavier_uniform_ on k_k / k_a: the routine's own formula
        what = ("you reached the vectors, and the routine's formula fails on them: xavier_uniform_ is for weight "
                "matrices, and k_k, k_a are [C] vectors; it was never the value they should hold: take the official "
                "values from rwkv7_vectors")
    elif isinstance(error, KeyError):
        what = ("rwkv7_vectors has entries only for the layer's own vectors (and the LoRA biases w0, a0, v0 and "
                "g_norm, which are not parameter names): the parameters of the submodules were reached by the "
                "routine's other branches and need nothing")
    elif "size" in str(error) or "shape" in str(error):
        what = ("rwkv7_vectors gives flat [C] vectors (r_k: [H, N]) and the mixes are [1, 1, C]: copy with "
                "value.view_as(parameter); N is layer.head_dim, not the number of heads")
    else:
        what = "read the message: it names the line of init_skipped that raised"
    return (f"init_skipped raised {message}", what, _LINE)


def initialisation_hints(errors: dict[str, dict[int, float]], unset: set[str], touched: list[str],
                         zeros: bool) -> tuple[str, ...]:
    """Hint tiers (where to look, what is wrong, the line) for the most basic mistake the measurements show:
    the garbage left in place (all of it: the stub; some: a partial fix), other parameters changed, zeros instead
    of the official values, the depth missing (right at layer 0, wrong at layer 7), values off at layer 0."""
    first, deeper = EXERCISE_LAYERS[0], EXERCISE_LAYERS[1]
    notebook = (f"layer {first}", f"layer {deeper}")
    wrong = {name for name, errs in errors.items() if not all(_within(e) for e in errs.values())} - unset
    if unset == set(vector_parameters()):
        return ("nothing your function ran changed the nine; compare what layer.apply hands your function "
                "(lesson.apply_visits(layer)) with where the nine are registered (layer.named_parameters())",
                "Module.apply(fn) calls fn on every module, the submodules and then the layer itself, never on a "
                "parameter: isinstance(module, nn.Parameter) is never true, so that branch never runs; the nine "
                "hang directly on RWKV7Attention, so no other branch reaches them either",
                _LINE)
    if unset:
        return (f"{_names(unset)} still hold the garbage",
                "every parameter registered directly on the layer was missed by the routine, not only the ones you "
                "set: layer.named_parameters(recurse=False) lists them all",
                _LINE)
    if touched:
        shown = ", ".join(touched[:3]) + (", ..." if len(touched) > 3 else "")
        return (f"{len(touched)} parameters besides the nine changed: {shown}",
                "the routine's other branches did reach the submodules' parameters (projections, LoRAs, GroupNorm); "
                "only the parameters on the layer itself were missed. Iterating layer.named_parameters() (which "
                "recurses) or re-initialising the whole layer replaces weights that were fine",
                _LINE)
    if zeros:
        return ("the nine are zeros at every layer checked",
                "zeros make the layer finite (upstream's first fix did just that) but are not the official RWKV-7 "
                "init: a zero mix never looks at the previous token, a zero k_k removes nothing from the state; "
                "take the values from rwkv7_vectors",
                _LINE)
    if wrong and all(_within(errors[name][label]) for name in wrong for label in notebook):
        other = next(label for label in next(iter(errors.values())) if label not in notebook)
        return (f"{_names(wrong)} are right at layers {first} and {deeper} of the notebook's {DEPTH}-layer model "
                f"(C=128) and wrong at {other}",
                "numbers written into the function fit only the layer they were read from: pass rwkv7_vectors the "
                "layer's own sizes (layer.hidden_size, layer.head_dim, layer.layer_idx, layer.num_hidden_layers)",
                _LINE)
    mixes = [name for name in MIX_POWERS if name in wrong]
    if mixes and all(_within(errors[name][f"layer {first}"]) for name in mixes):
        return (f"{_names(mixes)} are right at layer {first} and wrong at layer {deeper}",
                f"the mixes depend on the layer's depth through rho1 = 1 - layer_idx / num_hidden_layers, which is 1 "
                f"at layer {first} whatever the depth: pass the layer's own layer_idx and num_hidden_layers",
                _LINE)
    if wrong == {"k_k"}:
        return ("k_k is off at every layer checked, and only k_k",
                "k_k's ramp is c/(C-1), from 0 at the first channel to 1 at the last (the mixes divide by C); "
                "rwkv7_vectors has it right",
                _LINE)
    if wrong:
        return (f"{_names(wrong)} are off at layer {first} already",
                "compare your values with rwkv7_vectors(C, N, layer_idx, num_hidden_layers)[name], channel by channel",
                _LINE)
    return ("the nine are right, yet the layer's output or gradients are not",
            "set the nine in place (copy_ under torch.no_grad()), do not replace the Parameter objects",
            _LINE)


def check_initialisation(candidate, hidden_size: int = 128, T: int = 16) -> Verdict:
    """Run `candidate(layer)` on layers built with the bug on (layers 0 and 7 of `DEPTH`, and `OTHER_SIZES`: a
    layer of another width and depth) and check that
    - each of the nine vectors equals what the fixed path sets (largest |difference|, at each layer);
    - every parameter is finite and |x| <= HUGE, and the others (LoRAs, projections, norm) are untouched (at the
      notebook's layers 0 and 7);
    - layer 0's output and gradients (fp32, the real `chunk_rwkv7` kernel) match its float64 twin.
    The hint tiers follow the most basic mistake measured (`initialisation_hints`); a candidate that raises gets
    NOT YET with the exception, not a traceback."""
    cases = [(l, hidden_size, DEPTH) for l in EXERCISE_LAYERS] + [OTHER_SIZES]
    vector_err = {name: {} for name in vector_parameters()}  # |yours - fixed path|, per layer
    unset = set()  # vectors the candidate left as the garbage they were
    touched = []  # other parameters the candidate changed
    zeros = True
    finite = n_params = n_others = untouched = 0
    layers = {}
    for l, size, depth in cases:
        label = case_label(l, size, depth, hidden_size)
        notebook_case = (size, depth) == (hidden_size, DEPTH)
        layer = exercise_layer(l, size, num_hidden_layers=depth)
        before = {n: p.detach().clone() for n, p in layer.named_parameters()}
        try:
            candidate(layer)
        except Exception as error:  # the learner's code: report it as a verdict, so Run All goes on
            return Verdict("the initialisation #150 skipped", False,
                           [f"init_skipped({label}) raised {type(error).__name__}: {error}"],
                           raised_hints(error, None if notebook_case else label))
        want = fixed_path_vectors(l, size, depth)
        for name in vector_parameters():
            value = getattr(layer, name).detach()
            vector_err[name][label] = float((value.double().cpu() - want[name].double()).abs().max())
            zeros &= bool((value == 0).all())
            if torch.equal(value, before[name]):
                unset.add(name)
        if not notebook_case:  # only the vectors are compared there
            continue
        layers[l] = layer
        rows = parameter_census(layer)
        finite += sum(not r.garbage for r in rows)
        n_params += len(rows)
        others = [n for n in before if n not in vector_parameters()]
        changed = [n for n in others if not torch.equal(layer.get_parameter(n).detach(), before[n])]
        touched += [n for n in changed if n not in touched]
        untouched += len(others) - len(changed)
        n_others += len(others)
    layer = layers[EXERCISE_LAYERS[0]]
    x = layer_input(T, hidden_size, torch.float32, B=1)
    o, grads = forward_backward(layer, x)
    o_ref, grads_ref = forward_backward(float64_twin(layer), x.double())
    tol = check.tolerance(torch.float32)
    where = f"layers {' and '.join(map(str, EXERCISE_LAYERS))}"
    checks = [vector_fact(name, errs) for name, errs in vector_err.items()] + [
        (finite == n_params, f"parameters finite and |x| <= {HUGE:g}: {finite} of {n_params} ({where})"),
        (untouched == n_others, f"the {n_others} other parameters ({where}) left as they were: "
                                f"{untouched} of {n_others}"),
        error_fact("layer 0 output vs float64", check.rel_error(o, o_ref), tol.fwd),
        error_fact(f"layer 0 gradients (input + {len(grads) - 1} parameters) vs float64, worst",
                   _worst(check.grad_errors(grads_ref, grads)), tol.grad),
    ]
    return verdict("the initialisation #150 skipped", checks,
                   initialisation_hints(vector_err, unset, touched, zeros and not unset))

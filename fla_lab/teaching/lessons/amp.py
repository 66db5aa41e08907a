"""Notebook 05: RWKV-7's decay sigmoid in bf16 under AMP (upstream #181), a per-step bias that compounds.

Every decay here comes from the layer's own code, its decay line on the LoRA output `x`: `bug="bf16_decay"` computes
`-e^-0.5 * sigmoid(x)` in the dtype of `x` (upstream before 965c3553, and again from d9e86d00 / v0.2.0 to 0.6.0);
without the switch the layer runs the fix of #181, which the notebook's exercise is to write.
Both start from the same rounded LoRA output, as in a bf16 model: what differs is only the rounding on the way,
which is what #181 is about.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import matplotlib
import torch
from torch import nn

from fla_lab.ops import contract
from fla_lab.teaching import exercises
from fla_lab.spec import reference
from fla_lab import runtime
from fla_lab.tools import viz, widgets
from fla_lab.layers import RWKV7Attention

BUG = "bf16_decay"  # the catalogue entry this notebook turns on (`bugs.show([amp.BUG])`)
DEPTH = 12
SIGMOID_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
AUTOCAST_OPS = ("linear", "exp", "softplus", "log", "sigmoid", "tanh", "mul by a constant")
# Measured on a GPU: dtype of each op's result on a bf16 input under torch.autocast("cuda", dtype=torch.bfloat16);
# tests/test_gpu_quoted_numbers.py measures it again on the GPU it runs on. CUDA autocast lists exp, log, softplus
# as fp32 ops.
CUDA_AUTOCAST_BF16 = {"linear": "bf16", "exp": "fp32", "softplus": "fp32", "log": "fp32", "sigmoid": "bf16",
                      "tanh": "bf16", "mul by a constant": "bf16"}


def log_decays(lora_output: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """(buggy, fixed) log-decays in float64 for LoRA outputs rounded to `dtype`, through the layer's own decay line.

    The buggy path computes the sigmoid in `dtype` (`bug="bf16_decay"`); the fixed one is the layer's line without the
    switch (965c3553).
    """
    x = lora_output.to(dtype)
    return _layer_decay(x, BUG).double(), _layer_decay(x, None).double()


def _layer_decay(lora_output: torch.Tensor, bug: str | None) -> torch.Tensor:
    """The layer's own decay line on LoRA outputs, with the switch `bug` on or off (`RWKV7Attention.log_decay`
    without the LoRA). Called through the layer's module, not imported by name: a name of this module would put
    the shipped line one `??` away from the exercise."""
    from fla_lab.layers import rwkv7

    return rwkv7.log_decay_from_lora(lora_output, bug)


def lora_grid(lo: float = -8.0, hi: float = 4.0, n: int = 100001) -> torch.Tensor:
    """Decay-LoRA outputs: -8 is the slowest channel of the official init, 4 far past the fastest."""
    return torch.linspace(lo, hi, n)


def rounding_stats(x: torch.Tensor | None = None, dtype: torch.dtype = torch.bfloat16) -> dict[str, float]:
    """|w_low - w_fp32| (max, mean) and the same relative to |w_fp32|, over LoRA outputs `x`."""
    x = lora_grid() if x is None else x
    low, fixed = log_decays(x, dtype)
    err, rel = (low - fixed).abs(), ((low - fixed) / fixed).abs()
    return {"max_abs": float(err.max()), "mean_abs": float(err.mean()), "max_rel": float(rel.max()),
            "mean_rel": float(rel.mean())}


def per_step_bias(x: float, dtype: torch.dtype = torch.bfloat16) -> float:
    """w_low - w_fp32 for one constant LoRA output: the same error at every step (> 0: decays too slowly)."""
    low, fixed = log_decays(torch.tensor([x]), dtype)
    return float(low - fixed)


def cumulative_decay(x: float, T, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """(relative error of exp(sum_t w), exp(sum_t w) itself) after T steps of the constant LoRA output x.

    The error is the same every step, so the log of the cumulative decay is off by T * bias: the relative error
    is expm1(T * bias) = (number of e-folds of decay) x (relative error of w), growing linearly in T.
    """
    T = torch.as_tensor(T, dtype=torch.float64)
    low, fixed = log_decays(torch.tensor([x]), dtype)
    return torch.expm1(T * (low - fixed)), torch.exp(T * fixed)


def cumulative_decay_varying(x: float, spread: float, T: int, dtype: torch.dtype = torch.bfloat16,
                             seed: int = 0) -> torch.Tensor:
    """Relative error of the cumulative decay at every step when the LoRA output varies per token
    (x + spread * N(0, 1)): each step's rounding differs, and only their mean keeps compounding."""
    gen = torch.Generator().manual_seed(seed)
    low, fixed = log_decays(x + spread * torch.randn(T, generator=gen), dtype)
    return torch.expm1(torch.cumsum(low - fixed, 0))


def plot_rounding_error(dtype: torch.dtype = torch.bfloat16):
    """Left: |w_low - w_fp32| against the LoRA output, under the bound of two roundings (the sigmoid, then the
    product), each at most the unit roundoff ε = eps/2 relative: 2 ε |w|. Right: the signed relative error."""
    x = lora_grid(n=20001)
    low, fixed = log_decays(x, dtype)
    xs = x.to(dtype).double().numpy()
    u = torch.finfo(dtype).eps / 2
    name = viz.DTYPE_NAMES[dtype]
    fig, (left, right) = viz.figure(ncols=2, width=4.6, height=3.3)
    left.plot(xs, (low - fixed).abs().clamp(min=1e-12).numpy(), ".", ms=1, color=viz.DTYPE_COLORS[dtype])
    left.plot(xs, fixed.abs().numpy() * 2 * u, color="k", lw=0.8, label=f"2 ε |w|, ε = {u:.1e} ({name})")
    left.set(yscale="log", ylim=(1e-9, 1e-2), xlabel="decay-LoRA output x", ylabel="|w_low - w_fp32|")
    left.set_title(f"{name} sigmoid: absolute error per step", fontsize=10)
    left.legend(fontsize=9, title="two roundings at most", title_fontsize=9)
    right.plot(xs, (100 * (low - fixed) / fixed.abs()).numpy(), ".", ms=1, color=viz.DTYPE_COLORS[dtype])
    right.axhline(0, color="k", lw=0.6)
    for sign in (1, -1):
        right.axhline(sign * 200 * u, color="k", lw=0.8, ls="--", label="± 2 ε" if sign > 0 else None)
    right.set(xlabel="decay-LoRA output x", ylabel="(w_low - w_fp32) / |w_fp32|  (%)",
              title=f"{name} rounding: > 0 decays too slowly")
    right.legend(fontsize=9, loc="lower right")
    return fig


def plot_cumulative_decay(xs=(-8.0, -7.0, -6.0, -5.0, -4.0), T_max: int = 8192, dtype: torch.dtype = torch.bfloat16):
    import numpy as np

    T = np.unique(np.geomspace(1, T_max, 200).astype(int))
    fig, (left, right) = viz.figure(ncols=2, width=4.6, height=3.4)
    for i, x in enumerate(xs):
        rel, decay = cumulative_decay(x, T, dtype)
        color = matplotlib.colormaps["plasma"](0.85 * i / max(len(xs) - 1, 1))  # plasma's top end is pale yellow
        positive = bool(rel[-1] > 0)  # solid: decays too slowly; dashed: too fast (some curves overlap otherwise)
        left.plot(T, 100 * rel.abs().numpy(), color=color, ls="-" if positive else "--",
                  label=f"x = {x:g} ({'+' if positive else '-'})")
        right.plot(T, decay.numpy(), color=color, label=f"x = {x:g}")
    left.set(xscale="log", yscale="log", xlabel="steps T", ylabel="|relative error| of exp(sum w)  (%)",
             title=f"{viz.DTYPE_NAMES[dtype]} sigmoid: the bias compounds ~ T")
    left.legend(fontsize=9, title="sign: + solid, - dashed", title_fontsize=9)
    right.axhline(1e-6, color="k", ls=":", lw=0.8)
    right.text(1.2, 2e-6, "below 1e-6: the token is forgotten anyway", fontsize=9)
    right.set(xscale="log", yscale="log", ylim=(1e-12, 2), xlabel="steps T", ylabel="cumulative decay exp(sum w)",
              title="what the error multiplies")
    return fig


# ---------------------------------------------------------------- the real layer: per channel and at long context

def decay_layer(hidden_size: int = 768, layer_idx: int = 0, bug: str | None = None, seed: int = 0,
                dtype: torch.dtype = torch.bfloat16) -> RWKV7Attention:
    torch.manual_seed(seed)
    layer = RWKV7Attention("chunk", hidden_size=hidden_size, layer_idx=layer_idx, num_hidden_layers=DEPTH, bug=bug)
    return layer.to(dtype)


@functools.lru_cache(maxsize=16)
def channel_decays(layer_idx: int = 0, hidden_size: int = 768, dtype: torch.dtype = torch.bfloat16):
    """Per-channel decays at init from the layer's own `log_decay`, in float64 (`[C]` each; cached, read-only).

    At init the decay LoRA's down-projection is 0, so its output is the bias w0 (as the layer holds it, rounded
    to `dtype`) at every token: `x`; `low` and `fixed` are the log-decays with and without `bug="bf16_decay"`.
    """
    out = {}
    for key, bug in (("low", BUG), ("fixed", None)):
        layer = decay_layer(hidden_size, layer_idx, bug, dtype=dtype)
        with torch.no_grad():
            out[key] = layer.log_decay(torch.zeros(1, 1, hidden_size, dtype=dtype))[0, 0].double()
    out["x"] = layer.w_lora.lora[2].bias.detach().double()
    return out


def channel_cumulative_error(T: int, layer_idx: int = 0, hidden_size: int = 768,
                             dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """(relative error of the cumulative decay after T steps, the cumulative decay), per channel."""
    d = channel_decays(layer_idx, hidden_size, dtype)
    return torch.expm1(T * (d["low"] - d["fixed"])), torch.exp(T * d["fixed"])


def plot_decay_error(channel: int = 0, T: int = 4096, dtype: torch.dtype = torch.bfloat16, layer_idx: int = 0,
                     hidden_size: int = 768, forgotten: float = 1e-6):
    """Left: every channel's cumulative-decay error after T steps (channels whose decay fell below `forgotten`
    are marked at 0: their relative error is huge, but of a weight nobody reads). Right: the chosen channel's
    error and decay against the number of steps."""
    import numpy as np

    d = channel_decays(layer_idx, hidden_size, dtype)
    rel, decay = channel_cumulative_error(T, layer_idx, hidden_size, dtype)
    kept = (decay >= forgotten).numpy()
    fig, (left, right) = viz.figure(ncols=2, width=4.8, height=3.5)
    c = np.arange(hidden_size)
    left.plot(c[~kept], np.zeros((~kept).sum()), "|", ms=4, color="#bbbbbb",
              label=f"decay < {forgotten:g}: forgotten ({(~kept).sum()})")
    left.plot(c[kept], 100 * rel.numpy()[kept], ".", ms=4, color=viz.DTYPE_COLORS.get(dtype, "k"),
              label=f"decay >= {forgotten:g} ({kept.sum()})")
    mark = 100 * float(rel[channel]) if kept[channel] else 0.0
    left.plot([channel], [mark], "o", mfc="none", mec="k", ms=9, label=f"channel {channel}")
    left.axhline(0, color="k", lw=0.5)
    left.set(xlabel="channel", ylabel="relative error of exp(T w)  (%)")
    left.set_title(f"layer {layer_idx}, {viz.DTYPE_NAMES[dtype]} sigmoid, after T = {T} steps", fontsize=9)
    left.legend(fontsize=9)
    steps = np.unique(np.geomspace(1, max(T, 2), 200).astype(int))
    right.plot(steps, 100 * torch.expm1(torch.as_tensor(steps) * (d["low"] - d["fixed"])[channel]).numpy(),
               color="#d62728")
    right.set(xscale="log", xlabel="steps", ylabel="relative error (%), solid")
    right.set_title(f"channel {channel}: x = {float(d['x'][channel]):.3f}, "
                    f"half-life {math.log(2) / -float(d['fixed'][channel]):.0f} steps", fontsize=9)
    twin = right.twinx()
    twin.plot(steps, torch.exp(torch.as_tensor(steps) * d["fixed"][channel]).numpy(), color="#555555", ls="--")
    twin.set(yscale="log", ylabel="cumulative decay, dashed")
    return fig


def decay_explorer():
    return widgets.explorer(
        plot_decay_error,
        dtype=widgets.dtype_choice(torch.bfloat16, SIGMOID_DTYPES, "sigmoid dtype"),
        T=widgets.choice("T (steps)", [256, 1024, 4096, 16384, 65536], 4096),
        channel=widgets.int_slider("channel (x = w0[channel])", 0, 0, 767),
    )


def long_context_layer(dtype: torch.dtype, bug: str | None, hidden_size: int = 64, seed: int = 0) -> RWKV7Attention:
    """An official-init layer with an open output (`o_proj` orthogonal, as after some training) whose recurrence
    runs in the float64 reference (`reference.recurrent_rwkv7`), output cast back to the layer's dtype as the
    kernel stores it. Everything else, the decays included, is the layer's own code."""
    from fla_lab.teaching.lessons.init import open_output

    layer = decay_layer(hidden_size, 0, bug, seed, dtype=torch.float32)
    layer = open_output(layer, seed).to(dtype)

    def float64_recurrence(r, w, k, v, a, b, **kwargs):
        o, state = reference.recurrent_rwkv7(r, w, k, v, a, b, **kwargs)
        return o.to(r.dtype), state

    layer.attention_op = float64_recurrence
    return layer


def long_context_outputs(T: int = 4096, hidden_size: int = 64, seed: int = 0) -> dict[str, torch.Tensor]:
    """Outputs `[T, C]` (float64) of the same weights and input: fp32, bf16 fixed, bf16 with `bug="bf16_decay"`."""
    x = torch.randn(1, T, hidden_size, generator=torch.Generator().manual_seed(seed + 5))
    runs = {"fp32": (torch.float32, None), "bf16 fixed": (torch.bfloat16, None),
            "bf16 bug": (torch.bfloat16, "bf16_decay")}
    out = {}
    with torch.no_grad():
        for name, (dtype, bug) in runs.items():
            out[name] = long_context_layer(dtype, bug, hidden_size, seed)(x.to(dtype))[0][0].double()
    return out


def windows(T: int) -> list[tuple[int, int]]:
    """[0, 16), [16, 32), [32, 64), ... doubling windows of positions up to T."""
    edges = [0, 16]
    while edges[-1] < T:
        edges.append(min(2 * edges[-1], T))
    return list(zip(edges[:-1], edges[1:]))


def output_errors(outputs: dict[str, torch.Tensor]) -> dict[str, list[tuple[int, float]]]:
    """Relative error against the fp32 run per window of positions, and the bug-vs-fix difference."""
    ref = outputs["fp32"]
    pairs = {"bf16 fixed vs fp32": (outputs["bf16 fixed"], ref), "bf16 bug vs fp32": (outputs["bf16 bug"], ref),
             "bug - fixed (the decay's share)": (outputs["bf16 bug"], outputs["bf16 fixed"])}
    result = {}
    for name, (got, base) in pairs.items():
        result[name] = [(hi, float((got[lo:hi] - base[lo:hi]).norm() / ref[lo:hi].norm()))
                        for lo, hi in windows(len(ref))]
    return result


def plot_output_errors(errors: dict[str, list[tuple[int, float]]]):
    fig, (ax,) = viz.figure(width=6.0, height=3.4)
    for (name, rows), style in zip(errors.items(), ("-o", "-s", "--^")):
        ax.plot([t for t, _ in rows], [e for _, e in rows], style, ms=4, label=name)
    ax.set(xscale="log", yscale="log", xlabel="position t (window ending at t)",
           ylabel="relative error of the layer output", title="RWKV7Attention output at long context, bf16")
    ax.legend(fontsize=9)
    return fig


# ---------------------------------------------------------------- autocast

def autocast_dtypes(device: str = "cpu") -> dict[str, str]:
    """The result dtype of each op on the bf16 output of a Linear under `torch.autocast(device, bf16)`."""
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(4, 8, generator=gen).to(device)
    linear = nn.Linear(8, 8).to(device)
    ops = {"exp": torch.exp, "softplus": nn.functional.softplus, "log": lambda t: torch.log(t.abs()),
           "sigmoid": torch.sigmoid, "tanh": torch.tanh, "mul by a constant": lambda t: -0.6065 * t}
    with torch.autocast(device, dtype=torch.bfloat16):
        x = linear(h)
        result = {"linear": x.dtype} | {name: op(x).dtype for name, op in ops.items()}
    return {name: viz.DTYPE_NAMES[d] for name, d in result.items()}


# PyTorch's CUDA autocast op reference (the ops a decay line can call): these run in fp32 on bf16 inputs, the
# matrix ops in bf16, every other op in its inputs' dtype. The GPU measurement (CUDA_AUTOCAST_BF16) agrees.
CUDA_FP32_OPS = frozenset({"exp", "expm1", "log", "log1p", "log2", "log10", "pow", "__pow__", "__rpow__", "softplus",
                           "reciprocal", "rsqrt", "__rdiv__", "__rtruediv__", "cumsum", "cumprod", "sum", "prod",
                           "softmax", "log_softmax", "layer_norm", "group_norm", "norm", "normalize", "sinh", "cosh",
                           "tan", "acos", "asin", "erfinv"})
CUDA_BF16_OPS = frozenset({"linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "conv1d", "conv2d"})
CASTS = frozenset({"float", "double", "half", "bfloat16", "to", "type"})  # explicit: autocast leaves them alone


class _OpLog(torch.overrides.TorchFunctionMode):
    """Records (op name, tensor inputs, output) of every top-level torch call that returns a tensor."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", str(func))
        if isinstance(out, torch.Tensor) and name != "__get__":
            self.ops.append((name, [a for a in args if isinstance(a, torch.Tensor)], out))
        return out


def _cuda_rule(name: str, inputs: list[torch.dtype], made: torch.dtype) -> torch.dtype:
    """The dtype CUDA autocast (bf16) gives op `name` on inputs of these dtypes; `made`: the dtype the op returned
    here, kept by an op with no tensor input (a factory such as `torch.ones`), which autocast leaves alone."""
    floats = [d for d in inputs if d.is_floating_point]
    if name in CUDA_FP32_OPS and floats:
        return torch.float32
    if name in CUDA_BF16_OPS:
        return torch.bfloat16
    return functools.reduce(torch.promote_types, floats) if floats else (inputs[0] if inputs else made)


def trace_dtypes(line: Callable[[torch.Tensor], torch.Tensor], device: str = "cpu") -> list[tuple[str, str, str]]:
    """Run `line(w_raw)` on a Linear's output under `torch.autocast(device, bf16)`, op by op: (op, the dtype it
    returned there, the dtype CUDA autocast's op lists give it). Casts keep their own dtype in both columns."""
    gen = torch.Generator().manual_seed(0)
    linear, h = nn.Linear(8, 8).to(device), torch.randn(4, 8, generator=gen).to(device)
    log, cuda = _OpLog(), {}
    with torch.autocast(device, dtype=torch.bfloat16), torch.no_grad(), log:
        line(linear(h))
    rows = []
    for name, inputs, out in log.ops:
        dtype = out.dtype if name in CASTS else _cuda_rule(name, [cuda.get(id(t), t.dtype) for t in inputs],
                                                           out.dtype)
        cuda[id(out)] = dtype
        rows.append((name.strip("_"), viz.DTYPE_NAMES[out.dtype], viz.DTYPE_NAMES[dtype]))
    return rows


def show_dtypes(line: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Print `trace_dtypes` as a table: CPU autocast live; CUDA autocast live on a GPU, else by its op lists."""
    cuda_live = torch.cuda.is_available()
    cpu_rows = trace_dtypes(line, "cpu")
    cuda_col = [r[1] for r in trace_dtypes(line, "cuda")] if cuda_live else [r[2] for r in cpu_rows]
    print(f"{'op':<18}{'CPU autocast':<16}CUDA autocast ({'live' if cuda_live else 'by its op lists'})")
    for i, ((name, cpu, _), cuda) in enumerate(zip(cpu_rows, cuda_col)):
        print(f"{name + (' -> w_raw' if i == 0 else ''):<18}{cpu:<16}{cuda}")


def official_log_decay(x: torch.Tensor) -> torch.Tensor:
    """The official RWKV-7 form, in float64: w = -softplus(-x) - 0.5, log-decay -exp(w) (under CUDA autocast
    softplus and exp run in fp32, so the official code never rounds the decay to bf16)."""
    return -torch.exp(-nn.functional.softplus(-x.double()) - 0.5)


def kernel_layer(bug: str | None, hidden_size: int = 64, seed: int = 0) -> RWKV7Attention:
    """`long_context_layer`'s twin on the real kernel (`chunk_rwkv7`, the layer's "chunk" mode), bf16, on the
    kernels' device (`fla_lab.device()`; built on the CPU from the seed, the same weights everywhere)."""
    from fla_lab import runtime
    from fla_lab.teaching.lessons.init import open_output

    layer = open_output(decay_layer(hidden_size, 0, bug, seed, dtype=torch.float32), seed)
    return layer.to(runtime.device(), torch.bfloat16)


def stand_in_agrees(kc: dict) -> bool:
    """Whether the float64 stand-in reproduces the size of bug - fixed that the kernel shows (`kernel_check`): within
    20% under the interpreter (fp32 products rounded once, on the store, like the stand-in: at T = 128 the two
    outputs are equal); within a factor of 2 on a GPU, whose bf16 tensor-core products round about as much as the
    bug moves."""
    agree = 0.2 if runtime.interpreting() else 0.5
    return abs(kc["bug - fixed, kernel"] - kc["bug - fixed, stand-in"]) < agree * kc["bug - fixed, kernel"]


def kernel_check(T: int = 128, hidden_size: int = 64, seed: int = 0) -> dict[str, float]:
    """The float64 stand-in against the real kernel, bf16, on T steps: relative errors, and the bug-vs-fix
    difference measured both ways."""
    from fla_lab.spec import check, harness

    x = torch.randn(1, T, hidden_size, generator=torch.Generator().manual_seed(seed + 5)).to(torch.bfloat16)
    builders = {"kernel": kernel_layer,  # on the kernels' device; the stand-in stays on the CPU
                "stand-in": lambda bug, size, seed: long_context_layer(torch.bfloat16, bug, size, seed)}
    inputs = {"kernel": harness.on_device(x), "stand-in": x}
    with torch.no_grad():  # check.rel_error compares on the CPU
        out = {(path, bug): build(bug, hidden_size, seed)(inputs[path])[0]
               for path, build in builders.items() for bug in (None, "bf16_decay")}
    return {"stand-in vs kernel, fixed": check.rel_error(out["stand-in", None], out["kernel", None]),
            "stand-in vs kernel, bug": check.rel_error(out["stand-in", "bf16_decay"], out["kernel", "bf16_decay"]),
            "bug - fixed, kernel": check.rel_error(out["kernel", "bf16_decay"], out["kernel", None]),
            "bug - fixed, stand-in": check.rel_error(out["stand-in", "bf16_decay"], out["stand-in", None])}


# ---------------------------------------------------------------- the fix inside a real AMP training step

@dataclass
class AMPStep:
    """One `torch.autocast(bf16)` forward and backward of the chunked layer (fp32 parameters and input)."""
    device: str
    dtypes: dict[str, str]  # what the kernel received
    w: torch.Tensor  # the log-decay the kernel received, as fp32
    output: torch.Tensor  # the layer output, float64 on the CPU
    finite: bool  # output, input gradient and every parameter gradient
    lora: torch.Tensor | None = None  # the decay LoRA's output the log-decay was computed from, as the LoRA gave it


def amp_step(bug: str | None, T: int = 256, hidden_size: int = 64, seed: int = 0,
             log_decay: Callable[[torch.Tensor], torch.Tensor] | None = None) -> AMPStep:
    """A real AMP training step on the device fla_lab runs its kernels on (CUDA autocast on a GPU, CPU autocast
    under the interpreter), with a spy on the layer's op that records what reaches `chunk_rwkv7`.

    `log_decay`, if given, replaces the layer's decay line: the layer's `log_decay` method then returns
    `log_decay(w_lora(xw))`, as the layer's own decay line does."""
    from fla_lab import runtime
    from fla_lab.teaching.lessons.init import open_output

    dev = runtime.device()
    layer = open_output(decay_layer(hidden_size, 0, bug, seed, dtype=torch.float32), seed).to(dev)
    op, seen = layer.default_op(), {}

    def spy(r, w, k, v, a, b, **kwargs):
        seen.update(w=w.detach().float(), dtypes={n: viz.DTYPE_NAMES[t.dtype]
                                                 for n, t in dict(r=r, w=w, k=k, v=v, a=a, b=b).items()})
        return op(r, w, k, v, a, b, **kwargs)

    layer.attention_op = spy
    layer.w_lora.register_forward_hook(lambda module, args, out: seen.update(lora=out.detach()))
    if log_decay is not None:
        layer.log_decay = lambda xw: log_decay(layer.w_lora(xw))
    x = torch.randn(1, T, hidden_size, generator=torch.Generator().manual_seed(seed + 5)).to(dev).requires_grad_()
    with torch.autocast(dev, dtype=torch.bfloat16):
        out = layer(x)[0]
    out.float().square().mean().backward()
    grads = [x.grad] + [p.grad for p in layer.parameters()]
    finite = bool(torch.isfinite(out).all()) and all(g is not None and bool(torch.isfinite(g).all()) for g in grads)
    return AMPStep(dev, seen["dtypes"], seen["w"].cpu(), out.detach()[0].double().cpu(), finite,
                   seen["lora"].cpu())


def amp_step_comparison(T: int = 256, hidden_size: int = 64, seed: int = 0) -> dict[str, object]:
    """The fixed and the buggy layer in the same AMP step: the decay's per-step relative bias, and how far the
    outputs drift apart per window of positions (does the bias grow with T?)."""
    fixed, buggy = amp_step(None, T, hidden_size, seed), amp_step("bf16_decay", T, hidden_size, seed)
    bias = ((buggy.w - fixed.w) / fixed.w).abs()
    drift = [(hi, float((buggy.output[lo:hi] - fixed.output[lo:hi]).norm() / fixed.output[lo:hi].norm()))
             for lo, hi in windows(T)]
    return {"fixed": fixed, "bug": buggy, "w bias max": float(bias.max()), "w bias mean": float(bias.mean()),
            "output drift": drift}


def debug_in_fp32() -> dict[str, str]:
    """A common advice, "debug in fp32 first", tried on three bugs: does an all-fp32 run make the failure go
    away (a precision bug) or not (a range or contract bug)?"""
    from fla_lab.spec import check, harness
    from fla_lab import ops
    from fla_lab.teaching.lessons import decay_contract

    x = lora_grid(-8, 4, 1001)
    w_fp32 = _layer_decay(x, "bf16_decay")  # the buggy line, on fp32 LoRA output
    bias = float(((w_fp32 - official_log_decay(x)) / official_log_decay(x)).abs().max())
    g = harness.gated_inputs(1, 80, 2, 32, 16, decay=100.0, bonus=True, seed=7, names=("r", "k", "v", "w"))
    with torch.no_grad():
        o77, _ = ops.chunk_rwkv6(**harness.on_device(g), chunk_size=32, bug="exclusive_reference")
    o150 = decay_contract.run_rwkv7("rand a, b; w = log(rand)", T=64, K=64).output
    return {"#181 bf16 decay, the buggy line in fp32": f"relative error of w {bias:.1e}: gone",
            "#77 exclusive reference, fp32, decay 100": f"output {check.nonfinite_census(o77)}",
            "#150 a, b ~ rand, fp32": f"output {o150}"}


# ---------------------------------------------------------------- exercise: write the decay line yourself

def decay_errors(w: torch.Tensor, lora: torch.Tensor) -> dict[str, float]:
    """Per-step error of log-decays `w` computed from LoRA outputs `lora`, against the official formula in float64
    on the same (already rounded) LoRA outputs: max |relative error|, mean |relative error|, mean signed relative
    error (the bias: > 0 decays too slowly)."""
    ref = official_log_decay(lora)
    rel = (w.double().reshape(ref.shape) - ref) / ref.abs()
    return {"max": float(rel.abs().max()), "mean": float(rel.abs().mean()), "bias": float(rel.mean())}


def rounded_like_the_sigmoid_line(w: torch.Tensor, x: torch.Tensor, device: str) -> bool:
    """Does `w` hold exactly the values of the historical line's bf16 sigmoid under the same autocast (the product
    with e^-0.5 taken in bf16 or in fp32)? Tells "the sigmoid was rounded" apart from other bf16 roundings, e.g. the
    official formula -exp(-softplus(-x) - 0.5) on a bf16 input, which CPU autocast keeps in bf16."""
    with torch.autocast(device, dtype=torch.bfloat16), torch.no_grad():
        sig = x.sigmoid()
        lines = (-math.exp(-0.5) * sig, -math.exp(-0.5) * sig.float())
    return any(torch.equal(w.float(), line.float()) for line in lines)


def _other_ops_note(device: str) -> str:
    if device == "cpu":
        return "under CPU autocast exp and softplus stay bf16 too (CUDA autocast upcasts them: the trace's CUDA column)"
    return "some op on the way ran in bf16 under autocast"


def check_log_decay(candidate: Callable[[torch.Tensor], torch.Tensor], T: int = 32) -> exercises.Verdict:
    """The learner's decay line `candidate(w_raw) -> w`, run as in a bf16 AMP model, against float64.

    1. On bf16 LoRA outputs x in [-8, 4] under `torch.autocast(device, bf16)` (CPU autocast under the interpreter,
       CUDA autocast on a GPU): the dtype that would reach the kernel (fp32 wanted) and the per-step error of w.
    2. In the real layer (`RWKV7Attention("chunk")`, fp32 weights, one autocast forward and backward of T steps),
       through its `log_decay` seam: the dtype and error of the w that `chunk_rwkv7` receives, and finiteness.
    Tolerance: fla_lab's fp32 forward tolerance (`check.tolerance(torch.float32).fwd`)."""
    from fla_lab.spec import check
    from fla_lab import runtime

    dev = runtime.device()
    tol = check.tolerance(torch.float32).fwd
    x = lora_grid(-8, 4, 4001).to(dev).to(torch.bfloat16)
    with torch.autocast(dev, dtype=torch.bfloat16), torch.no_grad():
        w = candidate(x)
    grid = decay_errors(w.float().cpu(), x.cpu())
    facts = [
        (w.dtype == torch.float32, f"x in [-8, 4], bf16 under {dev} autocast: w is {viz.DTYPE_NAMES.get(w.dtype, w.dtype)}"),
        exercises.error_fact("per-step relative bias of w, max |.|", grid["max"], tol),
        exercises.error_fact("per-step relative bias of w, mean |.|", grid["mean"], tol),
    ]
    try:
        with contract.value_checks(True):  # on a GPU too the kernel's value checks report here, inside the verdict
            step = amp_step(None, T=T, log_decay=candidate)
    except Exception as err:  # e.g. a dtype the kernel's input checks refuse: a verdict, not a traceback
        facts.append((False, f"in the layer (T = {T}): {type(err).__name__}: {str(err).splitlines()[0][:120]}"))
    else:
        facts += [
            (step.dtypes["w"] == "fp32", f"in the layer (T = {T}): chunk_rwkv7 receives w as {step.dtypes['w']}"),
            exercises.error_fact("in the layer: per-step relative bias of w, max |.|",
                                 decay_errors(step.w, step.lora)["max"], tol),
            (step.finite, f"in the layer: output and every gradient finite: {step.finite}"),
        ]
    hints = () if all(ok for ok, _ in facts) else decay_hints(candidate, w, x, grid, tol, dev)
    return exercises.verdict("RWKV-7 log-decay in fp32 under autocast", facts, hints)


# the solution line: sealed (base64 in this source; Tab, `??` and help() do not show it), opened by the last hint
# tier only
_LINE = exercises.Sealed("cmV0dXJuIC1tYXRoLmV4cCgtMC41KSAqIHdfcmF3LmZsb2F0KCkuc2lnbW9pZCgp")
# what is wrong after a cast that comes too late: it says where the cast goes, so it is sealed like the line
_WHAT_LATE_CAST = exercises.Sealed(
    "dyBpcyBmcDMyIGJ1dCBob2xkcyBiZjE2IHZhbHVlczogdGhlIHNpZ21vaWQgaGFkIGFscmVhZHkgcm91bmRlZCB0aGVtIHdoZW4geW91IGNhc3Q7IG"
    "EgY2FzdCBjYW5ub3QgYnJpbmcgYmFjayB0aGUgYml0cywgaXQgaGFzIHRvIGNvbWUgYmVmb3JlIHRoZSBmaXJzdCBvcCB0aGF0IHJvdW5kcw==")
ROUNDING_BOUND = 2 * 2.0 ** -8  # the most two bf16 roundings (the sigmoid, the product) move w, relative


def value_hints(w: torch.Tensor, x: torch.Tensor, rounded: list[str]) -> tuple[str, ...]:
    """Hint tiers for a line whose values are wrong, not rounded: a positive w (the sign), w off by one factor at
    every x (the constant), or another formula. Empty when the error is rounding (`decay_hints` takes over).

    A value error: w > 0 somewhere, or the median relative error beyond bf16's unit roundoff 2^-8 (rounding scatters
    around 0), or w fp32 from a line in which no op returned bf16 (nothing rounded, yet w is off)."""
    ref = official_log_decay(x.cpu())
    got = w.detach().double().cpu().reshape(ref.shape)
    rel = (got - ref) / ref.abs()
    nothing_rounded = w.dtype == torch.float32 and not rounded
    if not ((got > 0).any() or abs(float(rel.median())) > 2.0 ** -8 or nothing_rounded):
        return ()
    dtype = viz.DTYPE_NAMES.get(w.dtype, str(w.dtype))
    kind = ("a value error, not a rounding one: no op of your line returned bf16" if nothing_rounded else
            f"a value error, beyond what rounding does (at most {ROUNDING_BOUND:.1e} relative, scattered around 0)")
    dtype_too = "" if w.dtype == torch.float32 else f"; once the values are right, w's dtype ({dtype}) is next"
    if (got > 0).any():
        return exercises.hints(
            f"w is positive (up to {float(got.max()):.3g}) where float64's w = -e^-0.5 sigmoid(w_raw) lies in "
            f"(-e^-0.5, 0): {kind}",
            "w is a log-decay: the kernel multiplies the state by exp(w) at every step, so w <= 0 (a decay "
            "exp(w) <= 1); w > 0 makes the state grow. " + (
                "Look at the sign of the constant in front of the sigmoid" if bool((got >= 0).all()) else
                "Yours is positive at some x only: the function of w_raw must stay positive, the sigmoid in (0, 1), "
                "times a negative constant") + dtype_too, _LINE)
    ratio = got / ref
    factor = float(ratio.median())
    if float((ratio - factor).abs().max()) <= ROUNDING_BOUND * 1.01:
        return exercises.hints(
            f"w is {dtype} and off by the same factor at every x: w / float64's w = {factor:.5f}, {kind}",
            "the scale of RWKV-7's log-decay is e^-0.5 = 0.60653..., exactly: write it as math.exp(-0.5), not a "
            "rounded number. A constant off by a fraction is a per-step bias of that fraction, and it compounds "
            "over the sequence like the bf16 one" + dtype_too, _LINE)
    worst = int(rel.abs().argmax())
    return exercises.hints(
        f"w is {dtype} and off by more than rounding: median relative error {float(rel.median()):+.1e}, worst at "
        f"x = {float(x.flatten()[worst]):.2f} ({float(got[worst]):.4g} against float64's {float(ref[worst]):.4g}): "
        f"{kind}",
        "compare your line with RWKV-7's w = -e^-0.5 sigmoid(w_raw) term by term: the sigmoid of w_raw itself, "
        "times the constant -e^-0.5 (math.exp(-0.5))" + dtype_too, _LINE)


def decay_hints(candidate, w: torch.Tensor, x: torch.Tensor, grid: dict, tol: float, dev: str) -> tuple[str, ...]:
    """Hint tiers chosen from what the candidate did: values wrong rather than rounded (`value_hints`: the sign, the
    constant), the historical bf16 sigmoid, a cast after the sigmoid, a rounding by other ops (e.g. the official
    formula under CPU autocast), right values in the wrong dtype."""
    rounded = [name for name, got, _ in trace_dtypes(candidate, dev)[1:] if got == "bf16"]  # [0]: w_raw's Linear
    trace = (f"run amp.show_dtypes(my_log_decay): the ops of your line that return bf16 under {dev} autocast are "
             f"where w loses its bits ({', '.join(rounded) or 'none'})")
    if grid["max"] <= tol:
        return exercises.hints("the values are right: look at the first line, the dtype of w",
                               "the kernel takes w in fp32: return the fp32 result, not a cast of it")
    if value := value_hints(w, x, rounded):
        return value
    if not rounded_like_the_sigmoid_line(w, x, dev):
        return exercises.hints(
            trace, f"w was rounded on the way, but not by the historical line's sigmoid: {_other_ops_note(dev)}; a "
            "line that relies on autocast's op lists is fp32 only on a device whose lists include its ops", _LINE)
    if w.dtype == torch.float32:
        return exercises.hints(trace, _WHAT_LATE_CAST, _LINE)
    return exercises.hints(
        trace, "w_raw arrives as bf16 (a Linear's output under autocast), and sigmoid is on neither autocast's fp32 "
        "list: it computes and returns bf16, and so does the product after it. Switching autocast off does not help: "
        "the input is already bf16", _LINE)

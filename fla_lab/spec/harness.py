"""A tiny spec -> kernel -> check harness: make inputs, run an op and its float64 reference, compare all.

Used by the tests, `doctor()` and the notebooks, so every comparison is made the same way:
forward output and final state against the reference, then every input gradient under random cotangents,
judged with `check.grad_errors` (whole-gradient floor) and `check.tolerance(dtype)`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fla_lab.spec import check
from fla_lab import runtime


def log_decay(shape, magnitude: float, generator: torch.Generator) -> torch.Tensor:
    """Per-step natural-log decay `-magnitude * U(0.05, 1)`: the stress knob of upstream's baseline sweep."""
    return -magnitude * torch.empty(shape).uniform_(0.05, 1.0, generator=generator)


def gated_inputs(B, T, H, K, V, *, decay=1.0, initial_state=True, bonus=False, seed=0,
                 names=("q", "k", "v", "g")) -> dict[str, torch.Tensor]:
    """GLA / RWKV6 inputs in float32 on the CPU, in the op's positional order (+ `u`, `initial_state`)."""
    gen = torch.Generator().manual_seed(seed)
    nq, nk, nv, ng = names
    x = {nq: torch.randn(B, T, H, K, generator=gen), nk: torch.randn(B, T, H, K, generator=gen),
         nv: torch.randn(B, T, H, V, generator=gen), ng: log_decay((B, T, H, K), decay, gen)}
    if bonus:
        x["u"] = torch.randn(H, K, generator=gen)
    if initial_state:
        x["initial_state"] = torch.randn(B, H, K, V, generator=gen)
    return x


RWKV7_W_SCALE = -0.6065306597126334  # -exp(-0.5): RWKV-7's log-decay lies in (-e^-0.5, 0)


def rwkv7_inputs(B, T, H, K, V, *, decay=None, initial_state=True, seed=0) -> dict[str, torch.Tensor]:
    """RWKV-7 inputs in float32 on the CPU, in the op's positional order `r, w, k, v, a, b` (+ `initial_state`).

    `a` and `b` are RWKV-7's own, as its layer builds them from a random key and a random gate in (0, 1), so
    `diag(exp w) + b a^T` only removes state. `decay=None` is RWKV-7's own range `w = -e^-0.5 * sigmoid(randn)`;
    a number m gives the stress decay `-m * U(0.05, 1)` of `log_decay`.
    """
    from fla_lab.layers.rwkv7 import state_removal  # the layer's own construction (a lazy import: layers import torch.nn)

    gen = torch.Generator().manual_seed(seed)
    shape = (B, T, H, K)
    kk = torch.nn.functional.normalize(torch.randn(shape, generator=gen), dim=-1)
    a_gate = torch.rand(shape, generator=gen)
    if decay is None:
        w = RWKV7_W_SCALE * torch.sigmoid(torch.randn(shape, generator=gen))
    else:
        w = log_decay(shape, decay, gen)
    x = {"r": torch.randn(shape, generator=gen), "w": w, "k": torch.randn(shape, generator=gen),
         "v": torch.randn(B, T, H, V, generator=gen)}
    x["a"], x["b"] = state_removal(kk, a_gate)
    if initial_state:
        x["initial_state"] = torch.randn(B, H, K, V, generator=gen)
    return x


def gsa_inputs(B, T, H, K, V, M, *, decay=1.0, initial_state=True, seed=0) -> dict:
    """GSA inputs in float32 on the CPU: q, k, v, s (slot writes), g (slot log-forget gate, `log_decay`) and the
    state pair `(Hk0 [B, H, K, M], Hv0 [B, H, M, V])`."""
    gen = torch.Generator().manual_seed(seed)
    x = {"q": torch.randn(B, T, H, K, generator=gen), "k": torch.randn(B, T, H, K, generator=gen),
         "v": torch.randn(B, T, H, V, generator=gen), "s": torch.randn(B, T, H, M, generator=gen),
         "g": log_decay((B, T, H, M), decay, gen)}
    if initial_state:
        x["initial_state"] = (torch.randn(B, H, K, M, generator=gen), torch.randn(B, H, M, V, generator=gen))
    return x


def _named(name: str, x) -> dict:
    """A tensor, or a tuple of them (GSA's state pair) as `name[0]`, `name[1]`."""
    if isinstance(x, (tuple, list)):
        return {f"{name}[{i}]": t for i, t in enumerate(x)}
    return {name: x}


@dataclass
class Comparison:
    errors: dict[str, float]
    dtype: torch.dtype
    outputs: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    # the gradients' plain relative errors (`check.plain_grad_errors`) beside the floored ones in `errors`; kept
    # out of __str__ and repr, which notebooks print and nbval compares
    plain_errors: dict[str, float] = field(default_factory=dict, repr=False)

    @property
    def tolerance(self) -> check.Tolerance:
        return check.tolerance(self.dtype)

    def failures(self) -> dict[str, float]:
        tol = self.tolerance
        return {n: e for n, e in self.errors.items() if not e <= tol.of(n)}

    @property
    def ok(self) -> bool:
        return not self.failures()

    def __str__(self) -> str:
        return "  ".join(f"{n}={e:.1e}" for n, e in self.errors.items())


@dataclass
class Run:
    """One forward and backward: the output, the final state(s) by name (`ht`, or `ht[0]`, `ht[1]`), the input
    gradients by name (empty without a backward), all detached."""
    o: torch.Tensor
    states: dict[str, torch.Tensor]
    grads: dict[str, torch.Tensor]


def leaves(inputs: dict, dtype=None, device=None, grads=True) -> dict:
    """Inputs as fresh leaves: cast to `dtype` (initial states stay float32, as upstream's kernels expect; None
    keeps each dtype), moved to `device`, requiring grad. Cloned, so gradients never land in the caller's tensors."""
    def leaf(n, x):
        x = x if dtype is None or n.startswith("initial_state") else x.to(dtype)
        return x.to(device or x.device).detach().clone().requires_grad_(grads)

    return {n: (tuple(leaf(n, t) for t in x) if isinstance(x, (tuple, list)) else leaf(n, x))
            for n, x in inputs.items()}


def on_device(x, device=None):
    """A tensor, or a dict / list / tuple of them (nested), moved to `device` (default: where the kernels run,
    `runtime.device()`): on a GPU the Triton ops refuse CPU tensors. Make inputs seeded on the CPU (the same values
    on every machine), then move them with this. Anything else is returned as it is; on the CPU, tensors are
    returned themselves (`Tensor.to` of the same device is a no-op), so nothing changes there."""
    device = device or runtime.device()
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, dict):
        return {name: on_device(t, device) for name, t in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(on_device(t, device) for t in x)
    return x


def cotangents(o_shape, state_shapes: dict, seed: int, state_grad: bool = True):
    """Random float64 cotangents for the output and each final state (zeros for the states if not `state_grad`)."""
    gen = torch.Generator().manual_seed(seed + 1)
    do = torch.randn(o_shape, generator=gen, dtype=torch.float64)
    return do, {n: torch.randn(shape, generator=gen, dtype=torch.float64) * float(state_grad)
                for n, shape in state_shapes.items()}


def run(fn, inputs: dict, cotangent=None, **kwargs) -> Run:
    """`fn(**inputs, output_final_state=True)`, then (given `(do, dht)`, or a function of `(o, states)` that
    returns them) the backward of `sum(o * do) + sum(ht * dht)`. `inputs` are leaves (see `leaves`)."""
    o, ht = fn(**inputs, output_final_state=True, **kwargs)
    states = _named("ht", ht)
    grads = {}
    if cotangent is not None:
        do, dht = cotangent(o, states) if callable(cotangent) else cotangent
        loss = (o * do.to(o.device, o.dtype)).sum()
        loss = loss + sum((states[n] * d.to(states[n].device, states[n].dtype)).sum() for n, d in dht.items())
        loss.backward()
        grads = {m: t.grad for n, x in inputs.items() for m, t in _named(n, x).items()}
    return Run(o.detach(), {n: s.detach() for n, s in states.items()}, grads)


def exact_leaves(rounded: dict, device=None, grads: bool = True) -> dict:
    """The reference's inputs: every tensor (initial states too) as a float64 leaf of the same (already rounded)
    values, on `device` (None: where it is); anything else as it is."""
    def leaf(t):
        return t.detach().to(device or t.device, torch.float64).requires_grad_(grads)
    return {n: (tuple(leaf(t) for t in x) if isinstance(x, (tuple, list)) else
                leaf(x) if isinstance(x, torch.Tensor) else x) for n, x in rounded.items()}


def exact_run(reference, rounded: dict, *, seed=0, state_grad=True, grads=True, device="cpu", **kwargs):
    """The float64 reference on the op's (already rounded) inputs, with the random cotangents it draws for them;
    returns `(Run, (do, dht))` (cotangents None without `grads`)."""
    theirs = exact_leaves(rounded, device, grads)
    drawn = []

    def draw(o, states):
        drawn.append(cotangents(o.shape, {n: s.shape for n, s in states.items()}, seed, state_grad))
        return drawn[0]  # `run` moves them to the tensors' device

    exact = run(reference, theirs, draw if grads else None, **kwargs)
    return exact, (drawn[0] if drawn else None)


def compare(op, reference, inputs: dict[str, torch.Tensor], *, dtype=torch.float32, grads=True,
            seed=0, state_grad=True, reference_device="cpu", **kwargs) -> Comparison:
    """Run `op(**inputs cast to dtype, on the device)` and `reference(**inputs in float64)` and compare.

    `inputs` maps argument names to float32 CPU tensors (e.g. from `gated_inputs`); `initial_state` stays
    float32 as upstream's kernels expect. Keyword `kwargs` go to both (e.g. `scale`). The reference sees the
    same rounded values the op sees, upcast to float64, on `reference_device` (a GPU's float64 loop is far faster
    than the CPU's at training lengths).
    """
    ours = leaves(inputs, dtype, runtime.device(), grads)
    exact, cot = exact_run(reference, ours, seed=seed, state_grad=state_grad, grads=grads, device=reference_device,
                           **kwargs)
    return judge(run(op, ours, cot, **kwargs), exact, dtype)


def judge(got: Run, exact: Run, dtype: torch.dtype) -> Comparison:
    """A run of an op against the reference's run on the same inputs and cotangents (`exact_run`): the output's,
    each final state's and (where the runs have them) every gradient's error."""
    errors = {"o": check.rel_error(got.o, exact.o)}
    errors.update({n: check.rel_error(got.states[n], r) for n, r in exact.states.items()})
    grads = bool(exact.grads)
    if grads:
        errors.update(check.grad_errors(exact.grads, got.grads))
    plain = check.plain_grad_errors(exact.grads, got.grads) if grads else {}
    return Comparison(errors, dtype, {"o": got.o, "ht": _unnamed(got.states), "o_ref": exact.o,
                                      "run": got, "exact": exact}, plain)


def _unnamed(states: dict):
    values = list(states.values())
    return values[0] if len(values) == 1 else tuple(values)

"""What fla_lab knows about each op, in one place: its callable, float64 reference, inputs, bugs and tolerances.

The tests, the lessons, `doctor()`, the stability atlas (`fla_lab.tools.atlas`) and the NaN locator (`fla_lab.tools.hunt`)
all draw from `OPS`. `register_fla()` adds flash-linear-attention's ops (when that package is installed) under
the same specs, so anything that sweeps fla_lab's ops can sweep upstream's too.

    spec = registry.get("chunk_rwkv6")
    x = spec.inputs(registry.Shape(1, 65, 2, 32, 48), decay=100.0)      # fp32 CPU tensors, by argument name
    o, ht = spec.op("exclusive_reference", chunk_size=64)(**on_device(x), output_final_state=True)
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from fla_lab import layers
from fla_lab.spec import check, harness, reference

FIXED = "fixed"  # the variant with every switch off (`bug=None`)


@dataclass(frozen=True)
class Shape:
    B: int
    T: int
    H: int
    K: int
    V: int
    M: int = 32  # GSA's slots; ignored by the other families

    def __str__(self) -> str:
        return f"B{self.B} T{self.T} H{self.H} K{self.K} V{self.V}"


@dataclass(frozen=True)
class OpSpec:
    """One op: how to call it, what it should compute, on which inputs, and which historical lines it can switch on.

    `decay_name` is the argument that holds the per-step natural-log decay (the atlas' stress knob). Which Triton
    kernels a call launches is not listed here: `fla_lab.tools.hunt.trace_kernels` watches them launch.
    """
    name: str
    family: str
    fn: Callable
    reference: Callable
    make_inputs: Callable[..., dict]
    decay_name: str
    chunk_sizes: tuple[int, ...] = ()  # the op's `chunk_size` values worth sweeping (empty: no such argument)
    library: str = "fla_lab"
    requires_cuda: bool = False
    bug_names: tuple[str, ...] = field(default=())

    @property
    def label(self) -> str:
        return self.name if self.library == "fla_lab" else f"{self.library}:{self.name}"

    @property
    def variants(self) -> tuple[str, ...]:
        return (FIXED, *self.bug_names)

    def inputs(self, shape: Shape, decay: float | None = 1.0, initial_state: bool = True, seed: int = 0) -> dict:
        """fp32 CPU inputs by argument name; `decay` m draws the log-decay as `-m * U(0.05, 1)` (None: the family's
        natural range where it has one, RWKV-7's)."""
        return self.make_inputs(shape, decay=decay, initial_state=initial_state, seed=seed)

    def op(self, variant: str = FIXED, chunk_size: int | None = None) -> Callable:
        """The callable for `variant` ("fixed" or a catalogue name), with `chunk_size` bound where given."""
        if variant not in self.variants:
            raise ValueError(f"{self.label}: no variant {variant!r}; known: {list(self.variants)}")
        kwargs = {} if variant == FIXED else {"bug": variant}
        if chunk_size is not None:
            if not self.chunk_sizes:
                raise ValueError(f"{self.label} has no chunk_size")
            kwargs["chunk_size"] = chunk_size
        return functools.partial(self.fn, **kwargs) if kwargs else self.fn

    def tolerance(self, dtype: torch.dtype) -> check.Tolerance:
        return check.tolerance(dtype)

    def compare(self, inputs: dict, *, variant: str = FIXED, dtype=torch.float32, chunk_size=None, **kwargs):
        """`harness.compare` of this op against its reference: output, final state(s) and every gradient."""
        return harness.compare(self.op(variant, chunk_size), self.reference, inputs, dtype=dtype, **kwargs)


def _gated(names, bonus=False):
    def make(shape: Shape, decay, initial_state, seed):
        return harness.gated_inputs(shape.B, shape.T, shape.H, shape.K, shape.V, decay=1.0 if decay is None else decay,
                                    initial_state=initial_state, bonus=bonus, seed=seed, names=names)
    return make


def _rwkv7(shape: Shape, decay, initial_state, seed):
    return harness.rwkv7_inputs(shape.B, shape.T, shape.H, shape.K, shape.V, decay=decay,
                                initial_state=initial_state, seed=seed)


def _gsa(shape: Shape, decay, initial_state, seed):
    return harness.gsa_inputs(shape.B, shape.T, shape.H, shape.K, shape.V, shape.M,
                              decay=1.0 if decay is None else decay, initial_state=initial_state, seed=seed)


def _gla_reference(q, k, v, gk, **kwargs):  # fused_recurrent_gla names its decay `gk`, as upstream does
    return reference.recurrent_gla(q, k, v, gk, **kwargs)


def _specs() -> dict[str, OpSpec]:
    from fla_lab import ops

    specs = [
        OpSpec("chunk_gla", "gla", ops.chunk_gla, reference.recurrent_gla, _gated(("q", "k", "v", "g")), "g",
               chunk_sizes=(16, 32, 64)),
        OpSpec("fused_recurrent_gla", "gla", ops.fused_recurrent_gla, _gla_reference, _gated(("q", "k", "v", "gk")),
               "gk"),
        OpSpec("chunk_rwkv6", "rwkv6", ops.chunk_rwkv6, reference.recurrent_rwkv6,
               _gated(("r", "k", "v", "w"), bonus=True), "w", chunk_sizes=(16, 32, 64)),
        OpSpec("fused_recurrent_rwkv6", "rwkv6", ops.fused_recurrent_rwkv6, reference.recurrent_rwkv6,
               _gated(("r", "k", "v", "w"), bonus=True), "w"),
        OpSpec("chunk_gsa", "gsa", ops.chunk_gsa, reference.recurrent_gsa, _gsa, "g", chunk_sizes=(16, 32, 64)),
        OpSpec("fused_recurrent_gsa", "gsa", ops.fused_recurrent_gsa, reference.recurrent_gsa, _gsa, "g"),
        OpSpec("chunk_rwkv7", "rwkv7", ops.chunk_rwkv7, reference.recurrent_rwkv7, _rwkv7, "w"),
        OpSpec("fused_recurrent_rwkv7", "rwkv7", ops.fused_recurrent_rwkv7, reference.recurrent_rwkv7, _rwkv7, "w"),
    ]
    return {s.name: replace(s, bug_names=tuple(w.name for w in layers.SWITCHES if w.op == s.name)) for s in specs}


OPS: dict[str, OpSpec] = {}  # filled on first use: building it imports the kernels


def ops() -> dict[str, OpSpec]:
    """Every registered op, fla_lab's first, then any external library's (keyed by `label`)."""
    if not OPS:
        OPS.update(_specs())
    return OPS


def get(name: str, library: str = "fla_lab") -> OpSpec:
    key = name if library == "fla_lab" else f"{library}:{name}"
    table = ops()
    if key not in table:
        raise KeyError(f"no op {key!r} in the registry; known: {sorted(table)}")
    return table[key]


def names(library: str = "fla_lab") -> list[str]:
    return [s.name for s in ops().values() if s.library == library]


def for_bug(name: str) -> OpSpec | None:
    """The op whose `bug=` switch holds catalogue entry `name` (None for the layer-level bugs)."""
    return next((s for s in ops().values() if s.library == "fla_lab" and name in s.bug_names), None)


# --- flash-linear-attention under the same specs -----------------------------------------------------------------

FLA_MODULES = {  # fla_lab op -> upstream module (0.6.0 layout); same signatures, `[B, T, H, D]`, log-space decays
    "chunk_gla": "fla.ops.gla", "fused_recurrent_gla": "fla.ops.gla", "chunk_rwkv6": "fla.ops.rwkv6",
    "fused_recurrent_rwkv6": "fla.ops.rwkv6", "chunk_gsa": "fla.ops.gsa", "fused_recurrent_gsa": "fla.ops.gsa",
    "chunk_rwkv7": "fla.ops.rwkv7", "fused_recurrent_rwkv7": "fla.ops.rwkv7",
}


def fla_available() -> bool:
    return importlib.util.find_spec("fla") is not None and torch.cuda.is_available()


def register_fla(library: str = "fla") -> list[str]:
    """Register flash-linear-attention's ops (needs the package and a CUDA device) as `fla:<op>`: same inputs,
    reference and tolerances as fla_lab's, no bug variants (a release is what it is). Returns the labels added."""
    if not fla_available():
        return []
    added = []
    for name, module in FLA_MODULES.items():
        try:
            fn = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        ours = get(name)
        spec = replace(ours, fn=fn, library=library, requires_cuda=True, bug_names=())
        ops()[spec.label] = spec
        added.append(spec.label)
    return added

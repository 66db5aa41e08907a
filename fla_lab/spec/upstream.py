"""flash-linear-attention (FLA) as fla_lab meets it: its op entry points, how their arguments map onto fla_lab's ops
and float64 references, which of its layers call them, and how to import those layers.

Every piece of FLA-version knowledge fla_lab uses is in this module. Checked against the wheels of fla-core /
flash-linear-attention 0.5.2 and 0.6.0 (`CHECKED_ON`): the entry points below have the same tensor arguments and
the same meaning in both; they differ only in speed hints (0.6.0 adds `lower_bound` to the DPLR / RWKV-7 chunk
ops) and in whether a function takes `**kwargs` (0.6.0's `fused_recurrent_rwkv6` does not). `fused_chunk_gla` is
not listed: both releases make it raise NotImplementedError.

What the mapping does (FLA name -> fla_lab):
  chunk_gla, fused_recurrent_gla, chunk_rwkv6, fused_recurrent_rwkv6, chunk_gsa, fused_recurrent_gsa,
  chunk_rwkv7, fused_recurrent_rwkv7               -> the fla_lab op of the same name (same names, layouts)
  fused_mul_recurrent_rwkv7(r, w, k, v, kk, a)      -> fused_recurrent_rwkv7(r, w, k, v, a=-kk, b=kk * a), what
                                                       FLA's RWKV7Attention passes to chunk_rwkv7 on its chunk path
  chunk_dplr_delta_rule(q, k, v, a, b, gk)           -> chunk_rwkv7(r=q, w=gk, k, v, a, b)
  fused_recurrent_dplr_delta_rule(q, k, v, a, b, gk) -> fused_recurrent_rwkv7(r=q, w=gk, k, v, a, b)
Options: `scale` is recorded with FLA's own default (None means K ** -0.5 in every op above; chunk_rwkv7 and
fused_mul_recurrent_rwkv7 default to 1.0); `state_v_first` transposes the GLA state ([N, H, V, K]); `cu_seqlens`
(packed sequences) is replayed one sequence at a time; speed hints (`HINTS`) are dropped. Options that change the
math and that the references do not model (`REFUSED`), and any option this module has never seen, raise
`UnsupportedCall` rather than replay something else.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import sys
import types
from dataclasses import dataclass, replace
from typing import Callable

import torch

CHECKED_ON = ("0.5.2", "0.6.0")
INSTALL = ("pip install flash-linear-attention fla-core (checked on " + ", ".join(CHECKED_ON) + "; the layers need "
           "only fla-core and einops when imported through fla_lab.spec.upstream.import_layer)")

# do not change the result: which kernel variant, chunk size, recomputation or assertion FLA uses
HINTS = frozenset({"safe_gate", "chunk_size", "disable_recompute", "lower_bound", "checkpoint_level",
                   "cu_seqlens_cpu", "output_final_state"})
# change the result in ways the float64 references do not model: option -> the value that is harmless
REFUSED = {"head_first": False, "reverse": False, "gv": None, "cp_context": None}
KNOWN = HINTS | set(REFUSED) | {"scale", "state_v_first", "cu_seqlens", "initial_state"}


class UnsupportedCall(ValueError):
    """An FLA call whose options the float64 references cannot replay faithfully."""


class Unavailable(RuntimeError):
    """FLA is not importable, or there is no CUDA device for its kernels."""


def _renamed(pairs: dict[str, str]) -> Callable[[dict], dict]:
    def rename(tensors: dict) -> dict:
        return {pairs.get(n, n): t for n, t in tensors.items()}
    return rename


def _same(tensors: dict) -> dict:
    return dict(tensors)


def _mul_rwkv7(tensors: dict) -> dict:
    """`fused_mul_recurrent_rwkv7`'s (kk, a) are RWKV-7's unit-norm key and in-context learning rate: the same
    transition as fla_lab's (and FLA's chunk_rwkv7's) a, b built from them as RWKV-7's layer builds them."""
    out = {n: t for n, t in tensors.items() if n not in ("kk", "a")}
    kk, a = tensors["kk"], tensors["a"]
    return {**out, "a": -kk, "b": kk * a}


@dataclass(frozen=True)
class Entry:
    """One FLA op entry point: where FLA exports it, the fla_lab op computing the same thing, how its tensors
    become that op's, and the name of its per-step log-decay argument."""
    name: str
    module: str
    ours: str
    decay: str
    to_ours: Callable[[dict], dict] = _same


_DPLR = _renamed({"q": "r", "gk": "w"})
ENTRIES: dict[str, Entry] = {e.name: e for e in (
    Entry("chunk_gla", "fla.ops.gla", "chunk_gla", "g"),
    Entry("fused_recurrent_gla", "fla.ops.gla", "fused_recurrent_gla", "gk"),
    Entry("chunk_rwkv6", "fla.ops.rwkv6", "chunk_rwkv6", "w"),
    Entry("fused_recurrent_rwkv6", "fla.ops.rwkv6", "fused_recurrent_rwkv6", "w"),
    Entry("chunk_gsa", "fla.ops.gsa", "chunk_gsa", "g"),
    Entry("fused_recurrent_gsa", "fla.ops.gsa", "fused_recurrent_gsa", "g"),
    Entry("chunk_rwkv7", "fla.ops.rwkv7", "chunk_rwkv7", "w"),
    Entry("fused_recurrent_rwkv7", "fla.ops.rwkv7", "fused_recurrent_rwkv7", "w"),
    Entry("fused_mul_recurrent_rwkv7", "fla.ops.rwkv7", "fused_recurrent_rwkv7", "w", _mul_rwkv7),
    Entry("chunk_dplr_delta_rule", "fla.ops.generalized_delta_rule", "chunk_rwkv7", "gk", _DPLR),
    Entry("fused_recurrent_dplr_delta_rule", "fla.ops.generalized_delta_rule", "fused_recurrent_rwkv7", "gk", _DPLR),
)}


# --- is FLA here --------------------------------------------------------------------------------------------------

def version() -> str | None:
    """The installed fla-core (or, before the split into two wheels, flash-linear-attention) version."""
    for dist in ("fla-core", "flash-linear-attention"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    module = sys.modules.get("fla")
    return getattr(module, "__version__", None)


def require() -> None:
    """Raise `Unavailable` with what to install, or that a GPU is needed (FLA's kernels autotune on CUDA and do not
    run under the Triton interpreter)."""
    if importlib.util.find_spec("fla") is None:
        raise Unavailable(f"flash-linear-attention is not installed: {INSTALL}")
    if not torch.cuda.is_available():
        raise Unavailable("flash-linear-attention's kernels need a CUDA device (they autotune on the GPU and do "
                          "not run under TRITON_INTERPRET=1): run this on a machine with a GPU")
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise Unavailable("TRITON_INTERPRET=1 is set: FLA's autotuned kernels need the CUDA driver; unset it")


def first_config_timings(autotuner, *args, **kwargs) -> list[float]:
    """A Triton autotuner's timing of one config, the same for every config: the autotuner keeps its first."""
    return [1.0, 1.0, 1.0]


def pin_autotune_to_first_config() -> None:
    """For verdicts and accuracy, not speed: every Triton autotuner in this process (FLA's) takes its first config
    instead of compiling and timing them all (minutes per op on a fresh machine)."""
    from triton.runtime import autotuner

    autotuner.Autotuner._bench = first_config_timings


def entry_points() -> dict[str, Callable]:
    """FLA's function per entry name, for the entries the installed FLA exports (imported here)."""
    found = {}
    for name, entry in ENTRIES.items():
        try:
            found[name] = getattr(importlib.import_module(entry.module), name)
        except (ImportError, AttributeError):
            continue  # an older FLA without this op: nothing of it can be called
    return found


def call_sites(functions: dict[str, Callable]) -> list[tuple[types.ModuleType, str, str]]:
    """(module, attribute, entry name) for every loaded `fla.*` module that holds one of `functions` by name.
    FLA's layers import their ops by name (`from fla.ops.rwkv6 import chunk_rwkv6`), and one op calls another the
    same way (0.6.0's chunk_rwkv7 calls chunk_dplr_delta_rule), so patching the exporting package alone records
    nothing: every namespace holding the function is patched."""
    by_id = {id(fn): name for name, fn in functions.items()}
    sites = []
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == "fla" or module_name.startswith("fla.")):
            continue
        for attribute, value in list(vars(module).items()):
            if id(value) in by_id:
                sites.append((module, attribute, by_id[id(value)]))
    return sites


# --- one call in fla_lab's terms -----------------------------------------------------------------------------------

def recorded_options(fn: Callable, bound: dict) -> dict:
    """The options to record for a call: what was passed, plus FLA's own `scale` default (it differs by op)."""
    options = dict(bound)
    parameter = inspect.signature(fn).parameters.get("scale")
    if "scale" not in options and parameter is not None and parameter.default is not inspect.Parameter.empty:
        options["scale"] = parameter.default
    return options


def check_options(name: str, tensors: dict, options: dict) -> None:
    unknown = sorted(set(options) - KNOWN)
    if unknown:
        raise UnsupportedCall(f"FLA's {name} was called with {unknown}, options fla_lab.spec.upstream has not mapped "
                              f"(checked on FLA {', '.join(CHECKED_ON)}; this is {version()})")
    given = {**options, **tensors}
    for option, harmless in REFUSED.items():
        value = given.get(option, harmless)
        if not (value is harmless or (isinstance(value, bool) and value == harmless)):
            raise UnsupportedCall(f"FLA's {name} was called with {option}={_short(value)}: the float64 "
                                  "references do not model it, so this call cannot be replayed")


def _short(value) -> str:
    return f"tensor{list(value.shape)}" if isinstance(value, torch.Tensor) else repr(value)


def to_ours(name: str, tensors: dict, options: dict) -> tuple[dict, dict]:
    """FLA's tensors and options of a call of `name` -> fla_lab's op's (differentiable: gradients of FLA's own
    inputs come back through the mapping). Speed hints dropped, `scale` explicit."""
    entry = ENTRIES[name]
    check_options(name, tensors, options)
    ours = entry.to_ours(tensors)
    scale = options.get("scale")
    keep = {n: v for n, v in options.items() if n in ("state_v_first", "cu_seqlens")}
    return ours, {**keep, "scale": ours["k"].shape[-1] ** -0.5 if scale is None else scale}  # FLA's default: K**-0.5


def reference(name: str) -> Callable:
    """fla_lab's float64 reference for FLA's `name`, called with FLA's argument names (packed sequences one at a
    time, `conventions.packed_reference`; a `state_v_first` state transposed in and out)."""
    from fla_lab.spec import registry
    from fla_lab.ops.common.conventions import packed_reference

    exact = registry.get(ENTRIES[name].ours).reference

    def fla_reference(output_final_state: bool = False, **arguments):
        tensors, options = _split(arguments)
        ours, options = to_ours(name, tensors, options)
        return _in_state_layout(exact, ours, options, output_final_state)
    reference_of_a_pack = packed_reference(fla_reference)
    reference_of_a_pack.__name__ = f"reference_for_fla_{name}"
    return reference_of_a_pack


def kernel(name: str) -> Callable:
    """fla_lab's Triton op for FLA's `name`, called with FLA's argument names (its ops take FLA 0.6.0's layouts,
    `cu_seqlens` and `state_v_first` themselves)."""
    from fla_lab import ops

    def fla_lab_kernel(output_final_state: bool = False, **arguments):
        tensors, options = _split(arguments)
        ours, options = to_ours(name, tensors, options)
        op = getattr(ops, ENTRIES[name].ours)
        return op(**ours, **{n: v for n, v in options.items() if v is not None},
                  output_final_state=output_final_state)
    fla_lab_kernel.__name__ = f"fla_lab_for_fla_{name}"
    return fla_lab_kernel


def spec(name: str, fn: Callable):
    """A registry.OpSpec for FLA's `name` (calling `fn`), so the locator and the audit treat its calls as they
    treat fla_lab's: FLA's argument names, decay name and the float64 reference through the mapping."""
    from fla_lab.spec import registry

    entry = ENTRIES[name]
    return replace(registry.get(entry.ours), name=name, fn=fn, reference=reference(name), decay_name=entry.decay,
                   library="fla", requires_cuda=True, bug_names=(), chunk_sizes=())


def _split(arguments: dict) -> tuple[dict, dict]:
    """Floating-point tensors (and tuples of them: GSA's state pair) are inputs; anything else is an option."""
    def is_tensor_input(v):
        if isinstance(v, torch.Tensor):
            return v.is_floating_point()
        return isinstance(v, (tuple, list)) and bool(v) and all(
            isinstance(t, torch.Tensor) and t.is_floating_point() for t in v)
    tensors = {n: v for n, v in arguments.items() if is_tensor_input(v)}
    return tensors, {n: v for n, v in arguments.items() if n not in tensors}


def _transposed(state):
    return None if state is None else state.transpose(-1, -2)


def _in_state_layout(exact: Callable, ours: dict, options: dict, output_final_state: bool):
    """`exact` on fla_lab's key-major states: a `state_v_first` state ([N, H, V, K]) transposed in and out."""
    v_first = bool(options.pop("state_v_first", False))
    h0 = ours.pop("initial_state", None)
    o, ht = exact(**ours, initial_state=_transposed(h0) if v_first else h0, **options,
                  output_final_state=output_final_state)
    return o, (_transposed(ht) if v_first else ht)


# --- FLA's layers --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Layer:
    """One FLA attention layer: module, class, the constructor's arguments for a small model, and whether its
    forward returns RWKV-7's `v_first` (the first layer's values, which later layers mix in)."""
    module: str
    cls: str
    kwargs: dict
    v_first: bool = False


LAYERS = {
    "rwkv6": Layer("fla.layers.rwkv6", "RWKV6Attention", {"num_heads": 4, "expand_k": 0.5, "expand_v": 1.0}),
    "rwkv7": Layer("fla.layers.rwkv7", "RWKV7Attention", {"head_dim": 64}, v_first=True),
    "gsa": Layer("fla.layers.gsa", "GatedSlotAttention", {"num_heads": 4, "num_slots": 64, "expand_k": 1.0,
                                                            "expand_v": 1.0}),
    "gla": Layer("fla.layers.gla", "GatedLinearAttention", {"num_heads": 4, "expand_k": 0.5, "expand_v": 1.0}),
}


def import_layer(family: str):
    """FLA's attention layer class for `family`, without importing `fla.layers/__init__.py`: in 0.5.2 and 0.6.0
    that file imports every layer, among them `attn.py`, which imports `transformers` at module level; the RWKV,
    GSA and GLA layer modules themselves import only fla-core and einops."""
    layer = LAYERS[family]
    spec = importlib.util.find_spec("fla")
    if spec is None:
        raise Unavailable(f"flash-linear-attention is not installed: {INSTALL}")
    # `fla/__init__` imports fla.layers and fla.models when transformers is importable, and skips both when not;
    # run it first, so that a layer module importing `fla.ops` later does not start it with a bare package in place
    # (its models would then import layers that are not there, or a layer module half-way through).
    importlib.import_module("fla")
    if "fla.layers" not in sys.modules:
        package = types.ModuleType("fla.layers")
        package.__path__ = [os.path.join(os.path.dirname(spec.origin), "layers")]
        sys.modules["fla.layers"] = package  # a bare package: its submodules import, its __init__ does not run
    return getattr(importlib.import_module(layer.module), layer.cls)

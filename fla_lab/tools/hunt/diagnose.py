"""Diagnosis of one op call: its inputs' statistics (`input_stats`), a replay with its kernels traced, the float64
reference on the same inputs (`reference_for_call`), and the cause class that explains them (`replay`).
"""
from __future__ import annotations

import contextlib
import inspect
import math

import torch

from fla_lab.spec import check, harness, registry
from fla_lab.ops import contract
from fla_lab.tools.hunt.causes import OVERFLOW_ADVICE, Diagnosis
from fla_lab.tools.hunt.scores import score_blocks
from fla_lab.tools.hunt.trace import KernelTracer, _dims


FP32_MAX = torch.finfo(torch.float32).max


def _tensors(inputs: dict):
    for name, x in inputs.items():
        if isinstance(x, (tuple, list)):
            yield from ((f"{name}[{i}]", t) for i, t in enumerate(x) if isinstance(t, torch.Tensor))
        elif isinstance(x, torch.Tensor):
            yield name, x


def _first_step(x: torch.Tensor, bad) -> int | None:
    """The first time step of a [B, T, H, D] tensor where `bad(x)` holds anywhere."""
    steps = bad(x.detach()).flatten(2).any(-1).any(0)
    return int(steps.nonzero()[0]) if steps.any() else None


def input_stats(spec: registry.OpSpec, inputs: dict) -> dict:
    """What explains most NaNs before any kernel runs: dtypes, the decay's range, non-finite inputs."""
    g = inputs[spec.decay_name]
    stats = {"dtype": str(inputs[next(iter(inputs))].dtype).replace("torch.", ""),
             "decay dtype": str(g.dtype).replace("torch.", ""),
             "log-decay min": float(g.min()), "log-decay max": float(g.max()),
             "T": g.shape[1]}
    bad = [n for n, t in _tensors(inputs) if not torch.isfinite(t).all()]
    if bad:
        stats["non-finite inputs"] = bad
    if spec.family == "rwkv7":
        from fla_lab.ops.contract import transition_radius

        ours = inputs if spec.library == "fla_lab" else _as_ours(spec, inputs)
        radius = transition_radius(ours["w"], ours["a"], ours["b"]) if not bad else math.nan
        stats["transition radius"] = radius
    return stats


def as_states(ht) -> tuple:
    """An op's final state(s) as a tuple: GSA's pair comes as a tuple from fla_lab and as a list from FLA 0.6.0's
    chunk_gsa (`o, *final_state = ...`); a single state (or None) as a 1-tuple."""
    return tuple(ht) if isinstance(ht, (tuple, list)) else (ht,)


def _as_ours(spec, inputs: dict) -> dict:
    """An FLA call's tensors under fla_lab's names (RWKV-7's a, b from FLA's kk, a; DPLR's q, gk as r, w)."""
    from fla_lab.spec import upstream

    return upstream.ENTRIES[spec.name].to_ours(inputs)


def reference_for_call(spec: registry.OpSpec, kwargs: dict):
    """The spec's float64 reference as one recorded call needs it: with the call's options that the reference takes
    (all of them for the adapter's references of FLA's ops, which take **kwargs), and a packed batch's sequences
    one at a time (`conventions.packed_reference`)."""
    import functools

    from fla_lab.ops.common.conventions import packed_reference

    parameters = inspect.signature(spec.reference).parameters
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    options = {n: v for n, v in kwargs.items() if (takes_all or n in parameters) and n != "cu_seqlens"}
    return functools.partial(packed_reference(spec.reference), **options, cu_seqlens=kwargs.get("cu_seqlens"))


def _reference_run(spec, inputs: dict, do, dht, kwargs: dict) -> dict:
    """The float64 answer on the same (already rounded) inputs: is it representable in fp32?"""
    ref_in = harness.exact_leaves(inputs, "cpu")
    o, ht = reference_for_call(spec, kwargs)(**ref_in, output_final_state=True)
    states = as_states(ht)
    out = {"o": o.detach(), "state max": max(float(s.detach().abs().max()) for s in states)}
    out["o first > fp32 max"] = _first_step(o, lambda x: ~(x.abs() <= FP32_MAX))
    if do is not None:
        loss = (o * do.double().cpu()).sum()
        if dht is not None:
            loss = loss + sum((s * d.double().cpu()).sum() for s, d in zip(states, as_states(dht)) if d is not None)
        loss.backward()
        grads = [t.grad for _, t in _tensors(ref_in) if t.grad is not None]
        out["grads finite"] = all(bool((g.abs() <= FP32_MAX).all()) for g in grads)
    return out


def replay(spec: registry.OpSpec, fn, inputs: dict, kwargs: dict | None = None, do=None, dht=None) -> Diagnosis:
    """Run one op call again (forward, and backward when `do` is given) watching its kernels, run the float64
    reference on the same inputs, and say where the first non-finite value appeared and why."""
    kwargs = dict(kwargs or {})
    stats = input_stats(spec, inputs)
    arrived = _nonfinite_cotangent(spec, do, dht, stats)
    if arrived is not None:  # nothing to replay: the op only passed on what it was given
        return arrived
    leaves = {n: (tuple(t.detach().clone().requires_grad_(t.is_floating_point()) for t in x)
                  if isinstance(x, (tuple, list)) else x.detach().clone().requires_grad_(x.is_floating_point()))
              for n, x in inputs.items()}
    tracer, raised, o, phase = KernelTracer(), None, None, "forward"
    with tracer.watching(), _quiet(), contract.value_checks(False):  # let the input through, as the model did
        try:
            o, ht = fn(**leaves, **kwargs, output_final_state=True)
            if do is not None and torch.isfinite(o).all():
                phase = "backward"
                states = as_states(ht)
                dhts = as_states(dht)
                loss = (o * do.to(o)).sum() + sum((s * d.to(s)).sum() for s, d in zip(states, dhts) if d is not None)
                loss.backward()
        except Exception as exc:  # what a failing kernel does is part of the diagnosis
            raised = exc
    bad = tracer.first_bad()
    diagnosis = Diagnosis(spec.label, bad.phase if bad else phase, "none", stats=stats)
    if bad:
        diagnosis.kernel = bad.kernel
        if bad.written:
            diagnosis.intermediate, census = next(iter(bad.written.items()))
            diagnosis.where = diagnosis.written_at = census.first
            if spec.chunk_sizes:
                chunk = kwargs.get("chunk_size") or _default_chunk(spec)
                diagnosis.scores = score_blocks(bad.masks[diagnosis.intermediate], stats["T"], chunk)
    if raised is not None and bad is not None and bad.raised:
        diagnosis.cause, diagnosis.note = "kernel_raised", f"{type(raised).__name__}: {_first_line(raised)}"
        return diagnosis
    if raised is not None:  # raised outside any kernel: the op's own checks
        stats["raised"] = f"{type(raised).__name__}: {_first_line(raised)}"
    ref = _reference_run(spec, inputs, do, dht, kwargs) if "non-finite inputs" not in stats else {}
    if ref:
        stats["state max (float64)"] = ref["state max"]
    diagnosis.where = _where(o, leaves, diagnosis.phase) or diagnosis.where
    diagnosis.cause, diagnosis.note = _classify(spec, stats, ref, diagnosis, kwargs)
    return diagnosis


def _nonfinite_cotangent(spec, do, dht, stats) -> Diagnosis | None:
    """A cotangent (of the output or a final state) that arrived non-finite: the op is a victim, not the source."""
    named = {"do": do} | {f"dht[{i}]": d for i, d in enumerate(as_states(dht))}
    bad = {n: d for n, d in named.items() if d is not None and not torch.isfinite(d).all()}
    if not bad:
        return None
    name, d = next(iter(bad.items()))
    census = check.nonfinite_census(d, dims=_dims(d))
    return Diagnosis(spec.label, "backward", "nonfinite_cotangent", where={"grad of": name, **census.first},
                     stats=stats, note=f"`{name}` arrived with {census.count} non-finite value(s) of {d.numel()}")


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [""])[-1][:160]


def _where(o, leaves, phase) -> dict | None:
    """The (b, t, h, d) of the first non-finite value of the output (forward) or of the first gradient (backward)."""
    if phase == "forward" and o is not None and not torch.isfinite(o).all():
        return check.nonfinite_census(o).first
    for name, t in _tensors(leaves):
        if t.grad is not None and t.dim() == 4 and not torch.isfinite(t.grad).all():
            return {"grad": name, **check.nonfinite_census(t.grad).first}
    return None


def _classify(spec, stats, ref, diagnosis, kwargs) -> tuple[str, str]:
    if "non-finite inputs" in stats:
        return "nonfinite_input", f"non-finite: {', '.join(stats['non-finite inputs'])}"
    if stats["log-decay max"] > 0:
        return "positive_decay", f"max log-decay {stats['log-decay max']:.3g} > 0" + _chunk_early(ref, diagnosis)
    if stats.get("transition radius", 0.0) > 1.02:
        return "growing_transition", (f"eigenvalue modulus {stats['transition radius']:.3g}"
                                      + _chunk_early(ref, diagnosis))
    if diagnosis.kernel is None:
        if stats["decay dtype"] in ("bfloat16", "float16"):
            return "rounded_decay", f"{spec.decay_name} is {stats['decay dtype']}"
        return "none", ""
    if diagnosis.phase == "backward" and spec.chunk_sizes:
        chunk = kwargs.get("chunk_size") or _default_chunk(spec)
        if stats["T"] % chunk:
            return "padded_rows", f"T = {stats['T']} is not a multiple of chunk_size = {chunk}"
    scores = diagnosis.scores
    mechanism = ("unlocated" if scores is None else "diagonal" if not scores.off_diagonal else
                 "off-diagonal" if not scores.diagonal else None)
    diagnosis.advice = OVERFLOW_ADVICE[mechanism] if mechanism else (
        OVERFLOW_ADVICE["diagonal"] + "; and " + OVERFLOW_ADVICE["off-diagonal"])
    return "exp_overflow", (f"the float64 result is finite (state max {ref.get('state max', math.nan):.3g}); "
                            f"log-decay down to {stats['log-decay min']:.3g} per step")


def _chunk_early(ref: dict, diagnosis: Diagnosis) -> str:
    """A chunked kernel's first NaN can come before the exact output overflows: an inf later in the chunk meets
    the zeros of a masked score matrix (0 * inf) and poisons every row of the chunk."""
    exact_t, got_t = ref.get("o first > fp32 max"), (diagnosis.where or {}).get("t")
    if exact_t is None or got_t is None or got_t >= exact_t:
        return ""
    return (f"; chunk-early NaN: the exact output first leaves fp32 at t={exact_t}, the kernel's first NaN is at "
            f"t={got_t} (an overflow later in the chunk reaches earlier rows as 0 * inf)")


def _default_chunk(spec) -> int:
    return inspect.signature(spec.fn).parameters["chunk_size"].default or 64


@contextlib.contextmanager
def _quiet():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield

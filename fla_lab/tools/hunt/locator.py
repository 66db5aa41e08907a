"""The locator: `locate(model)` wraps every op and module while its block runs, records each op call, stops at the
first non-finite output or gradient, and on leaving diagnoses that call (`Locator`, `LocatorError`).
"""
from __future__ import annotations

import inspect
import sys

import torch

from fla_lab.spec import registry
from fla_lab.tools.hunt.causes import Diagnosis
from fla_lab.tools.hunt.diagnose import _tensors, as_states, input_stats, replay
from fla_lab.tools.hunt.report import Call, Event, Report, spec_of


GARBAGE = 1e30  # no trained parameter comes near this; uninitialised memory often does


class LocatorError(RuntimeError):
    """The locator itself failed (not the model, not an op)."""


class Locator:
    def __init__(self, model: torch.nn.Module | None = None, replay: bool = True, fla: bool | None = None):
        """`fla`: also record flash-linear-attention's op calls (None: when `fla` is already imported)."""
        self.model, self.do_replay = model, replay
        self.record_fla = ("fla" in sys.modules) if fla is None else fla
        self._inside_fla = 0  # > 0 while an FLA op runs: the ops it calls are its own, not the model's
        self.calls: list[Call] = []
        self.event: Event | None = None
        self.report: Report | None = None
        self._stack: list[str] = []
        self._pending: Call | None = None  # the call whose backward started and has not finished
        self._op_raised = False
        self.own_error: Exception | None = None  # a failure of the locator itself (its hooks)

    # forward ---------------------------------------------------------------------------------------------------
    def _wrap_op(self, name: str, real, library: str = "fla_lab"):
        signature = inspect.signature(real)
        fla = library != "fla_lab"

        def located(*args, **kwargs):
            if fla and self._inside_fla:  # 0.6.0's chunk_rwkv7 calls chunk_dplr_delta_rule: one call, the outer
                return real(*args, **kwargs)
            bound = signature.bind(*args, **kwargs).arguments
            bound = {**bound, **bound.pop("kwargs", {})}  # a wrapper's **kwargs may carry tensors too
            inputs = {n: v for n, v in bound.items() if _is_input(v)}
            options = {n: v for n, v in bound.items() if n not in inputs and n != "output_final_state"}
            if fla:
                from fla_lab.spec import upstream

                options = upstream.recorded_options(real, options)
            flag = signature.parameters.get("output_final_state")
            call = Call(len(self.calls), name, self._stack[-1] if self._stack else "-", real,
                        {n: _copy(v) for n, v in inputs.items()}, options,
                        output_final_state=bool(bound.get("output_final_state",
                                                          flag.default if flag is not None else True)),
                        library=library)
            self.calls.append(call)
            self._inside_fla += fla
            try:
                o, ht = real(*args, **kwargs)
            except Exception:
                self._record(call, "forward", "the op raised")
                self._op_raised = True
                raise
            finally:
                self._inside_fla -= fla
            if self.event is None and not _all_finite(o, ht):
                self._record(call, "forward", "non-finite output")
            self._watch_backward(call, inputs, o, ht)
            return o, ht
        return located

    def _record(self, call: Call, phase: str, what: str) -> None:
        if self.event is None:
            self.event = Event(call, phase, what)

    # backward --------------------------------------------------------------------------------------------------
    def _watch_backward(self, call: Call, inputs: dict, o, ht) -> None:
        states = as_states(ht)
        if torch.is_grad_enabled() and any(t.requires_grad for _, t in _tensors(inputs)):
            returned = {"o": o, **{f"ht[{i}]" if len(states) > 1 else "ht": s for i, s in enumerate(states)}}
            call.detached = tuple(n for n, t in returned.items() if t is not None and not t.requires_grad)
        if not torch.is_grad_enabled() or not o.requires_grad:
            return

        def got_do(grad):
            call.do, self._pending = grad.detach().clone(), call
            if self.event is None and not torch.isfinite(grad).all():
                self._record(call, "backward", "non-finite gradient reached the op's output")
        o.register_hook(self._guarded(got_do))
        call.dht = [None] * len(states)
        for i, s in enumerate(states):
            if s is not None and s.requires_grad:
                s.register_hook(self._guarded(_store_state_grad(call, i)))
        for name, t in _tensors(inputs):
            if t.requires_grad:
                t.register_hook(self._guarded(self._grad_check(call, name)))

    def _guarded(self, hook):
        """A hook of the locator's own: if it fails, that is the locator's failure, reported as such (LocatorError
        from the backward, `own_error` on the locator), never taken for the model's."""
        def guarded(grad):
            try:
                return hook(grad)
            except Exception as exc:
                self.own_error = exc
                raise LocatorError(f"fla_lab.tools.hunt's own backward hook failed ({type(exc).__name__}: {exc}); the "
                                   "model's backward was stopped by the locator, not by the model") from exc
        return guarded

    def _grad_check(self, call: Call, name: str):
        def check_grad(grad):
            if self._pending is call:
                self._pending = None
            if self.event is None and not torch.isfinite(grad).all():
                self._record(call, "backward", f"non-finite gradient of `{name}`")
        return check_grad

    # modules -----------------------------------------------------------------------------------------------------
    def _enter_module(self, name):
        def pre(module, args):
            self._stack.append(name)
        return pre

    def _leave_module(self, module, args, output):
        if self._stack:
            self._stack.pop()

    def __enter__(self) -> "Locator":
        from fla_lab import ops

        self._patches = []
        for spec in registry.ops().values():
            if spec.library == "fla_lab":
                real = getattr(ops, spec.name)
                self._patches.append((ops, spec.name, real))
                setattr(ops, spec.name, self._wrap_op(spec.name, real))
        if self.record_fla:
            self._patch_fla()
        self._hooks = []
        if self.model is not None:
            for name, module in self.model.named_modules():
                label = f"{name or 'model'} ({type(module).__name__})"
                self._hooks.append(module.register_forward_pre_hook(self._enter_module(label)))
                self._hooks.append(module.register_forward_hook(self._leave_module))
        return self

    def _patch_fla(self) -> None:
        """Wrap FLA's op entry points in every `fla.*` namespace that holds them (its layers import them by name):
        one wrapper per function, so each call is recorded once whichever namespace it came through."""
        from fla_lab.spec import upstream

        functions = upstream.entry_points()
        wrapped = {name: self._wrap_op(name, fn, "fla") for name, fn in functions.items()}
        for module, attribute, name in upstream.call_sites(functions):
            self._patches.append((module, attribute, functions[name]))
            setattr(module, attribute, wrapped[name])

    def __exit__(self, exc_type, exc, tb) -> bool:
        for module, name, real in self._patches:
            setattr(module, name, real)
        for hook in self._hooks:
            hook.remove()
        if self.own_error is not None:  # the locator's failure: no report to trust, and the exception propagates
            self.report = None
            return False
        if exc is not None and self.event is None and self._pending is not None:
            self._record(self._pending, "backward", f"the backward raised {exc_type.__name__}")
            self._op_raised = True
        self.report = self._report()
        # an op (or its backward) that raised is part of the report, even when it only reacted to an earlier NaN
        return exc is not None and self.event is not None and self._op_raised

    def _report(self) -> Report:
        if self.event is None:
            audit = self._precision_audit()
            return Report(self.calls, audit and Event(audit[0], "forward", "precision audit"),
                          audit and audit[1])
        call = self.event.call
        spec = spec_of(call)
        diagnosis = None
        if self.do_replay:
            do = call.do if self.event.phase == "backward" else None
            dht = tuple(call.dht) if isinstance(call.dht, list) and len(call.dht) > 1 else (
                call.dht[0] if isinstance(call.dht, list) else None)
            diagnosis = replay(spec, call.fn, call.inputs, call.kwargs, do=do, dht=dht)
        return Report(self.calls, self.event, diagnosis, self._bad_parameters())

    def _precision_audit(self):
        for call in self.calls:
            spec = spec_of(call)
            g = call.inputs.get(spec.decay_name)
            if g is not None and g.dtype in (torch.bfloat16, torch.float16):
                return call, Diagnosis(spec.label, "forward", "rounded_decay", stats=input_stats(spec, call.inputs),
                                       note=f"`{spec.decay_name}` arrived in {str(g.dtype)[6:]}")
        return None

    def _bad_parameters(self) -> dict[str, str]:
        if self.model is None:
            return {}
        bad = [n for n, p in self.model.named_parameters() if not (p.detach().abs() <= GARBAGE).all()]
        return {"parameters": f"{len(bad)} parameter(s) hold NaN/inf or |x| > {GARBAGE:g}: {', '.join(bad[:6])}"
                              + (" ..." if len(bad) > 6 else "")} if bad else {}


def _store_state_grad(call: Call, i: int):
    def store(grad):  # None when autograd gives this state no gradient (GSA's pair: only one of them used)
        call.dht[i] = None if grad is None else grad.detach().clone()
    return store


def _is_input(v) -> bool:
    """Floating-point tensors (or tuples of them: GSA's state pair); integer tensors (cu_seqlens) are options."""
    return _is_float(v) or (isinstance(v, (tuple, list)) and bool(v) and all(_is_float(t) for t in v))


def _is_float(v) -> bool:
    return isinstance(v, torch.Tensor) and v.is_floating_point()


def _copy(v):
    return tuple(t.detach().clone() for t in v) if isinstance(v, (tuple, list)) else v.detach().clone()


def _all_finite(o, ht) -> bool:
    states = as_states(ht)
    return bool(torch.isfinite(o).all()) and all(s is None or bool(torch.isfinite(s).all()) for s in states)


def locate(model: torch.nn.Module | None = None, replay: bool = True) -> Locator:
    """`with locate(model) as found: <forward and backward>`; then `print(found.report)`.

    An exception an fla_lab op (or its backward) raises inside the block, once something is located, is swallowed
    and reported (a kernel that fails to compile; an input check that meets an earlier op's NaN); any other
    exception propagates. A failure of the locator's own hooks raises `LocatorError` (the report is then None).
    """
    return Locator(model, replay)

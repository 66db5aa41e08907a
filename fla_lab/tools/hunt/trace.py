"""Kernel tracing: every launch of fla_lab's Triton kernels watched for the first non-finite value it writes into
one of its arguments (`trace_kernels`, `KernelTracer`), and whether autograd's backward is running (`autograd_phase`).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from fla_lab.spec import check


@dataclass
class Launch:
    kernel: str
    phase: str
    written: dict[str, check.Census] = field(default_factory=dict)  # argument -> non-finite values that appeared
    raised: str | None = None
    masks: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)  # argument -> where (bool, CPU)


class KernelTracer:
    """Watches every launch of fla_lab's Triton kernels (`fla_lab.ops.common.utils.kernel`): after each launch,
    records every tensor argument that holds a non-finite value where it held a finite one before. Positions, not
    counts: an output from `torch.empty` may hold NaN bit patterns, more of them than the kernel writes.

    A replay tool: it reads every argument twice per launch (and syncs), so use it on one call, not in training.
    """

    def __init__(self):
        self.launches: list[Launch] = []

    def first_bad(self) -> Launch | None:
        return next((launch for launch in self.launches if launch.written or launch.raised), None)

    def _wrap(self, name: str, jitted):
        run, arg_names, tracer = jitted.run, list(jitted.arg_names), self

        def traced_run(*args, **kwargs):
            tensors = {n: a for n, a in zip(arg_names, args) if isinstance(a, torch.Tensor)}
            tensors.update({n: a for n, a in kwargs.items() if isinstance(a, torch.Tensor)})
            # positions, not counts: an output from torch.empty may hold NaN bit patterns before the kernel writes it
            before = {n: ~torch.isfinite(t) for n, t in tensors.items()}
            launch = Launch(name, autograd_phase())
            tracer.launches.append(launch)
            try:
                return run(*args, **kwargs)
            except Exception as exc:
                launch.raised = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                raise
            finally:
                for n, t in tensors.items():
                    bad = ~torch.isfinite(t)
                    if (bad & ~before[n]).any():
                        launch.written[n] = check.nonfinite_census(t, dims=_dims(t))
                        launch.masks[n] = bad.cpu()
        return traced_run

    @contextlib.contextmanager
    def watching(self):
        from fla_lab.ops.common import utils

        kernels = {n.rsplit(".", 1)[1]: k for n, k in utils.registered_kernels().items() if hasattr(k, "arg_names")}
        for name, jitted in kernels.items():
            jitted.run = self._wrap(name, jitted)
        empty, empty_like = torch.empty, torch.empty_like
        # The ops allocate their outputs with torch.empty: memory just freed by the same computation (the model's
        # own forward, before the replay) comes back holding the very NaN a kernel is about to write, and the write
        # would go unseen. While watching, new tensors start at zero.
        torch.empty = lambda *args, **kwargs: empty(*args, **kwargs).zero_()
        torch.empty_like = lambda *args, **kwargs: empty_like(*args, **kwargs).zero_()
        try:
            yield self
        finally:
            torch.empty, torch.empty_like = empty, empty_like
            for jitted in kernels.values():
                del jitted.run  # back to the class's method


def autograd_phase() -> str:
    """"backward" while autograd runs a backward pass (a graph task is executing), else "forward"."""
    return "backward" if torch._C._current_graph_task_id() != -1 else "forward"


def _dims(t: torch.Tensor) -> tuple[str, ...]:
    """[B, T, H, D] for the ops' sequence tensors; anything else is located by flat index."""
    return ("b", "t", "h", "d") if t.dim() == 4 else tuple(f"i{n}" for n in range(t.dim()))


def trace_kernels() -> contextlib.AbstractContextManager[KernelTracer]:
    """`with trace_kernels() as tracer: ...` then `tracer.first_bad()`: the first launch that wrote NaN/inf."""
    return KernelTracer().watching()

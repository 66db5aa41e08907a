"""`doctor()`: is this installation able to run fla_lab's kernels, and do they agree with their reference?

Separate from `runtime` (which must not import kernels: it runs before any kernel module is decorated).
"""
from __future__ import annotations

import sys

from fla_lab import runtime


def problems() -> list[str]:
    """Everything that would stop the kernels from running, each with what to do about it."""
    found = []
    version = runtime.triton_version()
    if version is None:
        found.append("triton is not installed: run `python3 workbook.py setup` (or `pip install triton==3.7.1`).")
        return found
    low, high = runtime.SUPPORTED_TRITON
    if not low <= version <= high:
        found.append(
            f"triton {version[0]}.{version[1]} is outside the tested range "
            f"{low[0]}.{low[1]}..{high[0]}.{high[1]}: install the pinned one with `python3 workbook.py setup`."
        )
    if not runtime._cuda_available() and not runtime.interpreting():
        found.append(
            "no CUDA device and TRITON_INTERPRET=0: the kernels cannot run. Unset TRITON_INTERPRET "
            "(fla_lab then turns the interpreter on) and restart the Python kernel."
        )
    found.extend(_triton_imported_before_interpreter())
    found.extend(_kernels_decorated_in_wrong_mode())
    return found


def _triton_imported_before_interpreter() -> list[str]:
    """Triton's own library (`tl.sum`, `tl.cdiv`, ...) is decorated at `import triton`: imported before fla_lab
    switched the interpreter on, it stays compiled-only, and every kernel that calls it fails under the
    interpreter with "Cannot call @triton.jit'd outside of the scope of a kernel"."""
    if not runtime.interpreting() or "triton.language" not in sys.modules:
        return []
    from triton.language import standard
    from triton.runtime.interpreter import InterpretedFunction

    if isinstance(standard.cdiv, InterpretedFunction):
        return []
    return [
        "triton was imported before fla_lab switched the Triton interpreter on, so Triton's own library functions "
        "(tl.sum, tl.cdiv, ...) cannot run under the interpreter. Restart the Python kernel and `import fla_lab` "
        "before `import triton` (or start Python with TRITON_INTERPRET=1)."
    ]


def _kernels_decorated_in_wrong_mode() -> list[str]:
    """A kernel decorated before the interpreter switch is a JITFunction that fails at launch."""
    if not runtime.interpreting() or "fla_lab.ops.common.utils" not in sys.modules:
        return []
    from triton.runtime.interpreter import InterpretedFunction

    from fla_lab.ops.common import utils as common

    stale = [name for name, fn in common.registered_kernels().items() if not isinstance(fn, InterpretedFunction)]
    if not stale:
        return []
    return [
        f"{len(stale)} kernel(s) (e.g. {stale[0]}) were decorated before the Triton interpreter was switched on, "
        "so they will fail with '0 active drivers'. Restart the Python kernel and `import fla_lab` before "
        "anything that imports triton kernels (or start Python with TRITON_INTERPRET=1)."
    ]


def doctor(short: bool = False) -> bool:
    """Print versions, device and mode, then run one small kernel against its float64 reference."""
    info = runtime.describe()
    if short:
        print(f"fla_lab: {info['mode']} | torch {info['torch']} | triton {info['triton']}")
    else:
        width = max(map(len, info))
        for key, value in info.items():
            print(f"{key:<{width}} : {value}")
    found = problems()
    if not found:
        found = _health_check(verbose=not short)
    for message in found:
        print(f"PROBLEM: {message}")
    if not short:
        print("doctor: all good" if not found else f"doctor: {len(found)} problem(s)")
    return not found


def _health_check(verbose: bool) -> list[str]:
    """fused_recurrent_gla forward and backward on a tiny problem against the float64 recurrence (the registry's
    spec: its inputs, with an initial state and a final-state cotangent, its reference and its tolerances)."""
    import torch

    from fla_lab.spec import registry

    spec = registry.get("fused_recurrent_gla")
    try:
        result = spec.compare(spec.inputs(registry.Shape(1, 9, 2, 16, 32), decay=1.0))
    except Exception as exc:  # the point of a health check is to report, not to crash
        return [f"the health-check kernel failed: {type(exc).__name__}: {exc}"]
    worst = max(result.errors.values())
    if verbose:
        tol = spec.tolerance(torch.float32)
        print(f"health check: {spec.name} fwd+bwd, fp32, max rel. error {worst:.1e} (tolerance {tol.grad:.0e})")
    if not result.ok:
        return [f"the health-check kernel disagrees with its reference ({result.failures()}): "
                "run `python3 workbook.py test` and report the failure."]
    return []

"""Where the kernels run: a CUDA GPU (compiled Triton) or the CPU (the Triton interpreter).

`configure()` runs when `fla_lab` is imported, before any kernel module is, because Triton reads
TRITON_INTERPRET when `@triton.jit` decorates a kernel, not when it launches one.
"""
from __future__ import annotations

import importlib.util
import os
import platform
import sys
import warnings

SUPPORTED_TRITON = ((3, 6), (3, 9))  # inclusive (major, minor) range the kernels are tested on

# Filled by configure(); read them through the functions below.
_STATE = {"device": "cpu", "interpret": False, "interpret_source": "unset"}


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def configure() -> None:
    """Pick the device, turn the interpreter on without CUDA, and silence interpreter noise."""
    user_value = os.environ.get("TRITON_INTERPRET")
    has_cuda = _cuda_available()
    if user_value is not None:
        _STATE["interpret"] = user_value.strip() not in ("", "0")
        _STATE["interpret_source"] = "set by you (TRITON_INTERPRET)"
    elif not has_cuda:
        os.environ["TRITON_INTERPRET"] = "1"
        _STATE["interpret"] = True
        _STATE["interpret_source"] = "set by fla_lab (no CUDA device)"
    else:
        _STATE["interpret_source"] = "off (CUDA device found)"
    if _STATE["interpret"]:
        _switch_triton_knob_on()
    _STATE["device"] = "cuda" if has_cuda and not _STATE["interpret"] else "cpu"
    _silence_interpreter_warnings()


def _switch_triton_knob_on() -> None:
    """Also flip the knob in case triton was imported (and read the variable) before us."""
    if "triton" not in sys.modules:
        return
    try:
        import triton

        triton.knobs.runtime.interpret = True
    except (AttributeError, ImportError):  # older triton reads only the environment variable
        pass


def _silence_interpreter_warnings() -> None:
    # The interpreter runs kernels with numpy; exp overflow (a legitimate inf the kernels mask) makes numpy
    # print a RuntimeWarning with a site-packages path, which would differ between machines in notebooks.
    for module in (r"triton\.runtime\.interpreter", r"numpy(\..*)?"):
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=module)


def device() -> str:
    """'cuda' when kernels run compiled on a GPU, 'cpu' when they run under the interpreter."""
    return _STATE["device"]


def interpreting() -> bool:
    return bool(_STATE["interpret"])


def triton_version() -> tuple[int, int] | None:
    if importlib.util.find_spec("triton") is None:
        return None
    import triton

    major, minor = (int(p) for p in triton.__version__.split(".")[:2])
    return major, minor


def problems() -> list[str]:
    """Everything that would stop the kernels from running, each with what to do about it."""
    found = []
    version = triton_version()
    if version is None:
        found.append("triton is not installed: run `python3 workbook.py setup` (or `pip install triton==3.7.1`).")
        return found
    low, high = SUPPORTED_TRITON
    if not low <= version <= high:
        found.append(
            f"triton {version[0]}.{version[1]} is outside the tested range "
            f"{low[0]}.{low[1]}..{high[0]}.{high[1]}: install the pinned one with `python3 workbook.py setup`."
        )
    if not _cuda_available() and not interpreting():
        found.append(
            "no CUDA device and TRITON_INTERPRET=0: the kernels cannot run. Unset TRITON_INTERPRET "
            "(fla_lab then turns the interpreter on) and restart the Python kernel."
        )
    found.extend(_kernels_decorated_in_wrong_mode())
    return found


def _kernels_decorated_in_wrong_mode() -> list[str]:
    """A kernel decorated before the interpreter switch is a JITFunction that fails at launch."""
    if not interpreting() or "fla_lab.ops.common.utils" not in sys.modules:
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


def describe() -> dict:
    import torch

    version = triton_version()
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": "missing" if version is None else __import__("triton").__version__,
        "device": device(),
        "mode": "Triton interpreter on the CPU" if interpreting() else "compiled Triton on the GPU",
        "TRITON_INTERPRET": _STATE["interpret_source"],
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def doctor(short: bool = False) -> bool:
    """Print versions, device and mode, then run one small kernel against its float64 reference."""
    info = describe()
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
    """fused_recurrent_gla forward and backward on a tiny problem against the float64 recurrence."""
    import torch

    from fla_lab import check, reference
    from fla_lab.ops import fused_recurrent_gla

    gen = torch.Generator().manual_seed(0)
    B, T, H, K, V = 1, 9, 2, 16, 32
    q, k = (torch.randn(B, T, H, K, generator=gen) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, generator=gen))
    h0 = torch.randn(B, H, K, V, generator=gen)
    inputs = [x.to(device()).requires_grad_() for x in (q, k, v, g, h0)]
    try:
        o, ht = fused_recurrent_gla(*inputs[:4], initial_state=inputs[4], output_final_state=True)
        (o.sum() + ht.sum()).backward()
    except Exception as exc:  # the point of a health check is to report, not to crash
        return [f"the health-check kernel failed: {type(exc).__name__}: {exc}"]
    ref_inputs = [x.detach().double().cpu().requires_grad_() for x in inputs]
    o_ref, ht_ref = reference.recurrent_gla(*ref_inputs[:4], initial_state=ref_inputs[4], output_final_state=True)
    (o_ref.sum() + ht_ref.sum()).backward()
    errors = {"o": check.rel_error(o, o_ref), "ht": check.rel_error(ht, ht_ref)}
    errors.update(check.grad_errors({n: x.grad for n, x in zip("qkvg", ref_inputs)} | {"h0": ref_inputs[4].grad},
                                    {n: x.grad for n, x in zip("qkvg", inputs)} | {"h0": inputs[4].grad}))
    tol = check.tolerance(torch.float32)
    worst = max(errors.values())
    if verbose:
        print(f"health check: fused_recurrent_gla fwd+bwd, fp32, max rel. error {worst:.1e} (tolerance {tol.grad:.0e})")
    if not worst <= tol.grad:
        return [f"the health-check kernel disagrees with its reference (max rel. error {worst:.2e}): "
                "run `python3 workbook.py test` and report the failure."]
    return []

"""Where the kernels run: a CUDA GPU (compiled Triton) or the CPU (the Triton interpreter).

`configure()` runs when `fla_lab` is imported, before any kernel module is, because Triton reads
TRITON_INTERPRET when `@triton.jit` decorates a kernel, not when it launches one. The health check that runs a
kernel (`doctor()`) lives in `fla_lab.tools.health`, so this module never imports the kernels.
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
        round_bf16_casts_to_nearest()
        index_tensors_as_scalars()
    _STATE["device"] = "cuda" if has_cuda and not _STATE["interpret"] else "cpu"
    if _STATE["device"] == "cpu":
        same_digits_on_every_cpu()
    hide_interpreter_noise()


def same_digits_on_every_cpu() -> None:
    """Make torch's CPU arithmetic sum in the same order on every x86-64 machine, so the notebooks print the digits
    their prose quotes (and nbval compares) whatever the CPU and its core count:

    - one thread: torch splits a reduction (a bf16 matmul's, a norm's) among its threads, one partial sum each, so
      the last digits depend on the thread count, which torch sets to the machine's physical cores;
    - torch's own matmul kernels, not oneDNN's: torch hands bf16 matmuls to oneDNN only on AVX-512 CPUs, whose
      AMX or AVX-512 kernels block the sum differently from the AVX2 kernel other CPUs run.

    numpy's OpenBLAS (the interpreter's `tl.dot`) and torch's MKL pick their kernels when they load, from the
    environment: `workbook.py` sets those variables (`same_numbers_on_every_cpu`). Call `torch.set_num_threads`
    after importing fla_lab to trade the digits for speed."""
    import torch

    if platform.machine() in ("x86_64", "AMD64"):
        os.environ.setdefault("MKL_CBWR", "AVX2")
    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = False


COMPILE_NOTE = ("fla_lab: Triton is compiling this GPU's kernels (or loading them from its disk cache): the first "
                "call of each op waits for it, later calls do not")


_ANNOUNCED = []  # COMPILE_NOTE was printed in this process


def announce_first_launch(jitted, say=print) -> None:
    """On a GPU, print COMPILE_NOTE before the first launch of any fla_lab kernel in this process (a kernel's first
    launch compiles it or loads it from Triton's disk cache), so the wait of a notebook's first cells is explained
    where it happens. Wraps the jitted kernel's `run` until its first launch, then puts the original back. (Not a
    `triton.knobs.runtime` hook: setting one makes Triton serialise every kernel's constexprs as JSON, which fails
    for kernels that take a `@triton.jit` helper as an argument.)"""
    if _STATE["device"] != "cuda":
        return
    original = jitted.run

    def run(*args, **kwargs):
        jitted.run = original
        if not _ANNOUNCED:
            _ANNOUNCED.append(True)
            say(COMPILE_NOTE)
        return original(*args, **kwargs)

    jitted.run = run


def _switch_triton_knob_on() -> None:
    """Also flip the knob in case triton was imported (and read the variable) before us."""
    if "triton" not in sys.modules:
        return
    try:
        import triton

        triton.knobs.runtime.interpret = True
    except (AttributeError, ImportError):  # older triton reads only the environment variable
        pass


def bf16_round_to_nearest_even(x):
    """fp32 values as bf16 bit patterns (uint16), rounded to nearest even as a GPU's `cvt.rn.bf16.f32`: the
    discarded 16 bits decide, a tie goes to the even pattern, a carry may reach the exponent (up to inf); NaN stays a
    quiet NaN."""
    import numpy as np

    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    quiet_nan = (bits >> np.uint32(16)) | np.uint32(0x0040)
    return np.where(np.isnan(x), quiet_nan, rounded).astype(np.uint16)


def round_bf16_casts_to_nearest() -> bool:
    """Make the interpreter's fp32 -> bf16 casts (`x.to(tl.bfloat16)`, a bf16 store) round to nearest even, as a
    GPU does; Triton 3.6-3.7's interpreter truncates (`InterpreterBuilder.cast_impl` converts with no rounding mode:
    half of all values 1 ulp off, and a bias towards zero). FLA's test of chunk_gla at D = 512 in bf16 fails its
    tolerance with truncated casts (benchmarks/results/fla_tests.md) and passes with these; see
    tests/test_runtime.py. Returns False where the interpreter has no such method (the casts then stay as the
    interpreter makes them)."""
    try:
        from triton import language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    builder = getattr(interpreter, "InterpreterBuilder", None)
    cast = getattr(builder, "cast_impl", None)
    if cast is None or getattr(cast, "rounds_bf16_to_nearest", False):
        return cast is not None

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return interpreter.TensorHandle(bf16_round_to_nearest_even(src.data), dst_type.scalar)
        return cast(self, src, dst_type)

    cast_impl.rounds_bf16_to_nearest = True
    builder.cast_impl = cast_impl
    return True


def index_tensors_as_scalars() -> bool:
    """Make the interpreter turn a scalar tensor used as an index (a loop bound computed in the kernel, such as a
    packed sequence's chunk count) into a Python int as Triton 3.7 does, by squeezing it first. Triton 3.6 calls
    `int()` on its one-element array, which numpy 2.4 rejects (TypeError: only 0-dimensional arrays can be
    converted to Python scalars). Returns False where the interpreter has no such hook."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "indexes_squeezed", False):
        return patch is not None

    def patch_lang_tensor(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patch_lang_tensor.indexes_squeezed = True
    interpreter._patch_lang_tensor = patch_lang_tensor
    return True


# numpy 1.25-2.3 deprecate int() of a 1-element array (2.4 raises), which Triton 3.6's interpreter does for loop
# bounds (3.7 no longer does; `index_tensors_as_scalars` makes 3.6 do as 3.7): Triton's internals, not the caller's.
INTERPRETER_DEPRECATION = r"Conversion of an array with ndim > 0 to a scalar is deprecated"


def hide_interpreter_noise() -> None:
    """Filter out the warnings the Triton interpreter raises about itself, not about the kernel's inputs.

    Called once at import; call it again inside `warnings.catch_warnings()` after `simplefilter("always")` or
    `("error")`, which would otherwise record (or raise) them. The interpreter runs kernels with numpy: exp overflow
    (a legitimate inf the kernels mask) makes numpy warn with a site-packages path, which would differ between
    machines in notebooks; Triton 3.6 converts arrays to scalars the way numpy deprecated.
    """
    for module in (r"triton\.runtime\.interpreter", r"numpy(\..*)?"):
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=module)
    warnings.filterwarnings("ignore", message=INTERPRETER_DEPRECATION, category=DeprecationWarning)


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
    if device() == "cpu":
        info["cpu arithmetic"] = (f"{torch.get_num_threads()} thread(s), oneDNN "
                                  f"{'on' if torch.backends.mkldnn.enabled else 'off'}, MKL_CBWR="
                                  f"{os.environ.get('MKL_CBWR', 'unset')} (see same_digits_on_every_cpu)")
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def submodule_getattr(package: str):
    """A package's module `__getattr__` that imports its submodule on first attribute access, so that
    `import fla_lab; fla_lab.tools.audit.audit(...)` works as written in the docs without loading every module."""
    import importlib

    def __getattr__(name: str):
        if importlib.util.find_spec(f"{package}.{name}") is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return importlib.import_module(f"{package}.{name}")

    return __getattr__

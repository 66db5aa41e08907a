"""fla_lab: how linear-attention kernels fail numerically, reproduced with real Triton kernels.

The runtime switch runs first: without CUDA the Triton interpreter must be on before any kernel module is
imported (Triton reads TRITON_INTERPRET when a kernel is decorated).
"""
from fla_lab import runtime

runtime.configure()

from fla_lab.runtime import device, interpreting  # noqa: E402
from fla_lab.tools.health import doctor  # noqa: E402

__version__ = "0.1.0"
__all__ = ["device", "doctor", "interpreting", "layers", "ops", "spec", "teaching", "tools"]


def __getattr__(name):
    # The layers import triton; load them on first use so `fla_lab.doctor()` can report a missing triton.
    if name in ("ops", "layers", "spec", "tools", "teaching"):
        import importlib

        return importlib.import_module(f"fla_lab.{name}")
    raise AttributeError(f"module 'fla_lab' has no attribute {name!r}")

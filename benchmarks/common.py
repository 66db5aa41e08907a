"""What the benchmarks share: the reference shape and the inputs built for each op, `do_bench` medians, peak
memory, the card and versions a result names, writing a result (with a copy in $OUT), and flash-linear-attention's
(FLA's) ops, imported only when a benchmark asks for them.

Every benchmark runs from the repository root as `python -m benchmarks.<name>` (benchmarks/README.md lists them).
"""
from __future__ import annotations

import datetime
import importlib
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = RESULTS.parents[1]
B, T, H, K, V, M = 8, 4096, 16, 64, 64, 64  # the reference shape (GSA: M slots)
DTYPE = torch.bfloat16
WARMUP_MS, REP_MS = 50, 300  # `triton.testing.do_bench`'s warm-up and measuring time; each time is its median
UPSTREAM = {  # FLA's op -> its module
    "chunk_gla": "fla.ops.gla", "fused_recurrent_gla": "fla.ops.gla", "chunk_rwkv6": "fla.ops.rwkv6",
    "fused_recurrent_rwkv6": "fla.ops.rwkv6", "chunk_gsa": "fla.ops.gsa", "chunk_rwkv7": "fla.ops.rwkv7",
    "fused_recurrent_rwkv7": "fla.ops.rwkv7",
}


# --- inputs: fp32 on the CPU, `on_device` casts ---------------------------------------------------------------------

def gated(bonus: bool, B=B, T=T, H=H) -> list[torch.Tensor]:
    """q (r), k, v and a log-sigmoid decay; with `bonus`, RWKV-6's u."""
    x = [torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, H, V),
         F.logsigmoid(torch.randn(B, T, H, K))]
    if bonus:
        x.append(torch.randn(H, K))
    return x


def gsa(B=B, T=T, H=H) -> list[torch.Tensor]:
    """q, k, v, slot logits s and their log-sigmoid decay."""
    return [torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, H, V), torch.randn(B, T, H, M),
            F.logsigmoid(torch.randn(B, T, H, M))]


def rwkv7(B=B, T=T, H=H) -> list[torch.Tensor]:
    """r, w, k, v, a = -kk, b = kk * a' as RWKV-7's layer builds them (kk unit-normalized)."""
    kk = F.normalize(torch.randn(B, T, H, K), dim=-1)
    return [torch.randn(B, T, H, K), -0.6065 * torch.rand(B, T, H, K), torch.randn(B, T, H, K),
            torch.randn(B, T, H, V), -kk, kk * torch.rand(B, T, H, K)]


INPUTS = {  # op -> builder of its inputs at (B, T, H)
    "chunk_gla": lambda B=B, T=T, H=H: gated(False, B, T, H),
    "chunk_rwkv6": lambda B=B, T=T, H=H: gated(True, B, T, H),
    "fused_recurrent_rwkv6": lambda B=B, T=T, H=H: gated(True, B, T, H),
    "chunk_gsa": gsa,
    "chunk_rwkv7": rwkv7,
    "fused_recurrent_rwkv7": rwkv7,
}


def op_kwargs(op: str) -> dict:
    """The same keywords for both libraries (their defaults differ: FLA's RWKV-7 ops output the final state)."""
    return {"output_final_state": False, **({"scale": 1.0} if "rwkv7" in op else {})}


def on_device(inputs, device="cuda") -> list[torch.Tensor]:
    """The inputs as bf16 leaves that require gradients."""
    return [t.to(device, DTYPE).requires_grad_() for t in inputs]


def cotangent(x, device="cuda") -> torch.Tensor:
    """A random `do` shaped like the output `[B, T, H, V]` (B, T, H of the first input)."""
    return torch.randn(*x[0].shape[:3], V, device=device, dtype=DTYPE)


# --- what is measured -----------------------------------------------------------------------------------------------

def forward_backward(fn, x, do, kwargs) -> None:
    fn(*x, **kwargs)[0].backward(do)


def forward_ms(fn, x, kwargs) -> float:
    with torch.no_grad():
        return triton.testing.do_bench(lambda: fn(*x, **kwargs), warmup=WARMUP_MS, rep=REP_MS, return_mode="median")


def forward_backward_ms(fn, x, do, kwargs) -> float:
    """Median of forward+backward; `grad_to_none` gives every call fresh gradients."""
    return triton.testing.do_bench(lambda: forward_backward(fn, x, do, kwargs), warmup=WARMUP_MS, rep=REP_MS,
                                   grad_to_none=x, return_mode="median")


def peak_MiB(fn, x, do, kwargs) -> float:
    """Peak memory of one forward+backward above what was allocated before it (the inputs and `do`, no
    gradients): the gradients, saved activations and workspace."""
    for t in x:
        t.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    forward_backward(fn, x, do, kwargs)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def timings(fn, inputs, kwargs) -> tuple[float, float, float]:
    """(forward ms, forward+backward ms, peak MiB) of `fn` on `inputs` moved to the GPU."""
    x = on_device(inputs)
    do = cotangent(x)
    return forward_ms(fn, x, kwargs), forward_backward_ms(fn, x, do, kwargs), peak_MiB(fn, x, do, kwargs)


def wall_ms(fn, repeat: int) -> float:
    """Median wall-clock time of `fn()` over `repeat` calls, the GPU synchronized before and after each."""
    times = []
    for _ in range(repeat):
        synchronize()
        start = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def median(values):
    """The median of the values that are not None; None when none is."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


# --- what a result names --------------------------------------------------------------------------------------------

def card() -> str:
    """The CUDA device's name ("NVIDIA H200"), or "cpu"."""
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def require_cuda(name: str, elsewhere: str = "") -> None:
    """Exit, saying so, where there is no CUDA device; `elsewhere`: what the benchmark can do without one."""
    if not torch.cuda.is_available():
        sys.exit(f"benchmarks.{name} times GPU kernels: no CUDA device here{elsewhere}")


def fla_version() -> str | None:
    """FLA's version, None when it is not installed."""
    try:
        import fla
    except ImportError:
        return None
    return getattr(fla, "__version__", "?")


def environment(device: str | None = None, fla: bool = False) -> dict:
    """Device, torch and triton versions (FLA's with `fla`) and today's date, as every result records them."""
    env = {"device": device or card(), "torch": torch.__version__, "triton": triton.__version__}
    if fla:
        env["fla_version"] = fla_version()
    return {**env, "date": datetime.date.today().isoformat()}


# --- where a result goes --------------------------------------------------------------------------------------------

def write_json(data, path) -> Path:
    """Write `data` to `path` (atomically: a killed run leaves the previous file), then copy it to $OUT."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(data, indent=1))
    os.replace(partial, path)
    copy_to_out(path)
    return path


def copy_to_out(path) -> None:
    """A copy of `path` in $OUT when that is set: what comes back from a GPU machine, even from a run cut off."""
    out = os.environ.get("OUT")
    if out and Path(out).resolve() != Path(path).resolve().parent:
        Path(out).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(out) / Path(path).name)


def load_json(path, empty=None):
    """The JSON at `path`; `empty` when there is no file."""
    path = Path(path)
    return json.loads(path.read_text()) if path.exists() else empty


# --- flash-linear-attention ----------------------------------------------------------------------------------------

def upstream_ops(names=tuple(UPSTREAM)) -> dict:
    """FLA's ops by name (ImportError when `fla` is missing). Its fused_recurrent_rwkv7 is inference only: its
    backward raises NotImplementedError."""
    return {name: getattr(importlib.import_module(UPSTREAM[name]), name) for name in names}


def upstream_ops_or_none(names=tuple(UPSTREAM)) -> dict:
    """`upstream_ops`, or {} (and a line saying so) where FLA is not importable."""
    try:
        return upstream_ops(names)
    except ImportError as exc:
        print(f"flash-linear-attention not importable ({exc}): fla_lab only", flush=True)
        return {}


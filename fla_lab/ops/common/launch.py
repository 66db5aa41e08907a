"""Launch settings of the chunked kernels, passed per call and validated before any kernel is compiled.

The defaults are what `benchmarks/tune_launch.py` found fastest at B=8, T=4096, H=16, K=V=64, bf16 (results:
docs/performance.md, 'ChunkLaunch defaults'). A notebook or a benchmark sweeps them by passing
`launch=ChunkLaunch(...)` to an op; nothing global changes.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

MIN_DOT = 16  # the smallest dimension a GPU `tl.dot` compiles for 16-bit operands (the interpreter takes any)
WARPS = (1, 2, 4, 8, 16)
STAGES = (1, 2, 3, 4, 5)


@dataclass(frozen=True)
class ChunkLaunch:
    """Tile widths and warps of the chunk stages.

    - `scores_BK`, `scores_warps`: the gated score kernel (forward A of GLA/RWKV6, dA of GSA's slot pass);
    - `dqk_BK`, `dqk_warps`: the key-side dq/dk kernel, whose diagonal block is a [16, 16, dqk_BK] tile;
    - `slots_BV`, `slots_warps`: the value-side kernels (GSA's slot pass), a [16, 16, slots_BV] tile;
    - `state_BV`, `state_warps`, `state_stages`: the two sequential passes over chunks (forward states, state
      adjoints), one [K, state_BV] state tile per program: a narrower tile gives more programs to the only loop
      that cannot run in parallel over chunks. None picks it per call (`common.chunk.state_width`): 64, halved
      while the programs would fill less than half the GPU's SMs (why: docs/performance.md, 'ChunkLaunch: state_BV
      per call');
    - `out_BV`, `out_warps`: the key-side output kernel, one [BT, out_BV] tile per program;
    - `dg_BK`: channels per program of the decay gradient (one program per chunk; not a dot dimension, still a
      power of two);
    - `dot_dtype`: None uses the input dtype on a GPU (tensor cores), torch.float32 forces IEEE fp32 dots.
    """
    scores_BK: int = 64  # the pair-grid score kernel: docs/performance.md, 'chunk scores: folded diagonal'
    scores_warps: int = 2
    dqk_BK: int = 64
    dqk_warps: int = 2
    slots_BV: int = 32
    slots_warps: int = 4
    state_BV: int | None = None
    state_warps: int = 8
    state_stages: int = 3
    out_BV: int = 64
    out_warps: int = 4
    dg_BK: int = 64
    dot_dtype: torch.dtype | None = None

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "state_BV" and value is None:
                continue
            if f.name.endswith(("_BK", "_BV")):
                if not isinstance(value, int) or value < MIN_DOT or value & (value - 1):
                    raise ValueError(f"ChunkLaunch.{f.name}={value!r}: tile widths must be powers of two >= {MIN_DOT} "
                                     "(a GPU tl.dot needs every dimension >= 16; the interpreter would accept "
                                     "less and hide it)")
            elif f.name.endswith("_warps") and value not in WARPS:
                raise ValueError(f"ChunkLaunch.{f.name}={value!r}: num_warps must be one of {WARPS}")
            elif f.name.endswith("_stages") and value not in STAGES:
                raise ValueError(f"ChunkLaunch.{f.name}={value!r}: num_stages must be one of {STAGES}")
        if self.dot_dtype not in (None, torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"ChunkLaunch.dot_dtype={self.dot_dtype!r}: None, float32, float16 or bfloat16")


DEFAULT_LAUNCH = ChunkLaunch()


def resolve(launch: ChunkLaunch | None) -> ChunkLaunch:
    if launch is None:
        return DEFAULT_LAUNCH
    if not isinstance(launch, ChunkLaunch):
        raise TypeError(f"launch must be a fla_lab.ops.ChunkLaunch, got {type(launch).__name__}")
    return launch


def check_chunk_size(chunk_size, op: str | None = None, allowed: tuple[int, ...] | None = None,
                     why: str = "") -> int:
    """The chunk size an op runs with, checked before any kernel is compiled.

    Without `allowed`: a chunk is split into 16-row sub-chunks, so a power of two >= 16. With `allowed` (a kernel
    built for fixed chunk sizes, e.g. RWKV-7's 16): one of those, None meaning the first. `op` names the op in the
    error message; `why` says there why the kernel takes only `allowed`.
    """
    where = f"{op}: " if op else ""
    if allowed is not None:
        if chunk_size is None:
            return allowed[0]
        if isinstance(chunk_size, int) and not isinstance(chunk_size, bool) and chunk_size in allowed:
            return chunk_size
        sizes = " or ".join(map(str, allowed))
        raise ValueError(f"{where}chunk_size={chunk_size!r}: this kernel works on chunks of {sizes} rows"
                         f"{f' ({why})' if why else ''}; pass None or {sizes}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < MIN_DOT \
            or chunk_size & (chunk_size - 1):
        raise ValueError(f"{where}chunk_size must be a power of two >= {MIN_DOT}, got {chunk_size!r}")
    return chunk_size

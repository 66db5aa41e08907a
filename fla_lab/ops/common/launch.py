"""Launch settings of every kernel family, passed per call (`launch=`) and validated before any kernel is compiled.

One frozen dataclass per family: `ChunkLaunch` (the chunked GLA, RWKV6 and GSA kernels), `RecurrentLaunch` (the
fused recurrent kernels of GLA, RWKV6 and GSA), `RWKV7RecurrentLaunch` and `RWKV7ChunkLaunch`. An op called with
`launch=None` runs with `default_launch(family, x)`, chosen once per device: the interpreter's settings off the GPU,
`TUNED[device name]` on a card measured here, else `launch_for(family, smem_bytes)`, the measured settings shrunk
to the card's shared memory. A notebook or a benchmark sweeps a setting by passing `launch=dataclasses.replace(
default_launch(...), field=value)`; nothing global changes.

The class defaults are what `benchmarks/tune_launch.py` and `benchmarks/tune_kernels.py` found fastest at B=8,
T=4096, H=16, K=V=64, bf16 (results: docs/performance.md, 'ChunkLaunch defaults' and the sections each field's
comment names).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace

import torch

from fla_lab import runtime

MIN_DOT = 16  # the smallest dimension a GPU `tl.dot` compiles for 16-bit operands (the interpreter takes any)
WARP_CHOICES = (1, 2, 4, 8, 16)
STAGE_CHOICES = (1, 2, 3, 4, 5)


def _power_of_two(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0 and not value & (value - 1)


def _check_value(where: str, kind: str, value) -> None:
    if kind == "tile" and (not _power_of_two(value) or value < MIN_DOT):
        raise ValueError(f"{where}: tile widths must be powers of two >= {MIN_DOT} (a GPU tl.dot needs every "
                         "dimension >= 16; the interpreter would accept less and hide it)")
    if kind == "warps" and value not in WARP_CHOICES:
        raise ValueError(f"{where}: num_warps must be one of {WARP_CHOICES}")
    if kind == "stages" and value not in STAGE_CHOICES:
        raise ValueError(f"{where}: num_stages must be one of {STAGE_CHOICES}")
    if kind == "rows" and not _power_of_two(value):
        raise ValueError(f"{where}: rows per program must be a power of two")


def _check_pair(where: str, pair) -> None:
    if not (isinstance(pair, tuple) and len(pair) == 2):
        raise ValueError(f"{where}: a (value columns, num_warps) pair")
    _check_value(where, "tile", pair[0])
    _check_value(where, "warps", pair[1])


def _check_fields(launch) -> None:
    """Every field by its name's suffix: `_BK`/`_BV` tiles, `_warps`, `_stages`, `_rows`, `_launch` a
    (value columns, num_warps) pair, `_launches` a tuple of them. None passes: the op picks it per call."""
    kinds = {"_BK": "tile", "_BV": "tile", "_warps": "warps", "_stages": "stages", "_rows": "rows"}
    for f in fields(launch):
        value, where = getattr(launch, f.name), f"{type(launch).__name__}.{f.name}={getattr(launch, f.name)!r}"
        if value is None:
            continue
        if f.name.endswith("_launch"):
            _check_pair(where, value)
        elif f.name.endswith("_launches"):
            if not isinstance(value, tuple):
                raise ValueError(f"{where}: a tuple of (value columns, num_warps) pairs")
            for pair in value:
                _check_pair(where, pair)
        else:
            _check_value(where, next((k for suffix, k in kinds.items() if f.name.endswith(suffix)), ""), value)


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
    - `softmax_rows`: rows per program of GSA's slot softmax;
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
    softmax_rows: int = 16
    dot_dtype: torch.dtype | None = None

    def __post_init__(self):
        _check_fields(self)
        if self.dot_dtype not in (None, torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"ChunkLaunch.dot_dtype={self.dot_dtype!r}: None, float32, float16 or bfloat16")


@dataclass(frozen=True)
class RecurrentLaunch:
    """Tile widths and warps of the fused recurrent kernels that GLA, RWKV6 and both GSA passes share
    (`fla_lab.ops.common.fused_recurrent`).

    - `fwd_BK`, `fwd_BV`, `fwd_warps`: the forward; a larger K splits into key blocks whose outputs add up (FLA
      0.6.0 splits at 64: `_fused_recurrent_tiling`, `o.sum(0)`, fla/ops/common/fused_recurrent.py); the narrowest
      value tile gives the most programs (docs/performance.md, 'fused_recurrent_rwkv6: FWD_BV');
    - `fwd_wide_launch`: None, or the forward's (value columns, num_warps) once the programs counted in tiles that
      wide reach `WIDE_LOAD` per SM: with that many, a wider tile with fewer warps each runs faster
      (docs/performance.md, 'fused recurrent forwards per card');
    - `dq_BK`, `dq_BV`, `dq_warps`: the dq kernel, upstream's non-square (16, 64) tile, where #18 showed
      (`fused_recurrent_rwkv6(dq_tiles=...)` overrides the tile);
    - `dkv_BK`, `dkv_BV`, `dkv_warps`: the dkv kernel's state tile; one value block (V <= dkv_BV) keeps dg and the
      RWKV6 bonus inside the kernel; 16 keys give four times the programs of 64 (docs/performance.md,
      'fused_recurrent_rwkv6: DKV_BK'); the warps: docs/performance.md, 'fused_recurrent_rwkv6: warps';
    - `softmax_rows`: rows per program of GSA's slot softmax.
    """
    fwd_BK: int = 256
    fwd_BV: int = 16
    fwd_warps: int = 4
    fwd_wide_launch: tuple[int, int] | None = None
    dq_BK: int = 16
    dq_BV: int = 64
    dq_warps: int = 2
    dkv_BK: int = 16
    dkv_BV: int = 64
    dkv_warps: int = 1
    softmax_rows: int = 16

    def __post_init__(self):
        _check_fields(self)


@dataclass(frozen=True)
class RWKV7RecurrentLaunch:
    """(value columns, num_warps) of the fused recurrent RWKV-7 kernels (`fla_lab.ops.rwkv7.fused_recurrent`).

    - `fwd_launch`, `bwd_launch`: a fixed pair, or None: the per-call rule (`forward_launch`, `backward_launch`);
    - the forward's rule (docs/performance.md, 'fused_recurrent_rwkv7: forward_launch'): `few_programs_launch`
      while 16-column tiles give at most two programs per SM; else, counted in `max_BV`-column tiles,
      `fwd_by_load_launches[i]` from `FWD_LOADS[i]` programs per SM;
    - the backward's rule: `gpu_bwd_launch` (docs/performance.md, 'fused_recurrent_rwkv7: backward_launch');
    - `max_BV`: value columns per program at most;
    - `keys_last_launches`: forward launches that hold the state tile keys-last, `[BV, BK]` (docs/performance.md,
      'fused_recurrent_rwkv7: keys-last state').
    Off the GPU both rules give `(min(next_pow2(V), max_BV), 4)`.
    """
    fwd_launch: tuple[int, int] | None = None
    bwd_launch: tuple[int, int] | None = None
    few_programs_launch: tuple[int, int] = (16, 8)
    fwd_by_load_launches: tuple[tuple[int, int], ...] = ((64, 1), (32, 1), (32, 4))
    gpu_bwd_launch: tuple[int, int] = (32, 4)
    max_BV: int = 64
    keys_last_launches: tuple[tuple[int, int], ...] = ((32, 1),)

    def __post_init__(self):
        _check_fields(self)
        if len(self.fwd_by_load_launches) != len(FWD_LOADS):
            raise ValueError(f"RWKV7RecurrentLaunch.fwd_by_load_launches: one pair per load of FWD_LOADS {FWD_LOADS}")


FWD_LOADS = (4, 2, 0)  # programs per SM from which each of `fwd_by_load_launches` runs
WIDE_LOAD = 4  # programs per SM from which RecurrentLaunch.fwd_wide_launch runs


@dataclass(frozen=True)
class RWKV7ChunkLaunch:
    """Tiles and warps of the chunked RWKV-7 kernels (`fla_lab.ops.rwkv7.chunk`).

    - `*_warps`: num_warps per kernel, as `benchmarks/tune_kernels.py chunk_rwkv7` picked them;
    - `max_BV`: value columns per program of the per-chunk kernels;
    - `bwd_BV`, `bwd_BK`: value columns per step and key channels per program of dplr_bwd_kernel; 16 columns
      rather than 32 halve its shared memory (docs/performance.md, 'chunk_rwkv7: BWD_BV');
    - `dv_BV`: value columns per step of dplr_bwd_dv_kernel (docs/performance.md, 'chunk_rwkv7: DV_BV');
    - `dw_BK`: key channels per program of dplr_dw_kernel;
    - `state_BV`: value columns per program of both sequential passes, or None: per call, 64 halved while the
      pass's programs would fill less than the GPU's SMs, the forward's at most `fwd_state_BV`
      (docs/performance.md, 'chunk_rwkv7: FWD_STATE_BV'); off the GPU None means `fwd_state_BV`.
    """
    scores_warps: int = 4
    intra_warps: int = 1
    fwd_h_warps: int = 4
    fwd_o_warps: int = 1
    bwd_dh_warps: int = 4
    bwd_dv_warps: int = 2
    bwd_warps: int = 2
    max_BV: int = 64
    bwd_BV: int = 16
    bwd_BK: int = 32
    dv_BV: int = 32
    dw_BK: int = 32
    state_BV: int | None = None
    fwd_state_BV: int = 32

    def __post_init__(self):
        _check_fields(self)


FAMILIES = {"chunk": ChunkLaunch, "recurrent": RecurrentLaunch, "rwkv7_recurrent": RWKV7RecurrentLaunch,
            "rwkv7_chunk": RWKV7ChunkLaunch}

# The settings off the GPU (the Triton interpreter), where SMs mean nothing: per family, the fields that differ
# from the class defaults.
INTERPRETER = {"rwkv7_chunk": {"state_BV": 32}}  # B=8, T=4096's width

# Per GPU (by `torch.cuda.get_device_name`), per family: the fields that differ from the class defaults (the
# interpreter's, and measured on the first card for every other field). A card missing here runs
# `launch_for(family, its shared memory)`, from MEASURED_ON's entry.
TUNED = {
    "NVIDIA H200": {  # docs/performance.md, 'fused recurrent forwards per card'
        "recurrent": {"fwd_BK": 32, "fwd_warps": 8, "fwd_wide_launch": (64, 2)},
    },
    "NVIDIA H100 80GB HBM3": {
        "recurrent": {"fwd_BK": 32, "fwd_warps": 8, "fwd_wide_launch": (64, 2)},
        "rwkv7_recurrent": {"fwd_by_load_launches": ((64, 1), (32, 1), (16, 4))},
    },
}
MEASURED_ON = "NVIDIA H200"  # the card whose settings `launch_for` starts from

BYTES_16BIT, BYTES_FP32 = 2, 4
ROWS_PER_CHUNK = 64  # the chunk kernels' default chunk size, for the estimate
MAX_HEAD_DIM = 128  # the widest K the estimates assume


def chunk_state_smem(launch: ChunkLaunch, K: int = MAX_HEAD_DIM) -> int:
    """An estimate of the shared memory of ChunkLaunch's state passes, the largest of its kernels: each pipeline
    stage holds a chunk's 16-bit [BT, K] keys and [BT, BV] values, and the fp32 [K, BV] state tile goes through
    shared memory into the dot's layout. tests/test_launch.py checks the compiled kernels on a GPU."""
    BV = launch.state_BV or 64
    staged = launch.state_stages * ROWS_PER_CHUNK * (K + BV) * BYTES_16BIT
    return staged + K * BV * BYTES_FP32


def _fit_chunk(launch: ChunkLaunch, smem_bytes: int) -> ChunkLaunch:
    """Fewer pipeline stages, then narrower state tiles, until the estimate fits."""
    while chunk_state_smem(launch) > smem_bytes and launch.state_stages > 1:
        launch = replace(launch, state_stages=launch.state_stages - 1)
    while chunk_state_smem(launch) > smem_bytes and (launch.state_BV or 64) > MIN_DOT:
        launch = replace(launch, state_BV=(launch.state_BV or 64) // 2)
    return launch


SHRINK = {"chunk": _fit_chunk}  # the other families' kernels hold their state in registers, not in dots


def measured(family: str, device_name: str = MEASURED_ON):
    """The launch TUNED holds for a card, the class defaults where it names no field."""
    cls = _family(family)
    return cls(**TUNED.get(device_name, {}).get(family, {}))


def launch_for(family: str, smem_bytes: int, device_name: str = MEASURED_ON):
    """A card's launch from its shared memory per block (opt-in): `device_name`'s settings (the measured card by
    default), shrunk where their estimated shared memory would not fit."""
    launch = measured(family, device_name)
    shrink = SHRINK.get(family)
    return launch if shrink is None else shrink(launch, smem_bytes)


def _family(family: str):
    if family not in FAMILIES:
        raise ValueError(f"unknown launch family {family!r}: one of {sorted(FAMILIES)}")
    return FAMILIES[family]


def default_launch(family: str, x: torch.Tensor | torch.device | None = None):
    """The launch an op runs with when it is given none, for x's device (a tensor or a device)."""
    device = x.device if isinstance(x, torch.Tensor) else torch.device(x if x is not None else "cpu")
    if device.type != "cuda" or runtime.interpreting():
        return _interpreter_launch(family)
    return _gpu_launch(family, torch.device("cuda", device.index if device.index is not None
                                            else torch.cuda.current_device()).index)


@functools.cache
def _interpreter_launch(family: str):
    return _family(family)(**INTERPRETER.get(family, {}))


@functools.cache
def _gpu_launch(family: str, index: int):
    name = torch.cuda.get_device_name(index)
    if name in TUNED:
        return measured(family, name)
    properties = torch.cuda.get_device_properties(index)
    return launch_for(family, getattr(properties, "shared_memory_per_block_optin", properties.shared_memory_per_block))


def resolve(launch, family: str, x: torch.Tensor | None = None):
    """The launch an op runs with: `launch`, checked to be the family's class, or (None) the device's default."""
    if launch is None:
        return default_launch(family, x)
    cls = _family(family)
    if not isinstance(launch, cls):
        raise TypeError(f"launch must be a fla_lab.ops.{cls.__name__}, got {type(launch).__name__}")
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

"""Launch settings of every kernel family, passed per call (`launch=`) and validated before any kernel is compiled.

One frozen dataclass per family: `ChunkLaunch` (the chunked GLA, RWKV6 and GSA kernels), `RecurrentLaunch` (the
fused recurrent kernels of GLA, RWKV6 and GSA), `RWKV7RecurrentLaunch` and `RWKV7ChunkLaunch`. Each holds its
fields and the rules that turn them into a call's tiles and warps from the problem's shape and the GPU's SMs (its
methods: `ChunkLaunch.state_width`, `RecurrentLaunch.forward_tiles`, ...). The chunk families also carry a
`Precision`: how their kernels multiply, resolved per call into the kernels' constexprs.

An op called with `launch=None` runs with `default_launch(family, x)`, chosen once per device: the interpreter's
settings off the GPU, the `TUNED` entry of the card's model (`tuned_model`: "NVIDIA H100 PCIe" runs "H100") on a
card measured here, else `launch_for(family, smem_bytes)`, the measured settings shrunk to the card's shared
memory. A notebook or a benchmark sweeps a setting by passing `launch=dataclasses.replace(default_launch(...),
field=value)`; nothing global changes.

The class defaults are what `python -m benchmarks.tune` (its sweep and `--greedy`) found fastest at B=8,
T=4096, H=16, K=V=64, bf16 (results: docs/performance.md, 'ChunkLaunch defaults' and the sections each field's
comment names).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, fields, replace

import torch
import triton.language as tl

from fla_lab import runtime
from fla_lab.ops.common.utils import grid_size, next_pow2

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


def _check_tiles(where: str, tiles) -> None:
    if not (isinstance(tiles, tuple) and len(tiles) == 3):
        raise ValueError(f"{where}: a (key columns, value columns, num_warps) triple")
    _check_value(where, "tile", tiles[0])
    _check_value(where, "tile", tiles[1])
    _check_value(where, "warps", tiles[2])


def _check_pair(where: str, pair) -> None:
    if not (isinstance(pair, tuple) and len(pair) == 2):
        raise ValueError(f"{where}: a (value columns, num_warps) pair")
    _check_value(where, "tile", pair[0])
    _check_value(where, "warps", pair[1])


def _check_by_load(where: str, table) -> None:
    """(programs per SM, pair) entries, the loads strictly falling to 0: every call finds its entry."""
    entries = table if isinstance(table, tuple) else ()
    loads = [e[0] if isinstance(e, tuple) and len(e) == 2 and isinstance(e[0], int) else -1 for e in entries]
    if not loads or loads != sorted(set(loads), reverse=True) or loads[-1] != 0:
        raise ValueError(f"{where}: (programs per SM, (value columns, num_warps)) entries, loads falling to 0")
    for _, pair in entries:
        _check_pair(where, pair)


def _check_fields(launch) -> None:
    """Every field by its name's suffix: `_BK`/`_BV` tiles, `_warps`, `_stages`, `_rows`, `_launch` a
    (value columns, num_warps) pair, `_launches` a tuple of them, `_tiles` a tuple of (key columns, value columns,
    num_warps) triples, `_by_load` (programs per SM, pair) entries from the highest load to 0. None passes: the op
    picks it per call."""
    kinds = {"_BK": "tile", "_BV": "tile", "_warps": "warps", "_stages": "stages", "_rows": "rows"}
    for f in fields(launch):
        value, where = getattr(launch, f.name), f"{type(launch).__name__}.{f.name}={getattr(launch, f.name)!r}"
        if value is None:
            continue
        if f.name.endswith("_launch"):
            _check_pair(where, value)
        elif f.name.endswith("_by_load"):
            _check_by_load(where, value)
        elif f.name.endswith("_tiles"):
            if not isinstance(value, tuple):
                raise ValueError(f"{where}: a tuple of (key columns, value columns, num_warps) triples")
            for tiles in value:
                _check_tiles(where, tiles)
        elif f.name.endswith("_launches"):
            if not isinstance(value, tuple):
                raise ValueError(f"{where}: a tuple of (value columns, num_warps) pairs")
            for pair in value:
                _check_pair(where, pair)
        else:
            _check_value(where, next((k for suffix, k in kinds.items() if f.name.endswith(suffix)), ""), value)


TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
SOLVE_PRECISIONS = ("ieee", "tf32", "tf32x3")  # `tl.dot`'s input precisions for fp32 operands


@dataclass(frozen=True)
class Precision:
    """How the chunk kernels multiply, carried by their launch objects and resolved per call (the interpreter or a
    GPU is known only then) into constexprs of the kernels.

    - `dot_dtype`: the `tl.dot` operand dtype, the kernels' DOT (`utils.mma`): None takes the input dtype on a GPU
      (16-bit inputs on the tensor cores), torch.float32 forces fp32 dots. Under the interpreter always fp32: it
      runs 16-bit arithmetic and 16-bit `tl.dot` on raw bit patterns, silently wrong. fp32 operands always multiply
      in IEEE fp32, never TF32 (`mma`): a workbook about numerical error should not hide TF32's 1e-3 in "fp32";
    - `split_states`: a 16-bit dot with an fp32 state (h, dh) takes the state as two 16-bit halves, hi + lo, the
      kernels' SPLIT_STATES (`utils.mma_split`); False rounds it once (benchmarks/long_accuracy.py measures both);
    - `solve`: the input precision of RWKV-7's fp32 chunk products (the solve with (I - A_ab)^-1, W, U0), its
      SOLVE_PRECISION (`fla_lab/ops/rwkv7/chunk.py`, `fdot`): None is "tf32x3" on a GPU, three TF32 products on the
      tensor cores with about fp32's accuracy, and "ieee" under the interpreter, which has no TF32.
    """
    dot_dtype: torch.dtype | None = None
    split_states: bool = True
    solve: str | None = None

    def __post_init__(self):
        if self.dot_dtype is not None and self.dot_dtype not in TL_DTYPES:
            raise ValueError(f"Precision.dot_dtype={self.dot_dtype!r}: None, float32, float16 or bfloat16")
        if not isinstance(self.split_states, bool):
            raise ValueError(f"Precision.split_states={self.split_states!r}: True or False")
        if self.solve is not None and self.solve not in SOLVE_PRECISIONS:
            raise ValueError(f"Precision.solve={self.solve!r}: None or one of {SOLVE_PRECISIONS}")

    def dot(self, x: torch.Tensor):
        """DOT for a call on `x`: fp32 under the interpreter, else `dot_dtype` or x's dtype, as a Triton dtype."""
        if runtime.interpreting():
            return tl.float32
        return TL_DTYPES[self.dot_dtype or x.dtype]

    def solve_precision(self) -> str:
        """SOLVE_PRECISION for a call: `solve`, or (None) "tf32x3" on a GPU and "ieee" under the interpreter."""
        if self.solve is not None:
            return self.solve
        return "ieee" if runtime.interpreting() else "tf32x3"


def _check_precision(launch) -> None:
    if not isinstance(launch.precision, Precision):
        raise ValueError(f"{type(launch).__name__}.precision={launch.precision!r}: a fla_lab.ops.Precision")


# The shape side of the launch objects' per-call rules


def tile_width(D: int) -> int:
    """A chunk kernel's tile over a dimension of D channels: D's power of two, between 16 and 64."""
    return max(MIN_DOT, min(next_pow2(D), 64))


def gpu_sms(x: torch.Tensor) -> int | None:
    """The SM count of x's GPU, which per-call launch rules fill; None off the GPU and under the interpreter."""
    if x.device.type != "cuda" or runtime.interpreting():
        return None
    return torch.cuda.get_device_properties(x.device).multi_processor_count


def resident_warps(x: torch.Tensor) -> int | None:
    """Warps x's GPU keeps resident at once over all its SMs (one wave); None off the GPU and under the interpreter."""
    sms = gpu_sms(x)
    if sms is None:
        return None
    return sms * torch.cuda.get_device_properties(x.device).max_threads_per_multi_processor // 32


def parallel_sequences(B: int, T: int, seqs) -> float:
    """How many sequences' worth of rows the sequential passes walk side by side: B, or for a packed batch
    (`conventions.Packed`) T over its longest sequence."""
    return B if seqs is None else T / max(eos - bos for bos, eos in seqs.bounds)


def filling_width(width: int, V: int, rows: float, sms: int, fill: float = 0.5) -> int:
    """`width` halved (down to 16) while `rows` programs per value tile, `V / width` tiles each, fill less than
    `fill` of `sms`."""
    while width > MIN_DOT and rows * grid_size(V, width) < int(sms * fill):
        width //= 2
    return width


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
    - `precision`: how the kernels multiply (`Precision`).
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
    precision: Precision = Precision()

    def __post_init__(self):
        _check_fields(self)
        _check_precision(self)

    def state_width(self, x: torch.Tensor, V: int, H: int, seqs) -> int:
        """The state passes' value tile: `state_BV`, or (None) 64 halved down to 16 while the passes' programs, one
        per sequence, head and tile, would fill less than half the GPU's SMs. The passes run each sequence's chunks
        one after another, so a packed batch counts as T / (its longest sequence) sequences: the longest one is the
        critical path."""
        width = tile_width(V)
        if self.state_BV is not None:
            return min(width, self.state_BV)
        sms = gpu_sms(x)
        return width if sms is None else filling_width(width, V, parallel_sequences(*x.shape[:2], seqs) * H, sms)


@dataclass(frozen=True)
class RecurrentLaunch:
    """Tile widths and warps of the fused recurrent kernels that GLA, RWKV6 and both GSA passes share
    (`fla_lab.ops.common.fused_recurrent`).

    - `fwd_BK`, `fwd_BV`, `fwd_warps`: the forward; a larger K splits into key blocks whose outputs add up (FLA
      0.6.0 splits at 64: `_fused_recurrent_tiling`, `o.sum(0)`, fla/ops/common/fused_recurrent.py); the narrowest
      value tile gives the most programs (docs/performance.md, 'fused_recurrent_rwkv6: FWD_BV');
    - `fwd_fallback_tiles`: (key columns, value columns, num_warps) triples the forward falls back to, in turn, on
      a GPU where the launch before would not run in one wave (its programs' warps more than the GPU keeps
      resident): a sequential loop's time is its waves times T; the last one runs regardless
      (docs/performance.md, 'fused recurrent forward: one wave');
    - `dq_BK`, `dq_BV`, `dq_warps`: the dq kernel, upstream's non-square (16, 64) tile, where #18 showed (notebook
      04 sweeps it with `dataclasses.replace(default_launch("recurrent", x), dq_BK=..., dq_BV=...)`);
    - `dkv_BK`, `dkv_BV`, `dkv_warps`: the dkv kernel's state tile; one value block (V <= dkv_BV) keeps dg and the
      RWKV6 bonus inside the kernel; 16 keys give four times the programs of 64 (docs/performance.md,
      'fused_recurrent_rwkv6: DKV_BK'); the warps: docs/performance.md, 'fused_recurrent_rwkv6: warps';
    - `softmax_rows`: rows per program of GSA's slot softmax.
    """
    fwd_BK: int = 256
    fwd_BV: int = 16
    fwd_warps: int = 4
    fwd_fallback_tiles: tuple[tuple[int, int, int], ...] = ()
    dq_BK: int = 16
    dq_BV: int = 64
    dq_warps: int = 2
    dkv_BK: int = 16
    dkv_BV: int = 64
    dkv_warps: int = 1
    softmax_rows: int = 16

    def __post_init__(self):
        _check_fields(self)

    def forward_tiles(self, q: torch.Tensor, V: int, seqs) -> tuple[int, int, int]:
        """The forward's (BK, BV, num_warps): the fields', or on a GPU the first of `fwd_fallback_tiles` that runs
        in one wave when the launch before it does not (the last regardless)."""
        B, T, H, K = q.shape
        wave = resident_warps(q)
        tiles = [(self.fwd_BK, self.fwd_BV, self.fwd_warps), *(self.fwd_fallback_tiles if wave else ())]
        for max_BK, max_BV, warps in tiles:
            BK, BV = min(next_pow2(K), max_BK), min(next_pow2(V), max_BV)
            programs = parallel_sequences(B, T, seqs) * H * grid_size(K, BK) * grid_size(V, BV)
            if wave is None or programs * warps <= wave:
                break
        return BK, BV, warps


@dataclass(frozen=True)
class RWKV7RecurrentLaunch:
    """(value columns, num_warps) of the fused recurrent RWKV-7 kernels (`fla_lab.ops.rwkv7.fused_recurrent`).

    - `fwd_launch`, `bwd_launch`: a fixed pair, or None: the per-call rule (`forward_launch`, `backward_launch`,
      below);
    - the forward's rule (docs/performance.md, 'fused_recurrent_rwkv7: forward_launch'): `few_programs_launch`
      while 16-column tiles give at most two programs per SM; else, counted in `max_BV`-column tiles, the pair of
      the first entry of `fwd_launch_by_load` whose programs per SM the call reaches;
    - the backward's rule: `gpu_bwd_launch` (docs/performance.md, 'fused_recurrent_rwkv7: backward_launch');
    - `max_BV`: value columns per program at most;
    - `keys_last_launches`: forward launches that hold the state tile keys-last, `[BV, BK]` (docs/performance.md,
      'fused_recurrent_rwkv7: keys-last state').
    Off the GPU both rules give `(min(next_pow2(V), max_BV), 4)`.
    """
    fwd_launch: tuple[int, int] | None = None
    bwd_launch: tuple[int, int] | None = None
    few_programs_launch: tuple[int, int] = (16, 8)
    fwd_launch_by_load: tuple[tuple[int, tuple[int, int]], ...] = ((4, (64, 1)), (2, (32, 1)), (0, (32, 4)))
    gpu_bwd_launch: tuple[int, int] = (32, 4)
    max_BV: int = 64
    keys_last_launches: tuple[tuple[int, int], ...] = ((32, 1),)

    def __post_init__(self):
        _check_fields(self)

    def forward_launch(self, x: torch.Tensor, V: int, H: int, seqs) -> tuple[int, int]:
        """The forward's (value columns, num_warps): `fwd_launch`, or (None) per call. One step's latency grows with
        the tile, and many programs per SM want few warps each. On a GPU: `few_programs_launch` while 16-column tiles
        give at most two programs per SM; else, counted in `max_BV`-column tiles, the first `fwd_launch_by_load`
        entry whose programs per SM the call reaches. The launches were timed with `python -m benchmarks.tune`:
        docs/performance.md, 'fused_recurrent_rwkv7: forward_launch'.
        """
        if self.fwd_launch is not None:
            return min(next_pow2(V), self.max_BV, self.fwd_launch[0]), self.fwd_launch[1]
        sms = gpu_sms(x)
        if sms is None:
            return min(next_pow2(V), self.max_BV), 4
        rows = parallel_sequences(*x.shape[:2], seqs) * H  # programs per value tile
        if rows * grid_size(V, 16) <= 2 * sms:  # few sequences: the narrowest tile, for the shortest step
            return self.few_programs_launch
        programs = rows * grid_size(V, self.max_BV)
        return next(pair for load, pair in self.fwd_launch_by_load if programs >= load * sms)

    def backward_launch(self, x: torch.Tensor, V: int) -> tuple[int, int]:
        """The backward's (value columns, num_warps): `bwd_launch`, or (None) `gpu_bwd_launch` on a GPU. Each value
        tile adds one fp32 partial of dr, dw, dk, da, db, so 16 columns, a little faster, would double that memory
        again, and 64 are slower (docs/performance.md, 'fused_recurrent_rwkv7: backward_launch')."""
        BV, warps = self.bwd_launch or (self.gpu_bwd_launch if gpu_sms(x) is not None else (self.max_BV, 4))
        return min(next_pow2(V), self.max_BV, BV), warps


@dataclass(frozen=True)
class RWKV7ChunkLaunch:
    """Tiles and warps of the chunked RWKV-7 kernels (`fla_lab.ops.rwkv7.chunk`).

    - `*_warps`: num_warps per kernel, as `python -m benchmarks.tune chunk_rwkv7` picked them;
    - `max_BV`: value columns per program of the per-chunk kernels;
    - `bwd_BV`, `bwd_BK`: value columns per step and key channels per program of dplr_bwd_kernel; 16 columns
      rather than 32 halve its shared memory (docs/performance.md, 'chunk_rwkv7: BWD_BV');
    - `dv_BV`: value columns per step of dplr_bwd_dv_kernel (docs/performance.md, 'chunk_rwkv7: DV_BV');
    - `dw_BK`: key channels per program of dplr_dw_kernel;
    - `state_BV`: value columns per program of both sequential passes, or None: per call, 64 halved while the
      pass's programs would fill less than the GPU's SMs, the forward's at most `fwd_state_BV`
      (docs/performance.md, 'chunk_rwkv7: FWD_STATE_BV'); off the GPU None means `fwd_state_BV` (`state_width`);
    - `precision`: how the kernels multiply (`Precision`).
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
    precision: Precision = Precision()

    def __post_init__(self):
        _check_fields(self)
        _check_precision(self)

    def value_block(self, V: int) -> int:
        """Value columns per program of the per-chunk kernels."""
        return max(MIN_DOT, min(next_pow2(V), self.max_BV))

    def state_width(self, x: torch.Tensor, V: int, seqs=None, backward: bool = False) -> int:
        """The state passes' value tile: `state_BV`, or (None) 64 halved while the pass's programs would fill less
        than the GPU's SMs, the forward's at most `fwd_state_BV` (off the GPU: `fwd_state_BV`)."""
        width, sms = self.value_block(V), gpu_sms(x)
        if self.state_BV is not None or sms is None:
            return min(width, self.state_BV or self.fwd_state_BV)
        filling = filling_width(width, V, parallel_sequences(*x.shape[:2], seqs) * x.shape[2], sms, fill=1.0)
        return filling if backward else min(filling, self.fwd_state_BV)


FAMILIES = {"chunk": ChunkLaunch, "recurrent": RecurrentLaunch, "rwkv7_recurrent": RWKV7RecurrentLaunch,
            "rwkv7_chunk": RWKV7ChunkLaunch}

# The settings off the GPU (the Triton interpreter), where SMs mean nothing: per family, the fields that differ
# from the class defaults.
INTERPRETER = {"rwkv7_chunk": {"state_BV": 32}}  # B=8, T=4096's width

# Per GPU model (`tuned_model` of `torch.cuda.get_device_name`: every card of a model, SXM, PCIe or NVL, runs its
# entry), per family: the fields that differ from the class defaults (the interpreter's, and measured on the first
# card for every other field). A card of another model runs `launch_for(family, its shared memory)`, from
# MEASURED_ON's entry.
TUNED = {
    "H200": {  # docs/performance.md, 'fused recurrent forwards per card', 'fused recurrent forward: one wave'
        "recurrent": {"fwd_BK": 32, "fwd_warps": 8, "fwd_fallback_tiles": ((64, 16, 4), (32, 64, 2))},
    },
    "H100": {  # the same sections, and 'fused_recurrent_rwkv7: 16 columns under one program per SM'
        "recurrent": {"fwd_BK": 32, "fwd_warps": 8, "fwd_fallback_tiles": ((64, 16, 4), (32, 64, 2))},
        "rwkv7_recurrent": {"fwd_launch_by_load": ((4, (64, 1)), (2, (32, 1)), (1, (32, 4)), (0, (16, 4)))},
    },
}
MEASURED_ON = "H200"  # the model whose settings `launch_for` starts from
MODEL = re.compile(r"\b([A-Z]+\d+)\b")  # a model in a device name: "H100" in "NVIDIA H100 PCIe"


def tuned_model(device_name: str) -> str | None:
    """The TUNED entry a card runs with: the first model word of its name that TUNED holds ("NVIDIA H100 PCIe" and
    "NVIDIA H100 80GB HBM3": "H100"; "NVIDIA H200 NVL": "H200"), None for a card of another model ("NVIDIA GH200
    480GB", "NVIDIA A100-SXM4-80GB")."""
    return next((model for model in MODEL.findall(device_name) if model in TUNED), None)

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


def measured(family: str, model: str = MEASURED_ON):
    """The launch TUNED holds for a GPU model, the class defaults where it names no field."""
    cls = _family(family)
    return cls(**TUNED.get(model, {}).get(family, {}))


def launch_for(family: str, smem_bytes: int, model: str = MEASURED_ON):
    """A card's launch from its shared memory per block (opt-in): `model`'s settings (the measured model by
    default), shrunk where their estimated shared memory would not fit."""
    launch = measured(family, model)
    shrink = SHRINK.get(family)
    return launch if shrink is None else shrink(launch, smem_bytes)


def card_launch(family: str, device_name: str, smem_bytes: int):
    """The launch of a card by its name and shared memory per block: its model's TUNED entry (`tuned_model`), else
    `launch_for(family, smem_bytes)`."""
    model = tuned_model(device_name)
    return measured(family, model) if model is not None else launch_for(family, smem_bytes)


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
    properties = torch.cuda.get_device_properties(index)
    return card_launch(family, torch.cuda.get_device_name(index),
                       getattr(properties, "shared_memory_per_block_optin", properties.shared_memory_per_block))


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

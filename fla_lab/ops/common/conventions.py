"""flash-linear-attention's calling conventions that fla_lab maps onto its kernels in PyTorch.

Packed variable-length batches, `cu_seqlens`: B = 1, sequence n is rows `cu_seqlens[n]:cu_seqlens[n + 1]` of the
time axis, with its own initial and final state (`[N, H, K, V]`). Every op takes `cu_seqlens=` and runs each kernel
once for the whole packed batch, as FLA does (`packed_batch`: the offsets checked, the `Packed` tables by which the
kernels find each sequence's rows, chunks and states), so no state or chunk ever spans two sequences. The result is
bit for bit the op called on each sequence alone (`per_sequence`, which the float64 references and the tests use;
tests/test_varlen.py), but for sums over sequences (RWKV6's bonus gradient).
`cu_seqlens_cpu`, where FLA takes it, is a host copy of the offsets: read instead of `cu_seqlens`, it saves the one
sync.

The state layout, `state_v_first=True` (chunk_gla, fused_recurrent_gla): states passed and returned `[N, H, V, K]`;
fla_lab's kernels keep them key-major, so they are transposed on the way in and out. `fused_recurrent_gla` also takes
FLA 0.6.0's deprecated name for it, `transpose_state_layout` (a DeprecationWarning, as upstream).
"""
from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Packed:
    """A packed batch as the kernels index it in one launch (FLA's `prepare_chunk_indices` and
    `prepare_chunk_offsets`), for chunks of BT rows. Kernels take its tables and `VARLEN=True`
    (`common.chunk.chunk_tables`, `sequence_tables`); inside them `fla_lab.ops.common.utils.sequence_rows`,
    `sequence_chunks` and `chunk_of_sequence` find a program's sequence.

    - `cu_seqlens [N + 1]` int32: the offsets, on the kernels' device;
    - `chunk_indices [NT, 2]` int32: (sequence, chunk within it) of every chunk of the batch, sequence by sequence;
    - `chunk_offsets [N + 1]` int32: the index of each sequence's first chunk (an empty sequence has none);
    - `N` sequences, `NT` chunks in all, `bounds` the host copy of each sequence's (bos, eos)."""
    cu_seqlens: torch.Tensor
    chunk_indices: torch.Tensor
    chunk_offsets: torch.Tensor
    N: int
    NT: int
    BT: int
    bounds: tuple


def packed(bounds, BT: int, device) -> Packed:
    """The `Packed` tables of sequences `bounds` ((bos, eos) pairs, from `check_cu_seqlens`), built on the
    host and copied over once."""
    chunks = [-(-(eos - bos) // BT) for bos, eos in bounds]
    starts = [0]
    for n in chunks:
        starts.append(starts[-1] + n)
    pairs = [(n, c) for n, count in enumerate(chunks) for c in range(count)]
    as_int32 = functools.partial(torch.tensor, dtype=torch.int32)
    return Packed(cu_seqlens=as_int32([bounds[0][0], *(eos for _, eos in bounds)]).to(device),
                  chunk_indices=as_int32(pairs or [(0, 0)]).reshape(-1, 2).to(device),
                  chunk_offsets=as_int32(starts).to(device), N=len(bounds), NT=starts[-1], BT=BT,
                  bounds=tuple(bounds))


# The tables of the last few offsets tensors (as FLA's `tensor_cache`): every layer of a model reads the same
# `cu_seqlens` in a step, and each would otherwise read it on the host (a sync) and copy the tables over again.
_RECENT: list[tuple[torch.Tensor, int, Packed]] = []
RECENT = 4


def packed_batch(op: str, cu_seqlens, cu_seqlens_cpu, x: torch.Tensor, initial_state, BT: int) -> Packed:
    """An op's `cu_seqlens` (and host copy) checked by the contract, as the tables of one launch (`Packed`).

    An offsets tensor met in one of the last calls, unchanged since (its version counter: an in-place write is read
    again), reuses that call's tables; the contract still checks B, T and the initial states against them."""
    offsets = cu_seqlens if cu_seqlens_cpu is None else cu_seqlens_cpu
    if not isinstance(offsets, torch.Tensor):
        return packed(check_cu_seqlens(op, offsets, x.shape[0], x.shape[1], initial_state), BT, x.device)
    for seen, version, table in _RECENT:
        if seen is offsets and version == offsets._version and table.BT == BT and \
                table.cu_seqlens.device == x.device:
            check_cu_seqlens(op, offsets, x.shape[0], x.shape[1], initial_state, bounds=list(table.bounds))
            return table
    table = packed(check_cu_seqlens(op, offsets, x.shape[0], x.shape[1], initial_state), BT, x.device)
    _RECENT.insert(0, (offsets, offsets._version, table))
    del _RECENT[RECENT:]
    return table


def per_sequence(op: str, fn: Callable, sequences: dict, cu_seqlens, initial_state, output_final_state: bool,
                 cu_seqlens_cpu=None, **options):
    """`fn(**each sequence's rows of sequences, initial_state=its own, output_final_state, **options)` for every
    packed sequence; returns `(o [1, T, H, V], final states [N, ...] or None)` like the op itself.

    `sequences`: the op's `[1, T, H, D]` arguments by name (None allowed); `initial_state`: a tensor or, for GSA, a
    pair of tensors, each `[N, ...]`; `cu_seqlens_cpu`: the same offsets on the host (read instead: no sync);
    `options`: every other argument, passed unchanged."""
    first = next(t for t in sequences.values() if t is not None)
    offsets = cu_seqlens if cu_seqlens_cpu is None else cu_seqlens_cpu
    bounds = check_cu_seqlens(op, offsets, first.shape[0], first.shape[1], initial_state)
    outputs, finals = [], []
    for n, (bos, eos) in enumerate(bounds):
        if eos == bos:  # an empty sequence: no rows, and its final state is its initial state (filled in below)
            finals.append(None)
            continue
        rows = {name: None if t is None else t[:, bos:eos] for name, t in sequences.items()}
        o, ht = fn(**rows, initial_state=_state_of(initial_state, n), output_final_state=output_final_state,
                   **options)
        outputs.append(o)
        finals.append(ht)
    if not output_final_state:
        return torch.cat(outputs, dim=1), None
    shape_of = next(ht for ht in finals if ht is not None)
    finals = [_passed_through(_state_of(initial_state, n), shape_of) if ht is None else ht
              for n, ht in enumerate(finals)]
    return torch.cat(outputs, dim=1), _stack_states(finals)


def packed_reference(exact: Callable) -> Callable:
    """`exact`, a float64 reference over whole batch rows, taking the ops' `cu_seqlens`: with it, each packed
    sequence on its own (`per_sequence`): the `[B, T, H, D]` tensors are the sequences, any other argument goes to
    every call unchanged. Without it, `exact` itself."""
    def reference(cu_seqlens=None, initial_state=None, output_final_state=False, **arguments):
        if cu_seqlens is None:
            return exact(initial_state=initial_state, output_final_state=output_final_state, **arguments)
        sequences = {n: t for n, t in arguments.items() if isinstance(t, torch.Tensor) and t.dim() == 4}
        options = {n: v for n, v in arguments.items() if n not in sequences}
        return per_sequence("reference", exact, sequences, cu_seqlens, initial_state, output_final_state, **options)
    return reference


def _passed_through(initial_state, like):
    """An empty sequence's final state: its initial state in fp32 (gradients flow through), or zeros shaped like
    another sequence's final state (`like`)."""
    if isinstance(like, (tuple, list)):
        states = initial_state if initial_state is not None else [None] * len(like)
        return type(like)(_passed_through(s, t) for s, t in zip(states, like))
    return torch.zeros_like(like) if initial_state is None else initial_state.float()


def _state_of(initial_state, n: int):
    if initial_state is None:
        return None
    if isinstance(initial_state, (tuple, list)):
        return type(initial_state)(s[n:n + 1] for s in initial_state)
    return initial_state[n:n + 1]


def _stack_states(finals: list):
    if isinstance(finals[0], (tuple, list)):
        return type(finals[0])(torch.cat(parts, dim=0) for parts in zip(*finals))
    return torch.cat(finals, dim=0)


def deprecated_state_layout(op: str, state_v_first: bool, kwargs: dict) -> bool:
    """`state_v_first`, or FLA 0.6.0's deprecated `transpose_state_layout` popped from `kwargs` (with its
    DeprecationWarning; both at once is a ValueError, as upstream's `fused_recurrent_gla`)."""
    if "transpose_state_layout" not in kwargs:
        return state_v_first
    if state_v_first:
        raise ValueError(f"{op}: pass `state_v_first` or the deprecated `transpose_state_layout`, not both")
    warnings.warn(f"{op}: `transpose_state_layout` is deprecated; it is named `state_v_first` (FLA 0.6.0)",
                  DeprecationWarning, stacklevel=3)
    return bool(kwargs.pop("transpose_state_layout"))


def key_major(state):
    """A `[N, H, V, K]` (V-first) state as the `[N, H, K, V]` the kernels take (None stays None)."""
    return None if state is None else state.transpose(-1, -2)


def v_first(state):
    """A returned `[N, H, K, V]` state in FLA's V-first layout `[N, H, V, K]` (None stays None)."""
    return None if state is None else state.transpose(-1, -2).contiguous()


def describe_tensor(x: torch.Tensor) -> str:
    return f"shape {tuple(x.shape)}, {x.dtype}, {x.device}"


def check_cu_seqlens(op: str, cu_seqlens, B: int, T: int, initial_state=None,
                     bounds: list | None = None) -> list[tuple[int, int]]:
    """A packed batch's offsets, as flash-linear-attention takes them: B = 1, `cu_seqlens` a 1-D integer tensor
    `[0, ..., T]`, non-decreasing (an empty sequence, as FLA allows, passes its initial state through), one initial
    state per sequence (`[N, H, K, V]`). Returns each sequence's `(bos, eos)`. Reads the offsets on the host: one
    sync on a GPU, unless `bounds` holds what an earlier read of the same tensor returned."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"{op}: `cu_seqlens` must be a 1-D integer torch.Tensor [0, ..., T], got "
                        f"{type(cu_seqlens).__name__}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 or cu_seqlens.dtype.is_floating_point \
            or cu_seqlens.dtype.is_complex or cu_seqlens.dtype == torch.bool:
        raise ValueError(f"{op}: `cu_seqlens` must be a 1-D integer tensor of N + 1 offsets [0, ..., T], got "
                         f"{describe_tensor(cu_seqlens)}")
    if B != 1:
        raise ValueError(f"{op}: with `cu_seqlens` the sequences are packed along T, so B must be 1, got B = {B}. "
                         f"Pack them: x.reshape(1, B * T, H, D) with cu_seqlens = [0, T, 2T, ...]")
    offsets = [int(x) for x in cu_seqlens.tolist()] if bounds is None else [0, *(eos for _, eos in bounds)]
    if offsets[0] != 0 or offsets[-1] != T or T == 0:
        raise ValueError(f"{op}: `cu_seqlens` must start at 0 and end at T = {T} > 0, got {offsets[0]} ... "
                         f"{offsets[-1]}")
    for n, (bos, eos) in enumerate(zip(offsets[:-1], offsets[1:])):
        if eos < bos:
            raise ValueError(f"{op}: `cu_seqlens` must not decrease: sequence {n} runs from {bos} to {eos} (offsets "
                             "out of order)")
    N = len(offsets) - 1
    for h0 in (initial_state if isinstance(initial_state, (tuple, list)) else (initial_state,)):
        if h0 is not None and (not isinstance(h0, torch.Tensor) or h0.dim() < 1 or h0.shape[0] != N):
            raise ValueError(f"{op}: with `cu_seqlens` of {N} sequences, `initial_state` holds one state per "
                             f"sequence, [N = {N}, ...]; got "
                             f"{describe_tensor(h0) if isinstance(h0, torch.Tensor) else type(h0).__name__}")
    return list(zip(offsets[:-1], offsets[1:]))

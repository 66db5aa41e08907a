"""flash-linear-attention's calling conventions that fla_lab maps onto its kernels in PyTorch.

Packed variable-length batches, `cu_seqlens`: B = 1, sequence n is rows `cu_seqlens[n]:cu_seqlens[n + 1]` of the
time axis, with its own initial and final state (`[N, H, K, V]`). Every op takes `cu_seqlens=` and hands it here:
each sequence runs as its own call of the op, the same kernels forward and backward (autograd joins the slices), so
no state or chunk ever spans two sequences. The cost is N calls instead of one: fine for a few long sequences,
launch-bound for many short ones (one launch per kernel for the whole packed batch, as FLA does it, is not built).
`cu_seqlens_cpu`, where FLA takes it, is a host copy of the offsets: read instead of `cu_seqlens`, it saves the one
sync.

The state layout, `state_v_first=True` (chunk_gla, fused_recurrent_gla): states passed and returned `[N, H, V, K]`;
fla_lab's kernels keep them key-major, so they are transposed on the way in and out.
"""
from __future__ import annotations

from typing import Callable

import torch

from fla_lab.ops.contract import check_cu_seqlens


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
        rows = {name: None if t is None else t[:, bos:eos] for name, t in sequences.items()}
        o, ht = fn(**rows, initial_state=_state_of(initial_state, n), output_final_state=output_final_state,
                   **options)
        outputs.append(o)
        finals.append(ht)
    return torch.cat(outputs, dim=1), (_stack_states(finals) if output_final_state else None)


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


def key_major(state):
    """A `[N, H, V, K]` (V-first) state as the `[N, H, K, V]` the kernels take (None stays None)."""
    return None if state is None else state.transpose(-1, -2)


def v_first(state):
    """A returned `[N, H, K, V]` state in FLA's V-first layout `[N, H, V, K]` (None stays None)."""
    return None if state is None else state.transpose(-1, -2).contiguous()

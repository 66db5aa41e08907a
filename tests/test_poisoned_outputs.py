"""Every element of every output, final state and input gradient is written by the kernels.

The kernels allocate their outputs (and scratch) with `torch.empty`, `torch.empty_like` or `Tensor.new_empty`,
whose contents are whatever memory held: often zeros on the CPU, so a store that misses an element (a mask off by
one row, a tile or batch element never launched) can go unseen. The `poisoned` fixture fills every floating-point
tensor those allocators return with NaN; a missed store then leaves a NaN in the result, and NaN also spreads
through any kernel that reads an unwritten element of an intermediate buffer.

Shapes are ragged on purpose: odd T against chunk sizes 16 and 64 (partial last chunks and sub-chunks, a single
step), K != V and neither a power of two (masked key and value lanes, two value blocks), two batch elements and two
heads at the short lengths, an initial state, the final state returned, cotangents on the output and final state.

To cover a new op, add one line to OPS: a name, the op in `fla_lab.ops`' call form, and an input maker
`(B, T, H) -> dict`.
"""
from __future__ import annotations

import functools

import pytest
import torch

from fla_lab.spec import check, harness
from fla_lab import device
from fla_lab.ops import (chunk_gla, chunk_gsa, chunk_rwkv6, chunk_rwkv7, fused_recurrent_gla, fused_recurrent_rwkv6,
                         fused_recurrent_rwkv7)

K, V = 24, 80  # K != V, neither a power of two; V = 80 is two value blocks of 64, the second mostly masked
M = 20  # GSA's slots: neither K, V nor a power of two
SHAPES = [  # (B, T, H)
    (2, 1, 2),    # a single step: one partial sub-chunk; two batch elements and heads (their offsets)
    (2, 17, 2),   # one full sub-chunk and a 1-row tail: a partial chunk for chunk size 16 and for 64
    (1, 67, 1),   # several chunks of 16 with a 3-row tail; two chunks of 64, the second 3 rows long
]


def gla_inputs(B, T, H):
    return harness.gated_inputs(B, T, H, K, V, initial_state=True, seed=T, names=("q", "k", "v", "g"))


def gla_recurrent_inputs(B, T, H):
    return harness.gated_inputs(B, T, H, K, V, initial_state=True, seed=T, names=("q", "k", "v", "gk"))


def rwkv6_inputs(B, T, H):
    return harness.gated_inputs(B, T, H, K, V, initial_state=True, bonus=True, seed=T, names=("r", "k", "v", "w"))


def rwkv7_inputs(B, T, H):
    return harness.rwkv7_inputs(B, T, H, K, V, initial_state=True, seed=T)


def gsa_inputs(B, T, H):
    return harness.gsa_inputs(B, T, H, K, V, M, initial_state=True, seed=T)


OPS = [  # (name, op in fla_lab.ops' call form, input maker (B, T, H) -> dict of float32 CPU tensors)
    ("fused_recurrent_gla", fused_recurrent_gla, gla_recurrent_inputs),
    ("fused_recurrent_rwkv6", fused_recurrent_rwkv6, rwkv6_inputs),
    ("chunk_gla-c16", functools.partial(chunk_gla, chunk_size=16), gla_inputs),
    ("chunk_gla-c64", functools.partial(chunk_gla, chunk_size=64), gla_inputs),
    ("chunk_rwkv6-c16", functools.partial(chunk_rwkv6, chunk_size=16), rwkv6_inputs),
    ("chunk_rwkv6-c64", functools.partial(chunk_rwkv6, chunk_size=64), rwkv6_inputs),
    ("fused_recurrent_rwkv7", fused_recurrent_rwkv7, rwkv7_inputs),
    ("chunk_rwkv7-c16", chunk_rwkv7, rwkv7_inputs),  # chunk size 16 is its only one
    ("chunk_gsa-c16", functools.partial(chunk_gsa, chunk_size=16), gsa_inputs),
    ("chunk_gsa-c64", functools.partial(chunk_gsa, chunk_size=64), gsa_inputs),
]


@pytest.fixture
def poisoned(monkeypatch):
    """Make `torch.empty`, `torch.empty_like` and `Tensor.new_empty` return NaN-filled floating-point tensors
    (integer and bool tensors untouched). Returns the list of tensors it poisoned (kept alive for the test, so
    storage pointers cannot be reused)."""
    tensors = []
    real_empty, real_empty_like, real_new_empty = torch.empty, torch.empty_like, torch.Tensor.new_empty

    def poison(t):
        if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()):
            with torch.no_grad():
                t.fill_(float("nan"))
            tensors.append(t)
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: poison(real_empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: poison(real_empty_like(*a, **kw)))
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda self, *a, **kw: poison(real_new_empty(self, *a, **kw)))
    return tensors


def assert_written(results: dict[str, torch.Tensor]) -> None:
    """Every element finite: a NaN left by the poisoned allocators means an element was never stored."""
    unwritten = {name: check.nonfinite_census(t.detach().cpu()) for name, t in results.items()}
    unwritten = {name: str(c) for name, c in unwritten.items() if c.count}
    assert not unwritten, f"elements never written (still NaN): {unwritten}"


def leaves(name: str, x) -> dict[str, torch.Tensor]:
    """A tensor, or a tuple of them (GSA's state pair) as `name[0]`, `name[1]`."""
    if isinstance(x, (tuple, list)):
        return {f"{name}[{i}]": t for i, t in enumerate(x)}
    return {name: x}


def same_storage(t: torch.Tensor, others: list[torch.Tensor]) -> bool:
    return any(t.untyped_storage().data_ptr() == o.untyped_storage().data_ptr() for o in others)


# ---------------------------------------------------------------------------------------- the fixture itself


def test_fixture_poisons_floating_point_allocations_only(poisoned):
    assert torch.isnan(torch.empty(3, 4)).all()
    assert torch.isnan(torch.empty((2, 5), dtype=torch.bfloat16)).all()
    assert torch.isnan(torch.empty_like(torch.zeros(6, dtype=torch.float16))).all()
    assert torch.isnan(torch.zeros(2).new_empty(7, dtype=torch.float32)).all()
    ints = torch.empty(4, dtype=torch.int64)
    assert ints.dtype == torch.int64 and not same_storage(ints, poisoned)
    assert len(poisoned) == 4


def test_a_skipped_store_is_caught(poisoned):
    """An op that writes all of its output but the last time step: the check must see the hole."""
    B, H = 2, 3
    x = torch.randn(B, 5, H, V)

    def skips_last_step(x):
        o = torch.empty_like(x)
        o[:, :-1] = 2 * x[:, :-1]
        return o

    with pytest.raises(AssertionError, match=rf"'o': '{B * H * V}/{x.numel()} non-finite.*first at t=4"):
        assert_written({"o": skips_last_step(x)})


# ---------------------------------------------------------------------------------------- every op


@pytest.mark.filterwarnings("ignore::fla_lab.ops.LayoutWarning")  # T = 1 < H = 2 looks head-first: it is not
@pytest.mark.parametrize("B,T,H", SHAPES, ids=[f"B{B}-T{T}-H{H}" for B, T, H in SHAPES])
@pytest.mark.parametrize("name,op,make", OPS, ids=[name for name, *_ in OPS])
def test_outputs_final_state_and_gradients_are_fully_written(poisoned, name, op, make, B, T, H):
    on_device = lambda t: t.to(device()).requires_grad_()  # noqa: E731
    args = {n: tuple(map(on_device, x)) if isinstance(x, tuple) else on_device(x) for n, x in make(B, T, H).items()}
    assert "initial_state" in args
    o, ht = op(**args, output_final_state=True)
    outputs = {"o": o, **leaves("final_state", ht)}
    inputs = {leaf: t for n, x in args.items() for leaf, t in leaves(n, x).items()}
    # the outputs really come from the poisoned allocators (otherwise this test would check nothing)
    not_poisoned = [n for n, t in outputs.items() if not same_storage(t, poisoned)]
    assert not not_poisoned, f"{name}: {not_poisoned} not allocated with torch.empty / empty_like / new_empty"
    gen = torch.Generator().manual_seed(T)
    cotangents = [torch.randn(t.shape, generator=gen).to(t) for t in outputs.values()]
    torch.autograd.backward(list(outputs.values()), cotangents)
    missing = [n for n, t in inputs.items() if t.grad is None]
    assert not missing, f"{name}: no gradient for {missing}"
    assert_written({**outputs, **{f"d{n}": t.grad for n, t in inputs.items()}})

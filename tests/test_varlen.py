"""Packed variable-length batches (`cu_seqlens`, flash-linear-attention's varlen convention) for every op: each
sequence against the float64 reference run on that sequence alone, forward, final states and every gradient; and
the offsets the contract refuses."""
from __future__ import annotations

import functools

import pytest
import torch

from fla_lab.spec import harness, registry
from fla_lab import runtime
from fla_lab.ops import RecurrentLaunch, contract
from fla_lab.ops.common import conventions
from fla_lab.ops.common.conventions import packed_reference, per_sequence
from fla_lab.ops.rwkv7 import chunk as rwkv7_chunk

# A sequence shorter than a chunk, one an exact multiple of the chunk (64), a single row, one with a partial last chunk.
LENGTHS = {"chunk": (5, 64, 1, 19), "fused_recurrent": (5, 16, 1, 19)}


def _lengths(name: str) -> tuple[int, ...]:
    return LENGTHS["chunk" if name.startswith("chunk") else "fused_recurrent"]


def _packed_inputs(spec, lengths, seed=0):
    """B = 1, T = sum(lengths), and one initial state per sequence (a pair for GSA)."""
    shape = dict(H=2, K=16, V=32, M=16)
    x = spec.inputs(registry.Shape(1, sum(lengths), **shape), decay=1.0, initial_state=False, seed=seed)
    h0 = spec.inputs(registry.Shape(len(lengths), 1, **shape), initial_state=True, seed=seed + 1)["initial_state"]
    return {**x, "initial_state": h0}


def _offsets(lengths) -> list[int]:
    return [0, *torch.tensor(lengths).cumsum(0).tolist()]


def _reference_per_sequence(reference, cu_seqlens):
    """The float64 reference on each sequence alone (`packed_reference`, the ops' own splitting `per_sequence`:
    its bounds and joins are pinned by the contract test and by `test_equal_lengths_give_the_batched_call`)."""
    return functools.partial(packed_reference(reference), cu_seqlens=cu_seqlens)


@pytest.mark.parametrize("name", registry.names())
def test_packed_sequences_match_the_reference_per_sequence(name):
    spec = registry.get(name)
    lengths = _lengths(name)
    offsets = _offsets(lengths)
    cu = torch.tensor(offsets, dtype=torch.int32, device=runtime.device())
    result = harness.compare(functools.partial(spec.fn, cu_seqlens=cu),
                             _reference_per_sequence(spec.reference, cu.cpu()), _packed_inputs(spec, lengths))
    assert result.ok, f"{result.failures()} | {result}"


# Ops whose packed batch runs as one launch per kernel (the rest call the op once per sequence, `per_sequence`).
ONE_LAUNCH = ["chunk_gla", "chunk_rwkv6", "chunk_gsa", "chunk_rwkv7", "fused_recurrent_gla", "fused_recurrent_rwkv6",
              "fused_recurrent_gsa", "fused_recurrent_rwkv7"]


def _one_launch_lengths(name: str) -> tuple[int, ...]:
    """Chunked ops, in their chunks C (64; chunk_rwkv7's 16): shorter than a chunk, empty, one chunk, two chunks
    and a part, one sub-chunk of 16 and a part. Recurrent ops (a program walks its sequence one step at a time): a
    few steps, empty, one step, several of RWKV-7's 16-step checkpoint segments and a part, a part."""
    if not name.startswith("chunk"):
        return (5, 0, 1, 37, 19)
    C = rwkv7_chunk.CHUNK if name == "chunk_rwkv7" else 64
    return (5, 0, C, 2 * C + 2, 19)


def _run_with_grads(fn, x, seed=0) -> harness.Run:
    """fn's output, final states and every input's gradient under the harness's random cotangents (o and ht)."""
    def draw(o, states):
        return harness.cotangents(o.shape, {n: s.shape for n, s in states.items()}, seed)
    return harness.run(fn, harness.leaves(harness.on_device(x)), draw)


def _check_one_launch(name, drop=(), u_tol=(1e-6, 1e-7), **options):
    """`name` on a packed batch (`_one_launch_lengths`) against the op on each sequence alone, bit for bit but for
    the bonus gradient `u` (to `u_tol`, (rtol, atol); see `test_one_launch_is_the_op_called_per_sequence`).
    `drop`: inputs left out."""
    spec = registry.get(name)
    lengths = _one_launch_lengths(name)
    x = {n: t for n, t in _packed_inputs(spec, lengths).items() if n not in drop}
    cu = torch.tensor(_offsets(lengths), dtype=torch.int32, device=runtime.device())

    def one_sequence_at_a_time(initial_state=None, output_final_state=False, **x):
        rows = {n: t for n, t in x.items() if torch.is_tensor(t) and t.dim() == 4}
        rest = {n: t for n, t in x.items() if n not in rows}
        return per_sequence(name, spec.fn, rows, cu.cpu(), initial_state, output_final_state, **rest, **options)

    one = _run_with_grads(functools.partial(spec.fn, cu_seqlens=cu, **options), x)
    loop = _run_with_grads(one_sequence_at_a_time, x)
    assert _same(one.o, loop.o)
    assert one.states.keys() == loop.states.keys() and all(_same(one.states[n], loop.states[n]) for n in one.states)
    assert one.grads.keys() == loop.grads.keys()
    for n, a in one.grads.items():
        if n == "u":
            torch.testing.assert_close(a, loop.grads[n], rtol=u_tol[0], atol=u_tol[1])
        else:
            assert _same(a, loop.grads[n]), n


def _same(a, b) -> bool:
    """Bit for bit under the interpreter. Compiled for a GPU the packed kernels (VARLEN=True) and the dense ones
    are different binaries, whose multiply-adds may fuse into FMAs differently: fp32 rounding, 3e-8 of the largest
    value measured on the H200 (fused_recurrent_gla's and GSA's dq, dk); a value from another sequence is O(1)."""
    if a.device.type != "cuda":
        return torch.equal(a, b)
    return torch.allclose(a, b, rtol=1e-6, atol=1e-6 * b.abs().max().item())


@pytest.mark.filterwarnings("ignore::fla_lab.ops.LayoutWarning")  # the one-step sequence alone: T = 1 < H = 2
@pytest.mark.parametrize("name", ONE_LAUNCH)
def test_one_launch_is_the_op_called_per_sequence(name):
    """The packed batch in one launch per kernel against the op on each sequence alone: the same kernels on the same
    rows, so the output, the final states and every gradient (initial states and final-state cotangents included)
    agree bit for bit, the empty sequence's too (its state passed straight through). The one sum over sequences is
    RWKV6's bonus gradient `u`, summed over the chunks (chunk_rwkv6) or the sequences' partials (fused_recurrent_rwkv6)
    in another order than autograd adds the per-sequence calls' up: equal to rounding."""
    _check_one_launch(name)


@pytest.mark.filterwarnings("ignore::fla_lab.ops.LayoutWarning")
@pytest.mark.parametrize("name", ["fused_recurrent_gla", "fused_recurrent_rwkv6", "fused_recurrent_gsa"])
def test_one_launch_decay_grad_fallback(name):
    """Several value blocks (V = 32 > dkv_BV = 16): dg's reverse cumulative sum in `decay_grad_kernel` (GSA: pass 2)
    and the bonus in torch must stop at the sequences' boundaries too. There `u`'s gradient is one torch sum over
    every row of the batch, against a sum per sequence then autograd's: 1.3e-6 relative seen, so 1e-5."""
    _check_one_launch(name, u_tol=(1e-5, 1e-6), launch=RecurrentLaunch(dkv_BV=16))


@pytest.mark.filterwarnings("ignore::fla_lab.ops.LayoutWarning")
def test_one_launch_gsa_reverse_and_vanilla_abc():
    """fused_recurrent_gsa's `reverse=True` (the flipped batch holds the sequences in reverse order, their states
    with them) and both GSA ops' `g=None` (ABC's running logsumexp restarts at each sequence)."""
    _check_one_launch("fused_recurrent_gsa", reverse=True)
    _check_one_launch("fused_recurrent_gsa", drop=("g",))
    _check_one_launch("chunk_gsa", drop=("g",))


@pytest.mark.parametrize("name", ["chunk_gla", "chunk_rwkv7"])
def test_equal_lengths_give_the_batched_call(name):
    """Packing B sequences of one length is the batched call, bit for bit (the same kernels on the same rows)."""
    spec = registry.get(name)
    x = {n: t.to(runtime.device()) for n, t in spec.inputs(registry.Shape(2, 21, 1, 16, 16)).items()}
    o, ht = spec.fn(**x, output_final_state=True)
    packed = {n: (t.reshape(1, 42, *t.shape[2:]) if n != "initial_state" else t) for n, t in x.items()}
    cu = torch.tensor([0, 21, 42], device=runtime.device())
    o_p, ht_p = spec.fn(**packed, output_final_state=True, cu_seqlens=cu)
    assert torch.equal(o_p, o.reshape(1, 42, *o.shape[2:])) and torch.equal(ht_p, ht)


@pytest.mark.parametrize("offsets, message", [
    ([1, 5, 9], "start at 0 and end at T = 9"),
    ([0, 5, 8], "start at 0 and end at T = 9"),
    ([0, 6, 4, 9], "must not decrease: sequence 1 runs from 6 to 4 .offsets out of order"),
    ([9], "N \\+ 1 offsets"),
])
def test_malformed_offsets_are_refused(offsets, message):
    x = registry.get("chunk_gla").inputs(registry.Shape(1, 9, 1, 16, 16), initial_state=False)
    with pytest.raises(ValueError, match=message):
        registry.get("chunk_gla").fn(**x, cu_seqlens=torch.tensor(offsets))


@pytest.mark.parametrize("name", ["chunk_gla", "chunk_gsa", "chunk_rwkv7"])
def test_an_empty_sequence_passes_its_initial_state_through(name):
    """FLA allows empty sequences (`[0, 0, 16]`): no rows, and the final state is the initial state, gradient
    included; the other sequences are the packed call without it, bit for bit."""
    spec = registry.get(name)
    x = _packed_inputs(spec, (7, 12))
    h0 = x.pop("initial_state")
    pair = isinstance(h0, tuple)
    x = {n: t.to(runtime.device()) for n, t in x.items()}
    h0 = tuple(t.to(runtime.device()) for t in h0) if pair else h0.to(runtime.device())
    extra = tuple(torch.randn_like(t) for t in h0) if pair else torch.randn_like(h0)  # the empty sequence's state
    runs = []
    for offsets, states in (([0, 7, 19], h0), ([0, 7, 7, 19], _insert(h0, extra))):
        states = tuple(t.clone().requires_grad_() for t in states) if pair else states.clone().requires_grad_()
        o, ht = spec.fn(**x, initial_state=states, output_final_state=True,
                        cu_seqlens=torch.tensor(offsets, device=runtime.device()))
        (o.square().sum() + sum(t.sin().sum() for t in (ht if pair else (ht,)))).backward()
        runs.append((o, ht, states))
    (o, ht, _), (o_e, ht_e, states_e) = runs
    assert torch.equal(o_e, o)
    for final, start, state in zip(*[(t if pair else (t,)) for t in (ht_e, extra, states_e)]):
        assert torch.equal(final[1], start[0].float())
        assert torch.allclose(state.grad[1], final[1].cos())  # d/dS sin(S): the cotangent, passed straight through


def _insert(h0, extra):
    if isinstance(h0, tuple):
        return tuple(_insert(a, b) for a, b in zip(h0, extra))
    return torch.cat([h0[:1], extra[:1], h0[1:]])


def test_deprecated_transpose_state_layout_is_state_v_first():
    spec = registry.get("fused_recurrent_gla")
    x = {n: t.to(runtime.device()) for n, t in spec.inputs(registry.Shape(1, 9, 1, 16, 16)).items()}
    with pytest.warns(DeprecationWarning, match="state_v_first"):
        o, ht = spec.fn(**x, output_final_state=True, transpose_state_layout=True)
    o_v, ht_v = spec.fn(**x, output_final_state=True, state_v_first=True)
    assert torch.equal(o, o_v) and torch.equal(ht, ht_v)
    with pytest.raises(ValueError, match="not both"):
        spec.fn(**x, state_v_first=True, transpose_state_layout=True)


def test_offsets_need_b_1_integer_tensor_and_one_state_per_sequence():
    spec = registry.get("chunk_rwkv6")
    x = spec.inputs(registry.Shape(2, 9, 1, 16, 16), initial_state=False)
    with pytest.raises(ValueError, match="B must be 1, got B = 2"):
        spec.fn(**x, cu_seqlens=torch.tensor([0, 4, 9]))
    x = spec.inputs(registry.Shape(1, 9, 1, 16, 16), initial_state=True)  # one state for two sequences
    with pytest.raises(ValueError, match="one state per sequence, \\[N = 2"):
        spec.fn(**x, cu_seqlens=torch.tensor([0, 4, 9]))
    with pytest.raises(TypeError, match="1-D integer torch.Tensor"):
        spec.fn(**x, cu_seqlens=[0, 9])
    with pytest.raises(ValueError, match="integer tensor"):
        spec.fn(**x, cu_seqlens=torch.tensor([0.0, 9.0]))


def test_the_contract_check_returns_the_sequences():
    assert contract.check_cu_seqlens("op", torch.tensor([0, 3, 10]), 1, 10) == [(0, 3), (3, 10)]


@pytest.mark.parametrize("name", ["chunk_gla", "fused_recurrent_gla"])
def test_v_first_states_are_the_key_major_ones_transposed(name):
    """`state_v_first=True` (FLA's `[N, H, V, K]` states, in and out, gradients included) against the default
    layout on the same inputs."""
    spec = registry.get(name)
    x = {n: t.to(runtime.device()) for n, t in spec.inputs(registry.Shape(2, 21, 1, 16, 32)).items()}
    h0 = x.pop("initial_state")
    runs = []
    for v_first, state in ((False, h0), (True, h0.transpose(-1, -2).contiguous())):
        leaves = {n: t.clone().requires_grad_() for n, t in x.items()}
        state = state.clone().requires_grad_()
        o, ht = spec.fn(**leaves, initial_state=state, output_final_state=True, state_v_first=v_first)
        (o.square().sum() + ht.sin().sum()).backward()
        runs.append((o, ht, state.grad))
    (o, ht, dh0), (o_v, ht_v, dh0_v) = runs
    assert ht_v.shape == (2, 1, 32, 16)
    assert torch.equal(o_v, o) and torch.equal(ht_v, ht.transpose(-1, -2))
    assert torch.equal(dh0_v, dh0.transpose(-1, -2))


def test_the_host_copy_of_the_offsets_is_read_instead():
    spec = registry.get("chunk_gla")
    x = spec.inputs(registry.Shape(1, 30, 1, 16, 16), initial_state=False)
    x = {n: t.to(runtime.device()) for n, t in x.items()}
    cu = torch.tensor([0, 7, 30], device=runtime.device())
    o, _ = spec.fn(**x, cu_seqlens=cu)
    o_cpu, _ = spec.fn(**x, cu_seqlens=cu, cu_seqlens_cpu=cu.cpu())
    assert torch.equal(o, o_cpu)
    with pytest.raises(ValueError, match="host copy"):
        spec.fn(**x, cu_seqlens_cpu=cu.cpu())


def test_the_tables_of_a_recent_offsets_tensor_are_reused():
    """Every layer of a model reads the same `cu_seqlens` in a step: the second call reuses the first's tables (no
    host read), a tensor written in place since is read again, and the contract still checks the call's shapes."""
    spec = registry.get("chunk_gla")
    x = spec.inputs(registry.Shape(1, 30, 1, 16, 16), initial_state=False)
    x = {n: t.to(runtime.device()) for n, t in x.items()}
    cu = torch.tensor([0, 7, 30], device=runtime.device())
    first = conventions.packed_batch("chunk_gla", cu, None, x["q"], None, 64)
    assert conventions.packed_batch("chunk_gla", cu, None, x["q"], None, 64) is first
    assert conventions.packed_batch("chunk_gla", cu, None, x["q"], None, 16) is not first  # other chunks
    cu[1] = 9
    moved = conventions.packed_batch("chunk_gla", cu, None, x["q"], None, 64)
    assert moved is not first and moved.bounds == ((0, 9), (9, 30))
    with pytest.raises(ValueError, match="end at T = 29"):
        conventions.packed_batch("chunk_gla", cu, None, x["q"][:, :29], None, 64)
    o, _ = spec.fn(**x, cu_seqlens=cu)
    o_fresh, _ = spec.fn(**x, cu_seqlens=cu.clone())
    assert torch.equal(o, o_fresh)


# flash-linear-attention's varlen grids (tests/ops at bc3b101d), per op here: the (offsets, head size) pairs that
# FLA's varlen tests of the same kernels pack, H = 4, GSA M = 64; a fact list, not their code. chunk_gla stands for
# chunk_rwkv6's kernels (test_gla.py and test_rwkv6.py, test_chunk_varlen), fused_recurrent_rwkv6 for GLA's and GSA's
# fused ones (test_gla.py and test_gsa.py, test_fused_recurrent_varlen), chunk_gsa: test_gsa.py, test_chunk_varlen,
# chunk_rwkv7: test_dplr_delta.py. The ops sharing kernels are checked against each other on packed batches by
# `test_one_launch_is_the_op_called_per_sequence`, every op with a one-row sequence against the reference by
# `test_packed_sequences_match_the_reference_per_sequence`, and with an empty one by the two tests above.
FLA_VARLEN = {
    "chunk_gla": [([0, 15], 64), ([0, 0, 16], 64), ([0, 256, 500, 1000], 64), ([0, 15, 100, 300, 1200, 2000], 100)],
    "fused_recurrent_rwkv6": [([0, 15], 64), ([0, 256, 500, 1000], 64), ([0, 15, 100, 300, 1200, 2000], 100),
                              ([0, 1, 100, 300, 1200, 2048], 64), ([0, 200, 512, 1200, 2048], 128)],
    "chunk_gsa": [([0, 15], 64), ([0, 256, 500, 1000], 64), ([0, 15, 100, 300, 1200, 2000], 100)],
    "chunk_rwkv7": [([0, 15], 64), ([0, 256, 500, 1000], 64), ([0, 64, 128, 192], 64),
                    ([0, 15, 100, 300, 1111, 1599, 2000], 100)],
}
FLA_VARLEN_CASES = [(name, offsets, D) for name, grid in FLA_VARLEN.items() for offsets, D in grid]


def _interpreter_size(offsets, D):
    """On the CPU, FLA's sizes shrunk as dev/fla_tests.py shrinks them: each length L kept up to 128, else
    128 if a multiple of 64, else 64 + L % 64 (a partial last chunk stays partial), D 128 -> 64, H 4 -> 1."""
    if runtime.device() == "cuda":
        return offsets, D, 4
    lengths = [b - a for a, b in zip(offsets[:-1], offsets[1:])]
    lengths = [L if L <= 128 else 128 if L % 64 == 0 else 64 + L % 64 for L in lengths]
    return _offsets(lengths), 64 if D == 128 else D, 1


@pytest.mark.parametrize("name, offsets, D", FLA_VARLEN_CASES, ids=[f"{n}-{o}-D{d}" for n, o, d in FLA_VARLEN_CASES])
def test_flash_linear_attentions_varlen_grids(name, offsets, D):
    """Each of FLA's packed batches for the op's kernels (`FLA_VARLEN`) against the float64 reference on each
    sequence alone (outputs, final states, every gradient), with one initial state per sequence; at FLA's sizes on a
    GPU."""
    offsets, D, H = _interpreter_size(offsets, D)
    spec = registry.get(name)
    shape = dict(H=H, K=D, V=D, M=64)
    x = spec.inputs(registry.Shape(1, offsets[-1], **shape), decay=1.0, initial_state=False, seed=3)
    h0 = spec.inputs(registry.Shape(len(offsets) - 1, 1, **shape), initial_state=True, seed=4)["initial_state"]
    cu = torch.tensor(offsets, dtype=torch.int32, device=runtime.device())
    result = harness.compare(functools.partial(spec.fn, cu_seqlens=cu),
                             _reference_per_sequence(spec.reference, cu.cpu()), {**x, "initial_state": h0})
    assert result.ok, f"{result.failures()} | {result}"

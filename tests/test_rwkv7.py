"""fused_recurrent_rwkv7 and chunk_rwkv7 against the float64 reference: output, final state and every gradient.

Inputs follow RWKV-7's contract (`harness.rwkv7_inputs`): `a = -kk`, `b = kk * a_gate`, decays in RWKV-7's
range and far outside it. Odd T exercises the partial last checkpoint segment; V = 96 gives two value blocks
(partial sums over blocks) and masked key/value lanes (K = 24).
"""
from __future__ import annotations

import functools
import math
from dataclasses import replace

import pytest
import torch

from fla_lab.spec import check, harness, reference
from fla_lab import runtime
from fla_lab.ops import RWKV7RecurrentLaunch, default_launch
from fla_lab.ops.common import launch as launch_module
from fla_lab.ops.rwkv7 import fused_recurrent as rwkv7
from fla_lab.ops.rwkv7 import chunk_rwkv7, fused_recurrent_rwkv7

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
OPS = {"fused_recurrent": fused_recurrent_rwkv7, "chunk": chunk_rwkv7}
op_param = pytest.mark.parametrize("op", OPS.values(), ids=OPS.keys())

# (B, T, H, K, V, decay, initial_state, dtype); decay None is RWKV-7's range, a number m gives -m * U(0.05, 1)
CASES = [
    (1, 1, 1, 16, 16, None, True, F32),
    (1, 15, 2, 32, 16, None, False, F32),
    (2, 16, 1, 16, 64, None, True, F32),
    (1, 17, 3, 32, 16, None, True, F32),
    (2, 33, 2, 16, 32, None, False, F32),
    (1, 100, 1, 32, 32, None, True, F32),
    (1, 33, 1, 24, 96, None, True, F32),
    (1, 16, 1, 128, 16, None, True, F32),
    (1, 17, 1, 32, 16, 5, True, F32),
    (2, 33, 1, 16, 64, 50, False, F32),
    (1, 40, 2, 16, 16, 1000, True, F32),
    (1, 33, 1, 24, 96, 1000, True, F32),
    (2, 17, 3, 16, 16, None, True, BF16),
    (1, 33, 1, 32, 16, None, False, BF16),
    (1, 100, 1, 16, 32, None, True, BF16),
    (1, 17, 2, 16, 64, 50, True, BF16),
    (1, 33, 1, 32, 16, None, True, F16),
]


def _id(case):
    B, T, H, K, V, decay, h0, dtype = case
    return f"B{B}-T{T}-H{H}-K{K}-V{V}-w{decay or 'rwkv7'}-{'h0' if h0 else 'noh0'}-{str(dtype)[6:]}"


@op_param
@pytest.mark.parametrize("case", CASES, ids=map(_id, CASES))
def test_matches_reference(op, case):
    B, T, H, K, V, decay, h0, dtype = case
    inputs = harness.rwkv7_inputs(B, T, H, K, V, decay=decay, initial_state=h0, seed=T + K)
    result = harness.compare(op, reference.recurrent_rwkv7, inputs, dtype=dtype)
    assert result.ok, f"{result.failures()} (all: {result})"


@op_param
@pytest.mark.parametrize("scale", [0.25, None])
def test_scale(op, scale):
    """`scale=None` means K ** -0.5, like the reference; the default 1.0 is covered above."""
    inputs = harness.rwkv7_inputs(1, 19, 1, 16, 16)
    result = harness.compare(op, reference.recurrent_rwkv7, inputs, scale=scale)
    assert result.ok, f"{result.failures()} (all: {result})"


def _on_device(inputs, requires_grad=True):
    return {n: x.to(runtime.device()).requires_grad_(requires_grad) for n, x in inputs.items()}


@op_param
def test_gradients_without_final_state(op):
    """No `dht`: the adjoint starts from zero instead of the final state's cotangent."""
    inputs = harness.rwkv7_inputs(1, 21, 2, 16, 32)
    ours = _on_device(inputs)
    theirs = {n: x.detach().double().cpu().requires_grad_() for n, x in inputs.items()}
    o, ht = op(**ours)
    o_ref, _ = reference.recurrent_rwkv7(**theirs)
    assert ht is None
    do = torch.randn(o_ref.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    (o * do.to(o)).sum().backward()
    (o_ref * do).sum().backward()
    errors = check.grad_errors({n: x.grad for n, x in theirs.items()}, {n: x.grad for n, x in ours.items()})
    assert max(errors.values()) <= check.tolerance(F32).grad, errors


@op_param
def test_float32_decay_with_bf16_inputs(op):
    """The layer keeps `w` in fp32 (upstream #181): each gradient comes back in its own input's dtype."""
    inputs = harness.rwkv7_inputs(1, 18, 1, 16, 16, initial_state=False)
    ours = _on_device({n: (x if n == "w" else x.to(BF16)) for n, x in inputs.items()})
    theirs = {n: x.detach().double().cpu().requires_grad_() for n, x in ours.items()}
    o, _ = op(**ours)
    o_ref, _ = reference.recurrent_rwkv7(**theirs)
    do = torch.randn(o_ref.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    (o.float() * do.to(o.device, torch.float32)).sum().backward()
    (o_ref * do).sum().backward()
    assert o.dtype == BF16 and ours["w"].grad.dtype == F32 and ours["r"].grad.dtype == BF16
    assert check.rel_error(o, o_ref) <= check.tolerance(BF16).fwd
    errors = check.grad_errors({n: x.grad for n, x in theirs.items()}, {n: x.grad for n, x in ours.items()})
    assert max(errors.values()) <= check.tolerance(BF16).grad, errors


@op_param
def test_gradient_of_initial_state_alone(op):
    """Only h0 requires grad: the forward must still keep the checkpoints the backward replays."""
    inputs = harness.rwkv7_inputs(1, 35, 1, 16, 16)
    ours = _on_device(inputs, requires_grad=False)
    ours["initial_state"].requires_grad_()
    h0_ref = inputs["initial_state"].detach().double().requires_grad_()
    ref_inputs = {n: x.double() for n, x in inputs.items() if n != "initial_state"}
    o, _ = op(**ours)
    o_ref, _ = reference.recurrent_rwkv7(**ref_inputs, initial_state=h0_ref)
    o.sum().backward()
    o_ref.sum().backward()
    check.assert_close("dh0", ours["initial_state"].grad, h0_ref.grad, check.tolerance(F32).grad)


@pytest.mark.parametrize("T", [16, 37])
def test_checkpoints_hold_segment_states(T):
    """The backward saves ceil(T/16) states per head, each the state entering its 16-step segment, and
    nothing that grows like one state per step."""
    B, H, K, V = 1, 2, 16, 32
    every = rwkv7.CHECKPOINT_EVERY
    assert every == 16  # the official RWKV-7 kernels' CHUNK_LEN
    inputs = harness.rwkv7_inputs(B, T, H, K, V)
    o, _ = fused_recurrent_rwkv7(**_on_device(inputs))
    saved = o.grad_fn.saved_tensors
    states = [x for x in saved if x is not None and x.dim() == 5]
    assert [tuple(x.shape) for x in states] == [(B, H, math.ceil(T / every), K, V)]
    assert sum(x.numel() for x in saved if x is not None) == (  # the inputs and T/16 states, nothing per step
        sum(x.numel() for x in inputs.values()) + states[0].numel())
    for s in range(math.ceil(T / every)):
        prefix = {n: (x if n == "initial_state" else x[:, :s * every]) for n, x in inputs.items()}
        expected = prefix["initial_state"] if s == 0 else reference.recurrent_rwkv7(
            **prefix, output_final_state=True)[1]
        check.assert_close(f"checkpoint {s}", states[0][:, :, s], expected, check.tolerance(F32).fwd)


@op_param
def test_rejects_keys_wider_than_a_tile(op):
    inputs = harness.rwkv7_inputs(1, 4, 1, rwkv7.MAX_K + 32, 16)
    with pytest.raises(ValueError, match=f"K={rwkv7.MAX_K + 32}"):
        op(**inputs)


@op_param
@pytest.mark.parametrize("name", ["a", "b"])
def test_rejects_misshapen_removal_vectors(op, name):
    inputs = harness.rwkv7_inputs(1, 4, 1, 16, 16)
    inputs[name] = inputs[name][..., :8]
    with pytest.raises(ValueError, match=f"`{name}`"):
        op(**inputs)


@pytest.mark.parametrize("B, forward, backward", [(2, (16, 8), (32, 4)), (4, (16, 8), (32, 4)),
                                                  (16, (32, 4), (32, 4)), (32, (32, 1), (32, 4)),
                                                  (64, (64, 1), (32, 4))])
def test_launch_follows_how_full_the_gpu_is(monkeypatch, B, forward, backward):
    """The fused kernels' per-call tiles and warps on an H200 (132 SMs), 16 heads, V = 64: few sequences take the
    narrowest tile (the shortest step), many take one warp per program (`forward_launch`, `backward_launch`)."""
    x, launch = torch.empty(B, 65536 // B, 16, 64), RWKV7RecurrentLaunch()
    assert default_launch("rwkv7_recurrent", x) == launch  # off the GPU the rules are the device's
    assert launch.forward_launch(x, 64, 16, None) == (64, 4)  # off the GPU: one value tile
    assert launch.backward_launch(x, 64) == (64, 4)
    monkeypatch.setattr(launch_module, "gpu_sms", lambda _: 132)
    assert launch.forward_launch(x, 64, 16, None) == forward
    assert launch.backward_launch(x, 64) == backward
    fixed = replace(launch, fwd_launch=(32, 2))  # a tuner's setting wins
    assert fixed.forward_launch(x, 64, 16, None) == (32, 2)


@pytest.mark.parametrize("B, forward", [(4, (16, 8)), (8, (16, 4)), (16, (32, 4)), (32, (32, 1)), (64, (64, 1))])
def test_the_h100_forward_takes_16_columns_only_under_one_program_per_sm(monkeypatch, B, forward):
    """The H100's entry: 16 value columns on 4 warps below one 64-column program per SM (B=8: 128 programs on 132
    SMs), 32 on 4 from one to two (B=16: docs/performance.md, 'fused_recurrent_rwkv7: 16 columns under one program per SM')."""
    monkeypatch.setattr(launch_module, "gpu_sms", lambda _: 132)
    launch = launch_module.measured("rwkv7_recurrent", "H100")
    assert launch.forward_launch(torch.empty(B, 65536 // B, 16, 64), 64, 16, None) == forward


def test_checkpoints_only_where_autograd_records_the_call(monkeypatch):
    """Under torch.no_grad() (inference, inputs that require grad or not) the forward stores no checkpoints; with
    autograd recording, it does, and the backward reads them."""
    saved, forward = [], rwkv7._forward
    monkeypatch.setattr(rwkv7, "_forward", lambda *a, **kw: saved.append(kw["save_checkpoints"]) or forward(*a, **kw))
    leaves = _on_device(harness.rwkv7_inputs(1, 20, 1, 16, 16, seed=1))
    with torch.no_grad():
        fused_recurrent_rwkv7(**leaves)
    fused_recurrent_rwkv7(**{n: t.detach() for n, t in leaves.items()})
    fused_recurrent_rwkv7(**leaves)[0].sum().backward()
    assert saved == [False, False, True] and all(t.grad is not None for t in leaves.values())


@pytest.mark.parametrize("forward", [(16, 4), (32, 1), (32, 4)])
def test_narrow_forward_and_backward_tiles(forward):
    """What the GPU rules pick: 16-column forward programs for few sequences, (32, 4) between one and two programs
    per SM, (32, 1) with the state tile held keys-last (`keys_last_launches`: its checkpoints and final state stored
    back in `[K, V]` order), 32-column backward programs with fp32 partials of the key-side gradients, against the
    float64 reference."""
    launch = RWKV7RecurrentLaunch(fwd_launch=forward, bwd_launch=(32, 4))
    assert (forward in launch.keys_last_launches) == (forward == (32, 1))  # both layouts run
    inputs = harness.rwkv7_inputs(1, 37, 2, 32, 64, decay=3.0, initial_state=True, seed=4)
    result = harness.compare(functools.partial(fused_recurrent_rwkv7, launch=launch), reference.recurrent_rwkv7, inputs)
    assert result.ok, f"{result.failures()} | {result}"

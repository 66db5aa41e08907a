"""Fused recurrent GLA and RWKV6 kernels against the float64 references: output, final state, every gradient."""
import functools
from dataclasses import replace

import pytest
import torch

import fla_lab
from fla_lab.spec import harness, reference
from fla_lab.ops import RecurrentLaunch, default_launch, fused_recurrent_gla, fused_recurrent_rwkv6

FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16

# A covering list: every T, K/V pair, dtype, decay magnitude and initial-state setting appears at least once.
CASES = [  # B, T, H, K, V, dtype, decay, h0
    (1, 1, 1, 32, 64, FP32, 1.0, True),
    (2, 15, 2, 64, 16, FP32, 1e-3, False),
    (1, 63, 3, 32, 64, BF16, 1.0, True),
    (2, 64, 1, 16, 32, FP16, 10.0, True),
    (1, 65, 2, 64, 64, FP32, 100.0, False),
    (1, 200, 1, 32, 16, BF16, 1e4, True),
    (2, 33, 2, 48, 24, FP32, 30.0, True),   # K, V not powers of two: masked tiles
    (1, 17, 2, 16, 64, FP16, 1e-3, False),
]


def _gla(q, k, v, gk, **kw):
    return reference.recurrent_gla(q, k, v, gk, **kw)


@pytest.mark.parametrize("B,T,H,K,V,dtype,decay,h0", CASES)
def test_fused_recurrent_gla(B, T, H, K, V, dtype, decay, h0):
    x = harness.gated_inputs(B, T, H, K, V, decay=decay, initial_state=h0, names=("q", "k", "v", "gk"))
    result = harness.compare(fused_recurrent_gla, _gla, x, dtype=dtype)
    assert result.ok, f"{result.failures()} | {result}"


@pytest.mark.parametrize("B,T,H,K,V,dtype,decay,h0", CASES)
def test_fused_recurrent_rwkv6(B, T, H, K, V, dtype, decay, h0):
    x = harness.gated_inputs(B, T, H, K, V, decay=decay, initial_state=h0, bonus=True, names=("r", "k", "v", "w"))
    result = harness.compare(fused_recurrent_rwkv6, reference.recurrent_rwkv6, x, dtype=dtype, seed=T)
    assert result.ok, f"{result.failures()} | {result}"


@pytest.mark.parametrize("tiles", [(16, 64), (32, 32), (64, 16), (16, 16)])
def test_dq_tiles_do_not_change_the_result(tiles):
    x = harness.gated_inputs(1, 20, 2, 48, 40, initial_state=True, bonus=True, names=("r", "k", "v", "w"))
    launch = replace(default_launch("recurrent", fla_lab.device()), dq_BK=tiles[0], dq_BV=tiles[1])
    result = harness.compare(lambda **kw: fused_recurrent_rwkv6(**kw, launch=launch), reference.recurrent_rwkv6, x)
    assert result.ok, result


def test_explicit_scale_and_no_final_state():
    x = harness.gated_inputs(1, 9, 1, 16, 16, initial_state=False, names=("q", "k", "v", "gk"))
    o, ht = fused_recurrent_gla(**{n: t.to(fla_lab.device()) for n, t in x.items()}, scale=0.3)
    ref, _ = _gla(**x, scale=0.3)
    assert ht is None
    torch.testing.assert_close(o.double().cpu(), ref, rtol=1e-5, atol=1e-5)


# The dkv kernel's tile is at most `RecurrentLaunch`'s [dkv_BK, dkv_BV]: several key blocks keep dg and the bonus
# in the kernel, several value blocks (V > dkv_BV = 64) send them to the fallback (`decay_and_bonus_grads`: dg in
# `decay_grad_kernel`, the bonus in torch).
WIDE = [  # B, T, H, K, V
    (1, 9, 2, 128, 64),   # several key blocks: fused, dv summed over key blocks
    (1, 9, 1, 32, 96),    # two value blocks: fallback, K != V
    (1, 7, 1, 128, 128),  # both
]


@pytest.mark.parametrize("bonus", [False, True], ids=["gla", "rwkv6"])
@pytest.mark.parametrize("B,T,H,K,V", WIDE)
def test_several_state_blocks(B, T, H, K, V, bonus):
    names = ("r", "k", "v", "w") if bonus else ("q", "k", "v", "gk")
    x = harness.gated_inputs(B, T, H, K, V, initial_state=True, bonus=bonus, names=names)
    result = harness.compare(fused_recurrent_rwkv6 if bonus else fused_recurrent_gla,
                             reference.recurrent_rwkv6 if bonus else _gla, x)
    assert result.ok, f"{result.failures()} | {result}"


def _grads_of(op, x, output_final_state):
    """Every input gradient of sum(o * do) (+ sum(ht * dht) with the final state), in fp32."""
    leaves = harness.leaves(x, torch.float32, fla_lab.device())
    o, ht = op(**leaves, output_final_state=output_final_state)
    do, dht = harness.cotangents(o.shape, {"ht": (o.shape[0], o.shape[2], x["k"].shape[-1], o.shape[-1])}, seed=3)
    loss = (o * do.to(o)).sum() + ((ht * dht["ht"].to(ht)).sum() if output_final_state else 0)
    loss.backward()
    return {n: t.grad for n, t in leaves.items()}


@pytest.mark.parametrize("output_final_state", [True, False], ids=["dht", "no_dht"])
@pytest.mark.parametrize("bonus", [False, True], ids=["gla", "rwkv6"])
def test_in_kernel_decay_grad_matches_the_torch_fallback(bonus, output_final_state):
    names = ("r", "k", "v", "w") if bonus else ("q", "k", "v", "gk")
    x = harness.gated_inputs(2, 11, 2, 48, 40, initial_state=True, bonus=bonus, names=names)
    op = fused_recurrent_rwkv6 if bonus else fused_recurrent_gla
    in_kernel = _grads_of(op, x, output_final_state)
    narrow = RecurrentLaunch(dkv_BV=16)  # three value blocks: dg and the bonus in the fallback
    fallback = _grads_of(functools.partial(op, launch=narrow), x, output_final_state)
    # The two paths sum the same terms in different orders (the final state's term first or last; the bonus of dk
    # and dv added in torch), so they agree to rounding at the scale of the summed terms, not of each element:
    # with torch's reverse cumsum as the fallback (before decay_grad_kernel), on an H200, dw's worst
    # element differs by 1.1e-5 where max|dw| = 28 (4e-7 of the scale). A missing or doubled term is O(1).
    for name, grad in fallback.items():
        diff = float((in_kernel[name] - grad).abs().max())
        assert diff <= 1e-6 * float(grad.abs().max()), f"{name}: max |in-kernel - fallback| = {diff:.3g}"


# The forward keeps at most `RecurrentLaunch.fwd_BK` = 256 keys per program; a larger K is split into key blocks
# whose fp32 output
# partials add up (the backward's kernels tile K already). FLA's GLA fused recurrent tests use head dims of 512.
@pytest.mark.parametrize("bonus", [False, True], ids=["gla", "rwkv6"])
@pytest.mark.parametrize("state_grad", [True, False], ids=["dht", "no_dht"])
def test_split_key_blocks(bonus, state_grad):
    names = ("r", "k", "v", "w") if bonus else ("q", "k", "v", "gk")
    x = harness.gated_inputs(2, 13, 2, 40, 24, decay=3.0, initial_state=True, bonus=bonus, names=names)
    # K = 40: three key blocks, the last one masked
    op = functools.partial(fused_recurrent_rwkv6 if bonus else fused_recurrent_gla,
                           launch=RecurrentLaunch(fwd_BK=16))
    result = harness.compare(op, reference.recurrent_rwkv6 if bonus else _gla, x, dtype=FP16, state_grad=state_grad)
    assert result.ok, f"{result.failures()} | {result}"


WIDE_KEYS = [  # B, T, H, K, V, dtype, decay
    (1, 7, 1, 512, 32, FP32, 1.0),    # two forward key blocks, one dkv value block: dg in the kernel
    (1, 5, 1, 512, 512, BF16, 1e-3),  # FLA's head dim 512 (K = V): eight value blocks, dg in torch
    (1, 6, 2, 300, 40, FP16, 1e4),    # K past a block edge: the second block masked
]


@pytest.mark.parametrize("B,T,H,K,V,dtype,decay", WIDE_KEYS)
def test_fused_recurrent_gla_wide_keys(B, T, H, K, V, dtype, decay):
    x = harness.gated_inputs(B, T, H, K, V, decay=decay, initial_state=True, names=("q", "k", "v", "gk"))
    result = harness.compare(fused_recurrent_gla, _gla, x, dtype=dtype)
    assert result.ok, f"{result.failures()} | {result}"


def test_fused_recurrent_rwkv6_wide_keys():
    x = harness.gated_inputs(1, 6, 1, 512, 48, decay=10.0, initial_state=True, bonus=True, names=("r", "k", "v", "w"))
    result = harness.compare(fused_recurrent_rwkv6, reference.recurrent_rwkv6, x, dtype=BF16, seed=6)
    assert result.ok, f"{result.failures()} | {result}"

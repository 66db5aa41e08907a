"""fused_recurrent_gsa against the float64 reference: output, both final states and every gradient (both final-state
cotangents), over odd lengths, K != V != M, initial states, dtypes and decays from 1e-3 to 1e4; vanilla ABC
(`g=None`), `reverse=True`, and several state blocks in both passes (the value-side decay gradient kernel over
several slot blocks, pass 2's decay gradient in its fallback)."""
import functools

import pytest
import torch

from fla_lab.spec import harness, reference
from fla_lab.ops import RecurrentLaunch, fused_recurrent_gsa

FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16

CASES = [  # B, T, H, K, V, M, dtype, decay, h0
    (1, 1, 1, 16, 32, 16, FP32, 1.0, True),
    (2, 15, 2, 32, 16, 32, FP32, 1e-3, False),
    (1, 45, 1, 16, 32, 64, BF16, 30.0, True),
    (1, 64, 2, 32, 32, 16, FP16, 10.0, True),
    (1, 65, 1, 48, 24, 20, FP32, 100.0, True),  # no dimension a power of two: masked tiles
    (1, 100, 1, 16, 16, 32, FP32, 1e4, False),
    (1, 33, 2, 16, 32, 16, FP16, 1e-3, True),
    (1, 70, 1, 32, 16, 16, BF16, 1e4, True),
]


@pytest.mark.parametrize("B,T,H,K,V,M,dtype,decay,h0", CASES)
def test_fused_recurrent_gsa(B, T, H, K, V, M, dtype, decay, h0):
    x = harness.gsa_inputs(B, T, H, K, V, M, decay=decay, initial_state=h0, seed=T)
    result = harness.compare(fused_recurrent_gsa, reference.recurrent_gsa, x, dtype=dtype, seed=T)
    assert result.ok, f"{result.failures()} | {result}"


@pytest.mark.parametrize("state_grad", [True, False], ids=["dht", "no_dht"])
def test_several_state_blocks(state_grad):
    """M = 80 > dkv_BV slots: pass 1's dkv kernel and its value-side decay gradient run over two slot blocks; V = 96:
    pass 2's dg comes from the fallback (`decay_and_bonus_grads`)."""
    x = harness.gsa_inputs(1, 12, 1, 40, 96, 80, decay=3.0, initial_state=True, seed=5)
    result = harness.compare(fused_recurrent_gsa, reference.recurrent_gsa, x, state_grad=state_grad)
    assert result.ok, f"{result.failures()} | {result}"


def test_value_decay_gradient_over_several_key_blocks():
    """The value-side decay gradient's final-state term sums ht * dht over the keys in dkv_BK blocks: three here."""
    x = harness.gsa_inputs(1, 9, 2, 40, 16, 24, decay=1.0, initial_state=True, seed=2)
    op = functools.partial(fused_recurrent_gsa, launch=RecurrentLaunch(dkv_BK=16))
    result = harness.compare(op, reference.recurrent_gsa, x, dtype=FP16)
    assert result.ok, f"{result.failures()} | {result}"


def test_vanilla_abc_without_forget_gate():
    x = harness.gsa_inputs(1, 21, 1, 16, 16, 16, initial_state=False)
    del x["g"]
    result = harness.compare(fused_recurrent_gsa, reference.recurrent_gsa, x)
    assert result.ok, f"{result.failures()} | {result}"


def _reversed_reference(q, k, v, s, g, **kwargs):
    o, final = reference.recurrent_gsa(*(t.flip(1) for t in (q, k, v, s, g)), **kwargs)
    return o.flip(1), final


def test_reverse_runs_the_recurrence_from_the_last_step():
    x = harness.gsa_inputs(2, 13, 1, 16, 24, 16, decay=2.0, initial_state=True, seed=4)
    result = harness.compare(functools.partial(fused_recurrent_gsa, reverse=True), _reversed_reference, x, dtype=BF16)
    assert result.ok, f"{result.failures()} | {result}"


def test_same_function_as_chunk_gsa():
    """Same inputs, same dtype: the two GSA ops agree to fp32 rounding (outputs, final states and gradients)."""
    from fla_lab.ops import chunk_gsa

    x = harness.gsa_inputs(1, 37, 2, 16, 32, 16, decay=5.0, initial_state=True, seed=9)
    fused = harness.compare(fused_recurrent_gsa, reference.recurrent_gsa, x)
    chunk = harness.compare(functools.partial(chunk_gsa, chunk_size=16), reference.recurrent_gsa, x)
    assert fused.ok and chunk.ok, f"{fused} | {chunk}"
    got, other = fused.outputs["run"], chunk.outputs["run"]
    torch.testing.assert_close(got.o, other.o, rtol=1e-5, atol=1e-5)
    for name, grad in got.grads.items():
        torch.testing.assert_close(grad, other.grads[name], rtol=1e-4, atol=1e-4, msg=name)


def test_bad_input_is_refused_by_the_contract():
    x = harness.gsa_inputs(1, 5, 1, 16, 16, 8, initial_state=False)
    with pytest.raises(ValueError, match=r"^fused_recurrent_gsa: `g`"):
        fused_recurrent_gsa(**{**x, "g": x["g"][..., :4]})


def test_grouped_query_heads():
    """FLA's decode path: q with HQ = 2 H heads, query head i reading head i // 2 of k, v, s, g and the states; the
    same as every head repeated, against the float64 recurrence (states: one per head of k)."""
    from fla_lab import runtime

    x = harness.gsa_inputs(1, 9, 2, 16, 16, 16, decay=1.0, initial_state=True, seed=3)
    q = torch.randn(1, 9, 4, 16, generator=torch.Generator().manual_seed(4))
    dev = {n: (tuple(t.to(runtime.device()) for t in v) if isinstance(v, tuple) else v.to(runtime.device()))
           for n, v in x.items()}
    o, (hk, hv) = fused_recurrent_gsa(q.to(runtime.device()), dev["k"], dev["v"], dev["s"], dev["g"],
                                      initial_state=dev["initial_state"], output_final_state=True)
    spread = lambda t, dim=2: t.double().repeat_interleave(2, dim=dim)  # noqa: E731
    o_ref, (hk_ref, hv_ref) = reference.recurrent_gsa(q.double(), spread(x["k"]), spread(x["v"]), spread(x["s"]),
                                                      spread(x["g"]), initial_state=tuple(spread(t, 1) for t in
                                                                                          x["initial_state"]),
                                                      output_final_state=True)
    assert o.shape == (1, 9, 4, 16) and hk.shape == (1, 2, 16, 16)
    for got, want in ((o, o_ref), (hk, hk_ref[:, ::2]), (hv, hv_ref[:, ::2])):
        torch.testing.assert_close(got.double().cpu(), want, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="multiple of k's heads"):
        fused_recurrent_gsa(torch.randn(1, 9, 3, 16), x["k"], x["v"], x["s"], x["g"])

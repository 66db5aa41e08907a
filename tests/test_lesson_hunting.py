"""Notebook 06's capstone: the planted switches stay out of the catalogue, each does what the answer key says (one
NaN made in a layer's backward, one wrong-but-finite kernel), and the checks follow the learner's mistakes."""
import contextlib
import io

import pytest
import torch

import fla_lab
from fla_lab import audit, bugs, check, harness, registry
from fla_lab.layers import GatedSlotAttention
from fla_lab.lessons import hunting

PLANTED = [name for name, _ in bugs.PLANTED]


def _printed(fn, *args) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fn(*args)
    return out.getvalue()


def test_planted_switches_are_nowhere_in_the_catalogue():
    assert not set(PLANTED) & {b.name for b in bugs.CATALOGUE}
    listed = _printed(bugs.index) + _printed(bugs.show)
    assert not any(name in listed for name in PLANTED)
    assert not any(set(PLANTED) & set(spec.variants) for spec in registry.ops().values())


def test_a_planted_switch_is_accepted_only_by_its_own_op():
    bugs.check_bug("capstone_b", "chunk_rwkv7")
    with pytest.raises(ValueError, match="unknown bug='capstone_b'") as err:
        bugs.check_bug("capstone_b", "chunk_gsa")
    assert "capstone" not in str(err.value).split("has", 1)[1]  # the error lists catalogue names only


def _rwkv7(T: int, bug, dtype=torch.float32):
    spec = registry.get("chunk_rwkv7")
    x = harness.leaves(spec.inputs(registry.Shape(1, T, 1, 16, 16), decay=1.0, initial_state=False), dtype,
                       fla_lab.device())
    o, ht = fla_lab.ops.chunk_rwkv7(**x, output_final_state=True, bug=bug)
    return x, o.float(), ht


def test_capstone_b_is_wrong_but_finite_and_only_past_the_first_chunk():
    """The state leaving a 16-row chunk is wrong: the output of one chunk is bit-identical, the final state and every
    later chunk's output are finite but off by far more than rounding."""
    x, o_fixed, ht_fixed = _rwkv7(16, None)
    _, o_bug, ht_bug = _rwkv7(16, "capstone_b")
    assert torch.equal(o_fixed, o_bug)
    assert torch.isfinite(ht_bug).all() and check.rel_error(ht_bug, ht_fixed) > 1e-2
    x, o_fixed, _ = _rwkv7(32, None)
    _, o_bug, _ = _rwkv7(32, "capstone_b")
    assert torch.equal(o_fixed[:, :16], o_bug[:, :16]) and torch.isfinite(o_bug).all()
    exact, _ = registry.get("chunk_rwkv7").reference(**{n: t.double() for n, t in x.items()})
    assert check.rel_error(o_fixed, exact) < 2e-5 < 1e-2 < check.rel_error(o_bug, exact)


def _gate_grads(bug):
    with hunting._fork(0):
        layer = GatedSlotAttention(hidden_size=32, num_heads=1, num_slots=16, bug=bug).to(fla_lab.device())
    with torch.no_grad():
        layer.f_proj.weight.mul_(hunting.GATE_GROWTH)
    x = torch.randn(1, 20, 32, generator=torch.Generator().manual_seed(3)).to(fla_lab.device())
    o = layer(x)[0]
    o.pow(2).mean().backward()
    return o.detach(), {n: p.grad for n, p in layer.named_parameters()}


def test_capstone_a_keeps_the_forward_and_makes_the_gate_gradient_nan():
    o_fixed, g_fixed = _gate_grads(None)
    o_bug, g_bug = _gate_grads("capstone_a")
    assert torch.isfinite(o_bug).all() and check.rel_error(o_bug, o_fixed) < 1e-5
    assert all(torch.isfinite(g).all() for g in g_fixed.values())
    assert [n for n, g in g_bug.items() if not torch.isfinite(g).all()] == ["f_proj.weight"]


def test_the_mystery_model_hunt_end_to_end():
    """One bf16 step inside the locator: the NaN reaches block 0 as a gradient (not the catalogue's, says
    suspects()); block 1's gate is the only parameter of that block with a non-finite gradient; the audit flags
    only the RWKV-7 call; the checks say NOT YET with hints that follow the finding, and PASS once it is right."""
    model = hunting.mystery_model()
    report = hunting.hunt_step(model)
    d = report.diagnosis
    assert report.event.call.module.startswith("blocks.0.attn") and d.cause == "nonfinite_cotangent", str(report)
    assert report.suspects() == [] and "no catalogue entry matches" in str(report.suspects())
    census = hunting.grad_census(model, "blocks.1.attn")
    assert [n for n, c in census.items() if c.count] == ["blocks.1.attn.f_proj.weight"]
    with audit.audit(model) as recorded:  # block 0's call gets the NaN cotangent: compared forward only
        hunting.loss_of(model, hunting.tokens()).backward()
    assert [r.call.op for r in recorded.wrong()] == ["chunk_rwkv7"], recorded.report()

    victim = hunting.check_nan_hunt(model, {"module": "blocks.0.attn (RWKV6Attention)", "where": "x", "cause": ""})
    assert not victim.passed and "arrive" in victim.hints[0]
    method = hunting.check_nan_hunt(model, {"module": "blocks.1.attn", "where": "chunk_gsa", "cause": "a b c d"})
    assert not method.passed and "PyTorch code" in method.hints[0]
    right = {"module": "blocks.1.attn", "where": "GatedSlotAttention.gates",
             "cause": "where does not mask the gradient of log(sigmoid(x))"}
    assert not hunting.check_nan_hunt(model, right).passed  # still switched on
    assert hunting.switch_off(model, "blocks.1.attn")
    assert hunting.check_nan_hunt(model, right).passed

    wrong_kernel = hunting.check_silent_hunt(model, {"module": "blocks.2.attn", "where": "dplr_fwd_o_kernel"})
    assert not wrong_kernel.passed and "T = 16" in wrong_kernel.hints[0]
    assert hunting.switches_on(model) == 1 and hunting.switch_off(model, "blocks.2.attn")
    silent = {"module": "blocks.2.attn", "where": "dplr_fwd_h_kernel", "cause": "the state leaves a chunk under-decayed"}
    assert hunting.check_silent_hunt(model, silent).passed and hunting.switches_on(model) == 0


def test_the_model_as_called_joins_the_registry_beside_the_shipped_op():
    from fla_lab import hunt

    call = hunt.Call(0, "chunk_rwkv7", "blocks.2.attn", fla_lab.ops.chunk_rwkv7, {}, {"bug": "capstone_b", "scale": 1.0})
    label = hunting.register_as_called(call, library="test")
    try:
        spec = registry.get("chunk_rwkv7", library="test")
        assert label == "test:chunk_rwkv7" and spec.variants == (registry.FIXED,)
        assert spec.fn.keywords == {"bug": "capstone_b"}  # the switch, not the options the atlas sets itself
    finally:
        registry.ops().pop(label)

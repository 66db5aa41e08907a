"""Audit mode (`fla_lab.tools.audit`): every op call of a step replayed against float64 on its own inputs and cotangents.

The wrong-but-finite cases are real paths: chunk_rwkv7's unlisted switch that notebook 06's model runs (a state
update that skips a chunk's last decay), and a truncated-BPTT segment (no initial state, a final-state cotangent)
through an op whose final state is cut from the graph, so the gradient the next segment sends back is lost.
"""
from __future__ import annotations

import functools

import pytest
import torch

import fla_lab
from fla_lab.tools import audit
from fla_lab.spec import harness, registry
from fla_lab import ops

SHAPE = registry.Shape(B=1, T=48, H=1, K=16, V=16)  # three of RWKV-7's 16-row chunks; a partial 64-row GLA chunk


def _leaves(name: str, initial_state: bool = True, dtype=torch.float32) -> dict:
    return harness.leaves(registry.get(name).inputs(SHAPE, initial_state=initial_state), dtype, fla_lab.device())


def _step(op, x: dict, state_cotangent: bool = True) -> None:
    """A loss on the output and, like a truncated-BPTT segment feeding the next, on the final state."""
    o, ht = op(**x, output_final_state=True)
    loss = o.float().square().mean()
    if state_cotangent:
        loss = loss + ht.float().sum()
    loss.backward()


def test_every_call_is_right_on_the_shipped_ops_with_both_errors_and_a_peak():
    with audit.audit() as recorded:
        _step(ops.chunk_gla, _leaves("chunk_gla"))
        _step(ops.chunk_rwkv7, _leaves("chunk_rwkv7", initial_state=False))
    results = recorded.results()
    assert [r.call.op for r in results] == ["chunk_gla", "chunk_rwkv7"]
    assert all(r.ok and r.backward for r in results), recorded.report()
    gla = results[0]
    assert {"o", "ht", "dq", "dk", "dv", "dg", "dinitial_state"} <= set(gla.errors) == set(gla.plain)
    for name in ("dq", "dk", "dv", "dg"):  # the floor only ever lowers a gradient's error
        assert gla.plain[name] >= gla.errors[name] - 1e-12
    assert set(gla.peaks["o"]) == {"b", "t", "h", "d"} and 0 <= gla.peaks["o"]["t"] < SHAPE.T
    assert set(gla.peaks["ht"]) == set(gla.peaks["dinitial_state"]) == {"b", "h", "k", "v"}
    assert "0 of 2 call(s) beyond tolerance" in recorded.report()


@pytest.mark.parametrize("op", ["fused_recurrent_rwkv6", "chunk_gla"])
def test_a_packed_call_is_replayed_one_sequence_at_a_time(op):
    """cu_seqlens reaches the float64 reference (conventions.packed_reference): three sequences, each with its own
    initial state, are right; replayed as one sequence of B = 1 they could not be (three states for one row)."""
    spec = registry.get(op)
    x = spec.inputs(registry.Shape(B=1, T=40, H=1, K=16, V=16), initial_state=False)
    x["initial_state"] = torch.randn(3, 1, 16, 16, generator=torch.Generator().manual_seed(1))
    x = harness.leaves(x, torch.float32, fla_lab.device())
    cu_seqlens = torch.tensor([0, 7, 30, 40], device=fla_lab.device())
    with audit.audit() as recorded:
        _step(functools.partial(getattr(ops, op), cu_seqlens=cu_seqlens), x)
    (result,) = recorded.results()
    assert result.ok and result.backward, recorded.report()


def test_the_unlisted_rwkv7_switch_is_flagged_while_every_value_stays_finite():
    from fla_lab.teaching.lessons import hunting

    switched = hunting._option("silent")[2]  # notebook 06's op: chunk_rwkv7 with its unlisted switch bound
    assert switched.op == "chunk_rwkv7" and set(switched.options) == {"bug"}
    x = _leaves("chunk_rwkv7")
    with audit.audit() as recorded:
        _step(switched, x)
    (result,) = recorded.results()
    assert not result.ok, recorded.report()
    assert max(result.errors["o"], result.errors["ht"]) > result.tolerance.fwd  # the forward is wrong already
    assert all(torch.isfinite(torch.tensor(e)) for e in result.errors.values())
    assert "WRONG" in result.line() and "1 of 1 call(s) beyond tolerance: #0 chunk_rwkv7" in recorded.report()


def _final_state_term_dropped_without_h0(real, detach: bool):
    """Plausible bugs: without an initial state, the final state's gradient never reaches k, v, g (the backward
    seeds its state gradient from `dht` only under USE_H0), or the state comes back detached (as if it were only
    an output for inference)."""
    @functools.wraps(real)
    def op(*args, initial_state=None, **kwargs):
        o, ht = real(*args, initial_state=initial_state, **kwargs)
        if initial_state is None and ht is not None:
            ht = ht.detach() if detach else ht.detach() + 0.0 * ht  # the same values, a gradient of zero
        return o, ht
    return op


@pytest.mark.parametrize("detach", [False, True], ids=["gradient dropped", "state detached"])
def test_a_final_state_term_dropped_without_an_initial_state_is_found_only_there(monkeypatch, detach):
    monkeypatch.setattr(ops, "chunk_gla", _final_state_term_dropped_without_h0(ops.chunk_gla, detach))
    with audit.audit() as recorded:
        _step(ops.chunk_gla, _leaves("chunk_gla", initial_state=True))    # h0 given: the path is intact
        _step(ops.chunk_gla, _leaves("chunk_gla", initial_state=False))   # truncated BPTT's first segment
    with_h0, without = recorded.results()
    assert with_h0.ok, with_h0.line()
    assert not without.ok, without.line()
    assert without.errors["o"] < 1e-5  # the forward is right: only the gradients say it
    if detach:
        assert without.call.detached == ("ht",) and "ht returned detached" in without.line()
    else:
        assert without.worst in ("dk", "dv", "dg") and set(without.peaks[without.worst]) == {"b", "t", "h", "d"}


def test_a_call_without_a_backward_is_compared_forward_only():
    x = harness.leaves(registry.get("chunk_gla").inputs(SHAPE), torch.float32, fla_lab.device(), grads=False)
    with audit.audit() as recorded, torch.no_grad():
        ops.chunk_gla(**x, output_final_state=True)
    (result,) = recorded.results()
    assert not result.backward and set(result.errors) == {"o", "ht"} and result.ok
    assert "(forward only)" in result.line()


def test_an_error_inside_the_block_propagates():
    x = _leaves("chunk_gla")
    x["g"] = torch.full_like(x["g"], float("nan"))
    with pytest.raises(ValueError, match="non-finite"):
        with audit.audit():
            ops.chunk_gla(**x)
            ops.flush_value_checks()  # on a GPU the value check is read later, without a sync: read it here


def _h0_added_only_with_the_final_state(real):
    """The mutation check's `rwkv6_fused_h0_only_with_ht`, as a wrapper: the initial state counts only when the
    final state is asked for, so every replay that asks for it is right."""
    @functools.wraps(real)
    def op(*args, initial_state=None, output_final_state=False, **kwargs):
        h0 = initial_state if output_final_state else None
        return real(*args, initial_state=h0, output_final_state=output_final_state, **kwargs)
    return op


def test_a_call_made_without_the_final_state_is_replayed_as_called(monkeypatch):
    monkeypatch.setattr(ops, "chunk_gla", _h0_added_only_with_the_final_state(ops.chunk_gla))
    x = _leaves("chunk_gla")
    with audit.audit() as recorded:
        o, _ = ops.chunk_gla(**x)  # a model that never asks for the state
        o.float().square().mean().backward()
    (result,) = recorded.results()
    assert not result.call.output_final_state and not result.ok and result.worst == "o", result.line()

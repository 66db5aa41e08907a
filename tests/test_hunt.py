"""The NaN locator names, for every catalogued bug, the op, the kernel and the cause that `bugs.Bug.located` says.

Each scenario (`fla_lab.teaching.lessons.hunting.SCENARIOS`) triggers the bug in a layer (or op call) the way its report met
it; the switch being off must leave the locator with nothing to report.
"""
import inspect
import re

import pytest
import torch

import fla_lab
from fla_lab.teaching import bugs
from fla_lab.spec import harness, registry
from fla_lab.tools import hunt
from fla_lab.tools.hunt import diagnose, locator
from fla_lab.teaching.lessons import hunting
from fla_lab.ops.common import utils


def test_every_catalogue_entry_has_a_scenario():
    assert set(hunting.SCENARIOS) == {b.name for b in bugs.CATALOGUE}


@pytest.mark.parametrize("name", [b.name for b in bugs.CATALOGUE])
def test_locator_names_op_kernel_and_cause(name):
    op, kernel, cause = bugs.get(name).located
    report = hunting.scenario(name)
    found = report.diagnosis
    assert found is not None, f"nothing located for {name}: {report}"
    assert (found.op, found.kernel, found.cause) == (op, kernel, cause), str(report)
    assert hunt.CAUSES[cause][1] == found.fault


@pytest.mark.parametrize("name", [b.name for b in bugs.CATALOGUE if hunt.CAUSES[b.located[2]][1] == "kernel"])
def test_a_kernel_at_fault_takes_a_bug_switch(name):
    """Where the fault is the kernel's, the kernel the locator names compiles the historical line: it takes a
    `BUG...` constexpr, or a constexpr helper slot whose default is the fixed `@triton.jit` helper (the bug switch
    passes the historical one)."""
    bug = bugs.get(name)
    kernel = next(k for n, k in utils.registered_kernels().items() if n.endswith("." + bug.located[1]))
    switch = r"\bBUG\w*: tl\.constexpr|\b[A-Z][A-Z0-9_]*: tl\.constexpr = [a-z_]\w*"
    assert re.search(switch, inspect.getsource(kernel.fn)), bug.located


def test_fixed_layer_reports_nothing():
    layer = hunting._rwkv6_layer("chunk", None)
    hunting.fast_forgetting(layer)
    report = hunting._locate_layer(layer, hunting._hidden(hunting.T_TRAIN, hunting.HIDDEN))
    assert report.event is None and report.diagnosis is None, str(report)
    assert str(report).startswith("no non-finite value in 1 op call")


def test_tracer_restores_every_kernel():
    before = {n: k.run for n, k in utils.registered_kernels().items() if hasattr(k, "run")}
    with hunt.trace_kernels() as tracer:
        spec = registry.get("chunk_gla")
        spec.compare(spec.inputs(registry.Shape(1, 20, 1, 16, 16)), chunk_size=16)
    assert tracer.launches and tracer.first_bad() is None
    assert {n: k.run for n, k in utils.registered_kernels().items() if hasattr(k, "run")} == before


@pytest.mark.parametrize("case, cause, early", [(0, "growing_transition", False), (1, "positive_decay", True)])
def test_chunk_early_nan_is_named_on_the_reports_rwkv7_call(case, cause, early):
    """#150's `torch.rand` inputs on the chunked RWKV-7 kernel (notebook 02's trace): with log(w) the kernel fails
    where the exact output leaves fp32 (t = 31); with raw w its first NaN comes a chunk earlier (t = 16, 0 * inf)."""
    from fla_lab.teaching.lessons import decay_contract

    x = {n: t.to(fla_lab.device()) for n, t in decay_contract.rwkv7_case(decay_contract.RWKV7_CASES[case]).items()}
    found = hunt.replay(registry.get("chunk_rwkv7"), fla_lab.ops.chunk_rwkv7, x)
    assert (found.cause, found.fault) == (cause, "input"), str(found)
    assert ("chunk-early" in found.note) == early, str(found)
    assert found.where["t"] == (16 if early else 31), str(found)


def test_locator_leaves_ops_unpatched_and_propagates_unrelated_errors():
    real = fla_lab.ops.chunk_rwkv6
    with pytest.raises(ZeroDivisionError), hunt.locate():
        assert fla_lab.ops.chunk_rwkv6 is not real
        1 / 0
    assert fla_lab.ops.chunk_rwkv6 is real


def test_tracer_tells_backward_launches_from_forward_ones_on_its_own():
    """Outside `locate` too (notebook 06's exercise): GSA's padded rows write their first NaN in the backward."""
    spec = registry.get("chunk_gsa")
    x = {n: tuple(t.to(fla_lab.device()).requires_grad_() for t in v) if isinstance(v, tuple)
         else v.to(fla_lab.device()).requires_grad_() for n, v in spec.inputs(registry.Shape(1, 45, 1, 16, 16, 16),
                                                                             decay=30.0).items()}
    with hunt.trace_kernels() as tracer:
        o, _ = spec.op("unmasked_padding", chunk_size=64)(**x)
        assert torch.isfinite(o).all()
        o.sum().backward()
    assert {launch.phase for launch in tracer.launches} == {"forward", "backward"}
    bad = tracer.first_bad()
    assert (bad.kernel, bad.phase) == ("slot_rows_kernel", "backward"), bad


def test_a_final_state_without_gradient_does_not_break_the_locator():
    """GSA returns a pair of final states; a loss that uses only one leaves the other without a gradient, and the
    locator's hook must take that (it used to raise AttributeError inside the backward and report it as the op's)."""
    spec = registry.get("chunk_gsa")
    x = {n: tuple(t.to(fla_lab.device()).requires_grad_() for t in v) if isinstance(v, tuple)
         else v.to(fla_lab.device()).requires_grad_()
         for n, v in spec.inputs(registry.Shape(1, 20, 1, 16, 16, 16), initial_state=False).items()}
    with hunt.locate() as found:
        o, (hk, hv) = fla_lab.ops.chunk_gsa(**x, output_final_state=True)
        (o.sum() + hv.sum()).backward()
    assert found.report.event is None and str(found.report) == "no non-finite value in 1 op call(s)", found.report
    assert found.report.calls[0].dht[0] is None and found.report.calls[0].dht[1] is not None


def test_suspects_say_when_nothing_in_the_catalogue_matches():
    call = hunt.Call(0, "chunk_rwkv7", "-", None, {}, {})
    new = hunt.Diagnosis("chunk_rwkv7", "forward", "exp_overflow", kernel="dplr_fwd_h_kernel")
    suspects = hunt.Report([call], hunt.Event(call, "forward", "non-finite output"), new).suspects()
    assert suspects == [] and "no catalogue entry matches" in str(suspects) and "float64" in str(suspects)
    op, kernel, cause = bugs.get("exclusive_reference").located
    known = hunt.Diagnosis(op, "forward", cause, kernel=kernel)
    assert hunt.Report([call], None, known).suspects() == ["exclusive_reference"]
    assert "nothing was located" in str(hunt.Report([call], None, None).suspects())


def test_a_non_finite_cotangent_is_the_input_s_fault_not_the_kernel_s():
    """A NaN made downstream reaches an op's output as its gradient: the op only passes it on."""
    spec = registry.get("chunk_gla")
    x = spec.inputs(registry.Shape(1, 20, 1, 16, 16), initial_state=False)
    do = torch.randn(1, 20, 1, 16)
    do[0, 7, 0, 3] = float("nan")
    found = hunt.replay(spec, fla_lab.ops.chunk_gla, x, do=do)
    assert (found.cause, found.fault, found.kernel) == ("nonfinite_cotangent", "input", None), str(found)
    assert found.where == {"grad of": "do", "b": 0, "t": 7, "h": 0, "d": 3}, str(found)
    assert hunt.replay(spec, fla_lab.ops.chunk_gla, x, do=torch.randn(1, 20, 1, 16)).cause == "none"


def test_score_blocks_say_which_sub_chunk_blocks_and_pairs_hold_the_nan():
    """A [B, T, H, chunk] score matrix: (query row t, key column s of t's chunk), sub-chunks of 16."""
    T, chunk = 80, 64
    mask = torch.zeros(1, T, 1, chunk, dtype=torch.bool)
    mask[0, 20, 0, 3] = mask[0, 40, 0, 5] = True  # blocks (1, 0) and (2, 0): off-diagonal
    off = hunt.score_blocks(mask, T, chunk)
    assert (off.chunk_index, off.blocks, off.first_pair) == (0, {(1, 0): 1, (2, 0): 1}, (20, 3))
    assert off.off_diagonal and not off.diagonal and "off-diagonal block(s)" in str(off)
    diag = torch.zeros_like(mask)
    diag[0, 64 + 5, 0, 2] = True  # the second chunk's first diagonal block; a row past T is ignored
    only = hunt.score_blocks(diag, T, chunk)
    assert (only.chunk_index, only.blocks, only.first_pair) == (1, {(0, 0): 1}, (69, 66))
    assert only.diagonal and not only.off_diagonal
    assert hunt.score_blocks(torch.zeros(1, T, 1, 32, dtype=torch.bool), T, chunk) is None  # not a score matrix


def _overflow_advice(scores):
    spec = registry.get("chunk_rwkv6")
    stats = {"log-decay max": -0.1, "log-decay min": -150.0, "decay dtype": "float32", "T": 80}
    d = hunt.Diagnosis("chunk_rwkv6", "forward", "none", kernel="gated_scores_kernel", scores=scores)
    cause, _ = diagnose._classify(spec, stats, {"state max": 1.0}, d, {})
    return cause, d.advice


def test_advice_follows_the_mechanism_the_scores_show():
    T, chunk = 80, 64
    off = torch.zeros(1, T, 1, chunk, dtype=torch.bool)
    off[0, 20, 0, 3] = True
    diag = torch.zeros_like(off)
    diag[0, 20, 0, 18] = True
    cause, advice = _overflow_advice(hunt.score_blocks(off, T, chunk))
    assert cause == "exp_overflow" and "reference row" in advice and "after exp" not in advice
    assert "mask applied after exp" in _overflow_advice(hunt.score_blocks(diag, T, chunk))[1]
    assert "reference row" not in _overflow_advice(hunt.score_blocks(diag, T, chunk))[1]
    assert "stay <= 0" in _overflow_advice(None)[1]
    report = str(hunting.scenario("exclusive_reference"))  # #77: off-diagonal blocks, the reference row
    assert "scores   : chunk 0" in report and "off-diagonal" in report and "reference row" in report


def test_a_failure_of_the_locators_own_hook_is_reported_as_its_own(monkeypatch):
    def broken(call, i):
        def store(grad):
            raise KeyError("planted")
        return store

    monkeypatch.setattr(locator, "_store_state_grad", broken)  # where Locator looks it up
    x = harness.leaves(registry.get("chunk_gla").inputs(registry.Shape(1, 16, 1, 16, 16)), torch.float32,
                       fla_lab.device())
    with pytest.raises(hunt.LocatorError, match="own backward hook failed .*KeyError"):
        with hunt.locate() as found:
            o, ht = fla_lab.ops.chunk_gla(**x, output_final_state=True)
            (o.sum() + ht.sum()).backward()
    assert found.report is None and isinstance(found.own_error, KeyError)


def test_tracer_sees_nan_written_over_garbage_nan():
    """An output from torch.empty can hold more NaN bit patterns than the kernel then writes: the launch still
    counts as writing NaN where it put one over a finite value (the locator once missed #77 this way, now and then,
    depending on what the allocator handed back)."""
    from fla_lab.ops.common import chunk as common_chunk
    T, K = 32, 16
    g = -torch.rand(1, T, 1, K)
    g[0, 3, 0, 0] = float("nan")  # NaN in gi from row 3 to the chunk's end (row 15), channel 0
    gi = torch.zeros(1, T, 1, K)
    gi[0, 16:, 0, :] = float("nan")  # garbage: 256 NaN, more than the 13 the kernel writes
    g, gi = g.to(fla_lab.device()), gi.to(fla_lab.device())
    with hunt.trace_kernels() as tracer:
        common_chunk.chunk_cumsum_kernel[(1, 2, 1)](g, gi, None, None, None, None, T, H=1, K=K, BT=16, BK=16)
    bad = tracer.first_bad()
    assert bad is not None and bad.kernel == "chunk_cumsum_kernel" and set(bad.written) == {"gi"}
    assert bad.written["gi"].first == {"t": 3, "b": 0, "h": 0, "d": 0} and bad.written["gi"].count == 13


def test_tensors_made_while_tracing_start_at_zero():
    """The replay's outputs must not inherit the NaN of the model's own forward from the allocator (the #77
    scenario's score matrix did, now and then, and the locator named the output kernel instead)."""
    real = torch.empty
    for _ in range(3):
        nan = torch.full((4096,), float("nan"))
        del nan  # its block goes back to the allocator
        with hunt.trace_kernels():
            assert torch.isfinite(torch.empty(4096)).all() and torch.isfinite(torch.empty_like(torch.ones(9))).all()
    assert torch.empty is real

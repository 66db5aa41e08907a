"""The sweep of benchmarks/tune.py on the CPU, timings faked (no kernel runs): every knob it sweeps is a field of the
op's launch object, each measurement passes a launch with its value in place (None, a per-call rule, included), and
no module-level state changes."""
import pytest
import torch

from benchmarks import tune


@pytest.mark.parametrize("op", ["fused_recurrent_rwkv7", "fused_recurrent_rwkv6", "chunk_rwkv7", "chunk_gla"])
def test_each_setting_is_passed_as_a_launch_while_measured(monkeypatch, op):
    knobs = tune.knobs(op)
    seen = []

    def fake_time(fn, x, do, kwargs, backward):
        seen.append(kwargs["launch"])
        return 1.0

    monkeypatch.setattr(tune, "time_it", fake_time)
    monkeypatch.setattr(tune.common, "on_device", lambda inputs: [t.requires_grad_() for t in inputs])
    monkeypatch.setattr(tune.common, "cotangent", lambda x: torch.zeros(*x[0].shape[:3], 64))
    default = tune.default_launch(tune.FAMILY[op], "cpu")
    rows = []
    tune.sweep(op, 1, 16, rows, with_profile=False, with_sweep=True)
    assert [(r["knob"], r["metric"]) for r in rows[:2]] == [("fla_lab default", "fwd_ms"),
                                                           ("fla_lab default", "fwd_bwd_ms")]
    assert seen[0] == seen[1] == default  # the row a sweep is read against: the default launch, passed as one
    rows, seen = rows[2:], seen[2:]
    assert len(rows) == len(seen) == sum(len(values) for _, values, _ in knobs)
    i = 0
    for name, values, backward in knobs:
        for value in values:
            assert getattr(seen[i], name) == value and rows[i]["value"] == value
            assert seen[i] == type(default)(**{**vars(default), name: value})  # only this field differs
            assert rows[i]["metric"] == ("fwd_bwd_ms" if backward else "fwd_ms")
            i += 1
    assert tune.default_launch(tune.FAMILY[op], "cpu") == default

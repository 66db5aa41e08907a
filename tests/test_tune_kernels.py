"""benchmarks/tune_kernels.py on the CPU, timings faked (no kernel runs): every knob it sweeps exists, each
measurement runs with its setting in place, and every default comes back afterwards, None (a per-call rule)
included."""
import pytest
import torch

from conftest import benchmark_script


@pytest.fixture(scope="module")
def tune_kernels():
    return benchmark_script("tune_kernels")


@pytest.mark.parametrize("op", ["fused_recurrent_rwkv7", "fused_recurrent_rwkv6", "chunk_rwkv7"])
def test_each_setting_is_in_place_while_measured_and_defaults_come_back(tune_kernels, monkeypatch, op):
    knobs = tune_kernels.knobs(op)
    defaults = [tune_kernels.setting(module, attr, key) for module, attr, key, _, _ in knobs]
    seen = []

    def fake_time(fn, x, do, kwargs, backward):
        seen.append([tune_kernels.setting(module, attr, key) for module, attr, key, _, _ in knobs])
        return 1.0

    monkeypatch.setattr(tune_kernels, "time_it", fake_time)
    monkeypatch.setattr(tune_kernels.bench, "on_device", lambda inputs: [t.requires_grad_() for t in inputs])
    monkeypatch.setattr(tune_kernels.bench, "cotangent", lambda x: torch.zeros(*x[0].shape[:3], 64))
    rows = []
    tune_kernels.sweep(op, 1, 16, rows, with_profile=False, with_sweep=True)
    assert len(rows) == len(seen) == sum(len(values) for *_, values, _ in knobs)
    i = 0
    for k, (module, attr, key, values, backward) in enumerate(knobs):
        for value in values:
            assert seen[i][k] == value and rows[i]["value"] == value
            assert rows[i]["metric"] == ("fwd_bwd_ms" if backward else "fwd_ms")
            i += 1
    assert [tune_kernels.setting(module, attr, key) for module, attr, key, _, _ in knobs] == defaults

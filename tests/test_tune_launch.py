"""The greedy pass of benchmarks/tune.py on the CPU: its ChunkLaunch choices are valid launch settings, and the pass
keeps a change only beyond noise (timings faked here: no kernel runs)."""
import pytest

from benchmarks import tune
from fla_lab.ops import ChunkLaunch

DEFAULT_LAUNCH = ChunkLaunch()  # off the GPU, the chunk ops' default


def test_every_choice_is_a_valid_launch_setting():
    for field, values in tune.CHOICES.items():
        assert getattr(DEFAULT_LAUNCH, field) in values, f"{field}: the default is not among the values tried"
        for value in values:
            ChunkLaunch(**{field: value})  # raises on an invalid tile width, warp or stage count


def test_greedy_pass_keeps_only_changes_beyond_noise(monkeypatch):
    def fake_timings(fn, inputs, kwargs):  # (fwd, fwd+bwd, peak): dqk_BK=16 is 10% faster, state_warps=2 0.5%
        launch = kwargs["launch"]
        fwd_bwd = 10.0 - (launch.dqk_BK == 16) * 1.0 - (launch.state_warps == 2) * 0.05
        return 3.0, fwd_bwd, 0.0

    monkeypatch.setattr(tune.common, "timings", fake_timings)
    result = tune.greedy("chunk_gla", B=1, T=16)
    assert result["launch"]["dqk_BK"] == 16
    assert result["launch"]["state_warps"] == DEFAULT_LAUNCH.state_warps
    assert result["best"]["fwd_bwd_ms"] == pytest.approx(9.0)

"""The audit on models built from flash-linear-attention's own layers (CUDA and FLA only).

- FLA's ops that agree with the float64 reference pass (RWKV-7's chunk path, bf16, two truncated-BPTT segments);
- the audit's control, an op swapped into an FLA layer that reads half its initial state, is flagged on the
  segment that has one only, on RWKV-7's, GLA's and GSA's layers;
- on FLA 0.6.0, fused_recurrent_rwkv6's backward with a final-state cotangent is flagged (README: it drops `dht`),
  through the `audit` command, which exits 1 and writes its JSON.
"""
import argparse
import importlib.util
import json

import pytest
import torch

from fla_lab.spec import upstream
from fla_lab.tools import audit, fla_audit

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="FLA's kernels need a CUDA device"),
    pytest.mark.skipif(importlib.util.find_spec("fla") is None,
                       reason="flash-linear-attention is not installed (pip install flash-linear-attention fla-core)"),
]

T, SEGMENTS, LAYERS = 256, 2, 2  # FLA's RWKV7Attention needs 2 layers: its init divides by layers - 1


@pytest.fixture(autouse=True)
def first_config(monkeypatch):
    """FLA's autotuners keep their first config: these tests are about the audit's verdicts, and a fresh machine
    would otherwise compile and time every config of every kernel first (minutes per op)."""
    from triton.runtime import autotuner

    monkeypatch.setattr(autotuner.Autotuner, "_bench", upstream.first_config_timings)


def _model(family: str, mode: str = "chunk"):
    torch.manual_seed(0)
    return fla_audit.SmallModel(family, layers=LAYERS, mode=mode).to("cuda", torch.bfloat16)


def _audited_step(model) -> audit.Auditor:
    tokens, targets = (torch.randint(0, 1024, (1, T), device="cuda") for _ in range(2))
    with audit.audit(model, fla=True) as recorded:
        fla_audit.training_step(model, tokens, targets, SEGMENTS)
    return recorded


def test_fla_ops_that_agree_pass():
    recorded = _audited_step(_model("rwkv7"))
    assert [c.op for c in recorded.calls] == ["chunk_rwkv7"] * SEGMENTS * LAYERS, recorded.report()
    assert recorded.calls[0].dht[0] is not None  # truncated BPTT sent a final-state cotangent
    assert not recorded.wrong(), recorded.report()


@pytest.mark.parametrize("family", ["rwkv7", "gla", "gsa"])
def test_a_wrong_op_swapped_into_an_fla_layer_is_flagged(family):
    """The audit's control (`--control`): an op reading half its initial state, swapped into FLA's layer, is flagged
    on every call that gets an initial state (the second segment's) and on no other."""
    model = _model(family)
    with fla_audit.control_swap(family):
        recorded = _audited_step(model)
    results = recorded.results()  # segment by segment, layer by layer
    assert all(r.ok for r in results[:LAYERS]), recorded.report()  # no initial state to misread
    assert not any(r.ok for r in results[LAYERS:]), recorded.report()
    assert fla_audit.control_flagged(recorded)[0]


@pytest.mark.skipif(upstream.version() != "0.6.0", reason="the discrepancy was found on FLA 0.6.0")
def test_fused_recurrent_rwkv6_final_state_cotangent_is_flagged_on_060(tmp_path):
    path = tmp_path / "audit.json"
    args = argparse.Namespace(fla="rwkv6", layers=1, T=T, B=1, tbptt=SEGMENTS, dtype="fp32", mode="fused_recurrent",
                              hidden=256, kernel=False, warmup=0, seed=0, first_config=True, control=False,
                              json=str(path))
    assert fla_audit.run(args) == 1
    calls = json.loads(path.read_text())["calls"]
    with_dht = [c for c in calls if c["final_state_cotangent"]]
    assert with_dht and all(not c["ok"] and c["worst"] in ("dk", "dv", "dw") for c in with_dht), calls
    assert all(c["ok"] for c in calls if not c["final_state_cotangent"]), calls

"""Training length, on a GPU: every op in bf16 at T = 4096 (the chunked ops also at T = 16384) against the float64
reference: output, final state and every gradient, initial state and final-state cotangent included.

Weak decay is the hard case for the decay gradient: dg_t sums the terms of every later step, which nearly cancel,
so a sum over the whole sequence would keep the rounding of every dq and dk (2-3e-2 in bf16 at T = 4096 before the
per-chunk boundary form, above the bf16 tolerance). CUDA only (the interpreter would take hours): the `unit-cuda`
phase runs it.
"""
import pytest
import torch

from fla_lab.spec import registry
from fla_lab import runtime

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(runtime.device() != "cuda", reason="needs a CUDA device")]

CHUNKED = ("chunk_gla", "chunk_rwkv6", "chunk_gsa", "chunk_rwkv7")
RECURRENT = ("fused_recurrent_gla", "fused_recurrent_rwkv6", "fused_recurrent_gsa", "fused_recurrent_rwkv7")
CASES = ([(name, 4096, decay) for name in CHUNKED + RECURRENT for decay in (1e-3, 1.0)]
         + [(name, 16384, 1e-3) for name in CHUNKED])


@pytest.mark.parametrize("name,T,decay", CASES, ids=[f"{n}-T{T}-m{d:g}" for n, T, d in CASES])
def test_bf16_at_training_length(name, T, decay):
    spec = registry.get(name)
    inputs = spec.inputs(registry.Shape(1, T, 2, 64, 64, M=64), decay=decay)
    result = spec.compare(inputs, dtype=torch.bfloat16, reference_device="cuda")
    assert result.ok, f"{name} T={T} m={decay:g}: {result} (beyond tolerance: {result.failures()})"

"""The GPU numbers the notebooks quote, measured again on the GPU this runs on (skipped without CUDA).

Notebooks print stored H200 measurements under the interpreter (CI has no GPU). On a GPU machine the `unit-cuda`
phase of `workbook.py test` runs this file, so a quoted number that no longer holds (another Triton, another
kernel) fails there instead of staying in the notebook unchecked:

- `overflow.GPU_THRESHOLDS` (notebook 03a): the decay knob at which the buggy `chunk_rwkv6` forward first turns
  non-finite, per dtype and chunk size, bisected on the GPU;
- `amp.CUDA_AUTOCAST_BF16` (notebook 05): the result dtype of each op under CUDA autocast;
- the GPU atlas's bf16 `dg` of the fixed `chunk_gsa` at weak decay (notebooks 03b and 06, read from
  `fla_lab/tools/gpu_runs/atlas_gpu.json`): one setting of `python -m benchmarks.atlas_gpu`, measured again.
"""
import math

import pytest
import torch

from fla_lab import runtime

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(runtime.device() != "cuda", reason="needs a CUDA device")]

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _finite(decay: float, chunk_size: int, dtype: torch.dtype) -> bool:
    from fla_lab.spec import harness
    from fla_lab.teaching.lessons import overflow

    x = harness.leaves(overflow.inputs(decay, T=128, K=16), dtype, "cuda", grads=False)
    with torch.no_grad():
        o, _ = overflow.chunk_op(overflow.BUG, chunk_size)(**x)
    return bool(torch.isfinite(o).all())


def _threshold(chunk_size: int, dtype: torch.dtype, lo: float = 1.0, hi: float = 1e4, steps: int = 24) -> float:
    """Geometric bisection for the first decay knob at which the buggy forward is non-finite (inf: never)."""
    if _finite(hi, chunk_size, dtype):
        return math.inf
    for _ in range(steps):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if _finite(mid, chunk_size, dtype) else (lo, mid)
    return hi


@pytest.mark.parametrize("name", ["fp32", "fp16", "bf16"])
def test_overflow_gpu_thresholds_hold_on_this_gpu(name):
    from fla_lab.teaching.lessons import overflow

    quoted = overflow.GPU_THRESHOLDS[name]
    measured = {cs: _threshold(cs, DTYPES[name]) for cs in quoted}
    for cs, value in quoted.items():
        if math.isinf(value):
            assert math.isinf(measured[cs]), (name, cs, measured)
        else:
            assert measured[cs] == pytest.approx(value, abs=0.01), (name, cs, measured)


def test_cuda_autocast_table_holds_on_this_gpu():
    from fla_lab.teaching.lessons import amp

    assert amp.autocast_dtypes("cuda") == amp.CUDA_AUTOCAST_BF16


@pytest.mark.parametrize("decay", [1e-3, 1.0])
def test_gpu_atlas_gsa_dg_holds_on_this_gpu(decay):
    """chunk_gsa (fixed) bf16 at B=1, T=512, H=4, K=V=M=64: the scale-aware dg error the atlas json quotes."""
    from fla_lab.tools import atlas
    from fla_lab.teaching.lessons import gsa_padding

    quoted = gsa_padding.gpu_dg_errors()[(512, decay)]["scale-aware"]
    (setting,) = atlas.settings(["chunk_gsa"], variants=["fixed"], dtypes=("bf16",), decays=(decay,), lengths=(512,),
                                combinations=[(True, True)], B=1, H=4, K=64, V=64, M=64)  # as the json's records
    record = atlas.measure(setting)
    assert record["status"] != "raises", record["message"]
    # same seed, same inputs: the same kernel on the same software lands on the same error; another GPU or Triton
    # may round differently, but not by more than this
    assert record["errors"]["dg"] == pytest.approx(quoted, rel=0.25), (record["errors"]["dg"], quoted)

"""chunk_rwkv7 beyond the cases it shares with the recurrent kernel (`test_rwkv7.py`): the whole decay range in
every dtype, agreement with `fused_recurrent_rwkv7`, what it saves for the backward, and its chunk size."""
from __future__ import annotations

import functools

import pytest
import torch

from fla_lab.spec import check, harness, reference
from fla_lab import runtime
from fla_lab.ops import RWKV7ChunkLaunch, chunk_rwkv7, default_launch, fused_recurrent_rwkv7
from fla_lab.ops.common import launch as launch_module
from fla_lab.ops.rwkv7 import chunk as chunk_module

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
DECAYS = [1e-3, 1.0, 30.0, 100.0, 1e3, 1e4]


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("decay", DECAYS)
def test_exact_over_the_decay_range(decay, dtype):
    """Per-step log-decay -m * U(0.05, 1) from m = 1e-3 to 1e4: no exponent is ever positive, so nothing to
    promise and no fast path to fall out of. Odd T (a partial last chunk), K != V, an initial state; one head (the
    heads' offsets: `test_rwkv7.py`'s cases)."""
    inputs = harness.rwkv7_inputs(1, 37, 1, 32, 48, decay=decay, initial_state=True, seed=int(decay * 10) % 97)
    result = harness.compare(chunk_rwkv7, reference.recurrent_rwkv7, inputs, dtype=dtype)
    assert result.ok, f"{result.failures()} | {result}"


def test_narrow_state_tiles():
    """The two sequential passes split V over several programs (`state_BV`), each with its own share of dw's
    boundary term: still exact, initial state and final-state cotangent included."""
    inputs = harness.rwkv7_inputs(1, 37, 2, 32, 48, decay=3.0, initial_state=True, seed=3)
    op = functools.partial(chunk_rwkv7, launch=RWKV7ChunkLaunch(state_BV=16))
    result = harness.compare(op, reference.recurrent_rwkv7, inputs)
    assert result.ok, f"{result.failures()} | {result}"


@pytest.mark.parametrize("decay", [None, 1e4])
def test_agrees_with_the_recurrent_kernel(decay):
    """Two algorithms (a chunked WY solve, a step-by-step recurrence) on the same fp32 inputs."""
    inputs = harness.rwkv7_inputs(2, 45, 1, 16, 32, decay=decay, seed=5)
    outs = []
    for op in (chunk_rwkv7, fused_recurrent_rwkv7):
        x = {n: t.to(runtime.device()).requires_grad_() for n, t in inputs.items()}
        o, ht = op(**x, output_final_state=True)
        (o.sum() + ht.square().sum()).backward()
        outs.append({"o": o, "ht": ht, **{f"d{n}": t.grad for n, t in x.items()}})
    for name in ("o", "ht"):
        check.assert_close(name, outs[0][name], outs[1][name].double(), check.tolerance(F32).fwd)
    grads = [{n: g for n, g in out.items() if n.startswith("d")} for out in outs]
    errors = check.grad_errors({n: g.double() for n, g in grads[1].items()}, grads[0])  # scale-aware
    assert max(errors.values()) <= check.tolerance(F32).grad, errors


def test_saves_only_its_inputs():
    """Everything the backward needs is recomputed: nothing per chunk or per step is kept between passes."""
    inputs = harness.rwkv7_inputs(1, 40, 1, 16, 16)
    o, _ = chunk_rwkv7(**{n: t.to(runtime.device()).requires_grad_() for n, t in inputs.items()})
    saved = [t for t in o.grad_fn.saved_tensors if t is not None]
    assert sum(t.numel() for t in saved) == sum(t.numel() for t in inputs.values())


@pytest.mark.parametrize("chunk_size", [None, 16, 32, 64])
def test_accepts_fla_chunk_sizes(chunk_size):
    """FLA's 16, 32 and 64 are tilings of one recurrence; fla_lab runs each as 16-row chunks: the same numbers."""
    inputs = {n: t.to(runtime.device()) for n, t in harness.rwkv7_inputs(1, 37, 1, 16, 16).items()}
    o, _ = chunk_rwkv7(**inputs, chunk_size=chunk_size)
    assert torch.equal(o, chunk_rwkv7(**inputs)[0])


@pytest.mark.parametrize("chunk_size", [8, 24, 128])
def test_rejects_other_chunk_sizes(chunk_size):
    inputs = harness.rwkv7_inputs(1, 5, 1, 16, 16)
    with pytest.raises(ValueError, match=f"chunk_size={chunk_size}.*{chunk_module.CHUNK}"):
        chunk_rwkv7(**inputs, chunk_size=chunk_size)


def test_rejects_head_first():
    """#150's second reproduction passes `head_first=True`; upstream removed the argument (a TypeError)."""
    inputs = harness.rwkv7_inputs(1, 5, 1, 16, 16)
    with pytest.raises((TypeError, ValueError), match="head_first"):
        chunk_rwkv7(**inputs, head_first=True)


@pytest.mark.parametrize("B, width", [(4, 16), (8, 32), (16, 64), (64, 64)])
def test_state_tiles_narrow_until_the_passes_fill_every_sm(monkeypatch, B, width):
    """`state_BV = None` on an H200 (132 SMs), 16 heads, V = 64: the widths measured fastest there, by how full the
    pass keeps the SMs, the forward's at most 32 columns; off the GPU 32."""
    x = torch.empty(B, 4096, 16, 64)
    launch, per_call = default_launch("rwkv7_chunk", x), RWKV7ChunkLaunch()
    assert launch.state_width(x, 64, backward=True) == launch.state_width(x, 64) == 32
    assert per_call.state_width(x, 64) == 32
    monkeypatch.setattr(launch_module, "gpu_sms", lambda _: 132)
    assert per_call.state_width(x, 64, backward=True) == width
    assert per_call.state_width(x, 64) == min(width, 32)

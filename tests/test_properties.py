"""Property tests: every fixed op of the registry against its float64 reference on Hypothesis-drawn cases.

For each op in `registry.names()` Hypothesis draws B in 1..2, H in 1..2, K and V independently from
16/24/32/48/64 (non-powers of two, K != V; GSA's slots M from 16/20/32), T in 1..80 // (B*H) (odd lengths,
partial chunks), with or without an initial state, fp32/bf16/fp16, a per-step decay magnitude 10**e with e
uniform in [-3, 4] (log-uniform over 1e-3..1e4), a chunk size from `spec.chunk_sizes` where the op has one, and
a seed (plus one explicit corner, `CORNER`); then `spec.compare` checks the output, final state(s) and every
gradient against `check.tolerance(dtype)`. The fixed kernels are meant to pass on every such case, fp16 at decay
1e4 and bf16 included.

Under the Triton interpreter one case costs 0.2-8 s, growing with B*H*T (one program per batch and head, one
interpreted step per row or chunk; K and V barely matter: a tile is one numpy array), so each op gets only a few
examples (`EXAMPLES`), B*H*T is bounded (`WORK`), the cases are derandomized (the same on every run: CI is
reproducible) and not shrunk (a failure is reported as drawn). `FLA_LAB_PROPERTY_EXAMPLES=<n>` raises the
count for a longer local run, and turns shrinking on. On CUDA the same tests run unchanged.
"""
import os

import pytest
import torch
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from fla_lab.spec import registry
from fla_lab.ops.rwkv7.fused_recurrent import MAX_K

LOCAL_EXAMPLES = os.environ.get("FLA_LAB_PROPERTY_EXAMPLES")
EXAMPLES = int(LOCAL_EXAMPLES or 5)
WORK = 80  # bound on B*H*T: one head of T=80 (under the interpreter, the slowest op's call takes ~5 s)
WIDTHS = (16, 24, 32, 48, 64)
assert max(WIDTHS) <= MAX_K, "the RWKV-7 ops reject K > MAX_K (one program holds a whole key row of its state tile)"
SLOTS = (16, 20, 32)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@st.composite
def cases(draw):
    B, H = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    K, V = draw(st.sampled_from(WIDTHS)), draw(st.sampled_from(WIDTHS))
    T = draw(st.integers(1, WORK // (B * H)))
    return dict(
        shape=registry.Shape(B, T, H, K, V, M=draw(st.sampled_from(SLOTS))),
        initial_state=draw(st.booleans()),
        dtype=draw(st.sampled_from(DTYPES)),
        decay=10.0 ** draw(st.floats(-3.0, 4.0)),
        chunk=draw(st.integers(0, 2)),  # index into the op's `chunk_sizes` (modulo; ignored without one)
        seed=draw(st.integers(0, 2**16)),
    )


# Run for every op besides the drawn cases: fp16 at the strongest decay, with an initial state, partial last chunks
# (T = 33) and K != V, neither a power of two. Five draws per op rarely land there.
CORNER = dict(shape=registry.Shape(1, 33, 1, 48, 24, M=20), initial_state=True, dtype=torch.float16, decay=1e4,
              chunk=0, seed=0)


@pytest.mark.filterwarnings("ignore::fla_lab.ops.LayoutWarning")  # T < H is a legitimate draw here
@pytest.mark.parametrize("name", registry.names())
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          phases=(Phase.explicit, Phase.generate, *((Phase.shrink,) if LOCAL_EXAMPLES else ())),
          suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
@example(case=CORNER)
def test_fixed_op_matches_reference(name, case):
    spec = registry.get(name)
    sizes = spec.chunk_sizes
    chunk_size = sizes[case["chunk"] % len(sizes)] if sizes else None  # chunk_rwkv7: None (its only size, 16)
    x = spec.inputs(case["shape"], decay=case["decay"], initial_state=case["initial_state"], seed=case["seed"])
    result = spec.compare(x, dtype=case["dtype"], chunk_size=chunk_size, seed=case["seed"])
    assert result.ok, f"{name} {case} chunk_size={chunk_size}: failures {result.failures()} | {result}"

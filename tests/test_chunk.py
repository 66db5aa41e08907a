"""Chunked GLA and RWKV6 kernels against the float64 references: output, final state and every gradient.

Bug #77 (`bug="exclusive_reference"`) is reproduced in test_bugs.py; here only: GLA has no switch and no NaN.
"""
import functools

import pytest
import torch

from fla_lab.spec import check, harness, reference
from fla_lab import device
from fla_lab.ops import ChunkLaunch, chunk_gla, chunk_rwkv6, fused_recurrent_gla, fused_recurrent_rwkv6

FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16
GLA_NAMES, RWKV6_NAMES = ("q", "k", "v", "g"), ("r", "k", "v", "w")


def _on_device(x):
    """Inputs built on the CPU (reproducible), moved to where the kernels run (harness.compare does the same)."""
    return {name: t.to(device()) for name, t in x.items()}

# A covering list, not a product: every T, K/V pair, B, H, dtype, decay magnitude, initial-state setting and
# chunk size appears at least once, and partial last chunks meet strong decays (the padded-row hazard).
CASES = [  # B, T, H, K, V, dtype, decay, h0, chunk_size
    (1, 1, 1, 32, 64, FP32, 1.0, True, 64),
    (2, 15, 2, 64, 16, FP32, 1e-3, False, 16),
    (1, 63, 3, 32, 64, BF16, 1.0, True, 32),
    (1, 64, 1, 64, 64, FP16, 10.0, True, 64),
    (1, 65, 4, 64, 16, FP32, 100.0, False, 16),
    (1, 200, 1, 32, 64, FP32, 1e4, True, 64),
    (2, 33, 2, 48, 24, FP32, 30.0, True, 32),  # K, V not powers of two: masked tiles
    (1, 65, 2, 32, 64, FP16, 1e-3, False, 64),
    (2, 40, 1, 64, 16, BF16, 1e4, False, 16),
    (1, 17, 2, 16, 32, FP32, 1.0, True, 16),
    (1, 130, 1, 64, 64, BF16, 100.0, True, 64),
    (2, 15, 1, 32, 64, FP16, 1e4, True, 32),
]


def _ids(case):
    B, T, H, K, V, dtype, decay, h0, cs = case
    return f"B{B}-T{T}-H{H}-K{K}-V{V}-{str(dtype)[6:]}-m{decay:g}-{'h0' if h0 else 'noh0'}-c{cs}"


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_chunk_gla(case):
    B, T, H, K, V, dtype, decay, h0, cs = case
    x = harness.gated_inputs(B, T, H, K, V, decay=decay, initial_state=h0, seed=T, names=GLA_NAMES)
    result = harness.compare(functools.partial(chunk_gla, chunk_size=cs), reference.recurrent_gla, x, dtype=dtype,
                             seed=T)
    assert result.ok, f"{result.failures()} | {result}"


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_chunk_rwkv6(case):
    B, T, H, K, V, dtype, decay, h0, cs = case
    x = harness.gated_inputs(B, T, H, K, V, decay=decay, initial_state=h0, bonus=True, seed=T + 1,
                             names=RWKV6_NAMES)
    result = harness.compare(functools.partial(chunk_rwkv6, chunk_size=cs), reference.recurrent_rwkv6, x,
                             dtype=dtype, seed=T)
    assert result.ok, f"{result.failures()} | {result}"


@pytest.mark.parametrize("op, ref, bonus", [(chunk_gla, reference.recurrent_gla, False),
                                            (chunk_rwkv6, reference.recurrent_rwkv6, True)], ids=["gla", "rwkv6"])
def test_narrow_state_and_output_tiles(op, ref, bonus):
    """The state passes and the output kernel split V over several programs (each state tile carries its own
    share of dg's boundary term): same results as one tile, initial state and final-state cotangent included."""
    names = RWKV6_NAMES if bonus else GLA_NAMES
    x = harness.gated_inputs(1, 41, 2, 32, 48, decay=3.0, initial_state=True, bonus=bonus, seed=5, names=names)
    launch = ChunkLaunch(state_BV=16, state_warps=2, state_stages=2, out_BV=16, out_warps=2)
    result = harness.compare(functools.partial(op, chunk_size=16, launch=launch), ref, x)
    assert result.ok, f"{result.failures()} | {result}"


def test_explicit_scale_and_no_final_state():
    x = harness.gated_inputs(1, 20, 2, 16, 16, initial_state=False, bonus=True, names=RWKV6_NAMES)
    o, ht = chunk_rwkv6(**_on_device(x), scale=0.3, chunk_size=16)
    ref, _ = reference.recurrent_rwkv6(**x, scale=0.3)
    assert ht is None
    check.assert_close("o", o, ref, check.tolerance(FP32).fwd)


@pytest.mark.parametrize("chunk_size", [0, 8, 48, 100])
def test_chunk_size_must_be_a_power_of_two_of_at_least_16(chunk_size):
    x = harness.gated_inputs(1, 8, 1, 16, 16, initial_state=False, names=GLA_NAMES)
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_gla(**_on_device(x), chunk_size=chunk_size)


def test_chunk_agrees_with_fused_recurrent():
    x = _on_device(harness.gated_inputs(1, 50, 2, 32, 48, decay=3.0, initial_state=True, bonus=True,
                                        names=RWKV6_NAMES))
    tol = check.tolerance(FP32).fwd
    for chunked, fused, args in ((chunk_gla, fused_recurrent_gla, (x["r"], x["k"], x["v"], x["w"])),
                                 (chunk_rwkv6, fused_recurrent_rwkv6, (x["r"], x["k"], x["v"], x["w"], x["u"]))):
        o1, h1 = chunked(*args, initial_state=x["initial_state"], output_final_state=True, chunk_size=16)
        o2, h2 = fused(*args, initial_state=x["initial_state"], output_final_state=True)
        check.assert_close(f"{chunked.__name__} o", o1, o2, tol)
        check.assert_close(f"{chunked.__name__} ht", h1, h2, tol)


def _fla_error_ratio(ref, got) -> float:
    """flash-linear-attention's test metric (`fla.utils.get_err_ratio`): RMS(ref - got) / RMS(ref)."""
    ref, got = ref.double().cpu(), got.double().cpu()
    return float((ref - got).square().mean().sqrt() / ref.square().mean().sqrt())


def test_chunk_gla_at_head_dim_512_in_bf16():
    """FLA's test_chunk case D = 512 in bf16 (its inputs: q, k, v ~ U(0, 1), g = logsigmoid(U(0, 1)), h0 ~ U(0, 1);
    T and H shrunk for the interpreter): every result within fla_lab's bf16 tolerance of the float64 reference, and
    the output within FLA's 4e-3 error ratio of it: 1.7e-3 with bf16 stores rounded to nearest, as a GPU's (the
    interpreter's own truncating stores gave 3.4e-3; `runtime.round_bf16_casts_to_nearest`)."""
    gen = torch.Generator().manual_seed(42)
    q, k, v = (torch.rand(1, 128, 1, 512, generator=gen) for _ in range(3))
    x = dict(q=q, k=k, v=v, g=torch.nn.functional.logsigmoid(torch.rand(1, 128, 1, 512, generator=gen)),
             initial_state=torch.rand(1, 1, 512, 512, generator=gen))
    result = harness.compare(chunk_gla, reference.recurrent_gla, x, dtype=BF16)
    assert result.ok, f"{result.failures()} | {result}"
    assert _fla_error_ratio(result.outputs["o_ref"], result.outputs["o"]) < 4e-3


# ---- bug #77 (`bug="exclusive_reference"`) is reproduced in test_bugs.py; GLA has no such switch

def test_gla_has_no_bug_switch_and_no_nan_at_strong_decay():
    x = harness.gated_inputs(1, 80, 2, 32, 16, decay=1e4, initial_state=True, names=GLA_NAMES)
    with pytest.raises(TypeError):
        chunk_gla(**_on_device(x), bug="exclusive_reference")
    result = harness.compare(functools.partial(chunk_gla, chunk_size=32), reference.recurrent_gla, x)
    assert result.ok, f"{result.failures()} | {result}"


def test_unknown_bug_is_rejected():
    x = harness.gated_inputs(1, 8, 1, 16, 16, initial_state=False, bonus=True, names=RWKV6_NAMES)
    with pytest.raises(ValueError, match="unknown bug"):
        chunk_rwkv6(**_on_device(x), bug="transposed_h0_mask")


@pytest.mark.parametrize("B, width", [(1, 16), (4, 32), (8, 64), (16, 64)])
def test_state_tiles_narrow_until_the_state_passes_fill_the_gpu(B, width):
    """`ChunkLaunch(state_BV=None)`: 16 heads, V = 64, an H200's 132 SMs; the widths measured fastest there
    (chunk_gla and chunk_gsa, 65536 tokens: B = 1 -> 16, B = 4 -> 32, B = 16 -> 64)."""
    from fla_lab.ops.common.launch import filling_width
    assert filling_width(64, 64, B * 16, 132) == width


def test_a_packed_batch_counts_as_its_tokens_over_its_longest_sequence():
    from fla_lab.ops.common.conventions import packed
    from fla_lab.ops.common.launch import parallel_sequences
    assert parallel_sequences(1, 4096, packed([(0, 1024), (1024, 4096)], 64, "cpu")) == 4096 / 3072
    assert parallel_sequences(8, 4096, None) == 8
    x = torch.empty(1, 4096, 16, 64)
    assert ChunkLaunch(state_BV=32).state_width(x, 64, 16, None) == 32  # a given width is kept
    assert ChunkLaunch().state_width(x, 64, 16, None) == 64  # off the GPU: the widest tile

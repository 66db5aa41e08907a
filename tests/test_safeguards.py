"""Every numerical safeguard (fla_lab.spec.safeguards) has a test that fails when its line is reverted to the naive form.

`test_<id>` drives the inputs into the range where safeguard <id> matters (large logits, strong decay, bf16, tiny
gates) and passes with the shipped line. `test_the_naive_form_fails_its_test` (opt-in, FLA_LAB_SAFEGUARD_MUTATIONS=1:
one subprocess per safeguard) applies each naive form to an export of HEAD with the mutation check's own mechanism
and runs `test_<id>` there: it must fail.
The tests of a safeguard import `fla_lab.spec.safeguards` lazily: they also run against a copy where it is absent.
"""
import ast
import functools
import os
import shutil
import sys
from types import SimpleNamespace

import pytest
import torch

import fla_lab
from fla_lab.spec import reference, registry
from fla_lab import runtime
from fla_lab.layers.gsa import GatedSlotAttention
from fla_lab.layers.rwkv6 import RWKV6Attention

DEV = fla_lab.device()
HERE = os.path.abspath(__file__)


@functools.cache
def _failure(check, *args) -> str | None:
    """What `check(*args)` asserted, or None when it passed: run once per process, however many safeguards it
    tests (the mutation check runs each `test_<id>` in a process of its own)."""
    try:
        check(*args)
    except AssertionError as e:
        return str(e) or "assertion failed"
    return None


def _passes(check, *args):
    failure = _failure(check, *args)
    assert failure is None, failure


def _close(x, ref, rtol):
    x, ref = x.double().cpu(), ref.double().cpu()
    assert torch.isfinite(x).all(), "non-finite values"
    err = ((x - ref).abs().max() / ref.abs().max().clamp_min(1e-300)).item()
    assert err <= rtol, f"relative error {err:.2e} > {rtol:.0e}"


# --- the inventory ---------------------------------------------------------------------------------------------------

def test_every_entry_locates_its_marked_line_and_its_naive_form_changes_that_line_only():
    """(tests/test_markers.py: each id marks exactly one line, and every safeguard marker is an entry's.)"""
    from fla_lab.spec import safeguards

    entries = safeguards.inventory()
    ids = [e.guard.id for e in entries]
    assert len(ids) == len(set(ids))
    for e in entries:
        g = e.guard
        assert g.protects in safeguards.PROTECTS and g.ops and g.what, g.id
        text = safeguards.source(e)
        assert g.bug is None or g.naive in text, g.id  # a bug switch's naive form is its helper, in the same file
        naive = safeguards.with_naive(e)
        changed = [a for a, b in zip(text.splitlines(), naive.splitlines()) if a != b]
        assert changed == [text.splitlines()[e.line - 1]], (g.id, changed)  # exactly one line: the entry's
        assert ast.dump(ast.parse(naive)) != ast.dump(ast.parse(text)), g.id  # and it changes what runs


def test_each_safeguard_without_a_bug_switch_has_its_test_here_or_a_mutation():
    from fla_lab.spec import safeguards

    for g in safeguards.REGISTRY:
        if g.bug is None and g.mutation is None:
            assert f"test_{g.id}" in globals(), g.id
        for node in g.catching_tests():  # every named test exists
            path, name = node.split("::")
            assert f"def {name.split('[')[0]}(" in (safeguards.ROOT / path).read_text(), (g.id, node)


def test_the_mutation_check_reverts_each_safeguard_that_is_not_a_bug_switch():
    from dev import mutation_check
    from fla_lab.spec import markers, safeguards

    by_id = {m.id: m for m in mutation_check.MUTATIONS}
    for g in safeguards.REGISTRY:
        if g.bug is None:
            m = by_id[g.mutation or g.id]
            line = markers.find(m.marker, m.id)
            assert m.new == g.naive and line.where == markers.find("safeguard", g.id).where, g.id


def test_the_guide_section_is_current():
    from fla_lab.spec import safeguards

    text = safeguards.GUIDE.read_text()
    assert safeguards.render_guide(text) == text, "run: python -m fla_lab safeguards --write"


# --- one test per safeguard -------------------------------------------------------------------------------------------

def test_gsa_softmax_max_first():
    from fla_lab.ops.gsa.chunk import slot_softmax

    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0)) * 3 + 100  # logits above exp's 88
    _close(slot_softmax(x.to(DEV), torch.float32, rows=4), torch.softmax(x.double(), -1), 1e-5)


def test_gsa_softmax_bwd_max_first():
    from fla_lab.ops.gsa.chunk import slot_softmax_backward

    gen = torch.Generator().manual_seed(1)
    x, dp = torch.randn(8, 16, generator=gen) * 3 + 100, torch.randn(8, 16, generator=gen)
    xd = x.double().requires_grad_()
    torch.softmax(xd, -1).backward(dp.double())
    _close(slot_softmax_backward(x.to(DEV), dp.to(DEV), rows=4), xd.grad, 1e-5)


def _final_state(gate_v: bool):
    """The state pass over one 64-row chunk whose cumulative log-decay reaches about -190, against float64."""
    from fla_lab.ops.common.chunk import chunk_cumsum, forward_states
    from fla_lab.ops.common.launch import resolve

    gen = torch.Generator().manual_seed(2)
    k, v = torch.randn(1, 64, 1, 16, generator=gen), torch.randn(1, 64, 1, 16, generator=gen)
    g = -3 * (0.5 + torch.rand(1, 64, 1, 16, generator=gen))
    gi = chunk_cumsum(g.to(DEV), 64)
    _, ht = forward_states(k.to(DEV), v.to(DEV), gi, None, True, 64, resolve(None, "chunk", k), gate_v)
    G = g.double().cumsum(1)[0, :, 0]
    w = (G[-1] - G).exp()
    k, v = k[0, :, 0].double(), v[0, :, 0].double()
    ref = k.T @ (v * w) if gate_v else (k * w).T @ v
    return ht[0, 0], ref


def test_state_key_decay_to_chunk_end():
    _close(*_final_state(gate_v=False), 1e-5)


def test_state_value_decay_to_chunk_end():
    _close(*_final_state(gate_v=True), 1e-5)


def _rwkv7_close(backward: bool):
    """chunk_rwkv7 against float64 with a per-step decay of up to 30: a 16-row chunk's decay passes 88."""
    from fla_lab.spec import harness
    from fla_lab.ops import chunk_rwkv7

    x = harness.rwkv7_inputs(1, 32, 1, 16, 16, decay=30.0, initial_state=False, seed=3)
    _outputs_close(chunk_rwkv7, reference.recurrent_rwkv7, x, backward)


def _outputs_close(op, ref, x: dict, backward: bool, rtol=1e-4):
    """op's output and final state (and with `backward`, the input gradients) against `ref` in float64."""
    xs = {n: t.detach().to(DEV).requires_grad_(backward) for n, t in x.items()}
    xd = {n: t.detach().double().requires_grad_(backward) for n, t in x.items()}
    got, want = _flat(op(**xs, output_final_state=True)), _flat(ref(**xd, output_final_state=True))
    for a, b in zip(got, want):
        _close(a, b, rtol)
    if backward:
        sum(y.sum() for y in got).backward()
        sum(y.sum() for y in want).backward()
        for n in x:
            _close(xs[n].grad, xd[n].grad, rtol)


def _flat(outputs) -> list:
    """(o, state) or (o, (state, state)) as a flat list of tensors."""
    return [y for x in outputs for y in (x if isinstance(x, tuple) else (x,))]


def _gsa_close():
    """chunk_gsa's output, states and gradients against float64 with a per-step decay of up to 30."""
    from fla_lab.spec import harness
    from fla_lab.ops import chunk_gsa

    x = harness.gsa_inputs(1, 64, 1, 16, 16, 16, decay=30.0, initial_state=False, seed=8)
    _outputs_close(functools.partial(chunk_gsa, chunk_size=64), reference.recurrent_gsa, x, backward=True)


def test_gsa_dv_state_decay_to_chunk_end():
    _passes(_gsa_close)


def test_plain_rows_decay_to_chunk_end():
    _passes(_gsa_close)


def test_rwkv7_state_decay_to_chunk_end():
    _passes(_rwkv7_close, False)


def test_rwkv7_reader_weight_masked_before_exp():
    _passes(_rwkv7_close, True)


def test_rwkv7_writer_weight_masked_before_exp():
    _passes(_rwkv7_close, True)


def _gla_close():
    """chunk_gla's output, state and gradients against float64, one 64-row chunk whose cumulative log-decay reaches
    about -320 (-80 at its second sub-chunk, -160 at its third): every sub-chunk block, diagonal and off it, sees
    decays past exp's 88."""
    from fla_lab.ops import chunk_gla

    gen = torch.Generator().manual_seed(7)
    x = {n: torch.randn(1, 64, 1, 16, generator=gen) for n in "qkv"}
    x["g"] = -5 * (0.5 + torch.rand(1, 64, 1, 16, generator=gen))
    _outputs_close(functools.partial(chunk_gla, chunk_size=64), reference.recurrent_gla, x, backward=True)


def test_gla_dk_decay_to_chunk_end():
    _passes(_gla_close)


def _gates(x: torch.Tensor):
    """The GSA layer's gates with an identity projection (x is the gate logits)."""
    layer = SimpleNamespace(f_proj=lambda h: h, gate_fn="logsigmoid", gate_logit_normalizer=8, gate_clamp=None,
                            num_slots=16)
    return GatedSlotAttention.gates(layer, x)


def test_gsa_gate_logsigmoid():
    x = torch.linspace(-300, -50, 32).view(1, 1, 32)  # sigmoid underflows to 0 below about -104
    f, _ = _gates(x)
    _close(f.flatten(), torch.nn.functional.logsigmoid(x.double()).flatten() / 8, 1e-6)


def test_gsa_write_expm1():
    x = torch.linspace(12, 30, 32).view(1, 1, 32)  # f = logsigmoid(x) / 8 between -8e-7 and -1e-14
    _, s = _gates(x)
    _close(s.flatten(), -torch.expm1(torch.nn.functional.logsigmoid(x.double()) / 8).flatten(), 1e-5)


def test_gsa_gate_fp32():
    x = (torch.randn(1, 4, 32, generator=torch.Generator().manual_seed(5)) * 4).bfloat16()  # a bf16 projection
    f, s = _gates(x)
    f_ref = torch.nn.functional.logsigmoid(x.double()) / 8
    _close(f.flatten(), f_ref.flatten(), 1e-6)
    _close(s.flatten(), -torch.expm1(f_ref).flatten(), 1e-6)


def test_rwkv6_decay_fp32():
    xw = (torch.randn(1, 4, 32, generator=torch.Generator().manual_seed(6)) * 2).bfloat16()  # a bf16 LoRA output
    w = RWKV6Attention.log_decay(SimpleNamespace(w_lora=lambda h: h, bug=None), xw)
    assert w.dtype == torch.float32
    _close(w, -xw.double().exp(), 1e-6)


# the sub-chunk blocks' factors around the reference row (GLA's forward scores, dq and dk)

def test_earlier_rows_key_decay():
    _passes(_gla_close)


def test_earlier_rows_query_decay():
    _passes(_gla_close)


def test_later_rows_key_decay():
    _passes(_gla_close)


def test_later_rows_query_decay():
    _passes(_gla_close)


def test_gated_scores_query_decay():
    _passes(_gla_close)


def test_gated_scores_key_decay():
    _passes(_gla_close)


def test_folded_diagonal_decay():
    _passes(_gla_close)


def test_rwkv6_diagonal_masked_before_exp():
    """RWKV6's backward diagonal blocks: a per-step log-decay of 5 to 15, so a pair s > t eight rows apart has
    G_{t-1} - G_s past 88."""
    from fla_lab.ops import chunk_rwkv6

    gen = torch.Generator().manual_seed(10)
    x = {n: torch.randn(1, 32, 1, 16, generator=gen) for n in "rkv"}
    x["w"] = -10 * (0.5 + torch.rand(1, 32, 1, 16, generator=gen))
    x["u"] = torch.randn(1, 16, generator=gen)
    # dw, a difference of nearly equal terms at this decay, is good to 8e-5; the naive form gives NaN
    _outputs_close(functools.partial(chunk_rwkv6, chunk_size=32), reference.recurrent_rwkv6, x, True, rtol=1e-3)


def test_gsa_slot_diagonal_decay():
    _passes(_gsa_close)


def test_rwkv7_pair_weight_decay():
    _passes(_rwkv7_close, False)


# the slot softmax's padded slots, GSA's fp32 slot scores, ABC's gates

def _negative_logits():
    """[8, 12] slot logits all near -200 (M = 12: four padded slots in the kernel's 16-wide tile)."""
    return torch.randn(8, 12, generator=torch.Generator().manual_seed(11)) * 3 - 200


def test_gsa_softmax_pad_neg_inf():
    from fla_lab.ops.gsa.chunk import slot_softmax

    x = _negative_logits()
    _close(slot_softmax(x.to(DEV), torch.float32, rows=4), torch.softmax(x.double(), -1), 1e-5)


def test_gsa_softmax_bwd_pad_neg_inf():
    from fla_lab.ops.gsa.chunk import slot_softmax_backward

    x, dp = _negative_logits(), torch.randn(8, 12, generator=torch.Generator().manual_seed(12))
    xd = x.double().requires_grad_()
    torch.softmax(xd, -1).backward(dp.double())
    _close(slot_softmax_backward(x.to(DEV), dp.to(DEV), rows=4), xd.grad, 1e-5)


def _gsa_bf16_large_logits(op):
    """A GSA op on bf16 inputs whose slot logits reach tens (q x 30) against float64 on the same rounded inputs: the
    output's own bf16 rounding is 2e-3, a bf16 rounding of the logits moves the slot weights by percents."""
    from fla_lab.spec import harness

    x = harness.gsa_inputs(1, 64, 1, 16, 16, 16, decay=0.1, initial_state=False, seed=9)
    x = {n: (t * 30 if n == "q" else t).bfloat16() for n, t in x.items()}
    o, _ = op(**{n: t.to(DEV) for n, t in x.items()})
    want, _ = reference.recurrent_gsa(**{n: t.double() for n, t in x.items()})
    _close(o, want, 1e-2)


def test_gsa_slot_scores_fp32():
    from dataclasses import replace

    from fla_lab.ops import chunk_gsa
    from fla_lab.ops.common.launch import Precision, resolve

    # IEEE fp32 dots, as under the interpreter: on a GPU, bf16 operands would round the logits' terms as well
    launch = replace(resolve(None, "chunk", torch.zeros(1, device=DEV)), precision=Precision(dot_dtype=torch.float32))
    _gsa_bf16_large_logits(functools.partial(chunk_gsa, chunk_size=64, launch=launch))


def test_gsa_fused_slot_scores_fp32():
    from fla_lab.ops import fused_recurrent_gsa

    _gsa_bf16_large_logits(fused_recurrent_gsa)


def _abc_gates(s: torch.Tensor):
    """ABC's gates of `s` and their float64 values: (g, exact g)."""
    from fla_lab.ops.gsa.chunk import additive_gates

    z = s.double().logcumsumexp(1)
    return additive_gates(s)[1], torch.cat((z[:, :1], z[:, :-1]), 1) - z


def test_abc_gates_logcumsumexp():
    s = torch.randn(1, 64, 1, 16, generator=torch.Generator().manual_seed(13)) * 3 + 100  # slot writes above 88
    _close(*_abc_gates(s), 1e-5)


def test_abc_gates_fp32():
    s = torch.randn(1, 64, 1, 16, generator=torch.Generator().manual_seed(14)).bfloat16()  # bf16 slot writes
    _close(*_abc_gates(s), 1e-5)


# fp32 where a 16-bit form rounds

def test_chunk_cumsum_fp32():
    from fla_lab.ops.common.chunk import chunk_cumsum

    g = (-(0.5 + torch.rand(1, 64, 1, 16, generator=torch.Generator().manual_seed(15)))).half()  # G down to -96
    _close(chunk_cumsum(g.to(DEV), 64), g.double().cumsum(1), 1e-6)


def test_rwkv7_key_norm_eps():
    """Two zero-padded tokens first: their keys are 0 (no previous token to shift in either), so is kk."""
    from fla_lab.layers.rwkv7 import RWKV7Attention

    seen = []

    def op(r, w, k, v, a, b, scale, **kwargs):  # the float64 reference in the kernel's place
        o, _ = reference.recurrent_rwkv7(r, w, k, v, a, b, scale)
        seen.append(o)
        return o.to(r.dtype), None

    layer = RWKV7Attention(hidden_size=32, head_dim=16, layer_idx=0, num_hidden_layers=2)
    layer.attention_op = op
    x = torch.randn(1, 6, 32, generator=torch.Generator().manual_seed(16))
    x[:, :2] = 0
    with torch.no_grad():
        layer(x)
    assert torch.isfinite(seen[0]).all(), "non-finite attention output"


# GPU only: the interpreter's dots are IEEE fp32, whatever the dtypes

needs_cuda = pytest.mark.skipif(runtime.device() != "cuda", reason="needs a CUDA device")


def _gpu_errors(name: str, T: int, decay, dtype) -> tuple[dict, str]:
    """An op against the float64 reference on the GPU (B=1, H=2, K=V=M=64, as tests/test_training_length.py): its
    scale-aware errors by tensor, and the decay's name."""
    spec = registry.get(name)
    x = spec.inputs(registry.Shape(1, T, 2, 64, 64, M=64), decay=decay)
    return spec.compare(x, dtype=dtype, reference_device="cuda").errors, spec.decay_name


def _gsa_training_length_dg():
    """chunk_gsa, bf16, T = 4096, weak decay: dg's error (about 7e-3 split; 3e-2 with the slot pass unsplit, 5e-2
    with every state product unsplit: benchmarks/results/long_accuracy.md)."""
    errors, name = _gpu_errors("chunk_gsa", 4096, 1e-3, torch.bfloat16)
    assert errors[name] < 1.5e-2, errors


@pytest.mark.gpu
@needs_cuda
def test_state_products_split():
    _gsa_training_length_dg()


@pytest.mark.gpu
@needs_cuda
def test_gsa_state_pass_split():
    _gsa_training_length_dg()


@pytest.mark.gpu
@needs_cuda
def test_dot_precision_ieee():
    errors, _ = _gpu_errors("chunk_gla", 256, 1.0, torch.float32)
    assert max(errors.values()) < 2e-5, errors  # fp32's forward tolerance; TF32 rounds each operand by 2^-11


@pytest.mark.gpu
@needs_cuda
def test_rwkv7_solve_tf32x3():
    errors, _ = _gpu_errors("chunk_rwkv7", 256, None, torch.float32)
    assert max(errors.values()) < 2e-5, errors  # one TF32 product rounds the solve's operands by 2^-11


# --- the naive forms fail (slow: one subprocess per safeguard) ------------------------------------------------------

def _own_mutations():
    try:
        from fla_lab.spec import safeguards
    except ImportError:  # a copy of HEAD from before the inventory: only its `test_<id>` runs there
        return []
    cuda = torch.cuda.is_available()  # a GPU-only naive form changes nothing under the interpreter
    return [g.id for g in safeguards.mutations() if cuda or not getattr(g, "gpu_only", False)]


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("FLA_LAB_SAFEGUARD_MUTATIONS"),
                    reason="opt-in (about 20 s a safeguard): FLA_LAB_SAFEGUARD_MUTATIONS=1")
@pytest.mark.parametrize("guard", _own_mutations())
def test_the_naive_form_fails_its_test(guard):
    from dev import mutation_check as mc

    m = next(m for m in mc.MUTATIONS if m.id == guard)
    copy = mc.export_copy(m)
    try:
        check = "import fla_lab, sys; assert fla_lab.__file__.startswith(sys.argv[1]), fla_lab.__file__"
        rc, out, _ = mc._run([sys.executable, "-c", check, str(copy)], copy, 120)
        assert rc == 0, out[-400:]
        rc, out, _ = mc._run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                              f"{HERE}::test_{guard}"], copy, 300)
        assert rc == 1 and "1 failed" in out, out[-600:]
    finally:
        shutil.rmtree(copy, ignore_errors=True)

"""Every numerical safeguard (fla_lab.safeguards) has a test that fails when its line is reverted to the naive form.

`test_<id>` drives the inputs into the range where safeguard <id> matters (large logits, strong decay, bf16, tiny
gates) and passes with the shipped line. `test_the_naive_form_fails_its_test` (opt-in, FLA_LAB_SAFEGUARD_MUTATIONS=1:
one subprocess per safeguard) applies each naive form to an export of HEAD with the mutation check's own mechanism
and runs `test_<id>` there: it must fail.
The tests of a safeguard import `fla_lab.safeguards` lazily: they also run against a copy where it is absent.
"""
import functools
import os
import shutil
import sys
from types import SimpleNamespace

import pytest
import torch

import fla_lab
from fla_lab import reference
from fla_lab.layers.gsa import GatedSlotAttention
from fla_lab.layers.rwkv6 import RWKV6Attention

DEV = fla_lab.device()
HERE = os.path.abspath(__file__)


def _close(x, ref, rtol):
    x, ref = x.double().cpu(), ref.double().cpu()
    assert torch.isfinite(x).all(), "non-finite values"
    err = ((x - ref).abs().max() / ref.abs().max().clamp_min(1e-300)).item()
    assert err <= rtol, f"relative error {err:.2e} > {rtol:.0e}"


# --- the inventory ---------------------------------------------------------------------------------------------------

def test_every_entry_locates_its_line_and_every_marker_names_an_entry():
    from fla_lab import safeguards

    entries = safeguards.inventory()
    ids = [e.guard.id for e in entries]
    assert len(ids) == len(set(ids))
    for e in entries:
        g = e.guard
        assert g.protects in safeguards.PROTECTS and g.ops and g.what, g.id
        assert g.path.startswith(safeguards.SCANNED), g.id
        text = safeguards.source(g.path)
        assert text.count(g.code) == 1 and g.code != g.naive, g.id
        assert g.bug is None or g.naive in text, g.id  # a bug switch's naive form is its helper, in the same file
        changed = [a for a, b in zip(text.splitlines(), text.replace(g.code, g.naive).splitlines()) if a != b]
        assert changed == [text.splitlines()[e.line - 1]], (g.id, changed)  # exactly one line: the entry's
    for marker, places in safeguards.markers().items():
        assert marker in ids and len(places) == 1, (marker, places)
        entry = entries[ids.index(marker)]
        assert places[0] == (entry.guard.path, entry.line) and entry.marked, marker


def test_each_safeguard_without_a_bug_switch_has_its_test_here_or_a_mutation():
    from fla_lab import safeguards

    for g in safeguards.REGISTRY:
        if g.bug is None and g.mutation is None:
            assert f"test_{g.id}" in globals(), g.id
        for node in g.catching_tests():  # every named test exists
            path, name = node.split("::")
            assert f"def {name.split('[')[0]}(" in (safeguards.ROOT / path).read_text(), (g.id, node)


def test_the_mutation_check_reverts_each_safeguard_that_is_not_a_bug_switch():
    from conftest import benchmark_script
    from fla_lab import safeguards

    by_id = {m.id: m for m in benchmark_script("mutation_check").MUTATIONS}
    for g in safeguards.REGISTRY:
        if g.bug is None:
            m = by_id[g.mutation or g.id]
            assert g.code in m.old and g.naive in m.new and m.path == g.path, g.id


def test_the_guide_section_is_current():
    from fla_lab import safeguards

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
    from fla_lab import harness
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
    from fla_lab import harness
    from fla_lab.ops import chunk_gsa

    x = harness.gsa_inputs(1, 64, 1, 16, 16, 16, decay=30.0, initial_state=False, seed=8)
    _outputs_close(functools.partial(chunk_gsa, chunk_size=64), reference.recurrent_gsa, x, backward=True)


def test_gsa_dv_state_decay_to_chunk_end():
    _gsa_close()


def test_plain_rows_decay_to_chunk_end():
    _gsa_close()


def test_rwkv7_state_decay_to_chunk_end():
    _rwkv7_close(backward=False)


def test_rwkv7_reader_weight_masked_before_exp():
    _rwkv7_close(backward=True)


def test_rwkv7_writer_weight_masked_before_exp():
    _rwkv7_close(backward=True)


def test_gla_dk_decay_to_chunk_end():
    from fla_lab.ops import chunk_gla

    gen = torch.Generator().manual_seed(7)
    x = {n: torch.randn(1, 64, 1, 16, generator=gen) for n in "qkv"}
    x["g"] = -5 * (0.5 + torch.rand(1, 64, 1, 16, generator=gen))  # one 64-row chunk: about -320
    _outputs_close(functools.partial(chunk_gla, chunk_size=64), reference.recurrent_gla, x, backward=True)


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


# --- the naive forms fail (slow: one subprocess per safeguard) ------------------------------------------------------

def _own_mutations():
    try:
        from fla_lab import safeguards
    except ImportError:  # a copy of HEAD from before the inventory: only its `test_<id>` runs there
        return []
    return [g.id for g in safeguards.mutations()]


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("FLA_LAB_SAFEGUARD_MUTATIONS"),
                    reason="opt-in (about 20 s a safeguard): FLA_LAB_SAFEGUARD_MUTATIONS=1")
@pytest.mark.parametrize("guard", _own_mutations())
def test_the_naive_form_fails_its_test(guard):
    from conftest import benchmark_script

    mc = benchmark_script("mutation_check")
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

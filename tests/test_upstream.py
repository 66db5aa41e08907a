"""The FLA adapter (`fla_lab.spec.upstream`), the recording of FLA op calls by the locator and the audit, and the
`audit` command's argument and availability checks, on the CPU.

FLA's own kernels autotune on a CUDA device and do not run under the Triton interpreter, so here FLA's op entry
points are stand-ins with FLA's signatures, installed as `fla.*` modules (an op package and a layer module that
imported the op by name, as FLA's layers do). The real ones: tests/test_fla_audit_cuda.py.
"""
import sys
import types

import pytest
import torch

from fla_lab import __main__ as cli
from fla_lab.spec import upstream
from fla_lab.tools import audit, fla_audit, hunt
from fla_lab.spec import harness, reference


def _rand(*shape, scale=1.0):
    return torch.randn(*shape, dtype=torch.float64) * scale


def _rwkv7_step_loop(r, w, k, v, kk, a, h0):
    """RWKV-7 written out in FLA's `fused_mul_recurrent_rwkv7` terms: S <- S diag-decayed, minus (kk * a) times
    what kk reads from S, plus k v^T; o = S^T r."""
    S, out = h0.clone(), []
    for t in range(r.shape[1]):
        read = torch.einsum("bhk,bhkv->bhv", kk[:, t], S)
        S = S * w[:, t].exp()[..., None] - (kk[:, t] * a[:, t])[..., None] * read[:, :, None, :]
        S = S + k[:, t, ..., None] * v[:, t, :, None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", r[:, t], S))
    return torch.stack(out, 1), S


def test_fused_mul_rwkv7_maps_to_the_rwkv7_recurrence():
    B, T, H, K = 1, 6, 2, 4
    r, k, v = _rand(B, T, H, K), _rand(B, T, H, K), _rand(B, T, H, K)
    w = -torch.rand(B, T, H, K, dtype=torch.float64)
    kk = torch.nn.functional.normalize(_rand(B, T, H, K), dim=-1)
    a = torch.rand(B, T, H, K, dtype=torch.float64)
    h0 = _rand(B, H, K, K)
    o, ht = upstream.reference("fused_mul_recurrent_rwkv7")(r=r, w=w, k=k, v=v, kk=kk, a=a, scale=1.0,
                                                            initial_state=h0, output_final_state=True)
    o_loop, ht_loop = _rwkv7_step_loop(r, w, k, v, kk, a, h0)
    torch.testing.assert_close(o, o_loop)
    torch.testing.assert_close(ht, ht_loop)


def test_dplr_names_and_default_scale():
    """chunk_dplr_delta_rule(q, k, v, a, b, gk) is RWKV-7 with r = q, w = gk; FLA's scale None is K ** -0.5."""
    B, T, H, K = 1, 5, 2, 4
    q, k, v, a, b = (_rand(B, T, H, K) for _ in range(5))
    gk = -torch.rand(B, T, H, K, dtype=torch.float64)

    def dplr(q, k, v, a, b, gk, scale=None, initial_state=None, output_final_state=False, safe_gate=False):
        raise AssertionError("only its signature is read")
    options = upstream.recorded_options(dplr, {"safe_gate": True})
    assert options == {"safe_gate": True, "scale": None}
    o, _ = upstream.reference("chunk_dplr_delta_rule")(q=q, k=k, v=v, a=a, b=b, gk=gk, **options)
    expected, _ = reference.recurrent_rwkv7(q, gk, k, v, a, b, scale=K ** -0.5)
    torch.testing.assert_close(o, expected)
    assert not torch.allclose(o, reference.recurrent_rwkv7(q, gk, k, v, a, b, scale=1.0)[0])


def test_state_v_first_is_transposed_in_and_out():
    B, T, H, K, V = 1, 5, 2, 3, 4
    q, k, g = _rand(B, T, H, K), _rand(B, T, H, K), -torch.rand(B, T, H, K, dtype=torch.float64)
    v, h0 = _rand(B, T, H, V), _rand(B, H, K, V)
    gla = upstream.reference("chunk_gla")
    o, ht = gla(q=q, k=k, v=v, g=g, initial_state=h0, output_final_state=True)
    o_vk, ht_vk = gla(q=q, k=k, v=v, g=g, initial_state=h0.transpose(-1, -2).contiguous(), state_v_first=True,
                      output_final_state=True)
    torch.testing.assert_close(o_vk, o)
    torch.testing.assert_close(ht_vk, ht.transpose(-1, -2))


def test_packed_sequences_replay_one_at_a_time():
    H, K = 2, 4
    lengths = (3, 5)
    r, k, v = _rand(1, 8, H, K), _rand(1, 8, H, K), _rand(1, 8, H, K)
    w, u, h0 = -torch.rand(1, 8, H, K, dtype=torch.float64), _rand(H, K), _rand(2, H, K, K)
    cu = torch.tensor([0, 3, 8])
    o, ht = upstream.reference("fused_recurrent_rwkv6")(r=r, k=k, v=v, w=w, u=u, initial_state=h0, cu_seqlens=cu,
                                                        output_final_state=True)
    start = 0
    for i, n in enumerate(lengths):
        piece = slice(start, start + n)
        o_i, ht_i = reference.recurrent_rwkv6(r[:, piece], k[:, piece], v[:, piece], w[:, piece], u,
                                              initial_state=h0[i:i + 1], output_final_state=True)
        torch.testing.assert_close(o[:, piece], o_i)
        torch.testing.assert_close(ht[i:i + 1], ht_i)
        start += n


@pytest.mark.parametrize("options, tensors, what", [
    ({"reverse": True}, {}, "reverse=True"),
    ({"head_first": True}, {}, "head_first=True"),
    ({}, {"gv": torch.zeros(1, 2, 1, 2)}, "gv=tensor"),
    ({"a_new_option": 1}, {}, "a_new_option"),
])
def test_options_the_references_do_not_model_are_refused(options, tensors, what):
    with pytest.raises(upstream.UnsupportedCall, match=what.replace("[", r"\[")):
        upstream.check_options("fused_recurrent_gla", tensors, options)


def test_harmless_options_pass():
    upstream.check_options("chunk_rwkv7", {}, {"reverse": False, "cp_context": None, "safe_gate": True,
                                               "lower_bound": -0.6, "chunk_size": 64, "scale": 1.0})


def test_fla_lab_kernel_under_fla_names_matches_the_reference():
    B, T, H, K = 1, 8, 1, 16
    gen = torch.Generator().manual_seed(1)
    r, k, v = (torch.randn(B, T, H, K, generator=gen) for _ in range(3))
    w = -torch.rand(B, T, H, K, generator=gen)
    kk = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    a = torch.rand(B, T, H, K, generator=gen)
    args = dict(r=r, w=w, k=k, v=v, kk=kk, a=a, scale=1.0, output_final_state=True)
    o, ht = upstream.kernel("fused_mul_recurrent_rwkv7")(**harness.on_device(args))
    o_ref, ht_ref = upstream.reference("fused_mul_recurrent_rwkv7")(**args)
    torch.testing.assert_close(o.double().cpu(), o_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ht.double().cpu(), ht_ref, atol=1e-4, rtol=1e-4)


# --- recording: stand-ins installed as fla.* modules ---------------------------------------------------------------

class _DropStateGrad(torch.autograd.Function):
    """Identity forward; backward sends nothing on: a kernel whose backward ignores the final-state cotangent."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return torch.zeros_like(grad)


def _standin_rwkv6(drop_dht: bool):
    def fused_recurrent_rwkv6(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False,
                              reverse=False, cu_seqlens=None):
        o, ht = reference.recurrent_rwkv6(r, k, v, w, u, scale=scale, initial_state=initial_state,
                                          output_final_state=True)
        o, ht = o.to(r.dtype), ht.float()
        if drop_dht:
            ht = _DropStateGrad.apply(ht)
        return o, (ht if output_final_state else None)
    return fused_recurrent_rwkv6


class _Layer(torch.nn.Module):
    """A layer that looks its op up in its module's namespace at call time, as FLA's layers do."""

    def __init__(self, H=2, K=4, module="fla.layers.standin"):
        super().__init__()
        self.H, self.K, self.module = H, K, module
        self.proj = torch.nn.Linear(8, 4 * H * K)
        self.bonus = torch.nn.Parameter(torch.randn(H, K))

    def forward(self, x, state=None):
        B, T, _ = x.shape
        r, k, v, w = self.proj(x).view(B, T, 4, self.H, self.K).unbind(2)
        op = sys.modules[self.module].fused_recurrent_rwkv6
        return op(r=r, k=k, v=v, w=-torch.nn.functional.softplus(w), u=self.bonus, scale=1.0, initial_state=state,
                  output_final_state=True, cu_seqlens=None)  # FLA's layers pass cu_seqlens, None when unpacked


@pytest.fixture
def standin_fla(monkeypatch):
    """Install `fla`, `fla.ops.rwkv6` and `fla.layers.standin` holding one stand-in op; yield a setter."""
    installed = {}

    def install(fn):
        fla, ops, rwkv6 = (types.ModuleType(n) for n in ("fla", "fla.ops", "fla.ops.rwkv6"))
        layers = types.ModuleType("fla.layers.standin")
        rwkv6.fused_recurrent_rwkv6 = layers.fused_recurrent_rwkv6 = fn
        for module in (fla, ops, rwkv6, layers):
            monkeypatch.setitem(sys.modules, module.__name__, module)
        installed.update(ops=rwkv6, layers=layers)
        return installed
    return install


def _two_segments(layer, x):
    """Truncated BPTT over two segments: the first's final state is the second's initial state, one backward."""
    o1, h1 = layer(x[:, :5])
    o2, _ = layer(x[:, 5:], state=h1)
    (o1.pow(2).sum() + o2.pow(2).sum()).backward()


def test_fla_calls_are_recorded_with_options_and_the_final_state_cotangent(standin_fla):
    modules = standin_fla(_standin_rwkv6(drop_dht=False))
    original = modules["layers"].fused_recurrent_rwkv6
    layer = _Layer()
    with audit.audit(layer) as recorded:
        assert modules["layers"].fused_recurrent_rwkv6 is not original  # wrapped in the layer's namespace too
        _two_segments(layer, torch.randn(1, 10, 8))
    assert modules["layers"].fused_recurrent_rwkv6 is original  # and put back
    first, second = recorded.calls
    assert (first.library, first.label, first.kwargs["scale"]) == ("fla", "fla:fused_recurrent_rwkv6", 1.0)
    assert first.dht[0] is not None and second.dht[0] is None
    assert "initial_state" in second.inputs and "initial_state" not in first.inputs
    assert not recorded.wrong(), recorded.report()


def test_a_backward_that_drops_the_final_state_cotangent_is_flagged(standin_fla):
    standin_fla(_standin_rwkv6(drop_dht=True))
    layer = _Layer()
    with audit.audit(layer) as recorded:
        _two_segments(layer, torch.randn(1, 10, 8))
    first, second = recorded.results()
    assert not first.ok and first.worst in ("dk", "dv", "dw"), recorded.report()
    assert second.ok, recorded.report()  # no cotangent on its final state: nothing dropped
    assert "fla:fused_recurrent_rwkv6" in recorded.report().splitlines()[-1]


def test_an_op_calling_another_fla_op_is_recorded_once(standin_fla, monkeypatch):
    """0.6.0's chunk_rwkv7 calls chunk_dplr_delta_rule through its module's namespace: one call, the outer one."""
    standin_fla(_standin_rwkv6(drop_dht=False))
    inner_module = types.ModuleType("fla.ops.generalized_delta_rule")
    outer_module = types.ModuleType("fla.ops.rwkv7")

    def chunk_dplr_delta_rule(q, k, v, a, b, gk, scale=None, initial_state=None, output_final_state=False):
        o, ht = reference.recurrent_rwkv7(q, gk, k, v, a, b, scale=scale, initial_state=initial_state,
                                          output_final_state=output_final_state)
        return o.to(q.dtype), None if ht is None else ht.float()

    def chunk_rwkv7(r, w, k, v, a, b, scale=1.0, initial_state=None, output_final_state=False):
        return outer_module.chunk_dplr_delta_rule(q=r, k=k, v=v, a=a, b=b, gk=w, scale=scale,
                                                  initial_state=initial_state, output_final_state=output_final_state)
    inner_module.chunk_dplr_delta_rule = outer_module.chunk_dplr_delta_rule = chunk_dplr_delta_rule
    outer_module.chunk_rwkv7 = chunk_rwkv7
    monkeypatch.setitem(sys.modules, inner_module.__name__, inner_module)
    monkeypatch.setitem(sys.modules, outer_module.__name__, outer_module)
    x = {n: torch.randn(1, 4, 1, 4) for n in "rkvab"}
    with audit.audit() as recorded:
        outer_module.chunk_rwkv7(w=-torch.rand(1, 4, 1, 4), **x, output_final_state=True)
    assert [c.op for c in recorded.calls] == ["chunk_rwkv7"]


def test_a_final_state_returned_as_a_list_is_audited(monkeypatch):
    """FLA 0.6.0's chunk_gsa returns its state pair as a list (`o, *final_state = ...`): recorded, its cotangents
    kept and the call replayed as a tuple's would be."""
    module = types.ModuleType("fla.ops.gsa")

    def chunk_gsa(q, k, v, s, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
        o, (hk, hv) = reference.recurrent_gsa(q, k, v, s, g, scale=scale, initial_state=initial_state,
                                              output_final_state=True)
        return o.to(q.dtype), ([hk.float(), hv.float()] if output_final_state else [None, None])
    module.chunk_gsa = chunk_gsa
    monkeypatch.setitem(sys.modules, "fla", types.ModuleType("fla"))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    qkv = [torch.randn(1, 6, 2, 4, requires_grad=True) for _ in range(3)]
    s = torch.randn(1, 6, 2, 3, requires_grad=True)
    g = torch.nn.functional.logsigmoid(torch.randn(1, 6, 2, 3)).requires_grad_()
    with audit.audit() as recorded:
        o1, state = module.chunk_gsa(*(t[:, :3] for t in qkv), s[:, :3], g[:, :3], output_final_state=True)
        o2, _ = module.chunk_gsa(*(t[:, 3:] for t in qkv), s[:, 3:], g[:, 3:], initial_state=tuple(state),
                                 output_final_state=True, cu_seqlens=None)
        (o1.pow(2).sum() + o2.pow(2).sum()).backward()
    first, second = recorded.results()
    assert first.ok and second.ok, recorded.report()
    assert all(d is not None for d in recorded.calls[0].dht)  # both states of the first call got a cotangent


def test_the_control_swap_is_flagged_on_the_carried_segment_only(monkeypatch):
    """`audit --control`: the op the layer calls, swapped in FLA's package and the layer's module for one reading half
    its initial state, then put back; the audit flags the second segment's call and not the first's."""
    op = _standin_rwkv6(drop_dht=False)
    package, layers = types.ModuleType("fla.ops.rwkv6"), types.ModuleType("fla.layers.rwkv6")
    package.fused_recurrent_rwkv6 = layers.fused_recurrent_rwkv6 = op
    for module in (types.ModuleType("fla"), package, layers):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    layer = _Layer(module=layers.__name__)
    with fla_audit.control_swap("rwkv6", "fused_recurrent"):
        assert package.fused_recurrent_rwkv6 is not op and layers.fused_recurrent_rwkv6 is not op
        with audit.audit(layer) as recorded:
            _two_segments(layer, torch.randn(1, 10, 8))
    assert package.fused_recurrent_rwkv6 is op and layers.fused_recurrent_rwkv6 is op
    first, second = recorded.results()
    assert first.ok and not second.ok, recorded.report()
    caught, line = fla_audit.control_flagged(recorded)
    assert caught and "1 of 1 call(s) with an initial state flagged, 0 of 1 without" in line


def test_fla_recording_follows_whether_fla_is_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "fla", raising=False)
    assert hunt.Locator().record_fla is False
    monkeypatch.setitem(sys.modules, "fla", types.ModuleType("fla"))
    assert hunt.Locator().record_fla is True


# --- the command -------------------------------------------------------------------------------------------------

def test_audit_command_without_fla_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setattr(upstream.importlib.util, "find_spec", lambda name: None)
    assert cli.main(["audit", "--fla", "rwkv7", "--T", "64"]) == 2
    out = capsys.readouterr().out
    assert "pip install flash-linear-attention fla-core" in out and "0.6.0" in out


def test_audit_command_without_cuda_says_a_gpu_is_needed(monkeypatch, capsys):
    monkeypatch.setattr(upstream.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["audit", "--fla", "gsa"]) == 2
    assert "need a CUDA device" in capsys.readouterr().out


def test_audit_command_refuses_uneven_segments(capsys):
    assert cli.main(["audit", "--fla", "rwkv6", "--T", "100", "--tbptt", "3"]) == 2
    assert "not divisible by --tbptt 3" in capsys.readouterr().out


def test_audit_command_refuses_a_one_layer_rwkv7_model(capsys):
    assert cli.main(["audit", "--fla", "rwkv7", "--layers", "1"]) == 2  # FLA's init would divide by zero
    assert "needs --layers 2 or more" in capsys.readouterr().out


@pytest.mark.parametrize("extra", [["--tbptt", "1"], ["--tbptt", "2", "--kernel"]])
def test_audit_command_refuses_a_control_it_could_not_judge(capsys, extra):
    assert cli.main(["audit", "--fla", "gla", "--control", *extra]) == 2
    assert "--control needs --tbptt 2 or more" in capsys.readouterr().out


def test_first_config_pins_every_autotuner_to_its_first_config(monkeypatch):
    """`audit --first-config` (and the accuracy benchmarks): each config "times" the same, so Triton's autotuner,
    which keeps the fastest (the first of equals), keeps the first without compiling the others."""
    from triton.runtime import autotuner

    monkeypatch.setattr(autotuner.Autotuner, "_bench", autotuner.Autotuner._bench)  # restored after the test
    upstream.pin_autotune_to_first_config()
    timings = {config: autotuner.Autotuner._bench(None, config) for config in ("first", "second", "third")}
    assert min(timings, key=timings.get) == "first" and len({tuple(t) for t in timings.values()}) == 1


def test_audit_command_pins_the_autotuners_when_asked(monkeypatch, capsys):
    pinned = []
    monkeypatch.setattr(upstream, "pin_autotune_to_first_config", lambda: pinned.append(True))
    monkeypatch.setattr(upstream, "require", lambda: None)
    monkeypatch.setattr(upstream, "import_layer", lambda family: (_ for _ in ()).throw(ImportError("stop here")))
    assert cli.main(["audit", "--fla", "gsa", "--first-config"]) == 2 and pinned == [True]
    assert cli.main(["audit", "--fla", "gsa"]) == 2 and pinned == [True]  # not without the flag


@pytest.mark.parametrize("argv", [["audit", "--fla", "mamba"], ["audit", "--fla", "gla", "--layers", "0"],
                                  ["audit", "--fla", "gla", "--dtype", "fp64"]])
def test_audit_command_rejects_bad_arguments(argv):
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2


def test_carried_state_speaks_fla_layers_cache_protocol():
    from fla_lab.tools.fla_audit import CarriedState

    state = CarriedState()
    assert len(state) == 0
    h = torch.ones(2, requires_grad=True)
    state.update(layer_idx=0, recurrent_state=h * 2, conv_state=None, offset=5)
    assert len(state) == 1 and state[0]["recurrent_state"].requires_grad  # not detached: TBPTT's gradient path


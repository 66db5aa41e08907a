"""The input contract: one test per check, through the checks and through the ops that use them.

Each bad input must fail with an error that names the argument and says how to fix it (or warn, for the
layout and transition heuristics), before any kernel runs.
"""
from __future__ import annotations

import os
import types
import warnings

import pytest
import torch
import torch.nn.functional as F

import fla_lab
from fla_lab.spec import harness
from fla_lab import ops, runtime
from fla_lab.ops import chunk_gla, chunk_rwkv6, chunk_rwkv7, contract, fused_recurrent_rwkv7
from fla_lab.ops.common import value_flags as vf
from fla_lab.ops.contract import values

GATED_OPS = {
    "fused_recurrent_gla": (lambda: ops.fused_recurrent_gla, ("q", "k", "v", "gk"), False),
    "fused_recurrent_rwkv6": (lambda: ops.fused_recurrent_rwkv6, ("r", "k", "v", "w"), True),
}


def gated(name, B=1, T=8, H=2, K=16, V=16, seed=0):
    """(op, positional inputs, keyword inputs) for one of GATED_OPS, valid as built."""
    get_op, names, bonus = GATED_OPS[name]
    x = harness.gated_inputs(B, T, H, K, V, initial_state=False, bonus=bonus, seed=seed, names=names)
    args = [x.pop(n) for n in names]
    if bonus:
        args.append(x.pop("u"))
    return get_op(), args, names


def rwkv7_inputs(B=1, T=8, H=2, K=16, V=16, seed=0, dtype=torch.float32):
    """Inputs that follow the RWKV-7 contract: a = -kk, b = kk * a_gate with unit-norm kk."""
    g = torch.Generator().manual_seed(seed)
    r, k = torch.randn(B, T, H, K, generator=g), torch.randn(B, T, H, K, generator=g)
    v = torch.randn(B, T, H, V, generator=g)
    w = -0.6065 * torch.rand(B, T, H, K, generator=g)
    kk = F.normalize(torch.randn(B, T, H, K, generator=g), dim=-1)
    a_gate = torch.rand(B, T, H, K, generator=g)
    x = dict(r=r, w=w, k=k, v=v, a=-kk, b=kk * a_gate)
    return {n: (t if n == "w" else t.to(dtype)) for n, t in x.items()}


def on_kernel_device(tensors):
    """Tests that run an op to completion need its inputs where its kernels run (the GPU, when there is one)."""
    return [t.to(fla_lab.device()) for t in tensors]


def check7(inputs, initial_state=None, **kwargs):
    contract.check_rwkv7_inputs("fused_recurrent_rwkv7", *inputs.values(), initial_state, kwargs)


@pytest.fixture(autouse=True)
def default_value_checks(monkeypatch):
    monkeypatch.delenv("FLA_LAB_VALUE_CHECKS", raising=False)
    contract.set_value_checks(None)
    values._pending.clear()
    yield
    contract.set_value_checks(None)
    values._pending.clear()


# ------------------------------------------------------------------------------------------- positive log-decay

@pytest.mark.parametrize("name", GATED_OPS)
def test_positive_log_decay_suggests_log_space(name):
    op, args, names = gated(name)
    args[3] = torch.sigmoid(torch.randn_like(args[3]))  # upstream #11: a decay in (0, 1), not its log
    with pytest.raises(ValueError, match=rf"`{names[3]}` is a log-decay.*logsigmoid.*-torch.exp"):
        op(*args)


def test_positive_log_decay_rwkv7():
    x = rwkv7_inputs()
    x["w"] = torch.rand_like(x["w"])
    with pytest.raises(ValueError, match=r"`w` is a log-decay.*logsigmoid"):
        check7(x)


# ------------------------------------------------------------------------------------------- non-finite inputs

@pytest.mark.parametrize("name", GATED_OPS)
@pytest.mark.parametrize("which", [1, 2])
def test_nonfinite_input_is_named(name, which):
    op, args, names = gated(name)
    args[which] = args[which].clone()
    args[which][0, 3, 1, 2] = float("nan")
    with pytest.raises(ValueError, match=rf"`{names[which]}` has 1 non-finite"):
        op(*args)


def test_nonfinite_rwkv7_input_is_named():
    x = rwkv7_inputs()
    x["b"][0, 0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="`b` has 1 non-finite"):
        check7(x)


# ------------------------------------------------------------------------------------------- layout

@pytest.mark.parametrize("name", GATED_OPS)
def test_head_first_looking_input_warns(name):
    op, args, names = gated(name, T=2, H=4)  # T < H: probably [B, H, T, D]
    with pytest.warns(ops.LayoutWarning, match=r"looks like \[B, H, T, D\].*transpose\(1, 2\)"):
        op(*on_kernel_device(args))


def test_layout_warning_can_be_silenced():
    op, args, _ = gated("fused_recurrent_gla", T=2, H=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runtime.hide_interpreter_noise()  # Triton 3.6's interpreter warns about its own numpy use
        warnings.simplefilter("ignore", ops.LayoutWarning)
        op(*on_kernel_device(args))


def test_rwkv7_layout_warning():
    with pytest.warns(contract.LayoutWarning, match="T=2 < H=4"):
        check7(rwkv7_inputs(T=2, H=4))


@pytest.mark.parametrize("name", GATED_OPS)
def test_head_first_keyword_explains_the_layout(name):
    op, args, _ = gated(name)
    with pytest.raises(TypeError, match=r"head_first.*removed.*\[B, T, H, D\].*transpose\(1, 2\)"):
        op(*args, head_first=True)


def test_rwkv7_head_first_keyword():
    with pytest.raises(TypeError, match="head_first"):
        check7(rwkv7_inputs(), head_first=False)


def test_unknown_keyword_is_named():
    op, args, _ = gated("fused_recurrent_gla")
    with pytest.raises(TypeError, match="cu_seqlen"):
        op(*args, cu_seqlen=None)


# ------------------------------------------------------------------------------------------- shapes

@pytest.mark.parametrize("name", GATED_OPS)
def test_mismatched_key_shape(name):
    op, args, names = gated(name)
    args[1] = args[1][..., :8]
    with pytest.raises(ValueError, match=rf"`{names[1]}` should be like `{names[0]}`"):
        op(*args)


def test_mismatched_value_and_state_shapes():
    op, args, _ = gated("fused_recurrent_rwkv6")
    with pytest.raises(ValueError, match=r"`v` should be \[B, T, H, V\]"):
        op(args[0], args[1], args[2][:, :4], args[3], args[4])
    with pytest.raises(ValueError, match=r"`initial_state` should be \[B, H, K, V\]"):
        op(*args, initial_state=torch.zeros(1, 2, 16, 8))
    with pytest.raises(ValueError, match=r"`u` should be \[H, K\]"):
        op(*args[:4], torch.zeros(3, 16))


def test_three_dimensional_input():
    op, args, _ = gated("fused_recurrent_gla")
    args[0] = args[0][0]
    with pytest.raises(ValueError, match=r"`q` must be 4-D \[B, T, H, K\]"):
        op(*args)


@pytest.mark.parametrize("name", ["w", "a", "b"])
def test_rwkv7_mismatched_shapes(name):
    x = rwkv7_inputs()
    x[name] = x[name][:, :4]
    with pytest.raises(ValueError, match=rf"`{name}` should be like `r`"):
        check7(x)


def test_rwkv7_state_shape():
    with pytest.raises(ValueError, match="initial_state"):
        check7(rwkv7_inputs(), initial_state=torch.zeros(1, 2, 16, 4))


# ------------------------------------------------------------------------------------------- dtypes, devices

@pytest.mark.parametrize("name", GATED_OPS)
def test_mismatched_dtypes(name):
    op, args, names = gated(name)
    args[1] = args[1].half()
    with pytest.raises(TypeError, match="must share a dtype"):
        op(*args)


def test_unsupported_dtype():
    op, args, _ = gated("fused_recurrent_gla")
    args[2] = args[2].double()
    with pytest.raises(TypeError, match=r"`v` is torch.float64.*float32, float16 or bfloat16"):
        op(*args)


def test_rwkv7_dtypes():
    check7(rwkv7_inputs(dtype=torch.bfloat16))  # fp32 log-decay with bf16 rest: the layer's fix for #181
    x = rwkv7_inputs()
    x["a"] = x["a"].half()
    with pytest.raises(TypeError, match="must share a dtype"):
        check7(x)


def test_device_mismatch():
    op, args, _ = gated("fused_recurrent_gla")
    args[2] = args[2].to("meta")
    with pytest.raises(ValueError, match="different devices.*meta"):
        op(*args)
    x = rwkv7_inputs()
    x["a"] = x["a"].to("meta")
    with pytest.raises(ValueError, match="different devices"):
        check7(x)


def test_non_tensor_input():
    op, args, _ = gated("fused_recurrent_gla")
    args[1] = args[1].tolist()
    with pytest.raises(TypeError, match="`k` must be a torch.Tensor"):
        op(*args)


def test_empty_sequence():
    op, args, _ = gated("fused_recurrent_gla")
    with pytest.raises(ValueError, match="T = 0"):
        op(*[a[:, :0] for a in args])


# ------------------------------------------------------------------------------------------- RWKV-7 transition

def test_upstream_random_a_b_warn_about_growth():
    """#150 called the op with a, b ~ rand: 1 + a.b is an eigenvalue, about 17 for K = 64."""
    g = torch.Generator().manual_seed(0)
    B, T, H, K = 1, 8, 2, 64
    x = rwkv7_inputs(B, T, H, K, K)
    x["a"], x["b"] = torch.rand(B, T, H, K, generator=g), torch.rand(B, T, H, K, generator=g)
    assert contract.transition_radius(x["w"], x["a"], x["b"]) > 10
    with pytest.warns(contract.TransitionWarning, match=r"eigenvalue of modulus \d\d\.\d.*RWKV7Attention") as record:
        check7(x)
    message = str(record[0].message)  # what is wrong and where to look, not notebook 02's exercise line
    assert "b . a in [-1, 0]" in message and not any(s in message for s in ("kk", "normalize", "a_gate"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rwkv7_contract_inputs_do_not_warn(dtype):
    x = rwkv7_inputs(T=16, K=64, V=32, dtype=dtype)
    assert contract.transition_radius(x["w"], x["a"], x["b"]) <= 1 + contract.TRANSITION_TOL
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runtime.hide_interpreter_noise()  # Triton 3.6's interpreter warns about its own numpy use
        check7(x)


def test_transition_radius_is_the_largest_eigenvalue():
    """One step, one head, d = 1: I + b a^T has eigenvalues 1 (K - 1 times) and 1 + a.b."""
    K = 8
    a = torch.rand(1, 1, 1, K)
    b = torch.rand(1, 1, 1, K)
    w = torch.zeros(1, 1, 1, K)
    assert contract.transition_radius(w, a, b) == pytest.approx(1 + float((a.double() * b.double()).sum()), rel=1e-9)


# ------------------------------------------------------------------------------------------- value-check switch

CUDA_LIKE = types.SimpleNamespace(device=torch.device("cuda"))  # only the device is looked at


def test_value_checks_are_on_by_default_on_every_device():
    assert contract.value_check_mode(torch.zeros(1)) == "now"
    assert contract.value_check_mode(CUDA_LIKE) == "deferred"
    assert contract.value_checks_enabled(torch.zeros(1)) and contract.value_checks_enabled(CUDA_LIKE)
    assert contract.value_check_mode(torch.zeros(1, device="meta")) == "off"  # no data to read


def test_value_check_modes_by_setting():
    for setting, cpu, cuda in ((True, "now", "now"), (False, "off", "off"), (None, "now", "deferred")):
        with contract.value_checks(setting):
            assert (contract.value_check_mode(torch.zeros(1)), contract.value_check_mode(CUDA_LIKE)) == (cpu, cuda)


def test_value_checks_environment_variable(monkeypatch):
    monkeypatch.setenv("FLA_LAB_VALUE_CHECKS", "1")
    assert contract.value_check_mode(CUDA_LIKE) == "now"
    monkeypatch.setenv("FLA_LAB_VALUE_CHECKS", "0")
    assert not contract.value_checks_enabled(torch.zeros(1))
    assert contract.value_check_mode(CUDA_LIKE) == "off"


def test_value_checks_context_manager_restores():
    x = rwkv7_inputs()
    x["w"] = torch.rand_like(x["w"])
    with contract.value_checks(False):
        check7(x)  # a positive log-decay passes: the layers' bug paths rely on this
        assert not contract.value_checks_enabled(torch.zeros(1))
    assert contract.value_checks_enabled(torch.zeros(1))
    contract.set_value_checks(False)
    with contract.value_checks(True):
        with pytest.raises(ValueError, match="log-decay"):
            check7(x)
    assert not contract.value_checks_enabled(torch.zeros(1))


def test_metadata_checks_run_without_value_checks():
    op, args, _ = gated("fused_recurrent_gla")
    with contract.value_checks(False), pytest.raises(TypeError, match="head_first"):
        op(*args, head_first=True)


def test_valid_inputs_pass_through_the_ops():
    for name in GATED_OPS:
        op, args, _ = gated(name)
        o, ht = op(*on_kernel_device(args), output_final_state=True)
        assert torch.isfinite(o).all() and ht.shape == (1, 2, 16, 16)


# ------------------------------------------------------------------------------------------- every op checks

@pytest.mark.parametrize("name,op", [("chunk_gla", chunk_gla), ("chunk_rwkv6", chunk_rwkv6)])
def test_chunk_ops_check_before_running(name, op):
    base = name.replace("chunk", "fused_recurrent")
    _, args, names = gated(base)
    with pytest.raises(TypeError, match="head_first"):
        op(*args, head_first=True)
    args[3] = args[3].abs()
    with pytest.raises(ValueError, match="log-decay"):
        op(*args)


def test_fused_recurrent_rwkv7_checks_its_inputs():
    op = fused_recurrent_rwkv7
    x = dict(zip("rwkvab", on_kernel_device(rwkv7_inputs().values())))
    contract.set_value_checks(True)  # read at once (on a GPU the default reads them at a later call)
    with pytest.raises(TypeError, match="head_first"):
        op(*x.values(), head_first=True)
    bad = dict(x, w=x["w"].abs())
    with pytest.raises(ValueError, match="`w` is a log-decay"):
        op(*bad.values())
    g = torch.Generator().manual_seed(1)
    a_rand, b_rand = on_kernel_device([torch.rand(x["a"].shape, generator=g), torch.rand(x["b"].shape, generator=g)])
    grow = dict(x, a=a_rand, b=b_rand)
    with pytest.warns(contract.TransitionWarning):
        op(*grow.values())


def test_cpu_inputs_on_a_gpu_machine_get_a_clear_error(monkeypatch):
    from fla_lab import runtime

    monkeypatch.setitem(runtime._STATE, "device", "cuda")  # as on a GPU box, where kernels read GPU memory
    op, args, _ = gated("fused_recurrent_gla")
    with pytest.raises(ValueError, match=r"on the CPU, but here the Triton kernels run compiled on the GPU.*\.to\(fla_lab\.device\(\)\)"):
        op(*args)


# ---------------------------------------------------------------------------------------- the flag: one bit a finding

DECAY, GROWS = 1 << vf.POSITIVE_DECAY_BIT, 1 << vf.TRANSITION_BIT
RWKV7_SLOTS = ("w", "a", "b", "r", "k", "v", "initial_state")  # the contract's order: decay, a, b, the rest
GATED_SLOTS = ("g", "q", "k", "v", "u", "initial_state")


def rwkv7_slots(B=2, T=37, H=9, K=24, V=40, dtype=torch.float32):
    """Contract inputs (no bit set). 666 rows: not a multiple of the kernel's row block; K, V not powers of two;
    the state [B, H, K, V] has fewer rows than the sequence tensors."""
    x = harness.rwkv7_inputs(B, T, H, K, V)
    return [x[n] if n in ("w", "initial_state") else x[n].to(dtype) for n in RWKV7_SLOTS]


def gated_slots():
    x = harness.gated_inputs(2, 37, 9, 24, 40, bonus=True)
    return [x[n] for n in GATED_SLOTS]


def poke(slots, i, value, where=(-1, -1, -1, -1)):
    slots = list(slots)
    slots[i] = slots[i].clone()
    slots[i][where[:slots[i].dim()]] = value
    return slots


def strided(x):
    """The same values as a [B, T, H, D] view whose rows are not evenly spaced (a [B, H, T, D] buffer)."""
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def rand_ab(slots, sign=1.0):
    """#150's a, b ~ rand (sign=-1: a = -rand, an eigenvalue far below -1)."""
    g = torch.Generator().manual_seed(150)
    a, b = (torch.rand(slots[1].shape, generator=g).to(slots[1].dtype) for _ in range(2))
    return [slots[0], sign * a, b, *slots[3:]]


FLAG_CASES = {  # name: (slots, decay, transition, expected flag)
    "rwkv7 contract inputs": (rwkv7_slots(), True, True, 0),
    "rwkv7 bf16 contract inputs": (rwkv7_slots(dtype=torch.bfloat16), True, True, 0),
    **{f"NaN in {n}": (poke(rwkv7_slots(), i, float("nan")), True, True, 1 << i) for i, n in enumerate(RWKV7_SLOTS)},
    "-inf in the first row of r": (poke(rwkv7_slots(), 3, -float("inf"), (0, 0, 0, 0)), True, True, 1 << 3),
    "+inf in w: non-finite and positive": (poke(rwkv7_slots(), 0, float("inf")), True, True, 1 | DECAY),
    "positive w": (poke(rwkv7_slots(), 0, 0.3, (1, 20, 4, 7)), True, True, DECAY),
    "a, b ~ rand at K=64 (#150)": (rand_ab(rwkv7_slots(1, 8, 2, 64, 64)), True, True, GROWS),
    "a, b ~ rand, bf16": (rand_ab(rwkv7_slots(1, 8, 2, 64, 64, torch.bfloat16)), True, True, GROWS),
    "a = -rand, b = rand: eigenvalue below -1": (rand_ab(rwkv7_slots(1, 8, 2, 64, 64), -1.0), True, True, GROWS),
    "gla inputs": (gated_slots(), True, False, 0),
    "NaN in u": (poke(gated_slots(), 4, float("nan")), True, False, 1 << 4),
    "positive g, no decay slot": (poke(gated_slots(), 0, 0.5), False, False, 0),
    "strided views": ([strided(t) for t in poke(gated_slots(), 2, float("inf"))[:4]], True, False, 1 << 2),
}


@pytest.mark.parametrize("case", FLAG_CASES)
def test_each_flag_bit_is_set_by_its_input(case):
    slots, decay, transition, expected = FLAG_CASES[case]
    assert int(vf.reference_value_flags(slots, decay, transition)) == expected


@pytest.mark.parametrize("case", FLAG_CASES)
def test_flag_kernel_agrees_with_the_torch_definition(case):
    """The Triton kernel (the interpreter here, compiled on a GPU) against the torch ops that define the bits."""
    slots, decay, transition, expected = FLAG_CASES[case]
    slots = on_kernel_device(slots)
    flags = vf.launch_value_flags(slots, decay, transition)
    assert flags.dtype == torch.int32 and flags.device == slots[0].device
    assert int(flags) == int(vf.reference_value_flags(slots, decay, transition)) == expected


def test_growing_rows_match_the_eigenvalues():
    """Same-sign a_i b_i (RWKV-7's, #150's): flagged iff the spectral radius passes LAMBDA0 (all eigenvalues are
    real). Mixed signs: a flag is never wrong (it may miss a complex pair)."""
    g = torch.Generator().manual_seed(7)
    n, K = 400, 6
    w = -2 * torch.rand(n, K, generator=g, dtype=torch.float64)
    a = torch.rand(n, K, generator=g, dtype=torch.float64) * torch.logspace(-1, 0.5, n, dtype=torch.float64)[:, None]
    b = torch.rand(n, K, generator=g, dtype=torch.float64)
    for sign_a, sign_b in ((1, 1), (-1, 1), (1, torch.randn(n, K, generator=g, dtype=torch.float64).sign())):
        aa, bb = sign_a * a, sign_b * b
        radius = torch.linalg.eigvals(torch.diag_embed(w.exp()) + bb[:, :, None] * aa[:, None, :]).abs().amax(-1)
        grows = vf.growing_rows(w, aa, bb)
        clear = (radius - vf.LAMBDA0).abs() > 1e-3
        assert grows.any() and (~grows).any()
        assert (radius[grows & clear] > vf.LAMBDA0).all()
        if not isinstance(sign_b, torch.Tensor):
            assert torch.equal(grows[clear], radius[clear] > vf.LAMBDA0)


def test_rwkv7_contract_inputs_never_grow():
    for decay in (None, 0.01, 30.0):
        x = harness.rwkv7_inputs(2, 64, 4, 64, 64, decay=decay, seed=3)
        for dtype in (torch.float32, torch.bfloat16):
            assert not vf.growing_rows(x["w"], x["a"].to(dtype), x["b"].to(dtype)).any()


def test_one_growing_row_is_found_and_its_modulus_reported():
    """The check reads every row; the message's modulus comes from the flagged rows when the sample misses."""
    x = rwkv7_inputs(B=1, T=64, H=4, K=16, V=16)
    g = torch.Generator().manual_seed(0)
    x["a"][0, 41, 3], x["b"][0, 41, 3] = torch.rand(16, generator=g), torch.rand(16, generator=g)
    assert contract.transition_radius(x["w"], x["a"], x["b"]) < 1  # the 32-step sample misses it
    with pytest.warns(contract.TransitionWarning, match=r"eigenvalue of modulus (\d+\.?\d*) > 1") as record:
        check7(x)
    modulus = float(str(record[0].message).split("modulus ")[1].split(" ")[0])
    assert modulus > vf.LAMBDA0
    assert record[0].filename == __file__  # points at the caller, not inside fla_lab


def test_transition_warning_skips_fla_lab_frames_outside_ops():
    """A layer or lesson between the user and the op: the warning still points at the user's line."""
    g = torch.Generator().manual_seed(0)
    x = rwkv7_inputs(K=64, V=64)
    x["a"], x["b"] = torch.rand(x["a"].shape, generator=g), torch.rand(x["b"].shape, generator=g)
    layer = os.path.join(os.path.dirname(fla_lab.__file__), "layers", "stand_in.py")  # a frame in fla_lab/layers/
    scope = {"contract": contract}
    exec(compile("def forward(x):\n    contract.check_rwkv7_inputs('fused_recurrent_rwkv7', *x.values())\n",
                 layer, "exec"), scope)
    with pytest.warns(contract.TransitionWarning) as record:
        scope["forward"](x)
    assert record[0].filename == __file__


# ------------------------------------------------------------------------------------------- deferred reading

class FakeEvent:
    """Stands in for a CUDA event: the flag 'arrives' when the test says so (or when waited for)."""

    def __init__(self):
        self.ready, self.waited = False, False

    def query(self):
        return self.ready

    def synchronize(self):
        self.ready = self.waited = True


@pytest.fixture
def deferred(monkeypatch):
    """The GPU's default path on CPU tensors: flags queued behind fake events; returns the events made."""
    events = []

    def to_host(flags):
        events.append(FakeEvent())
        return flags, events[-1]

    monkeypatch.setattr(values, "_DEFERRED_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(values, "_to_host", to_host)
    return events


def positive_w():
    x = rwkv7_inputs()
    x["w"] = x["w"].abs()
    return x


def test_deferred_check_reports_at_a_later_call_once_the_flag_arrives(deferred):
    check7(positive_w())  # queued, no error yet
    check7(rwkv7_inputs())  # the first flag has not arrived: nothing to report
    assert len(values._pending) == 2
    deferred[0].ready = True
    with pytest.raises(ValueError, match=r"^fused_recurrent_rwkv7 call #\d+ \(checked without stopping the GPU, "
                                         r"reported at a later op call\): `w` is a log-decay.*logsigmoid"):
        check7(rwkv7_inputs())
    assert len(values._pending) == 1 and not deferred[0].waited  # read without waiting, then dropped


def test_flush_waits_for_every_deferred_check(deferred):
    check7(rwkv7_inputs())
    x = rwkv7_inputs()
    x["b"][0, 0, 0, 0] = float("inf")
    check7(x)
    with pytest.raises(ValueError, match=r"call #\d+ .*reported by flush_value_checks\(\)\): `b` has 1 non-finite"):
        contract.flush_value_checks()
    assert all(e.waited for e in deferred) and not values._pending
    contract.flush_value_checks()  # nothing left


def test_deferred_transition_warning_names_its_call(deferred):
    g = torch.Generator().manual_seed(0)
    x = rwkv7_inputs(K=64, V=64)
    x["a"], x["b"] = torch.rand(x["a"].shape, generator=g), torch.rand(x["b"].shape, generator=g)
    check7(x)
    with pytest.warns(contract.TransitionWarning, match=r"call #\d+ \(checked without stopping the GPU.*modulus"):
        contract.flush_value_checks()


def test_deferred_queue_is_bounded(deferred, monkeypatch):
    monkeypatch.setattr(values, "MAX_PENDING", 2)
    for _ in range(3):
        check7(rwkv7_inputs())
    assert len(values._pending) == 2 and deferred[0].waited and not deferred[1].waited


def test_switched_off_checks_queue_nothing(deferred):
    assert contract.value_check_mode(torch.zeros(1)) == "deferred"
    with contract.value_checks(False):
        check7(positive_w())
    assert not values._pending and not deferred


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
def test_cuda_default_is_deferred_without_a_sync():
    x = {n: t.cuda() for n, t in positive_w().items()}
    check7({n: t.cuda() for n, t in rwkv7_inputs().items()})  # warm-up: compile the flag kernel
    contract.flush_value_checks()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        check7(x)  # the bad decay is queued, nothing waits
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(values._pending) == 1
    with pytest.raises(ValueError, match=r"call #\d+ \(checked without stopping the GPU.*`w` is a log-decay"):
        contract.flush_value_checks()


@needs_cuda
def test_cuda_now_mode_reports_at_once():
    x = {n: t.cuda() for n, t in positive_w().items()}
    with contract.value_checks(True), pytest.raises(ValueError, match=r"^fused_recurrent_rwkv7: `w` is a log-decay"):
        check7(x)


# ------------------------------------------------------------------------------ checks inside the op's kernels

def rwkv7_with_state():
    return {**rwkv7_inputs(B=1, T=21, H=2, K=16, V=16), "initial_state": torch.randn(1, 2, 16, 16)}


IN_KERNEL_OPS = {  # op -> (function, its inputs: T=21 ends in a partial chunk, tensors the flag pass still reads)
    "chunk_gla": (chunk_gla, lambda: harness.gated_inputs(1, 21, 2, 16, 16, initial_state=True, bonus=False,
                                                          names=("q", "k", "v", "g")), 1),  # initial_state
    "chunk_rwkv6": (chunk_rwkv6, lambda: harness.gated_inputs(1, 21, 2, 16, 16, initial_state=True, bonus=True,
                                                              names=("r", "k", "v", "w")), 2),  # and u
    "chunk_rwkv7": (chunk_rwkv7, rwkv7_with_state, 4),  # w, a, b (the transition test reads them together), h0
}
IN_KERNEL_CASES = [  # (op, the argument made bad, how, the (batch, step, head, channel) it is put at)
    ("chunk_gla", "q", "nan", (0, 7, 1, 3)), ("chunk_gla", "k", "inf", (0, 20, 0, 15)),  # last row: a partial chunk
    ("chunk_gla", "v", "nan", (0, 16, 1, 0)), ("chunk_gla", "g", "inf", (0, 0, 0, 0)),
    ("chunk_gla", "g", "positive", (0, 9, 1, 2)), ("chunk_gla", "initial_state", "nan", (0, 1, 2, 3)),
    ("chunk_rwkv6", "r", "inf", (0, 20, 1, 1)), ("chunk_rwkv6", "w", "positive", (0, 20, 0, 15)),
    ("chunk_rwkv6", "u", "nan", (1, 4)),
    ("chunk_rwkv7", "r", "nan", (0, 7, 1, 3)), ("chunk_rwkv7", "k", "inf", (0, 20, 0, 15)),  # the scores kernel
    ("chunk_rwkv7", "v", "nan", (0, 16, 1, 0)),  # the solve kernel
    ("chunk_rwkv7", "w", "positive", (0, 20, 1, 2)), ("chunk_rwkv7", "a", "inf", (0, 3, 0, 0)),  # the flag pass
]


def in_kernel_call(name, bad=None, how=None, at=None):
    op, inputs, _ = IN_KERNEL_OPS[name]
    x = inputs()
    if bad is not None:
        x[bad][at] = {"nan": float("nan"), "inf": float("inf"), "positive": 0.5}[how]
    return op, {n: t.to(fla_lab.device()) for n, t in x.items()}


def reported_as(name, bad, how):
    message = "is a log-decay and must be <= 0" if how == "positive" else "has 1 non-finite value"
    return pytest.raises(ValueError, match=rf"{name} call #\d+ .*: `{bad}` {message}")


@pytest.mark.parametrize("name,bad,how,at", IN_KERNEL_CASES)
def test_chunk_ops_check_values_inside_their_kernels(deferred, monkeypatch, name, bad, how, at):
    """Deferred, the chunked GLA/RWKV6/RWKV-7 forward checks its big inputs as its kernels read them: the flag pass
    gets only the rest, and a bad value anywhere (a partial chunk's last row included) is still named."""
    passed = []
    monkeypatch.setattr(values, "value_flags", lambda slots, **kw: passed.append(len(slots)) or
                        vf.value_flags(slots, **kw))
    op, x = in_kernel_call(name, bad, how, at)
    op(**x)
    assert passed == [IN_KERNEL_OPS[name][2]]
    with reported_as(name, bad, how):
        contract.flush_value_checks()


@pytest.mark.parametrize("name", IN_KERNEL_OPS)
def test_chunk_ops_in_kernel_checks_pass_valid_inputs(deferred, name):
    op, x = in_kernel_call(name)
    op(**x)
    assert len(values._pending) == 1
    contract.flush_value_checks()  # nothing to report


@needs_cuda
@pytest.mark.parametrize("name,bad,how,at", IN_KERNEL_CASES)
def test_cuda_chunk_ops_check_values_inside_their_kernels(name, bad, how, at):
    """The same, compiled: the GPU's default (deferred) mode, where the kernels' bits are set."""
    op, x = in_kernel_call(name, bad, how, at)
    assert contract.value_check_mode(x["k"]) == "deferred"
    op(**x)
    with reported_as(name, bad, how):
        contract.flush_value_checks()

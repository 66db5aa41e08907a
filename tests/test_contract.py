"""The input contract: one test per check, through the checks and through the ops that use them.

Each bad input must fail with an error that names the argument and says how to fix it (or warn, for the
layout and transition heuristics), before any kernel runs.
"""
from __future__ import annotations

import types
import warnings

import pytest
import torch
import torch.nn.functional as F

import fla_lab
from fla_lab import harness, ops
from fla_lab.ops import chunk_gla, chunk_rwkv6, contract, fused_recurrent_rwkv7

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
    yield
    contract.set_value_checks(None)


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
    with pytest.warns(contract.TransitionWarning, match=r"eigenvalue of modulus \d\d\.\d.*a = -kk, b = kk \* a_gate"):
        check7(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rwkv7_contract_inputs_do_not_warn(dtype):
    x = rwkv7_inputs(T=16, K=64, V=32, dtype=dtype)
    assert contract.transition_radius(x["w"], x["a"], x["b"]) <= 1 + contract.TRANSITION_TOL
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check7(x)


def test_transition_radius_is_the_largest_eigenvalue():
    """One step, one head, d = 1: I + b a^T has eigenvalues 1 (K - 1 times) and 1 + a.b."""
    K = 8
    a = torch.rand(1, 1, 1, K)
    b = torch.rand(1, 1, 1, K)
    w = torch.zeros(1, 1, 1, K)
    assert contract.transition_radius(w, a, b) == pytest.approx(1 + float((a.double() * b.double()).sum()), rel=1e-9)


# ------------------------------------------------------------------------------------------- value-check switch

def test_value_checks_default_by_device():
    assert contract.value_checks_enabled(torch.zeros(1))
    assert not contract.value_checks_enabled(types.SimpleNamespace(device=torch.device("cuda")))


def test_value_checks_environment_variable(monkeypatch):
    cuda = types.SimpleNamespace(device=torch.device("cuda"))
    monkeypatch.setenv("FLA_LAB_VALUE_CHECKS", "1")
    assert contract.value_checks_enabled(cuda)
    monkeypatch.setenv("FLA_LAB_VALUE_CHECKS", "0")
    assert not contract.value_checks_enabled(torch.zeros(1))


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
    contract.set_value_checks(True)  # the value checks under test are off by default on a GPU
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

"""GatedSlotAttention: upstream 0.6.0's constructor, the forward against a float64 recomputation, the gate, the
dtypes (fp32, bf16, autocast), #77's `bug="unmasked_padding"` through the layer, and the refused options.

The recomputation reads only the layer's weights and redoes every step in float64 with
`fla_lab.spec.reference.recurrent_gsa`, so it does not share code with the layer. Sizes are small (C = 32, T <= 64)
for the CPU interpreter.
"""
from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

import fla_lab
from fla_lab.spec import reference
from fla_lab.layers import GatedSlotAttention

DEV = fla_lab.device()  # the layer runs its kernels where fla_lab runs them (the GPU, when there is one)
C, H, M = 32, 2, 16


def layer(**kwargs) -> GatedSlotAttention:
    kwargs = {"hidden_size": C, "num_heads": H, "num_slots": M, **kwargs}
    return GatedSlotAttention(**kwargs).to(DEV)


def inputs(B, T, seed=0, dtype=torch.float32) -> torch.Tensor:
    x = torch.randn(B, T, C, generator=torch.Generator().manual_seed(seed))
    return x.to(DEV, dtype).requires_grad_()


def gsa_float64(layer: GatedSlotAttention, x: torch.Tensor) -> torch.Tensor:
    """The layer's forward in float64 from its weights: projections, feature map, gate, GSA, silu, RMSNorm."""
    w = {name: p.detach().double() for name, p in layer.named_parameters()}
    B, T, _ = x.shape
    phi = {"swish": F.silu, "relu": F.relu}[layer.feature_map_name]

    def heads(t, d):
        return t.view(B, T, -1, d)

    q = phi(heads(x @ w["q_proj.weight"].T, layer.head_k_dim))
    k = phi(heads(x @ w["k_proj.weight"].T, layer.head_k_dim))
    v = F.silu(heads(x @ w["v_proj.weight"].T, layer.head_v_dim))
    f = F.logsigmoid(heads(x @ w["f_proj.weight"].T, layer.num_slots)) / layer.gate_logit_normalizer
    if layer.gate_clamp is not None:
        f = f.clamp(min=-layer.gate_clamp)
    s = 1 - f.exp()
    o, _ = reference.recurrent_gsa(q, k, v, s, f, scale=layer.scale)
    o = F.silu(o.reshape(B, T, -1))
    o = o * (o.pow(2).mean(-1, keepdim=True) + layer.g_norm.eps).rsqrt()
    if "g_norm.weight" in w:
        o = o * w["g_norm.weight"]
    return o @ w["o_proj.weight"].T


def rel(got, ref) -> float:
    got, ref = got.detach().double().cpu(), ref.detach().double().cpu()
    return float((got - ref).norm() / ref.norm())


def assert_finite_step(module, x):
    o, _, _ = module(x)
    o.float().square().mean().backward()
    assert torch.isfinite(o).all()
    assert torch.isfinite(x.grad).all()
    for name, p in module.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    return o


# ----------------------------------------------------------------------------------------------------------
# Constructor


def test_defaults_match_upstream():
    """flash-linear-attention 0.6.0 `fla/layers/gsa.py`: same names, same defaults (plus fla_lab's three)."""
    upstream = dict(mode="chunk", hidden_size=1024, expand_k=1.0, expand_v=1.0, num_heads=4, num_kv_heads=None,
                    use_short_conv=False, conv_size=4, conv_bias=False, num_slots=None, elementwise_affine=True,
                    norm_eps=1e-5, gate_logit_normalizer=8, feature_map="swish", use_output_gate=False,
                    use_norm=True, layer_idx=None, scale=1.0)
    params = inspect.signature(GatedSlotAttention).parameters
    got = {name: p.default for name, p in params.items() if p.kind is p.POSITIONAL_OR_KEYWORD}
    assert got == {**upstream, "gate_clamp": None, "gate_fn": "logsigmoid", "bug": None}
    assert list(got)[:len(upstream)] == list(upstream)  # positional order too
    default = GatedSlotAttention()
    assert (default.key_dim, default.value_dim, default.head_k_dim, default.num_slots) == (1024, 1024, 256, 256)
    assert default.scale == 1.0 and default.gate_logit_normalizer == 8


def test_parameter_and_output_shapes():
    m = layer(expand_k=0.5)
    K = C // 2
    shapes = {name: tuple(p.shape) for name, p in m.named_parameters()}
    assert shapes == {"q_proj.weight": (K, C), "k_proj.weight": (K, C), "v_proj.weight": (C, C),
                      "f_proj.weight": (H * M, C), "g_norm.weight": (C,), "o_proj.weight": (C, C)}
    assert all(b is None for b in (m.q_proj.bias, m.k_proj.bias, m.v_proj.bias, m.f_proj.bias, m.o_proj.bias))
    assert "g_norm.weight" not in dict(layer(elementwise_affine=False).named_parameters())
    assert layer(num_slots=None).num_slots == C // H  # upstream: num_slots defaults to head_k_dim
    with torch.no_grad():
        o, attn, cache = m(inputs(2, 19))
    assert o.shape == (2, 19, C) and attn is None and cache is None


# ----------------------------------------------------------------------------------------------------------
# Forward and gradient against float64


@pytest.mark.parametrize("options, T", [({}, 37), ({}, 70),
                                        (dict(feature_map="relu", expand_k=0.5, scale=None, gate_clamp=0.08,
                                              elementwise_affine=False, norm_eps=1e-3), 37)],
                         ids=["default-fused", "default-chunk", "variant-fused"])
def test_matches_float64_recomputation(options, T):
    """T <= 64 runs fused_recurrent_gsa, longer chunk_gsa (`test_kernel_choice_follows_upstream`)."""
    m = layer(**options)
    if m.g_norm.weight is not None:
        with torch.no_grad():
            m.g_norm.weight.uniform_(0.5, 1.5)  # so a wrong norm weight shows
    x = inputs(2, T, seed=1)
    o, _, _ = m(x)
    x64 = x.detach().double().requires_grad_()
    ref = gsa_float64(m, x64)
    assert rel(o, ref) < 2e-6
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(2)).to(DEV)
    o.backward(do)
    ref.backward(do.double())
    assert rel(x.grad, x64.grad) < 5e-6


@pytest.mark.parametrize("mode, bug, T, expected", [
    ("chunk", None, 64, "fused_recurrent_gsa"),  # upstream: fused_recurrent_gsa up to T = 64
    ("chunk", None, 65, "chunk_gsa"),
    ("fused_recurrent", None, 65, "fused_recurrent_gsa"),
    ("chunk", "unmasked_padding", 5, "chunk_gsa"),  # a chunk_gsa switch runs where it lives, at every length
])
def test_kernel_choice_follows_upstream(monkeypatch, mode, bug, T, expected):
    calls = []

    def spy(name):
        def op(q, k, v, s, g=None, scale=None, bug=None):
            calls.append((name, bug))
            return torch.zeros_like(v), None
        return op

    for name in ("chunk_gsa", "fused_recurrent_gsa"):
        monkeypatch.setattr(fla_lab.ops, name, spy(name))
    with torch.no_grad():
        layer(mode=mode, bug=bug)(inputs(1, T))
        assert calls == [(expected, bug)]
        calls.clear()
        layer(mode=mode, bug=bug, gate_fn="piecewise")(inputs(1, T))  # how the gate is written picks no kernel
        assert calls == [(expected, bug)]


# ----------------------------------------------------------------------------------------------------------
# The gate


def test_gate_formula_and_clamp():
    m = layer()
    x = inputs(1, 19, seed=3)
    with torch.no_grad():
        m.f_proj.weight.mul_(60)  # logits of tens: some f below -2, some near 0
        f, s = m.gates(x)
        logits = (x.double() @ m.f_proj.weight.double().T).view(1, 19, H, M)
        f64 = F.logsigmoid(logits) / 8
        assert f.dtype == s.dtype == torch.float32 and f.shape == (1, 19, H, M)
        assert torch.allclose(f.double(), f64, rtol=1e-5, atol=1e-6)
        assert torch.allclose(s.double(), 1 - f64.exp(), rtol=1e-5, atol=1e-7)
        assert (f <= 0).all() and (f < -2).any() and (f > -0.01).any()

        m.gate_clamp = 2.0
        fc, sc = m.gates(x)
        assert torch.allclose(fc.double(), f64.clamp(min=-2.0), rtol=1e-5, atol=1e-6)
        assert torch.allclose(sc.double(), 1 - f64.clamp(min=-2.0).exp(), rtol=1e-5, atol=1e-7)
        assert fc.min() == -2.0


def test_gate_stays_fp32_and_kernel_inputs_share_a_dtype_under_autocast(monkeypatch):
    """The gate is fp32 even when the projection is bf16; q, k, v, s reach the kernel in the autocast dtype
    (autocast on the device the layer runs on; a spy stands in for the kernel)."""
    seen = {}

    def spy(q, k, v, s, g=None, **kwargs):
        seen.update(q=q.dtype, k=k.dtype, v=v.dtype, s=s.dtype, g=g.dtype)
        return reference.recurrent_gsa(q, k, v, s, g, scale=kwargs["scale"])[0].to(v.dtype), None

    monkeypatch.setattr(fla_lab.ops, "chunk_gsa", spy)
    monkeypatch.setattr(fla_lab.ops, "fused_recurrent_gsa", spy)  # T = 5: the layer's fused path
    m = layer()
    with torch.autocast(DEV, dtype=torch.bfloat16):
        assert m.f_proj(inputs(1, 5)).dtype == torch.bfloat16
        f, s = m.gates(inputs(1, 5))
        m(inputs(1, 5))
    assert f.dtype == s.dtype == torch.float32
    assert seen == dict(q=torch.bfloat16, k=torch.bfloat16, v=torch.bfloat16, s=torch.bfloat16, g=torch.float32)


# ----------------------------------------------------------------------------------------------------------
# dtypes


@pytest.mark.parametrize("device_type", [
    pytest.param("cpu", marks=pytest.mark.skipif(DEV != "cpu", reason="the kernels run on the GPU here")),
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")),
])
def test_autocast_bf16_forward_backward(device_type):
    m = layer()  # fp32 parameters, fp32 input
    x = inputs(2, 19, seed=4)
    with torch.autocast(device_type, dtype=torch.bfloat16):
        o, _, _ = m(x)
    assert o.dtype == torch.bfloat16
    o.float().square().mean().backward()
    assert torch.isfinite(o).all() and torch.isfinite(x.grad).all()
    for name, p in m.named_parameters():
        assert p.dtype == torch.float32 and p.grad is not None and torch.isfinite(p.grad).all(), name
    with torch.no_grad():  # and close to fp32: bf16 rounding, not a different function
        assert rel(o, m(x)[0]) < 0.05


def test_bf16_module_forward_backward():
    m = layer().to(torch.bfloat16)
    o = assert_finite_step(m, inputs(1, 19, seed=5, dtype=torch.bfloat16))
    assert o.dtype == torch.bfloat16


# ----------------------------------------------------------------------------------------------------------
# Upstream #77 through the layer


def strong_forgetting(m: GatedSlotAttention, T: int) -> torch.Tensor:
    """An input near 1 and an f_proj of -160/C per entry: logits near -160, so f = logsigmoid/8 near -20."""
    with torch.no_grad():
        m.f_proj.weight.fill_(-160 / C)
    x = 1 + 0.1 * torch.randn(1, T, C, generator=torch.Generator().manual_seed(T))
    return x.to(DEV).requires_grad_()


@pytest.mark.parametrize("T", [45, 64])
def test_unmasked_padding_nan_gradient_needs_a_partial_chunk(T):
    """f about -20 per step: a sub-chunk of 16 rows decays by about -320 < -88.7. With T = 45 the last chunk is
    partial and the bug's exp(0 - gn) overflows on the padded rows: NaN in dx and in f_proj's gradient. With
    T = 64 there are no padded rows; the fixed path is finite at both lengths."""
    for bug in (None, "unmasked_padding"):
        m = layer(bug=bug)
        x = strong_forgetting(m, T)
        f, _ = m.gates(x)
        assert -22 < f.min() and f.max() < -18
        o, _, _ = m(x)
        o.sum().backward()
        assert torch.isfinite(o).all(), "the forward never reads the padded rows"
        broken = bug is not None and T % 64 != 0
        for name, grad in (("x", x.grad), ("f_proj.weight", m.f_proj.weight.grad)):
            assert torch.isnan(grad).any() == broken, f"bug={bug}, T={T}: d{name}"
            if not broken:
                assert torch.isfinite(grad).all(), f"bug={bug}, T={T}: d{name}"


# ----------------------------------------------------------------------------------------------------------
# Refused options


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(num_kv_heads=1), NotImplementedError, "num_kv_heads"),
    (dict(use_short_conv=True), NotImplementedError, "short convolution"),
    (dict(feature_map="t2r"), NotImplementedError, "feature_map"),
    (dict(mode="fused_recurrent", bug="unmasked_padding"), ValueError, "never runs"),
    (dict(mode="parallel"), ValueError, "mode"),
    (dict(use_output_gate=True), NotImplementedError, "ignores it"),
    (dict(use_norm=False), NotImplementedError, "ignores it"),
    (dict(expand_v=0.5), ValueError, "value_dim"),
    (dict(expand_k=0.3), ValueError, "integer"),
    (dict(num_heads=3), ValueError, "divisible"),
    (dict(gate_clamp=0.0), ValueError, "gate_clamp"),
    (dict(bug="sigmoid_decay"), ValueError, "unknown bug"),
])
def test_unsupported_options_raise(kwargs, error, match):
    with pytest.raises(error, match=match):
        layer(**kwargs)


def test_cache_and_mask_raise():
    m = layer()
    x = inputs(1, 4)
    for kwargs in (dict(attention_mask=torch.ones(1, 4)), dict(use_cache=True), dict(past_key_values=object())):
        with pytest.raises(NotImplementedError):
            m(x, **kwargs)


def test_malformed_offsets_reach_the_contract():
    """A packed batch goes to the op (tests/test_layers.py compares it with each sequence alone); offsets that do
    not end at T are the contract's error."""
    with pytest.raises(ValueError, match="end at T = 4"):
        layer()(inputs(1, 4), cu_seqlens=torch.tensor([0, 3], device=DEV))

"""RWKV6Attention / RWKV7Attention: the official init, the forward against official-style loops, the bug switches.

Everything here is independent of the layer code: the init formulas are recomputed element by element (as the
official RWKV-LM code writes them), and the forward passes are re-derived from the official recurrences in
float64 (state [value, key] for RWKV-7, the softplus form of the decay). Sizes are small (C <= 128, T <= 40)
for the CPU interpreter, except where a test names the reported size.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import fla_lab
from fla_lab.spec import check, reference
from fla_lab import ops
from fla_lab.layers import RWKV6Attention, RWKV7Attention, rwkv7
from fla_lab.ops import chunk_rwkv7, fused_recurrent_rwkv7

RWKV7_CASES = [(64, 32, 0, 2), (128, 64, 3, 5), (96, 32, 2, 3)]  # (C, N, layer, layers)
RWKV6_CASES = [(64, 16, 0, 2), (96, 24, 2, 4)]  # (C, N, layer, layers); K = C/2


def reference_rwkv7(r, w, k, v, a, b, scale=1.0, initial_state=None, output_final_state=False, **kwargs):
    """A thin wrapper over the float64 reference, standing in for fused_recurrent_rwkv7 (autograd backward)."""
    o, ht = reference.recurrent_rwkv7(r, w, k, v, a, b, scale=scale, initial_state=initial_state,
                                      output_final_state=output_final_state)
    return o.to(r.dtype), ht


@pytest.fixture
def rwkv7_op(monkeypatch):
    monkeypatch.setattr(ops, "fused_recurrent_rwkv7", reference_rwkv7, raising=False)
    monkeypatch.setattr(ops, "chunk_rwkv7", reference_rwkv7, raising=False)


DEV = fla_lab.device()  # layers run their kernels where fla_lab runs them (the GPU, when there is one)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


@torch.no_grad()
def trained_(layer: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Give the matrices the official init sets to zero (LoRA down weights, maa_w1, o_proj) random values, as
    training would, so every path of the forward matters."""
    g = gen(seed)
    for name, p in layer.named_parameters():
        if p.dim() >= 2 and name.endswith(("lora.0.weight", "maa_w1", "o_proj.weight")):
            fan_in = p.shape[-1] if "maa_w1" not in name else p.shape[0]
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
    return layer


def assert_orthogonal(weight: torch.Tensor, gain: float):
    w = weight.detach().double()
    gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
    assert torch.allclose(gram, gain ** 2 * torch.eye(gram.shape[0], dtype=torch.float64), atol=1e-5 * max(gain, 1))


# ----------------------------------------------------------------------------------------------------------
# RWKV-7 official init


def official_rwkv7_vectors(C, N, l, L):
    """Element by element, the way RWKV-LM's RWKV_Tmix_x070 writes them."""
    r0, r1 = l / (L - 1), 1.0 - l / L
    out = {name: torch.zeros(C, dtype=torch.float64) for name in
           ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g", "w0", "a0", "v0", "k_k")}
    for n in range(C):
        ddd = n / C
        linear = n / (C - 1) - 0.5
        z = ((n % N) - (N - 1) / 2) / ((N - 1) / 2)
        zigzag = z * abs(z)
        www = -6 + 6 * (n / (C - 1)) ** (1 + 1 * r0 ** 0.3)
        for name, p in (("x_r", 0.2), ("x_w", 0.9), ("x_k", 0.7), ("x_v", 0.7), ("x_a", 0.9), ("x_g", 0.2)):
            out[name][n] = 1.0 - ddd ** (p * r1)
        out["w0"][n] = www + 0.5 + zigzag * 2.5
        out["a0"][n] = -0.19 + zigzag * 0.3 + linear * 0.4
        out["v0"][n] = 0.73 - linear * 0.4
        out["k_k"][n] = 0.71 - linear * 0.1
    return out


@pytest.mark.parametrize("C,N,l,L", RWKV7_CASES)
def test_rwkv7_init_is_the_official_one(C, N, l, L):
    layer = RWKV7Attention("chunk", hidden_size=C, head_dim=N, layer_idx=l, num_hidden_layers=L)
    want = official_rwkv7_vectors(C, N, l, L)
    for name in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g", "k_k"):
        torch.testing.assert_close(getattr(layer, name).detach().double().flatten(), want[name], rtol=0, atol=1e-6)
    assert torch.all(layer.k_a == 1.02) and torch.all(layer.r_k == -0.04) and layer.r_k.shape == (C // N, N)
    torch.testing.assert_close(layer.w_lora.lora[2].bias.double(), want["w0"], rtol=0, atol=1e-6)
    torch.testing.assert_close(layer.a_lora.lora[2].bias.double(), want["a0"], rtol=0, atol=1e-6)
    if l == 0:
        assert not hasattr(layer, "v_lora")  # layer 0 produces v_first instead of mixing it in
    else:
        torch.testing.assert_close(layer.v_lora.lora[2].bias.double(), want["v0"], rtol=0, atol=1e-6)
    assert layer.g_lora.lora[2].bias is None
    for lora in [layer.w_lora, layer.a_lora, layer.g_lora] + ([layer.v_lora] if l else []):
        assert torch.all(lora.lora[0].weight == 0)
        rank, out = lora.lora[0].out_features, lora.lora[2].out_features
        assert_orthogonal(lora.lora[2].weight, 0.1 * (math.sqrt(rank / out) if rank > out else 1.0))
    assert_orthogonal(layer.r_proj.weight, 1.0)
    assert_orthogonal(layer.v_proj.weight, 1.0)
    assert_orthogonal(layer.k_proj.weight, 0.1)
    assert torch.all(layer.o_proj.weight == 0)
    torch.testing.assert_close(layer.g_norm.weight.double(),
                               torch.full((C,), ((l + 1) / L) ** 0.7, dtype=torch.float64), rtol=0, atol=1e-7)
    assert layer.g_norm.eps == pytest.approx(N * 1e-5)


def test_rwkv7_lora_ranks_follow_the_official_rule():
    layer = RWKV7Attention("chunk", hidden_size=768, layer_idx=1, num_hidden_layers=12)
    assert (layer.decay_low_rank_dim, layer.a_low_rank_dim, layer.v_low_rank_dim, layer.gate_low_rank_dim) == (
        64, 64, 32, 128)
    ranks = [m.lora[0].out_features for m in (layer.w_lora, layer.a_lora, layer.v_lora, layer.g_lora)]
    assert ranks == [64, 64, 32, 128]
    wide = RWKV7Attention("chunk", hidden_size=512, head_dim=128, layer_idx=0, num_hidden_layers=2)
    assert wide.decay_low_rank_dim == max(32, round(2.5 * math.sqrt(512) * 2 / 32) * 32)  # N/64 = 2
    assert wide.gate_low_rank_dim == max(32, round(5 * math.sqrt(512) / 32) * 32)


def test_reported_call_says_what_to_pass():
    """#150's `RWKV7Attention("chunk", hidden_size=768, layer_idx=0)`: a ValueError naming num_hidden_layers,
    where upstream 0.6.0 raises TypeError (L=None) or ZeroDivisionError (L=1)."""
    with pytest.raises(ValueError, match=r"num_hidden_layers.*>= 2"):
        RWKV7Attention("chunk", hidden_size=768, layer_idx=0)
    with pytest.raises(ValueError, match="num_hidden_layers=1"):
        RWKV7Attention("chunk", hidden_size=768, layer_idx=0, num_hidden_layers=1)
    with pytest.raises(ValueError, match="layer_idx"):
        RWKV7Attention("chunk", hidden_size=64, head_dim=32, num_hidden_layers=4)
    with pytest.raises(ValueError, match="outside"):
        RWKV7Attention("chunk", hidden_size=64, head_dim=32, layer_idx=4, num_hidden_layers=4)
    layer = RWKV7Attention("chunk", hidden_size=768, layer_idx=0, num_hidden_layers=2)
    assert all(torch.isfinite(p).all() for p in layer.parameters())


def test_bug_names_are_checked_against_the_catalogue():
    with pytest.raises(ValueError, match="uninitialized_params"):
        RWKV7Attention(hidden_size=64, head_dim=32, layer_idx=0, num_hidden_layers=2, bug="sigmoid_decay")
    with pytest.raises(ValueError, match="sigmoid_decay"):
        RWKV6Attention(hidden_size=64, num_heads=2, layer_idx=0, num_hidden_layers=2, bug="bf16_decay")


# ----------------------------------------------------------------------------------------------------------
# RWKV-7 forward


def official_rwkv7_forward(layer, x, v_first=None):
    """RWKV-LM's RWKV_Tmix_x070 in float64 from the layer's parameters: softplus decay, [value, key] state."""
    P = {name: p.detach().double() for name, p in layer.named_parameters()}
    x = x.detach().double()
    B, T, C = x.shape
    H, N = layer.num_heads, layer.head_dim
    xx = F.pad(x, (0, 0, 1, -1)) - x
    xr, xw, xk, xv, xa, xg = (x + xx * P[f"x_{c}"].view(C) for c in "rwkvag")

    def lora(name, t, act=lambda u: u):
        out = act(t @ P[f"{name}.lora.0.weight"].T) @ P[f"{name}.lora.2.weight"].T
        return out + P[f"{name}.lora.2.bias"] if f"{name}.lora.2.bias" in P else out

    r, k, v = xr @ P["r_proj.weight"].T, xk @ P["k_proj.weight"].T, xv @ P["v_proj.weight"].T
    w = -F.softplus(-lora("w_lora", xw, torch.tanh)) - 0.5
    d = torch.exp(-torch.exp(w))
    if layer.layer_idx == 0:
        v_first = v
    else:
        v = v + (v_first.double() - v) * torch.sigmoid(lora("v_lora", xv))
    a = torch.sigmoid(lora("a_lora", xa))
    g = lora("g_lora", xg, torch.sigmoid)
    kk = F.normalize((k * P["k_k"]).view(B, T, H, N), dim=-1).view(B, T, C)
    k = k * (1 + (a - 1) * P["k_a"])
    heads = lambda t: t.view(B, T, H, N)  # noqa: E731
    r_, d_, k_, v_, a_in, b_in = (heads(t) for t in (r, d, k, v, -kk, kk * a))
    S = torch.zeros(B, H, N, N, dtype=torch.float64)  # S[value i, key j]
    ys = []
    for t in range(T):
        sa = torch.einsum("bhij,bhj->bhi", S, a_in[:, t])
        S = (S * d_[:, t, :, None, :] + sa[..., None] * b_in[:, t, :, None, :]
             + v_[:, t, :, :, None] * k_[:, t, :, None, :])
        ys.append(torch.einsum("bhij,bhj->bhi", S, r_[:, t]))
    y = torch.stack(ys, 1)  # [B, T, H, N]
    mean, var = y.mean(-1, keepdim=True), y.var(-1, unbiased=False, keepdim=True)
    y = ((y - mean) / torch.sqrt(var + layer.g_norm.eps)).reshape(B, T, C) * P["g_norm.weight"] + P["g_norm.bias"]
    y = y + ((r_ * k_ * P["r_k"]).sum(-1, keepdim=True) * v_).reshape(B, T, C)
    return (y * g) @ P["o_proj.weight"].T, v_first


@pytest.mark.parametrize("mode", ["chunk", "fused_recurrent"])
def test_rwkv7_forward_matches_the_official_recurrence(rwkv7_op, mode):
    C, N, L = 64, 32, 3
    x = torch.randn(2, 20, C, generator=gen(1))
    l0 = trained_(RWKV7Attention(mode, hidden_size=C, head_dim=N, layer_idx=0, num_hidden_layers=L), 1)
    l1 = trained_(RWKV7Attention(mode, hidden_size=C, head_dim=N, layer_idx=1, num_hidden_layers=L), 2)
    o0, attn, cache, v_first = l0(x)
    assert attn is None and cache is None
    o1, *_, v_first1 = l1(x, v_first=v_first)
    want0, want_v_first = official_rwkv7_forward(l0, x)
    want1, _ = official_rwkv7_forward(l1, x, v_first)
    assert check.rel_error(v_first, want_v_first) < 1e-5 and v_first1 is v_first
    assert check.rel_error(o0, want0) < 1e-5
    assert check.rel_error(o1, want1) < 1e-5


def test_rwkv7_later_layers_need_v_first(rwkv7_op):
    layer = RWKV7Attention("chunk", hidden_size=64, head_dim=32, layer_idx=1, num_hidden_layers=2)
    with pytest.raises(ValueError, match="v_first"):
        layer(torch.randn(1, 4, 64))


def bf16_forward_backward(layer, x, **kwargs):
    layer = trained_(layer).to(DEV, torch.bfloat16)
    x = x.to(DEV, torch.bfloat16).requires_grad_(True)
    out = layer(x, **kwargs)[0]
    out.float().square().mean().backward()
    grads = {"x": x.grad, **{name: p.grad for name, p in layer.named_parameters()}}
    return out, grads


def test_rwkv7_bf16_forward_backward_finite(rwkv7_op):
    layer = RWKV7Attention("chunk", hidden_size=128, head_dim=64, layer_idx=0, num_hidden_layers=4)
    out, grads = bf16_forward_backward(layer, torch.randn(2, 24, 128, generator=gen(2)))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    missing = [n for n, g in grads.items() if g is None]
    assert not missing, f"no gradient for {missing}"
    assert all(torch.isfinite(g).all() for g in grads.values())
    assert grads["x"].abs().sum() > 0


KERNELS = {"chunk": ("chunk_rwkv7", chunk_rwkv7), "fused_recurrent": ("fused_recurrent_rwkv7", fused_recurrent_rwkv7)}


@pytest.mark.parametrize("mode", KERNELS)
def test_rwkv7_layer_on_the_real_kernel(monkeypatch, mode):
    """The same layer on the Triton kernel of its mode and on the float64 reference: same output and gradients."""
    name_of_op, op = KERNELS[mode]  # the kernel, imported before any monkeypatch of fla_lab.ops
    C, N = 64, 32
    layer = trained_(RWKV7Attention(mode, hidden_size=C, head_dim=N, layer_idx=0, num_hidden_layers=2))
    layer, x = layer.to(DEV), torch.randn(1, 21, C, generator=gen(3)).to(DEV)
    assert layer.default_op() is op
    results = {}
    for name, impl in (("kernel", op), ("reference", reference_rwkv7)):
        monkeypatch.setattr(ops, name_of_op, impl, raising=False)
        layer.zero_grad()
        out = layer(x)[0]
        out.square().mean().backward()
        results[name] = (out.detach(), {n: p.grad.clone() for n, p in layer.named_parameters()})
    (o, grads), (o_ref, grads_ref) = results["kernel"], results["reference"]
    assert check.rel_error(o, o_ref) < 2e-5
    errors = check.grad_errors(grads_ref, grads)
    assert max(errors.values()) < 5e-5, errors


def test_rwkv7_modes_agree():
    """"chunk" (chunk_rwkv7) and "fused_recurrent" (fused_recurrent_rwkv7): same weights, same output and grads."""
    results = []
    for mode in KERNELS:
        torch.manual_seed(0)
        layer = trained_(RWKV7Attention(mode, hidden_size=64, head_dim=32, layer_idx=0, num_hidden_layers=2)).to(DEV)
        out = layer(torch.randn(2, 37, 64, generator=gen(5)).to(DEV))[0]
        out.square().mean().backward()
        results.append((out.detach(), {n: p.grad.clone() for n, p in layer.named_parameters()}))
    (o_chunk, g_chunk), (o_rec, g_rec) = results
    assert check.rel_error(o_chunk, o_rec.double()) < 2e-5
    errors = check.grad_errors({n: g.double() for n, g in g_rec.items()}, g_chunk)
    assert max(errors.values()) < 5e-5, errors


@pytest.mark.parametrize("mode", KERNELS)
def test_rwkv7_bf16_on_the_real_kernel(monkeypatch, mode):
    monkeypatch.setattr(ops, KERNELS[mode][0], KERNELS[mode][1])
    layer = RWKV7Attention(mode, hidden_size=64, head_dim=32, layer_idx=0, num_hidden_layers=2)
    out, grads = bf16_forward_backward(layer, torch.randn(1, 16, 64, generator=gen(4)))
    assert torch.isfinite(out).all() and all(g is not None and torch.isfinite(g).all() for g in grads.values())


# ----------------------------------------------------------------------------------------------------------
# RWKV-7 bugs (the reproductions of the catalogue entries, trigger and control, are in test_bugs.py)


def test_uninitialized_params_is_deterministic_garbage():
    make = lambda: RWKV7Attention("chunk", hidden_size=768, layer_idx=0, bug="uninitialized_params")  # noqa: E731
    first, second = make(), make()
    names = ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g", "k_k", "k_a", "r_k")
    for name in names:  # same bits on every construction, unlike torch.empty
        assert torch.equal(getattr(first, name).view(torch.int32), getattr(second, name).view(torch.int32))
    values = torch.cat([getattr(first, n).detach().flatten() for n in names])
    assert (~torch.isfinite(values)).sum() > 0 and values[torch.isfinite(values)].abs().max() > 1e30
    assert first.legacy_parameter_branch_runs == 0  # the nn.Parameter branch of the old init never ran
    assert all(torch.isfinite(p).all() for n, p in first.named_parameters() if not n.startswith(names))


def test_module_apply_never_visits_parameters():
    """Why the old init's `isinstance(module, nn.Parameter)` branch is dead."""
    layer = RWKV7Attention("chunk", hidden_size=64, head_dim=32, layer_idx=0, num_hidden_layers=2)
    seen = []
    layer.apply(seen.append)
    assert seen and not any(isinstance(m, torch.nn.Parameter) for m in seen)
    assert all(isinstance(m, torch.nn.Module) for m in seen)


def test_real_torch_empty_helper_returns_a_tensor_of_the_shape():
    assert rwkv7.real_torch_empty((3, 5)).shape == (3, 5)  # its values are whatever memory held: not asserted


def test_bf16_decay_layers_run(rwkv7_op):
    x = torch.randn(1, 16, 64, generator=gen(7))
    layer = RWKV7Attention("chunk", hidden_size=64, head_dim=32, layer_idx=0, num_hidden_layers=2, bug="bf16_decay")
    out, grads = bf16_forward_backward(layer, x)
    assert torch.isfinite(out).all()


# ----------------------------------------------------------------------------------------------------------
# RWKV-6


def official_rwkv6_vectors(C, K, N, l, L):
    """Element by element, the way RWKV-LM's RWKV_Tmix_x060 writes them."""
    r0, r1 = l / (L - 1), 1.0 - l / L
    ddd = torch.tensor([n / C for n in range(C)], dtype=torch.float64)
    want = {"maa_x": 1.0 - ddd ** r1, "maa_w": 1.0 - ddd ** r1, "maa_k": 1.0 - ddd ** r1,
            "maa_v": 1.0 - (ddd ** r1 + 0.3 * r0), "maa_r": 1.0 - ddd ** (0.5 * r1),
            "maa_g": 1.0 - ddd ** (0.5 * r1)}
    want["w0"] = torch.tensor([-6 + 5 * (n / (K - 1)) ** (0.7 + 1.3 * r0) for n in range(K)], dtype=torch.float64)
    want["u"] = torch.tensor([r0 * (1 - (n / (K - 1))) + ((n + 1) % 3 - 1) * 0.1 for n in range(K)],
                             dtype=torch.float64).view(K // N, N)
    return want


@pytest.mark.parametrize("C,N,l,L", RWKV6_CASES)
def test_rwkv6_init_is_the_official_one(C, N, l, L):
    K = C // 2
    layer = RWKV6Attention("chunk", hidden_size=C, num_heads=K // N, layer_idx=l, num_hidden_layers=L)
    want = official_rwkv6_vectors(C, K, N, l, L)
    got = {"maa_x": layer.maa_x, "w0": layer.w_lora.lora[2].bias, "u": layer.bonus,
           **{f"maa_{n}": layer.maa[i] for i, n in enumerate("wkvrg")}}
    for name, value in want.items():
        torch.testing.assert_close(got[name].detach().double(), value, rtol=0, atol=1e-6, msg=name)
    assert torch.all(layer.maa_w1 == 0) and torch.all(layer.w_lora.lora[0].weight == 0)
    for p in (layer.maa_w2, layer.w_lora.lora[2].weight):
        assert p.abs().max() <= 0.01 and p.abs().max() > 0
    for proj, gain in ((layer.r_proj, 1.0), (layer.k_proj, 0.1), (layer.v_proj, 1.0), (layer.g_proj, 0.1)):
        assert_orthogonal(proj.weight, gain)
    assert torch.all(layer.o_proj.weight == 0)
    assert layer.g_norm.eps == pytest.approx(64e-5)


def test_rwkv6_needs_the_depth():
    with pytest.raises(ValueError, match="num_hidden_layers"):
        RWKV6Attention("chunk", hidden_size=64, num_heads=2, layer_idx=0)


def official_rwkv6_forward(layer, x, decay_from_raw=lambda w: -torch.exp(w)):
    P = {name: p.detach().double() for name, p in layer.named_parameters()}
    x = x.detach().double()
    B, T, C = x.shape
    H, N, R = layer.num_heads, layer.head_k_dim, layer.proj_low_rank_dim
    xx = F.pad(x, (0, 0, 1, -1)) - x
    low = torch.tanh((x + xx * P["maa_x"]) @ P["maa_w1"]).view(B * T, 5, R).transpose(0, 1)
    mw, mk, mv, mr, mg = torch.bmm(low, P["maa_w2"]).view(5, B, T, C)
    maa = dict(zip("wkvrg", P["maa"]))
    xw, xk, xv, xr, xg = (x + xx * (maa[c] + m) for c, m in zip("wkvrg", (mw, mk, mv, mr, mg)))
    r, k, v = xr @ P["r_proj.weight"].T, xk @ P["k_proj.weight"].T, xv @ P["v_proj.weight"].T
    g = F.silu(xg @ P["g_proj.weight"].T)
    w_raw = P["w_lora.lora.2.bias"] + torch.tanh(xw @ P["w_lora.lora.0.weight"].T) @ P["w_lora.lora.2.weight"].T
    d = torch.exp(decay_from_raw(w_raw))
    heads = lambda t: t.view(B, T, H, -1)  # noqa: E731
    r, k, v, d = heads(r), heads(k), heads(v), heads(d)
    S = torch.zeros(B, H, N, v.shape[-1], dtype=torch.float64, device=v.device)
    ys = []
    for t in range(T):
        kv = k[:, t, :, :, None] * v[:, t, :, None, :]
        ys.append(torch.einsum("bhk,bhkv->bhv", r[:, t], S + P["bonus"][None, :, :, None] * kv))
        S = S * d[:, t, :, :, None] + kv
    y = torch.stack(ys, 1)
    mean, var = y.mean(-1, keepdim=True), y.var(-1, unbiased=False, keepdim=True)
    y = ((y - mean) / torch.sqrt(var + layer.g_norm.eps)).reshape(B, T, -1) * P["g_norm.weight"] + P["g_norm.bias"]
    return (y * g) @ P["o_proj.weight"].T


def test_rwkv6_forward_matches_the_official_recurrence():
    layer = trained_(RWKV6Attention("chunk", hidden_size=64, num_heads=2, layer_idx=1, num_hidden_layers=3)).to(DEV)
    x = torch.randn(2, 24, 64, generator=gen(8)).to(DEV)
    out, attn, cache = layer(x)
    assert attn is None and cache is None
    assert check.rel_error(out, official_rwkv6_forward(layer, x)) < 1e-5


def test_rwkv6_dispatches_to_chunk_after_64_steps(monkeypatch):
    calls = []

    def spy(name):
        def op(r, k, v, w, u, scale=None, **kwargs):
            calls.append((name, scale, r.shape[1]))
            return reference.recurrent_rwkv6(r, k, v, w, u, scale=scale)[0].to(r.dtype), None
        return op

    monkeypatch.setattr(ops, "chunk_rwkv6", spy("chunk"), raising=False)
    monkeypatch.setattr(ops, "fused_recurrent_rwkv6", spy("fused_recurrent"))
    layer = RWKV6Attention("chunk", hidden_size=32, num_heads=1, layer_idx=0, num_hidden_layers=2)
    for T in (64, 65):
        layer(torch.randn(1, T, 32))
    recurrent = RWKV6Attention("fused_recurrent", hidden_size=32, num_heads=1, layer_idx=0, num_hidden_layers=2)
    recurrent(torch.randn(1, 65, 32))
    assert calls == [("fused_recurrent", 1.0, 64), ("chunk", 1.0, 65), ("fused_recurrent", 1.0, 65)]


def test_rwkv6_bf16_forward_backward_finite():
    layer = RWKV6Attention("fused_recurrent", hidden_size=64, num_heads=2, layer_idx=0, num_hidden_layers=2)
    out, grads = bf16_forward_backward(layer, torch.randn(2, 24, 64, generator=gen(9)))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())


def _packed_layers():
    from fla_lab.layers import GatedSlotAttention
    return {"RWKV6Attention": lambda: trained_(RWKV6Attention("chunk", hidden_size=64, num_heads=2, layer_idx=0,
                                                              num_hidden_layers=2)),
            "RWKV7Attention": lambda: trained_(RWKV7Attention("chunk", hidden_size=64, head_dim=32, layer_idx=0,
                                                              num_hidden_layers=2)),
            "GatedSlotAttention": lambda: GatedSlotAttention(hidden_size=32, num_heads=2, num_slots=16)}


@pytest.mark.parametrize("name", ["RWKV6Attention", "RWKV7Attention", "GatedSlotAttention"])
def test_a_packed_batch_is_each_sequence_alone(name):
    """`layer(x, cu_seqlens=...)` (FLA's varlen, B = 1) against the layer on each sequence alone, output and every
    parameter's gradient: the token shift and the state restart at each sequence (lengths 20 and 75: one below the
    chunk, one with a partial chunk). Without the offsets the second sequence reads the first: it differs."""
    torch.manual_seed(0)
    layer = _packed_layers()[name]().to(DEV)
    lengths = (20, 75)
    x = torch.randn(1, sum(lengths), layer.hidden_size, generator=gen(1)).to(DEV)
    cu = torch.tensor([0, 20, 95], device=DEV)

    def run(pieces):
        layer.zero_grad()
        o = torch.cat([layer(part, **kw)[0] for part, kw in pieces], dim=1)
        o.square().sum().backward()
        return o.detach(), {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}

    o, grads = run([(x, {"cu_seqlens": cu})])
    o_alone, grads_alone = run([(x[:, :20], {}), (x[:, 20:], {})])
    torch.testing.assert_close(o, o_alone, rtol=1e-5, atol=1e-5)
    for n in grads_alone:
        torch.testing.assert_close(grads[n], grads_alone[n], rtol=1e-4, atol=1e-5, msg=n)
    o_leaking, _ = run([(x, {})])
    assert not torch.allclose(o_leaking[:, 20:], o_alone[:, 20:], rtol=1e-3, atol=1e-3)

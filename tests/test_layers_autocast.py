"""Every layer in an autocast training step (bf16, fp32 parameters and input) on the device the kernels run on:
CPU autocast under the interpreter, CUDA autocast on a GPU. And the #181 fix inside that real AMP step: the
RWKV-7 decay reaches the kernel in fp32, unless `bug="bf16_decay"` rounds it."""
import pytest
import torch

from fla_lab import device
from fla_lab.layers import GatedSlotAttention, RWKV6Attention, RWKV7Attention

LAYERS = {
    "rwkv6": lambda **kw: RWKV6Attention(hidden_size=64, num_heads=2, layer_idx=0, num_hidden_layers=2, **kw),
    "rwkv7": lambda **kw: RWKV7Attention(hidden_size=64, head_dim=32, layer_idx=0, num_hidden_layers=2, **kw),
    "gsa": lambda **kw: GatedSlotAttention(hidden_size=64, num_heads=2, num_slots=16, **kw),
}


def _step(layer, T=21, seed=0):
    x = torch.randn(1, T, 64, generator=torch.Generator().manual_seed(seed)).to(device()).requires_grad_()
    with torch.autocast(device(), dtype=torch.bfloat16):
        out = layer(x)[0]
    out.float().square().mean().backward()
    return x, out


@pytest.mark.parametrize("name", LAYERS)
def test_layer_trains_under_autocast(name):
    torch.manual_seed(0)
    layer = LAYERS[name]().to(device())
    if name == "rwkv7":  # o_proj starts at zero (official init): give the loss something to differentiate
        torch.nn.init.normal_(layer.o_proj.weight, std=0.02)
    x, out = _step(layer)
    assert out.dtype == torch.bfloat16
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    grads = [p.grad for p in layer.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert all(p.dtype == torch.float32 for p in layer.parameters())


def _decays_seen_by_the_kernel(bug):
    torch.manual_seed(0)
    layer = LAYERS["rwkv7"](bug=bug).to(device())
    seen = {}
    op = layer.default_op()

    def spy(r, w, k, v, a, b, **kw):
        seen.update(w=w.detach().float(), dtypes={n: t.dtype for n, t in dict(r=r, w=w, k=k, v=v, a=a, b=b).items()})
        return op(r, w, k, v, a, b, **kw)

    layer.attention_op = spy
    _step(layer)
    return seen


def test_rwkv7_decay_reaches_the_kernel_in_fp32_under_autocast():
    seen = _decays_seen_by_the_kernel(None)
    assert seen["dtypes"]["w"] == torch.float32
    assert {seen["dtypes"][n] for n in "rkvab"} == {torch.bfloat16}


def test_bf16_decay_switch_rounds_the_decay_inside_a_real_autocast_step():
    fixed, buggy = _decays_seen_by_the_kernel(None), _decays_seen_by_the_kernel("bf16_decay")
    assert buggy["dtypes"]["w"] == torch.bfloat16
    rel = ((buggy["w"] - fixed["w"]).abs() / fixed["w"].abs()).max()
    assert 0 < rel <= 2 ** -7  # bf16 rounding of the sigmoid: nonzero, at most a couple of bf16 ulps

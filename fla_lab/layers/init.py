"""The official RWKV initialisation, as plain formulas of (hidden size C, head size N, layer l, layers L).

Sources (facts, not code): BlinkDL/RWKV-LM `RWKV-v7/train_temp/src/model.py` (`RWKV_Tmix_x070` and
`generate_init_weight`) and `RWKV-v5/src/model.py` (`RWKV_Tmix_x060`); flash-linear-attention adopted the RWKV-7
ones in 7497c8f7 (#365), fe157539 (#387), 1eb9ce25 (#418) and c90b3716 (#493). Each function returns float32
tensors; the layers copy them into their parameters, the tests recompute them independently.

Every formula depends on the layer's depth through l/(L-1) and l/L, so it needs `num_hidden_layers >= 2`
and `0 <= layer_idx < num_hidden_layers`; `layer_ratios` says so instead of upstream's TypeError
(L=None) or ZeroDivisionError (L=1).
"""
from __future__ import annotations

import math

import torch
from torch import nn

RWKV7_MIX_POWERS = {"x_r": 0.2, "x_w": 0.9, "x_k": 0.7, "x_v": 0.7, "x_a": 0.9, "x_g": 0.2}
RWKV6_MIX_ORDER = ("w", "k", "v", "r", "g")  # rows of the RWKV-6 data-dependent mix, official order


def layer_ratios(layer_idx: int | None, num_hidden_layers: int | None) -> tuple[float, float]:
    """(rho0, rho1) = (l/(L-1), 1 - l/L): 0 -> 1 and 1 -> ~0 from the first layer to the last."""
    fix = ("pass num_hidden_layers (the depth of the model this layer belongs to, >= 2) and layer_idx "
           "(0-based), e.g. RWKV7Attention('chunk', hidden_size=768, layer_idx=0, num_hidden_layers=12)")
    if layer_idx is None or num_hidden_layers is None:
        raise ValueError(f"the official RWKV init depends on the layer's depth: {fix}. "
                         f"Got layer_idx={layer_idx}, num_hidden_layers={num_hidden_layers}.")
    if num_hidden_layers < 2:
        raise ValueError(f"num_hidden_layers={num_hidden_layers}: the official init divides by "
                         f"num_hidden_layers - 1; {fix}. A standalone layer: num_hidden_layers=2.")
    if not 0 <= layer_idx < num_hidden_layers:
        raise ValueError(f"layer_idx={layer_idx} is outside 0..{num_hidden_layers - 1}; {fix}.")
    return layer_idx / (num_hidden_layers - 1), 1.0 - layer_idx / num_hidden_layers


def lora_rank(hidden_size: int, factor: float, head_scale: float = 1.0) -> int:
    """`max(32, round(factor * sqrt(C) * head_scale / 32) * 32)` (FLA 1eb9ce25; head_scale = N/64, 1 for g)."""
    return max(32, int(round(factor * hidden_size ** 0.5 * head_scale / 32) * 32))


def _channels(C: int) -> torch.Tensor:
    return torch.arange(C, dtype=torch.float64)


def _depth_fraction(C: int) -> torch.Tensor:
    """ddd[n] = n / C, the base of every time-shift mixing coefficient."""
    return _channels(C) / C


def _linear(C: int) -> torch.Tensor:
    return _channels(C) / (C - 1) - 0.5


def _zigzag(C: int, N: int) -> torch.Tensor:
    z = ((_channels(C) % N) - (N - 1) / 2) / ((N - 1) / 2)
    return z * z.abs()


def rwkv7_vectors(C: int, N: int, layer_idx: int, num_hidden_layers: int) -> dict[str, torch.Tensor]:
    """The RWKV-7 time-mix vectors: x_r..x_g, w0, a0, v0, k_k, k_a, r_k [H, N] and the GroupNorm weight."""
    rho0, rho1 = layer_ratios(layer_idx, num_hidden_layers)
    ddd, linear, zigzag = _depth_fraction(C), _linear(C), _zigzag(C, N)
    www = -6 + 6 * (_channels(C) / (C - 1)) ** (1 + rho0 ** 0.3)
    out = {name: 1 - ddd ** (p * rho1) for name, p in RWKV7_MIX_POWERS.items()}
    out.update(
        w0=www + 0.5 + 2.5 * zigzag,  # +0.5: the official softplus form, rewritten as a sigmoid
        a0=-0.19 + 0.3 * zigzag + 0.4 * linear,
        v0=0.73 - 0.4 * linear,
        k_k=0.71 - 0.1 * linear,
        k_a=torch.full((C,), 1.02, dtype=torch.float64),
        r_k=torch.full((C // N, N), -0.04, dtype=torch.float64),
        g_norm=torch.full((C,), ((layer_idx + 1) / num_hidden_layers) ** 0.7, dtype=torch.float64),
    )
    return {name: t.float() for name, t in out.items()}


def rwkv6_vectors(C: int, K: int, N: int, layer_idx: int, num_hidden_layers: int) -> dict[str, torch.Tensor]:
    """The RWKV-6 (`RWKV_Tmix_x060`) vectors: mixes maa_x and maa_w..maa_g [C], decay w0 [K], bonus u [K/N, N].

    C is the hidden size, K the key (attention) width, N the head size.
    """
    rho0, rho1 = layer_ratios(layer_idx, num_hidden_layers)
    ddd = _depth_fraction(C)
    mix = {"maa_x": 1 - ddd ** rho1, "maa_w": 1 - ddd ** rho1, "maa_k": 1 - ddd ** rho1,
           "maa_v": 1 - (ddd ** rho1 + 0.3 * rho0), "maa_r": 1 - ddd ** (0.5 * rho1),
           "maa_g": 1 - ddd ** (0.5 * rho1)}
    n = _channels(K)
    mix["w0"] = -6 + 5 * (n / (K - 1)) ** (0.7 + 1.3 * rho0)
    zigzag = ((n + 1) % 3 - 1) * 0.1
    mix["u"] = (rho0 * (1 - n / (K - 1)) + zigzag).view(K // N, N)
    return {name: t.float() for name, t in mix.items()}


@torch.no_grad()
def orthogonal_(weight: torch.Tensor, gain: float) -> torch.Tensor:
    """Orthogonal init computed in fp32 whatever the parameter dtype (bf16 QR is not supported everywhere)."""
    w = torch.empty(weight.shape, dtype=torch.float32, device=weight.device)
    nn.init.orthogonal_(w, gain=gain)
    return weight.copy_(w)


def lora_up_gain(rank: int, out_features: int, scale: float = 0.1) -> float:
    """Official `ortho_init(zeros(rank, out), scale)`: an extra sqrt(rank/out) when the rank is the larger."""
    return scale * (math.sqrt(rank / out_features) if rank > out_features else 1.0)

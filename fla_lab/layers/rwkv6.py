"""RWKV-6 time mixing ("Finch", arXiv 2404.05892) on fla_lab's kernels, with the official initialisation.

Forward (official `RWKV_Tmix_x060`, flash-linear-attention's `RWKV6Attention`):
- token shift `xx = shift(x) - x`; a data-dependent mix (ddlerp) `x_* = x + xx * (maa_* + lora_*(x + xx*maa_x))`;
- `r, k, v = W x_*`, `g = silu(W_g x_g)`, decay LoRA `w_raw = w0 + tanh(x_w A) B`, log-decay `w = -exp(w_raw)`;
- the RWKV6 kernel with the bonus `u`, scale 1: `chunk_rwkv6` when T > 64, else `fused_recurrent_rwkv6`;
- GroupNorm per head, times g, output projection.

`bug="sigmoid_decay"` (upstream #11) passes `sigmoid(w_raw)`, a decay in (0, 1), where the kernel expects a
log-decay: every step multiplies the state by exp(w) > 1.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from fla_lab.layers import init
from fla_lab.ops.common.switches import Switch, check_switch
from fla_lab.ops.rwkv6 import chunk as rwkv6_chunk, fused_recurrent as rwkv6_recurrent

FUSED_RECURRENT_MAX_T = 64  # like upstream: launching the chunk kernels for a few tokens is slower


def token_shift(x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """`shift(x) - x` along time, with a zero before the first token; before each packed sequence's first token
    with `cu_seqlens` (FLA's varlen, B = 1), so no token mixes with the last one of the sequence before it."""
    shifted = F.pad(x, (0, 0, 1, -1))
    if cu_seqlens is not None:  # a scatter, not an index: no host read of the offsets (an empty last one is T)
        T = x.shape[1]
        first = torch.zeros(T + 1, dtype=torch.bool, device=x.device)
        first = first.scatter(0, cu_seqlens[:-1].to(x.device, torch.long), True)[:T]
        shifted = shifted.masked_fill(first[None, :, None], 0)
    return shifted - x


def packed_kwargs(cu_seqlens) -> dict:
    """`cu_seqlens=` for the op only when given: an op wrapped or swapped in (a test's spy) need not take it."""
    return {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}


def split_heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    return x.view(*x.shape[:-1], -1, head_dim)


# the kernels' switches the layer passes on (`bug="exclusive_reference"` runs chunk_rwkv6 with it), by op
SWITCHES = (Switch("sigmoid_decay", "RWKV6Attention", 11,
                   located=("fused_recurrent_rwkv6", "fused_recurrent_fwd_kernel", "positive_decay")),)
KERNEL_BUGS = {s.name: s.op for s in rwkv6_chunk.SWITCHES + rwkv6_recurrent.SWITCHES}

class LoRA(nn.Module):
    """`activation(x A) B + bias`, A [C, r] initialised to 0, B orthogonal with gain 0.1 (official `ortho_init`)."""

    def __init__(self, input_dim: int, output_dim: int, low_rank_dim: int, bias: bool = True,
                 activation: str | None = "tanh"):
        super().__init__()
        self.low_rank_dim = low_rank_dim
        activations = {None: nn.Identity(), "tanh": nn.Tanh(), "sigmoid": nn.Sigmoid()}
        if activation not in activations:
            raise ValueError(f"LoRA: activation must be one of {list(activations)}, got {activation!r}")
        self.lora = nn.Sequential(nn.Linear(input_dim, low_rank_dim, bias=False), activations[activation],
                                  nn.Linear(low_rank_dim, output_dim, bias=bias))

    @torch.no_grad()
    def reset_official(self, bias: torch.Tensor | None = None) -> None:
        down, up = self.lora[0], self.lora[2]
        down.weight.zero_()
        init.orthogonal_(up.weight, init.lora_up_gain(self.low_rank_dim, up.out_features))
        if up.bias is not None:
            up.bias.copy_(torch.zeros(up.out_features) if bias is None else bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lora(x)


class RWKV6Attention(nn.Module):
    """RWKV-6 attention with upstream's constructor and return convention `(o, None, past_key_values)`.

    Differences from flash-linear-attention 0.6.0: the official RWKV-6 initialisation (it needs
    `num_hidden_layers >= 2` and `layer_idx`, see `init.layer_ratios`); GroupNorm eps `norm_eps * 64` as the
    official `head_size_divisor = 8`; no cache or attention mask; `bug=` switches (`fla_lab.teaching.bugs`). A packed batch
    as upstream's, `cu_seqlens=` (B = 1; the token shift restarts at each sequence).
    """

    def __init__(self, mode: str = "chunk", hidden_size: int = 1024, expand_k: float = 0.5, expand_v: float = 1.0,
                 num_heads: int = 4, gate_fn: str = "swish", proj_low_rank_dim: int = 32,
                 gate_low_rank_dim: int = 64, fuse_norm: bool = True, elementwise_affine: bool = True,
                 norm_eps: float = 1e-5, layer_idx: int | None = None, num_hidden_layers: int | None = None,
                 bug: str | None = None, **kwargs):
        super().__init__()
        if bug not in KERNEL_BUGS:
            check_switch(bug, "RWKV6Attention", SWITCHES)
        if mode not in ("chunk", "fused_recurrent"):
            raise ValueError(f"RWKV6Attention: mode must be 'chunk' or 'fused_recurrent', got {mode!r}")
        if gate_fn != "swish":
            raise ValueError(f"RWKV6Attention: fla_lab implements gate_fn='swish' only, got {gate_fn!r}")
        self.mode, self.bug, self.layer_idx = mode, bug, layer_idx
        self.hidden_size, self.num_heads = hidden_size, num_heads
        self.key_dim, self.value_dim = int(hidden_size * expand_k), int(hidden_size * expand_v)
        for name, dim in (("key", self.key_dim), ("value", self.value_dim)):
            if dim % num_heads:
                raise ValueError(f"RWKV6Attention: {name} dim {dim} is not divisible by num_heads={num_heads}")
        self.head_k_dim, self.head_v_dim = self.key_dim // num_heads, self.value_dim // num_heads
        self.proj_low_rank_dim = proj_low_rank_dim

        C, R = hidden_size, proj_low_rank_dim
        self.maa_x = nn.Parameter(torch.zeros(C))
        self.maa = nn.Parameter(torch.zeros(len(init.RWKV6_MIX_ORDER), C))
        self.maa_w1 = nn.Parameter(torch.zeros(C, len(init.RWKV6_MIX_ORDER) * R))
        self.maa_w2 = nn.Parameter(torch.zeros(len(init.RWKV6_MIX_ORDER), R, C))
        self.w_lora = LoRA(C, self.key_dim, gate_low_rank_dim, activation="tanh")  # bias = w0
        self.r_proj = nn.Linear(C, self.key_dim, bias=False)
        self.k_proj = nn.Linear(C, self.key_dim, bias=False)
        self.v_proj = nn.Linear(C, self.value_dim, bias=False)
        self.g_proj = nn.Linear(C, self.value_dim, bias=False)
        self.bonus = nn.Parameter(torch.zeros(num_heads, self.head_k_dim))
        self.g_norm = nn.GroupNorm(num_heads, self.value_dim, eps=norm_eps * 64, affine=elementwise_affine)
        self.o_proj = nn.Linear(self.value_dim, C, bias=False)
        self.reset_official(num_hidden_layers)

    @torch.no_grad()
    def reset_official(self, num_hidden_layers: int | None) -> None:
        """Official RWKV-6 init: depth-dependent mixes, decay speeds and bonus; mix/decay LoRA `A = 0`,
        `B ~ U(-0.01, 0.01)`; orthogonal r, v (gain 1), k, g (gain 0.1); zero output projection."""
        vec = init.rwkv6_vectors(self.hidden_size, self.key_dim, self.head_k_dim, self.layer_idx, num_hidden_layers)
        self.num_hidden_layers = num_hidden_layers
        self.maa_x.copy_(vec["maa_x"])
        self.maa.copy_(torch.stack([vec[f"maa_{name}"] for name in init.RWKV6_MIX_ORDER]))
        self.maa_w1.zero_()
        self.maa_w2.uniform_(-0.01, 0.01)
        self.w_lora.lora[0].weight.zero_()
        self.w_lora.lora[2].weight.uniform_(-0.01, 0.01)
        self.w_lora.lora[2].bias.copy_(vec["w0"])
        self.bonus.copy_(vec["u"])
        for proj, gain in ((self.r_proj, 1.0), (self.k_proj, 0.1), (self.v_proj, 1.0), (self.g_proj, 0.1)):
            init.orthogonal_(proj.weight, gain)
        self.o_proj.weight.zero_()
        if self.g_norm.affine:
            self.g_norm.weight.fill_(1.0)
            self.g_norm.bias.zero_()

    def mix_inputs(self, x: torch.Tensor, delta: torch.Tensor) -> dict[str, torch.Tensor]:
        """The data-dependent token shift: one mixed input per row of `init.RWKV6_MIX_ORDER`."""
        B, T, C = x.shape
        n = len(init.RWKV6_MIX_ORDER)
        low = torch.tanh((x + delta * self.maa_x) @ self.maa_w1).view(B, T, n, self.proj_low_rank_dim)
        mu = torch.einsum("btnr,nrc->btnc", low, self.maa_w2) + self.maa
        return {name: x + delta * mu[:, :, i] for i, name in enumerate(init.RWKV6_MIX_ORDER)}

    def log_decay(self, xw: torch.Tensor) -> torch.Tensor:
        # fp32 whatever autocast did to the LoRA's output: the kernels take an fp32 decay beside bf16 r, k, v
        w_raw = self.w_lora(xw).float()  # safeguard: rwkv6_decay_fp32
        # bug: sigmoid_decay
        if self.bug == "sigmoid_decay":  # upstream #11: a decay in (0, 1) where a log-decay belongs
            return torch.sigmoid(w_raw)
        return -torch.exp(w_raw)

    def forward(self, hidden_states: torch.Tensor, attention_mask=None, past_key_values=None, use_cache=False,
                output_attentions=False, **kwargs):
        if past_key_values is not None or use_cache or attention_mask is not None:
            raise NotImplementedError("RWKV6Attention: fla_lab layers have no cache and no attention mask")
        x, cu_seqlens = hidden_states, kwargs.get("cu_seqlens")
        mixed = self.mix_inputs(x, token_shift(x, cu_seqlens))
        r = split_heads(self.r_proj(mixed["r"]), self.head_k_dim)
        k = split_heads(self.k_proj(mixed["k"]), self.head_k_dim)
        v = split_heads(self.v_proj(mixed["v"]), self.head_v_dim)
        w = split_heads(self.log_decay(mixed["w"]), self.head_k_dim)
        g = F.silu(self.g_proj(mixed["g"]))
        o = self._attend(r, k, v, w, cu_seqlens)
        B, T, _ = x.shape
        o = self.g_norm(o.reshape(B * T, self.value_dim)).view(B, T, self.value_dim) * g
        return self.o_proj(o), None, past_key_values

    def _attend(self, r, k, v, w, cu_seqlens=None):
        from fla_lab import ops
        from fla_lab.ops import contract

        use_chunk = self.mode == "chunk" and r.shape[1] > FUSED_RECURRENT_MAX_T
        name = "chunk_rwkv6" if use_chunk else "fused_recurrent_rwkv6"
        # a kernel's own switch travels to its op (and only to that op)
        switch = {"bug": self.bug} if KERNEL_BUGS.get(self.bug) == name else {}
        # The bug path must reach the kernel: the contract would reject its positive log-decay first.
        with contract.value_checks(False) if self.bug else contextlib.nullcontext():
            o, _ = getattr(ops, name)(r, k, v, w, self.bonus.to(r.dtype), scale=1.0, **packed_kwargs(cu_seqlens),
                                      **switch)
        return o

"""Gated Slot Attention ("GSA", arXiv 2409.07146) on fla_lab's `chunk_gsa` and `fused_recurrent_gsa`, as
flash-linear-attention 0.6.0's layer.

Forward (upstream `fla/layers/gsa.py` `GatedSlotAttention`):
- `q, k = phi(W_q x), phi(W_k x)` with the feature map phi (swish by default), `v = silu(W_v x)`;
- a forget gate per head and slot, `f = logsigmoid(W_f x) / gate_logit_normalizer` (a natural-log decay in
  (-inf, 0): the normalizer 8 keeps slots slow, each step forgets at most a factor exp(-log(2)/8) at init), and
  the slot write `s = 1 - exp(f)`: what a slot forgets it refills, as in a GRU;
- `chunk_gsa(q, k, v, s, g=f, scale=scale)`, layer scale 1.0 (not head_dim^-0.5: q and k are already swished);
  `fused_recurrent_gsa` (the same function) instead for T <= 64 or with `mode='fused_recurrent'`, as upstream;
- `o_proj(RMSNorm(silu(o)))`, one RMSNorm over the whole hidden width (not per head).

Precision: under autocast the projections come out in the autocast dtype. The gate is computed in fp32 from the
projection (`gates`): a log-decay rounded to bf16 carries a relative error of 2^-8 that compounds over every step
it is summed (the lesson of upstream #181), and `1 - exp(f)` in bf16 rounds small writes to zero. The kernel then
gets q, k, v, s in one dtype (the projections' dtype: the autocast dtype, or the module's) and g in fp32, as
`chunk_gsa`'s contract asks. The RMSNorm runs in fp32 and returns to that dtype, as upstream's fused
`rms_norm_linear`.

fla_lab additions: `gate_clamp` (the workaround users of upstream #77 applied: `f >= -gate_clamp`; it also cuts the
gradient of every clamped gate, which is what a notebook can measure), `gate_fn` (how `log sigmoid` of the gate
logits is written: `"logsigmoid"`, `F.logsigmoid`, the default, or `"piecewise"`, the explicit two-branch form
`where(x < LOGSIGMOID_LINEAR_BELOW, x, log(sigmoid(x)))`, the same forward values to within fp32 rounding) and
`bug=`, passed to `chunk_gsa` (`"unmasked_padding"`, #77's NaN gradients of s and g with a partial last chunk and a
strong slot decay). The switches are `chunk_gsa`'s, so a layer with a `bug=` runs `chunk_gsa` at every length;
`mode='fused_recurrent'` refuses a switch, which it would never run.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fla_lab.ops.common.switches import check_switch
from fla_lab.ops.gsa.chunk import SWITCHES as KERNEL_SWITCHES
from fla_lab.layers.rwkv6 import packed_kwargs, split_heads

FEATURE_MAPS = {"swish": F.silu, "relu": F.relu}  # the parameter-free ones of upstream's three
GATE_FNS = ("logsigmoid", "piecewise")  # how `gates` writes log sigmoid of the logits (the class docstring)
FUSED_MAX_T = 64  # upstream's layer runs fused_recurrent_gsa up to this length (fla/layers/gsa.py, 0.6.0)
LOGSIGMOID_LINEAR_BELOW = -20.0  # log sigmoid(x) = x - log(1 + e^x): x itself to 2e-9 below this


class GatedSlotAttention(nn.Module):
    """GSA with upstream 0.6.0's constructor, parameter names and return convention `(o, None, past_key_values)`.

    Differences from flash-linear-attention 0.6.0, each raising a clear error rather than diverging silently:
    no cache or attention mask (a packed batch, `cu_seqlens=` with B = 1, runs as upstream's); no short
    convolution; no grouped keys/values (`num_kv_heads` must equal `num_heads`); feature maps 'swish' and 'relu'
    only (not 't2r'); with a `bug=` switch the chunk kernel at every length (upstream runs `fused_recurrent_gsa`
    for T <= 64, as this layer does without one); `use_output_gate=True` and `use_norm=False` are
    refused because upstream accepts and then ignores them (its forward never gates and always normalises);
    `expand_v` must give `value_dim == hidden_size`, because the norm is `hidden_size` wide (upstream fails in
    the forward otherwise). The norm uses `norm_eps` (upstream's fused call drops it for the default 1e-5).
    Parameters keep PyTorch's default init, as upstream's layer (its models re-initialise them).
    """

    def __init__(self, mode: str = "chunk", hidden_size: int = 1024, expand_k: float = 1.0, expand_v: float = 1.0,
                 num_heads: int = 4, num_kv_heads: int | None = None, use_short_conv: bool = False,
                 conv_size: int = 4, conv_bias: bool = False, num_slots: int | None = None,
                 elementwise_affine: bool | None = True, norm_eps: float = 1e-5, gate_logit_normalizer: int = 8,
                 feature_map: str = "swish", use_output_gate: bool = False, use_norm: bool = True,
                 layer_idx: int | None = None, scale: float | None = 1.0, gate_clamp: float | None = None,
                 gate_fn: str = "logsigmoid", bug: str | None = None, **kwargs):
        super().__init__()
        name = "GatedSlotAttention"
        check_switch(bug, "chunk_gsa", KERNEL_SWITCHES)  # the switches are the kernel's
        if mode not in ("chunk", "fused_recurrent"):
            raise ValueError(f"{name}: mode must be 'chunk' or 'fused_recurrent', got {mode!r}")
        if gate_fn not in GATE_FNS:
            raise ValueError(f"{name}: gate_fn must be one of {list(GATE_FNS)}, got {gate_fn!r}")
        if mode == "fused_recurrent" and bug is not None:
            raise ValueError(f"{name}: bug={bug!r} is a switch of chunk_gsa, which mode='fused_recurrent' never runs; "
                             "use mode='chunk'")
        if num_kv_heads is not None and num_kv_heads != num_heads:
            raise NotImplementedError(f"{name}: fla_lab supports num_kv_heads == num_heads only (no grouped keys "
                                      f"and values), got num_kv_heads={num_kv_heads}, num_heads={num_heads}")
        if use_short_conv:
            raise NotImplementedError(f"{name}: fla_lab has no short convolution; pass use_short_conv=False")
        if feature_map not in FEATURE_MAPS:
            raise NotImplementedError(f"{name}: feature_map must be one of {list(FEATURE_MAPS)}, got {feature_map!r}")
        if use_output_gate:
            raise NotImplementedError(f"{name}: upstream 0.6.0 accepts use_output_gate=True and ignores it (its "
                                      "forward has no output gate); fla_lab refuses it rather than do nothing")
        if not use_norm:
            raise NotImplementedError(f"{name}: upstream 0.6.0 accepts use_norm=False and ignores it (its forward "
                                      "always normalises); fla_lab refuses it rather than do nothing")
        if gate_logit_normalizer <= 0:
            raise ValueError(f"{name}: gate_logit_normalizer must be > 0, got {gate_logit_normalizer}")
        if gate_clamp is not None and not gate_clamp > 0:
            raise ValueError(f"{name}: gate_clamp is the largest per-step forgetting -f allowed, > 0 (e.g. 20), "
                             f"or None; got {gate_clamp}")

        self.mode, self.bug, self.layer_idx = mode, bug, layer_idx
        self.hidden_size, self.num_heads, self.num_kv_heads = hidden_size, num_heads, num_heads
        self.expand_k, self.expand_v = expand_k, expand_v
        self.key_dim = self._width(name, "expand_k", hidden_size, expand_k, num_heads)
        self.value_dim = self._width(name, "expand_v", hidden_size, expand_v, num_heads)
        if self.value_dim != hidden_size:
            raise ValueError(f"{name}: the output norm is hidden_size={hidden_size} wide, as upstream's, so value_dim "
                             f"= hidden_size * expand_v must equal it; got {self.value_dim} (pass expand_v=1)")
        self.head_k_dim, self.head_v_dim = self.key_dim // num_heads, self.value_dim // num_heads
        self.num_slots = self.head_k_dim if num_slots is None else num_slots  # upstream's layer default
        self.use_short_conv, self.conv_size, self.conv_bias = use_short_conv, conv_size, conv_bias
        self.use_output_gate, self.use_norm = use_output_gate, use_norm
        self.gate_logit_normalizer, self.gate_clamp, self.gate_fn = gate_logit_normalizer, gate_clamp, gate_fn
        self.feature_map_name, self.scale = feature_map, scale

        C = hidden_size
        self.q_proj = nn.Linear(C, self.key_dim, bias=False)
        self.k_proj = nn.Linear(C, self.key_dim, bias=False)
        self.v_proj = nn.Linear(C, self.value_dim, bias=False)
        self.f_proj = nn.Linear(C, num_heads * self.num_slots, bias=False)
        self.g_norm = nn.RMSNorm(C, eps=norm_eps, elementwise_affine=bool(elementwise_affine))
        self.o_proj = nn.Linear(self.value_dim, C, bias=False)

    @staticmethod
    def _width(name: str, arg: str, hidden_size: int, expand: float, num_heads: int) -> int:
        width = round(hidden_size * expand)
        if not math.isclose(hidden_size * expand, width):
            raise ValueError(f"{name}: hidden_size * {arg} must be an integer, got {hidden_size * expand}")
        if width % num_heads:
            raise ValueError(f"{name}: hidden_size * {arg} = {width} is not divisible by num_heads={num_heads}")
        return width

    def gates(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The forget gate and slot write `(f, s)`, fp32 `[B, T, H, M]`, from the input.

        `f = logsigmoid(W_f x) / gate_logit_normalizer` (log sigmoid written as `gate_fn` says), clamped to
        `>= -gate_clamp` when set, and `s = 1 - exp(f)`, written `-expm1(f)`: the same number without the
        cancellation that zeroes small writes. The projection may come out in bf16 (autocast); everything after it
        is fp32.
        """
        x = self.f_proj(hidden_states).float()  # safeguard: gsa_gate_fp32
        if self.gate_fn == "piecewise":
            f = torch.where(x < LOGSIGMOID_LINEAR_BELOW, x, torch.log(torch.sigmoid(x))) / self.gate_logit_normalizer
        else:
            f = F.logsigmoid(x) / self.gate_logit_normalizer  # safeguard: gsa_gate_logsigmoid
        if self.gate_clamp is not None:
            f = f.clamp(min=-self.gate_clamp)
        f = split_heads(f, self.num_slots)
        return f, -torch.expm1(f)  # safeguard: gsa_write_expm1

    def forward(self, hidden_states: torch.Tensor, attention_mask=None, past_key_values=None, use_cache=False,
                output_attentions=False, **kwargs):
        if past_key_values is not None or use_cache or attention_mask is not None:
            raise NotImplementedError("GatedSlotAttention: fla_lab layers have no cache and no attention mask")
        x = hidden_states
        B, T, _ = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        dtype = q.dtype  # the autocast dtype under autocast, else the module's: what the kernel computes in
        phi = FEATURE_MAPS[self.feature_map_name]
        q, k = (phi(split_heads(t, self.head_k_dim)).to(dtype) for t in (q, k))
        v = F.silu(split_heads(v, self.head_v_dim)).to(dtype)
        f, s = self.gates(x)
        o = self._attend(q, k, v, s.to(dtype), f, kwargs.get("cu_seqlens"))
        o = F.silu(o.reshape(B, T, self.value_dim))
        weight = None if self.g_norm.weight is None else self.g_norm.weight.float()
        o = F.rms_norm(o.float(), (self.value_dim,), weight, self.g_norm.eps).to(o.dtype)
        return self.o_proj(o), None, past_key_values

    def _attend(self, q, k, v, s, f, cu_seqlens=None):
        from fla_lab import ops  # looked up at call time, so a wrapper (a spy, the NaN locator) sees the call

        packed = packed_kwargs(cu_seqlens)
        if self.mode == "fused_recurrent" or (self.bug is None and q.shape[1] <= FUSED_MAX_T):
            o, _ = ops.fused_recurrent_gsa(q, k, v, s, g=f, scale=self.scale, **packed)
        else:
            o, _ = ops.chunk_gsa(q, k, v, s, g=f, scale=self.scale, bug=self.bug, **packed)
        return o

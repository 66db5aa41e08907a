"""RWKV-7 time mixing ("Goose") on fla_lab's kernels, with the official initialisation.

Forward (official `RWKV_Tmix_x070`, flash-linear-attention's `RWKV7Attention`):
- token shift `xx = shift(x) - x`, static mixes `x_* = x + xx * x_*` for r, w, k, v, a, g;
- `r, k, v = W x_*`; log-decay `w = -exp(-0.5) * sigmoid(w0 + tanh(x_w A) B)`, in (-0.6065, 0) (its precision
  under autocast: notebook 05);
- value residual: layer 0 returns `v_first = v`, later layers `v = lerp(v, v_first, sigmoid(v_lora))`;
- in-context learning rate `a = sigmoid(a_lora)`, removal key `kk = normalize(k * k_k)` per head,
  `k = k * (1 + (a - 1) * k_a)`;
- the DPLR kernel with a and b built from kk and the gate a (notebook 02 derives them), scale 1:
  `S_t = (diag(exp w_t) + b_t a_t^T) S_{t-1} + k_t v_t^T`;
- GroupNorm per head (eps head_dim * norm_eps), the bonus `(sum_head r * k * r_k) v`, times the gate
  `g = sigmoid(x_g G1) G2`, output projection.

Bug switches (`fla_lab.teaching.bugs`): `uninitialized_params` (#150) and `bf16_decay` (#181).

About the call reported in #150, `RWKV7Attention("chunk", hidden_size=768, layer_idx=0)`: upstream 0.6.0 raises
an opaque TypeError (num_hidden_layers=None in `l / (L - 1)`), and ZeroDivisionError for num_hidden_layers=1.
fla_lab raises a ValueError that says what to pass (`num_hidden_layers >= 2`, the model's depth): the official
init depends on the layer's depth and there is no neutral default to pick silently. The same call with
`bug="uninitialized_params"` builds the layer as it was before the official init existed (no depth needed)
and reproduces the all-NaN output.
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from fla_lab.layers import init
from fla_lab.layers.rwkv6 import LoRA, packed_kwargs, split_heads, token_shift
from fla_lab.ops.common.switches import Switch, check_switch

DECAY_SCALE = math.exp(-0.5)  # official w = -softplus(-w_raw) - 0.5 then exp: -exp(w) = -exp(-0.5) * sigmoid(w_raw)
GARBAGE_SEED = 150
SWITCHES = (Switch("uninitialized_params", "RWKV7Attention", 150, located=("chunk_rwkv7", "dplr_scores_kernel", "nonfinite_input")),
            Switch("bf16_decay", "RWKV7Attention", 181, located=("chunk_rwkv7", None, "rounded_decay")))
BYPASS_VALUE_CHECKS = ("uninitialized_params",)  # bug paths whose garbage must reach the kernel, as upstream


def uninitialized(shape, generator: torch.Generator) -> torch.Tensor:
    """A reproducible stand-in for `torch.empty`: random 32-bit patterns viewed as float32.

    Like uninitialised memory, it holds arbitrary values: NaN and inf (1 pattern in 256), huge and tiny
    magnitudes. Unlike it, it is the same on every run, so the #150 reproduction can be asserted on.
    """
    bits = torch.randint(-2 ** 31, 2 ** 31, tuple(shape), generator=generator, dtype=torch.int64)
    return bits.to(torch.int32).view(torch.float32)


def real_torch_empty(shape=(6, 768)) -> torch.Tensor:
    """What `torch.empty` really gives: whatever the allocator hands back (often zeros, sometimes old data).

    Non-deterministic: for display only (e.g. with `fla_lab.spec.check.nonfinite_census`), never assert on it.
    """
    return torch.empty(shape)


def state_removal(kk: torch.Tensor, gate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """RWKV-7's kernel inputs `(a, b)` from its unit-norm removal key and in-context learning rate, the one place the
    package builds them (the layer, `fla_lab.spec.harness.rwkv7_inputs`; notebook 02's Exercise 2 derives them)."""
    return -kk, kk * gate


def log_decay_from_lora(w_raw: torch.Tensor, bug: str | None = None) -> torch.Tensor:
    """RWKV-7's log-decay from its decay-LoRA output, `-exp(-0.5) * sigmoid(w_raw)`; `bug="bf16_decay"` computes it
    as upstream #181 did (notebook 05: what that changes under autocast, and writing the fix)."""
    if bug == "bf16_decay":  # upstream #181 (and 0.6.0 again): sigmoid rounded to bf16  # bug: bf16_decay
        return -DECAY_SCALE * w_raw.sigmoid()
    return -DECAY_SCALE * w_raw.float().sigmoid()  # safeguard: rwkv7_decay_fp32


class RWKV7Attention(nn.Module):
    """RWKV-7 attention with upstream's constructor and return convention `(o, None, past_key_values, v_first)`.

    The official init needs `layer_idx` and `num_hidden_layers >= 2` (see the module docstring). No cache
    or attention mask; a packed batch as upstream's, `cu_seqlens=` (B = 1; the token shift restarts at each
    sequence). `mode="chunk"` runs `fla_lab.ops.chunk_rwkv7`, `mode="fused_recurrent"`
    `fla_lab.ops.fused_recurrent_rwkv7` (both exact at any decay; they agree to fp32 rounding).
    """

    MIX = tuple(init.RWKV7_MIX_POWERS)  # x_r, x_w, x_k, x_v, x_a, x_g

    def __init__(self, mode: str = "chunk", hidden_size: int = 1024, head_dim: int | None = 64,
                 num_heads: int | None = None, decay_low_rank_dim: int | None = None,
                 gate_low_rank_dim: int | None = None, a_low_rank_dim: int | None = None,
                 v_low_rank_dim: int | None = None, elementwise_affine: bool = True, norm_eps: float = 1e-5,
                 layer_idx: int | None = None, fuse_norm: bool = False, value_dim: int | None = None,
                 num_hidden_layers: int | None = None, bug: str | None = None, **kwargs):
        super().__init__()
        check_switch(bug, "RWKV7Attention", SWITCHES)
        if mode not in ("chunk", "fused_recurrent"):
            raise ValueError(f"RWKV7Attention: mode must be 'chunk' or 'fused_recurrent', got {mode!r}")
        self.mode, self.bug, self.layer_idx = mode, bug, layer_idx
        # the op `attend` runs, with fla_lab's op signature; None: `default_op()`. Set it to run something else in
        # the layer's place (the float64 reference, a wrapper that records the kernel's inputs).
        self.attention_op = None
        self.hidden_size = C = hidden_size
        self.head_dim, self.num_heads = self._heads(hidden_size, head_dim, num_heads)
        self.value_dim = hidden_size if value_dim is None else value_dim
        self.head_v_dim = self.value_dim // self.num_heads
        scale = self.head_dim / 64  # wider heads get wider LoRAs (FLA 1eb9ce25)
        self.decay_low_rank_dim = decay_low_rank_dim or init.lora_rank(C, 2.5, scale)
        self.a_low_rank_dim = a_low_rank_dim or init.lora_rank(C, 2.5, scale)
        self.v_low_rank_dim = v_low_rank_dim or init.lora_rank(C, 1.7, scale)
        self.gate_low_rank_dim = gate_low_rank_dim or init.lora_rank(C, 5.0)

        # bug: uninitialized_params
        legacy = bug == "uninitialized_params"  # upstream #150: torch.empty + an init that never reaches them
        self._make_vector_parameters(garbage=legacy)
        self.r_proj = nn.Linear(C, C, bias=False)
        self.k_proj = nn.Linear(C, C, bias=False)
        self.v_proj = nn.Linear(C, self.value_dim, bias=False)
        self.o_proj = nn.Linear(self.value_dim, C, bias=False)
        self.w_lora = LoRA(C, C, self.decay_low_rank_dim, activation="tanh")
        if layer_idx != 0:
            self.v_lora = LoRA(C, self.value_dim, self.v_low_rank_dim, activation=None)
        self.a_lora = LoRA(C, C, self.a_low_rank_dim, activation=None)
        self.g_lora = LoRA(C, self.value_dim, self.gate_low_rank_dim, activation="sigmoid", bias=False)
        self.g_norm = nn.GroupNorm(self.num_heads, self.value_dim, eps=self.head_dim * norm_eps,
                                   affine=elementwise_affine)
        self.num_hidden_layers = num_hidden_layers
        if legacy:
            self.legacy_parameter_branch_runs = 0
            self.apply(self._legacy_initialize_weights)
        else:
            self.reset_official(num_hidden_layers)

    @staticmethod
    def _heads(hidden_size, head_dim, num_heads) -> tuple[int, int]:
        if head_dim is None and num_heads is None:
            raise ValueError("RWKV7Attention: pass head_dim (64 in RWKV-7) or num_heads")
        head_dim = head_dim or hidden_size // num_heads
        if hidden_size % head_dim:
            raise ValueError(f"RWKV7Attention: hidden_size={hidden_size} is not a multiple of head_dim={head_dim}")
        return head_dim, hidden_size // head_dim

    def _make_vector_parameters(self, garbage: bool) -> None:
        """x_r..x_g [1, 1, C], k_k, k_a [C], r_k [H, N]: zeros, or #150's "uninitialised memory"."""
        C, shapes = self.hidden_size, {name: (1, 1, self.hidden_size) for name in self.MIX}
        shapes.update(k_k=(C,), k_a=(C,), r_k=(self.num_heads, self.head_dim))
        gen = torch.Generator().manual_seed(GARBAGE_SEED + (self.layer_idx or 0))
        for name, shape in shapes.items():
            value = uninitialized(shape, gen) if garbage else torch.zeros(shape)
            setattr(self, name, nn.Parameter(value))

    @torch.no_grad()
    def _legacy_initialize_weights(self, module: nn.Module) -> None:
        """The init routine before d49c52f6, run through `self.apply` as it was.

        `Module.apply` calls this on every *module*, never on a parameter, so the `nn.Parameter` branch is dead:
        `legacy_parameter_branch_runs` stays 0 and x_r..x_g, k_k, k_a, r_k keep their garbage.
        """
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight, gain=2 ** -2.5)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        if isinstance(module, nn.Parameter):
            self.legacy_parameter_branch_runs += 1
            nn.init.xavier_uniform_(module, gain=2 ** -2.5)

    @torch.no_grad()
    def reset_official(self, num_hidden_layers: int | None) -> None:
        """The official RWKV-7 init (`init.rwkv7_vectors`): mixes, w0/a0/v0 biases, k_k, k_a, r_k; LoRA
        `A = 0`, `B` orthogonal gain 0.1; r, v orthogonal gain 1, k gain 0.1; o zero; GroupNorm ((l+1)/L)^0.7."""
        vec = init.rwkv7_vectors(self.hidden_size, self.head_dim, self.layer_idx, num_hidden_layers)
        for name in (*self.MIX, "k_k", "k_a", "r_k"):
            getattr(self, name).copy_(vec[name].view_as(getattr(self, name)))
        self.w_lora.reset_official(vec["w0"])
        self.a_lora.reset_official(vec["a0"])
        if self.layer_idx != 0:
            self.v_lora.reset_official(vec["v0"])
        self.g_lora.reset_official()
        for proj, gain in ((self.r_proj, 1.0), (self.k_proj, 0.1), (self.v_proj, 1.0)):
            init.orthogonal_(proj.weight, gain)
        self.o_proj.weight.zero_()
        if self.g_norm.affine:
            self.g_norm.weight.copy_(vec["g_norm"])
            self.g_norm.bias.zero_()

    def log_decay(self, xw: torch.Tensor) -> torch.Tensor:
        """`-exp(-0.5) * sigmoid(w_lora(xw))` (see `log_decay_from_lora`)."""
        return log_decay_from_lora(self.w_lora(xw), self.bug)

    def forward(self, hidden_states: torch.Tensor, attention_mask=None, past_key_values=None, use_cache=False,
                output_attentions=False, v_first: torch.Tensor | None = None, **kwargs):
        if past_key_values is not None or use_cache or attention_mask is not None:
            raise NotImplementedError("RWKV7Attention: fla_lab layers have no cache and no attention mask")
        x, cu_seqlens = hidden_states, kwargs.get("cu_seqlens")
        B, T, _ = x.shape
        delta = token_shift(x, cu_seqlens)
        xr, xw, xk, xv, xa, xg = (x.addcmul(delta, getattr(self, name)) for name in self.MIX)
        r, w, k, v = self.r_proj(xr), self.log_decay(xw), self.k_proj(xk), self.v_proj(xv)
        if self.layer_idx == 0:
            v_first = v
        elif v_first is None:
            raise ValueError("RWKV7Attention: layers after the first need v_first, the 4th output of layer 0")
        else:
            v = torch.lerp(v, v_first, self.v_lora(xv).sigmoid())
        a = self.a_lora(xa).sigmoid()
        g = self.g_lora(xg)
        kk = F.normalize(split_heads(k * self.k_k, self.head_dim), dim=-1)  # safeguard: rwkv7_key_norm_eps
        k = k.addcmul(k * (a - 1), self.k_a)
        r, w, k, a = (split_heads(t, self.head_dim) for t in (r, w, k, a))
        v = split_heads(v, self.head_v_dim)
        o = self.attend(r, w, k, v, *state_removal(kk, a), cu_seqlens)
        o = self.g_norm(o.reshape(B * T, self.value_dim)).view(B, T, self.value_dim)
        bonus = (r * k * self.r_k).sum(-1, keepdim=True) * v  # the current token's own contribution
        o = (o + bonus.view(B, T, self.value_dim)) * g
        return self.o_proj(o), None, past_key_values, v_first

    def default_op(self):
        """The op of this mode, looked up in `fla_lab.ops` at call time (so a test can swap it)."""
        from fla_lab import ops

        return ops.chunk_rwkv7 if self.mode == "chunk" else ops.fused_recurrent_rwkv7

    def attend(self, r, w, k, v, a, b, cu_seqlens=None):
        """Run the op. Under autocast the projections come out in the autocast dtype while the vector parameters
        (k_a, k_k) promote k, a, b to fp32: the kernel gets r, k, v, a, b in the projections' dtype (the autocast
        dtype, else the module's) and w as `log_decay` computed it (its dtype: notebook 05)."""
        from fla_lab.ops import contract

        k, v, a, b = (t.to(r.dtype) for t in (k, v, a, b))
        op = self.attention_op or self.default_op()
        with contract.value_checks(False) if self.bug in BYPASS_VALUE_CHECKS else contextlib.nullcontext():
            o, _ = op(r, w, k, v, a, b, scale=1.0, initial_state=None, output_final_state=False,
                      **packed_kwargs(cu_seqlens))
        return o

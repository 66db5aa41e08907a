"""Float64 reference recurrences: the spec every kernel in fla_lab is checked against.

Conventions (the same as flash-linear-attention 0.6.0, so a user can swap one for the other):
- layout `[B, T, H, D]`; states `[B, H, K, V]`;
- decays are natural-log decays (<= 0): one step multiplies the state by `exp(g)`;
- `scale=None` means `K ** -0.5` (RWKV-7 defaults to 1.0, like `chunk_rwkv7`);
- every function returns `(output, final_state)`, `final_state` is None unless `output_final_state=True`.

All computation is float64 and differentiable with autograd: the `recurrent_*` functions are step-by-step
loops (slow, obviously right); the `chunked_*` functions are an independent chunk-parallel formulation
(closed-form pairwise decays inside a chunk, a state between chunks) used to pin the loops.
"""
from __future__ import annotations

import torch

__all__ = [
    "recurrent_gla", "recurrent_rwkv6", "recurrent_rwkv7", "recurrent_gsa",
    "chunked_gla", "chunked_rwkv6", "chunked_rwkv7", "chunked_gsa", "chunk_local_cumsum",
]


def _f64(*xs):
    return [None if x is None else x.to(torch.float64) for x in xs]


def _default_scale(scale, q):
    return q.shape[-1] ** -0.5 if scale is None else scale


def _gated_loop(q, k, v, gk=None, gv=None, scale=1.0, h0=None, u=None, read_before_write=False):
    """S_t = diag(exp gk_t) S_{t-1} diag(exp gv_t) + k_t v_t^T, o_t = scale * S^T q_t.

    `read_before_write` (RWKV6): the output reads S_{t-1} plus the bonus `diag(u) k_t v_t^T` instead of S_t.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    S = q.new_zeros(B, H, K, V) if h0 is None else h0
    outputs = []
    for t in range(T):
        kv = k[:, t, :, :, None] * v[:, t, :, None, :]
        if read_before_write:
            outputs.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], S + u[None, :, :, None] * kv))
        if gk is not None:
            S = S * gk[:, t].exp()[..., :, None]
        if gv is not None:
            S = S * gv[:, t].exp()[..., None, :]
        S = S + kv
        if not read_before_write:
            outputs.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    return torch.stack(outputs, 1), S


def recurrent_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False):
    """GLA: `S_t = diag(exp g_t) S_{t-1} + k_t v_t^T`, `o_t = scale * S_t^T q_t`."""
    q, k, v, g, h0 = _f64(q, k, v, g, initial_state)
    o, S = _gated_loop(q, k, v, gk=g, scale=_default_scale(scale, q), h0=h0)
    return o, (S if output_final_state else None)


def recurrent_rwkv6(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False):
    """RWKV6: `o_t = scale * (S_{t-1} + diag(u) k_t v_t^T)^T r_t`, `S_t = diag(exp w_t) S_{t-1} + k_t v_t^T`.

    `u` is the per-head bonus `[H, K]` for the current token.
    """
    r, k, v, w, u, h0 = _f64(r, k, v, w, u, initial_state)
    o, S = _gated_loop(r, k, v, gk=w, scale=_default_scale(scale, r), h0=h0, u=u, read_before_write=True)
    return o, (S if output_final_state else None)


def recurrent_rwkv7(r, w, k, v, a, b, scale=1.0, initial_state=None, output_final_state=False):
    """RWKV-7 / DPLR: `S_t = (diag(exp w_t) + b_t a_t^T) S_{t-1} + k_t v_t^T`, `o_t = scale * S_t^T r_t`.

    In RWKV-7 proper `a` and `b` come from the key and a gate in (0, 1), so that `b a^T` removes part of the state.
    """
    r, w, k, v, a, b, h0 = _f64(r, w, k, v, a, b, initial_state)
    B, T, H, K = r.shape
    S = r.new_zeros(B, H, K, v.shape[-1]) if h0 is None else h0
    scale = _default_scale(scale, r)
    outputs = []
    for t in range(T):
        removed = torch.einsum("bhk,bhkv->bhv", a[:, t], S)  # a_t^T S_{t-1}, read before the decay
        S = S * w[:, t].exp()[..., None] + b[:, t, :, :, None] * removed[:, :, None, :]
        S = S + k[:, t, :, :, None] * v[:, t, :, None, :]
        outputs.append(scale * torch.einsum("bhk,bhkv->bhv", r[:, t], S))
    return torch.stack(outputs, 1), (S if output_final_state else None)


def _gsa_gates(s, g):
    """Without a forget gate GSA is vanilla ABC: slots normalised by a running logsumexp."""
    if g is not None:
        return s, g
    z = s.logcumsumexp(1)
    g = torch.cat((z[:, :1], z[:, :-1]), 1) - z
    return (s - z).exp(), g


def recurrent_gsa(q, k, v, s, g=None, scale=None, initial_state=None, output_final_state=False):
    """Gated Slot Attention: two gated passes with a softmax over the M slots between them.

    Pass 1 (keys -> slots): `Hk_t = Hk_{t-1} diag(exp g_t) + k_t s_t^T`, `p_t = softmax(scale * Hk_t^T q_t)`.
    Pass 2 (slots -> values): `Hv_t = diag(exp g_t) Hv_{t-1} + s_t v_t^T`, `o_t = Hv_t^T p_t`.
    `s, g` are `[B, T, H, M]`; `initial_state` is the pair `(Hk0 [B, H, K, M], Hv0 [B, H, M, V])`.
    """
    q, k, v, s, g = _f64(q, k, v, s, g)
    hk0, hv0 = _f64(*(initial_state if initial_state is not None else (None, None)))
    s, g = _gsa_gates(s, g)
    scores, hk = _gated_loop(q, k, s, gv=g, scale=_default_scale(scale, q), h0=hk0)
    o, hv = _gated_loop(scores.softmax(-1), s, v, gk=g, scale=1.0, h0=hv0)
    return o, ((hk, hv) if output_final_state else None)


# ---------------------------------------------------------------------------------------------------------
# Chunked formulation: inside a chunk every pair (t, s) gets its decay exp(G_t - G_s) directly from the
# chunk-local cumulative log-decay G; a state carries everything before the chunk.


def chunk_local_cumsum(g, chunk_size=16, dtype=torch.float64):
    """The chunk-local inclusive cumulative log-decay `G` of `g [B, T, H, D]` along T, restarting at every multiple
    of `chunk_size` (the `G` of the chunked references; the kernels' `gi`, `ops.common.chunk.chunk_cumsum`).
    Computed in `dtype`: float64, the spec; `torch.float32` gives the fp32 sums a kernel's `gi` holds."""
    g = g.to(dtype)
    return torch.cat([c.cumsum(1) for c in g.split(chunk_size, dim=1)], dim=1)


def _chunk_pairwise(q, k, v, gk, gv, scale, S, exclusive, u):
    """One chunk for one batch element: q, k `[C, H, K]`, v `[C, H, V]`, S `[H, K, V]`."""
    C = q.shape[0]
    t_idx = torch.arange(C)
    causal = (t_idx[:, None] > t_idx[None, :]) if exclusive else (t_idx[:, None] >= t_idx[None, :])
    Gk = gk.cumsum(0) if gk is not None else torch.zeros_like(q)
    Gq = Gk - gk if (exclusive and gk is not None) else Gk  # RWKV6 reads the state before this step's decay
    Gv = gv.cumsum(0) if gv is not None else torch.zeros_like(v)
    # pairwise decays exp(Gq_t - Gk_s) for s <= t; masked entries get exponent 0 so nothing overflows
    dk = torch.where(causal[:, :, None, None], Gq[:, None] - Gk[None, :], torch.zeros(()))
    dv = torch.where(causal[:, :, None, None], Gv[:, None] - Gv[None, :], torch.zeros(()))
    scores = torch.einsum("thk,shk,tshk->tsh", q, k, dk.exp()) * causal[:, :, None]
    o = torch.einsum("tsh,shv,tshv->thv", scores, v, dv.exp())
    o = o + torch.einsum("thk,hkv,thv->thv", q * Gq.exp(), S, Gv.exp())
    if u is not None:  # RWKV6 bonus: the current token, undecayed
        o = o + torch.einsum("thk,hk,thk->th", q, u, k)[..., None] * v
    key_decay = (Gk[-1] - Gk).exp()  # from each step to the chunk end
    value_decay = (Gv[-1] - Gv).exp()
    S = S * Gk[-1].exp()[..., :, None] * Gv[-1].exp()[..., None, :]
    S = S + torch.einsum("shk,shv->hkv", k * key_decay, v * value_decay)
    return scale * o, S


def _chunked(q, k, v, gk=None, gv=None, scale=1.0, h0=None, chunk_size=16, exclusive=False, u=None):
    B, T, H, K = q.shape
    V = v.shape[-1]
    outputs, finals = [], []
    for b in range(B):
        S = h0[b] if h0 is not None else q.new_zeros(H, K, V)
        pieces = []
        for start in range(0, T, chunk_size):
            sl = slice(start, start + chunk_size)
            o, S = _chunk_pairwise(q[b, sl], k[b, sl], v[b, sl], None if gk is None else gk[b, sl],
                                   None if gv is None else gv[b, sl], scale, S, exclusive, u)
            pieces.append(o)
        outputs.append(torch.cat(pieces, 0))
        finals.append(S)
    return torch.stack(outputs, 0), torch.stack(finals, 0)


def chunked_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, chunk_size=16):
    q, k, v, g, h0 = _f64(q, k, v, g, initial_state)
    o, S = _chunked(q, k, v, gk=g, scale=_default_scale(scale, q), h0=h0, chunk_size=chunk_size)
    return o, (S if output_final_state else None)


def chunked_rwkv6(r, k, v, w, u, scale=None, initial_state=None, output_final_state=False, chunk_size=16):
    r, k, v, w, u, h0 = _f64(r, k, v, w, u, initial_state)
    o, S = _chunked(r, k, v, gk=w, scale=_default_scale(scale, r), h0=h0, chunk_size=chunk_size,
                    exclusive=True, u=u)
    return o, (S if output_final_state else None)


def chunked_gsa(q, k, v, s, g=None, scale=None, initial_state=None, output_final_state=False, chunk_size=16):
    q, k, v, s, g = _f64(q, k, v, s, g)
    hk0, hv0 = _f64(*(initial_state if initial_state is not None else (None, None)))
    s, g = _gsa_gates(s, g)
    scores, hk = _chunked(q, k, s, gv=g, scale=_default_scale(scale, q), h0=hk0, chunk_size=chunk_size)
    o, hv = _chunked(scores.softmax(-1), s, v, gk=g, scale=1.0, h0=hv0, chunk_size=chunk_size)
    return o, ((hk, hv) if output_final_state else None)


def chunked_rwkv7(r, w, k, v, a, b, scale=1.0, initial_state=None, output_final_state=False, chunk_size=16):
    """Chunk form of the DPLR recurrence through explicit transition products.

    With `M_t = diag(exp w_t) + b_t a_t^T`, inside a chunk `S_t = P_t S_0 + sum_{s<=t} D_{t,s} k_s v_s^T`
    where `P_t = M_t ... M_1` and `D_{t,s} = M_t ... M_{s+1}`: no rank-1 update loop, a different order of
    operations from `recurrent_rwkv7`, so agreement pins the order (decay, removal, write, read).
    """
    r, w, k, v, a, b, h0 = _f64(r, w, k, v, a, b, initial_state)
    B, T, H, K = r.shape
    S = r.new_zeros(B, H, K, v.shape[-1]) if h0 is None else h0
    scale = _default_scale(scale, r)
    eye = torch.eye(K, dtype=torch.float64)
    M = torch.diag_embed(w.exp()) + b[..., :, None] * a[..., None, :]  # [B, T, H, K, K]
    kv = k[..., :, None] * v[..., None, :]
    outputs = []
    for start in range(0, T, chunk_size):
        stop = min(start + chunk_size, T)
        P = eye.expand(B, H, K, K)
        D = []  # D[s] = M_t ... M_{s+1} for the current t, one per earlier step s in the chunk
        for t in range(start, stop):
            D = [M[:, t] @ d for d in D] + [eye.expand(B, H, K, K)]
            P = M[:, t] @ P
            S_t = P @ S + sum(D[i] @ kv[:, start + i] for i in range(len(D)))
            outputs.append(scale * torch.einsum("bhk,bhkv->bhv", r[:, t], S_t))
        S = S_t
    return torch.stack(outputs, 1), (S if output_final_state else None)

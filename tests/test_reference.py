"""The float64 references are the spec: pin them with closed forms and an independent chunked formulation."""
import pytest
import torch
import torch.nn.functional as F

from fla_lab.spec import reference as R

B, H, K, V, M = 2, 3, 4, 5, 6


def rand(*shape):
    return torch.randn(*shape, dtype=torch.float64)


def log_decay(*shape):
    return F.logsigmoid(rand(*shape)) * 2


def test_gla_closed_forms_t1_t2():
    q, k, g = rand(B, 2, H, K), rand(B, 2, H, K), log_decay(B, 2, H, K)
    v, h0 = rand(B, 2, H, V), rand(B, H, K, V)
    o, ht = R.recurrent_gla(q, k, v, g, scale=0.7, initial_state=h0, output_final_state=True)
    dot = lambda a, b: (a * b).sum(-1, keepdim=True)  # noqa: E731
    qe = lambda t, decay: q[:, t] * decay  # noqa: E731
    o1 = 0.7 * (torch.einsum("bhk,bhkv->bhv", qe(0, g[:, 0].exp()), h0) + dot(q[:, 0], k[:, 0]) * v[:, 0])
    o2 = 0.7 * (torch.einsum("bhk,bhkv->bhv", qe(1, (g[:, 0] + g[:, 1]).exp()), h0)
                + dot(q[:, 1], g[:, 1].exp() * k[:, 0]) * v[:, 0] + dot(q[:, 1], k[:, 1]) * v[:, 1])
    torch.testing.assert_close(o[:, 0], o1)
    torch.testing.assert_close(o[:, 1], o2)
    h2 = (g[:, 0] + g[:, 1]).exp()[..., None] * h0 + (g[:, 1].exp() * k[:, 0])[..., None] * v[:, 0, :, None, :] \
        + k[:, 1, ..., None] * v[:, 1, :, None, :]
    torch.testing.assert_close(ht, h2)


def test_rwkv6_reads_state_before_decay_and_adds_bonus():
    r, k, w = rand(B, 2, H, K), rand(B, 2, H, K), log_decay(B, 2, H, K)
    v, u, h0 = rand(B, 2, H, V), rand(H, K), rand(B, H, K, V)
    o, _ = R.recurrent_rwkv6(r, k, v, w, u, scale=1.0, initial_state=h0)
    dot = lambda a, b: (a * b).sum(-1, keepdim=True)  # noqa: E731
    o1 = torch.einsum("bhk,bhkv->bhv", r[:, 0], h0) + dot(r[:, 0], u * k[:, 0]) * v[:, 0]
    o2 = (torch.einsum("bhk,bhkv->bhv", r[:, 1] * w[:, 0].exp(), h0) + dot(r[:, 1], k[:, 0]) * v[:, 0]
          + dot(r[:, 1], u * k[:, 1]) * v[:, 1])
    torch.testing.assert_close(o[:, 0], o1)
    torch.testing.assert_close(o[:, 1], o2)


def test_rwkv7_closed_forms():
    r, k, w, a, b = rand(B, 2, H, K), rand(B, 2, H, K), log_decay(B, 2, H, K), rand(B, 2, H, K), rand(B, 2, H, K)
    v, h0 = rand(B, 2, H, V), rand(B, H, K, V)
    o, ht = R.recurrent_rwkv7(r[:, :1], w[:, :1], k[:, :1], v[:, :1], a[:, :1], b[:, :1], initial_state=h0,
                              output_final_state=True)
    transition = torch.diag_embed(w[:, 0].exp()) + b[:, 0, ..., None] * a[:, 0, :, None, :]
    s1 = transition @ h0 + k[:, 0, ..., None] * v[:, 0, :, None, :]
    torch.testing.assert_close(ht, s1)
    torch.testing.assert_close(o[:, 0], torch.einsum("bhk,bhkv->bhv", r[:, 0], s1))  # scale defaults to 1.0
    o, _ = R.recurrent_rwkv7(r, w, k, v, a, b)  # no initial state: S_1 = k1 v1^T
    dot = lambda x, y: (x * y).sum(-1, keepdim=True)  # noqa: E731
    o2 = (dot(r[:, 1], w[:, 1].exp() * k[:, 0]) + dot(r[:, 1], b[:, 1]) * dot(a[:, 1], k[:, 0])) * v[:, 0] \
        + dot(r[:, 1], k[:, 1]) * v[:, 1]
    torch.testing.assert_close(o[:, 1], o2)


def test_gsa_closed_forms():
    q, k, v, s, g = rand(B, 2, H, K), rand(B, 2, H, K), rand(B, 2, H, V), rand(B, 2, H, M), log_decay(B, 2, H, M)
    o, _ = R.recurrent_gsa(q, k, v, s, g, scale=0.5)
    dot = lambda x, y: (x * y).sum(-1, keepdim=True)  # noqa: E731
    p1 = (0.5 * dot(q[:, 0], k[:, 0]) * s[:, 0]).softmax(-1)
    torch.testing.assert_close(o[:, 0], dot(p1, s[:, 0]) * v[:, 0])
    e2 = g[:, 1].exp()
    p2 = (0.5 * (dot(q[:, 1], k[:, 0]) * s[:, 0] * e2 + dot(q[:, 1], k[:, 1]) * s[:, 1])).softmax(-1)
    torch.testing.assert_close(o[:, 1], dot(p2, e2 * s[:, 0]) * v[:, 0] + dot(p2, s[:, 1]) * v[:, 1])


def test_default_scales():
    q, k, v, g = rand(1, 3, 1, 16), rand(1, 3, 1, 16), rand(1, 3, 1, 4), log_decay(1, 3, 1, 16)
    torch.testing.assert_close(R.recurrent_gla(q, k, v, g)[0], R.recurrent_gla(q, k, v, g, scale=0.25)[0])
    a = b = torch.zeros_like(q)
    torch.testing.assert_close(R.recurrent_rwkv7(q, g, k, v, a, b)[0], R.recurrent_rwkv7(q, g, k, v, a, b, scale=1.0)[0])


@pytest.mark.parametrize("T,chunk", [(1, 4), (7, 4), (16, 16), (37, 8)])
@pytest.mark.parametrize("with_h0", [False, True])
@pytest.mark.parametrize("decay", [0.01, 1.0, 50.0])
def test_chunked_agrees_with_recurrent(T, chunk, with_h0, decay):
    q, k, u = rand(B, T, H, K), rand(B, T, H, K), rand(H, K)
    v = rand(B, T, H, V)
    g = -decay * torch.rand(B, T, H, K, dtype=torch.float64)
    h0 = rand(B, H, K, V) if with_h0 else None
    kw = dict(initial_state=h0, output_final_state=True)
    for loop, chunked, args in ((R.recurrent_gla, R.chunked_gla, (q, k, v, g)),
                                (R.recurrent_rwkv6, R.chunked_rwkv6, (q, k, v, g, u))):
        (o1, s1), (o2, s2) = loop(*args, **kw), chunked(*args, chunk_size=chunk, **kw)
        torch.testing.assert_close(o1, o2, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(s1, s2, rtol=1e-10, atol=1e-10)
    kk = F.normalize(rand(B, T, H, K), dim=-1)
    a, b, w = -kk, kk * torch.rand(B, T, H, K, dtype=torch.float64), -torch.rand(B, T, H, K, dtype=torch.float64) * min(decay, 5)
    (o1, s1), (o2, s2) = (R.recurrent_rwkv7(q, w, k, v, a, b, **kw),
                          R.chunked_rwkv7(q, w, k, v, a, b, chunk_size=chunk, **kw))
    torch.testing.assert_close(o1, o2, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s1, s2, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("with_gate", [False, True])
def test_chunked_gsa_agrees_with_recurrent(with_gate):
    T = 21
    q, k, v, s = rand(B, T, H, K), rand(B, T, H, K), rand(B, T, H, V), rand(B, T, H, M)
    g = log_decay(B, T, H, M) if with_gate else None
    h0 = (rand(B, H, K, M), rand(B, H, M, V))
    (o1, (hk1, hv1)) = R.recurrent_gsa(q, k, v, s, g, initial_state=h0, output_final_state=True)
    (o2, (hk2, hv2)) = R.chunked_gsa(q, k, v, s, g, initial_state=h0, output_final_state=True, chunk_size=8)
    for x, y in ((o1, o2), (hk1, hk2), (hv1, hv2)):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-10)


def test_references_are_differentiable_and_float64():
    q, k, g = (rand(1, 4, 1, 3).requires_grad_() for _ in range(3))
    v = rand(1, 4, 1, 2).requires_grad_()
    o, _ = R.recurrent_gla(q.float(), k, v, g)
    assert o.dtype == torch.float64
    o.sum().backward()
    assert all(x.grad is not None and torch.isfinite(x.grad).all() for x in (q, k, v, g))

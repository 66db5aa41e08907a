"""The messages of the value checks: what a bad value is, where it sits and how to fix it.

`transition_radius` also gives the lessons and the hunt the number a `TransitionWarning` reports.
"""
from __future__ import annotations

import torch

from fla_lab.ops.common.value_flags import LAMBDA0, growing_rows


class TransitionWarning(UserWarning):
    """An RWKV-7 transition `diag(exp w) + b a^T` has an eigenvalue above 1: the state can grow step after step."""


def _nonfinite_message(where: str, name: str, t: torch.Tensor) -> str:
    n = int((~torch.isfinite(t)).sum())
    return (f"{where}: `{name}` has {n} non-finite value(s) (NaN/inf); "
            "fix the producer (see fla_lab.spec.check.nonfinite_census to locate them).")


def _log_decay_message(where: str, name: str, g: torch.Tensor) -> str:
    """Decays are natural-log decays: exp(g) must not grow the state."""
    top = float(g.max())
    return (f"{where}: `{name}` is a log-decay and must be <= 0, but its maximum is {top:.3g} (every step would "
            f"multiply the state by exp({top:.3g}) > 1). Pass log-space decays, e.g. "
            f"`F.logsigmoid(x)` or `-torch.exp(x)`, not `sigmoid(x)` or a decay in (0, 1).")


TRANSITION_SAMPLES = 32


def _largest_modulus(w: torch.Tensor, a: torch.Tensor, b: torch.Tensor, rows: torch.Tensor) -> float:
    """Largest |eigenvalue| of `diag(exp w) + b a^T` over the given flat (batch, step, head) rows, in float64."""
    K = w.shape[-1]
    pick = lambda x: x.detach().reshape(-1, K)[rows.to(x.device)].cpu().double()  # noqa: E731
    w, a, b = pick(w), pick(a), pick(b)
    M = torch.diag_embed(w.exp()) + b[:, :, None] * a[:, None, :]
    return float(torch.linalg.eigvals(M).abs().max())


def transition_radius(w: torch.Tensor, a: torch.Tensor, b: torch.Tensor, samples: int = TRANSITION_SAMPLES,
                      seed: int = 0) -> float:
    """Largest |eigenvalue| of `diag(exp w_t) + b_t a_t^T` over `samples` random (batch, step, head) triples.

    For the a and b that RWKV-7's layer builds it is <= 1: the rank-one term removes part of the state (notebook
    02's second exercise derives them). For `a, b ~ U(0, 1)` (upstream #150) it is about 1 + a.b, near 17 for K = 64.
    The check itself does not sample: `value_flags.growing_rows` tests every row; this estimate only gives the
    warning its number.
    """
    B, T, H, K = w.shape
    gen = torch.Generator().manual_seed(seed)
    return _largest_modulus(w, a, b, torch.randperm(B * T * H, generator=gen)[:samples])


def _growth_modulus(w: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> float:
    """The modulus a TransitionWarning reports: `transition_radius`, or, when its sample misses the few growing
    rows, the largest over (the first TRANSITION_SAMPLES of) the rows the check flagged."""
    radius = transition_radius(w, a, b)
    rows = growing_rows(w, a, b).flatten().nonzero().flatten()[:TRANSITION_SAMPLES]
    return radius if radius > LAMBDA0 or len(rows) == 0 else _largest_modulus(w, a, b, rows)


def _transition_message(where: str, w, a, b) -> str:
    # what is wrong and where to look, not the lines that build a and b: those are notebook 02's second exercise
    radius = _growth_modulus(w, a, b)
    return (f"{where}: the transition diag(exp w) + b a^T has an eigenvalue of modulus {radius:.3g} > 1, so the "
            f"state can grow like {radius:.3g}^t and overflow (upstream #150 used a, b ~ rand). RWKV-7's a and b are "
            "not free inputs: its own only remove state (b . a in [-1, 0] at every step); build them as its layer does "
            "(fla_lab.layers.RWKV7Attention), from the key and the in-context learning rate. Silence: "
            "warnings.simplefilter('ignore', fla_lab.ops.contract.TransitionWarning).")

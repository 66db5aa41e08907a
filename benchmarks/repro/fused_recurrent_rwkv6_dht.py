#!/usr/bin/env python3
"""FLA's `fused_recurrent_rwkv6` backward against a float64 recurrence, with and without a final-state cotangent.

Standalone (torch and flash-linear-attention only; no fla_lab), for an upstream report. What truncated BPTT sends
is a cotangent on the final state (`dht`): the next segment's loss reaches this segment's last state. Without it,
FLA's gradients agree with float64 to fp32 rounding; with it, dk, dv and dw do not (fla_lab found it on 0.6.0,
README "What was measured on a GPU"). `chunk_rwkv6`, FLA's other RWKV6 op, is run on the same inputs as a control.

    python benchmarks/repro/fused_recurrent_rwkv6_dht.py [--json out.json]

Prints, per op and case, ||got - exact|| / ||exact|| of o, ht and every gradient, FLA's version (and commit when the
installation recorded one), torch, triton and the device. Exit status 1 when some gradient is off by more than 1e-3.
"""
import argparse
import importlib.metadata
import json
import sys

import torch

B, T, H, K, V = 2, 128, 4, 64, 64
TOLERANCE = 1e-3  # fp32 kernels against float64 agree to ~1e-6 here; 1e-3 leaves room for any summation order


def exact_rwkv6(r, k, v, w, u, initial_state):
    """o_t = (S_{t-1} + diag(u) k_t v_t^T)^T r_t, S_t = diag(exp w_t) S_{t-1} + k_t v_t^T, in float64; scale 1."""
    S, out = initial_state, []
    for t in range(r.shape[1]):
        kv = k[:, t, :, :, None] * v[:, t, :, None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", r[:, t], S + u[None, :, :, None] * kv))
        S = S * w[:, t].exp()[..., None] + kv
    return torch.stack(out, 1), S


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    r, k = (torch.randn(B, T, H, K, generator=g) * 0.5 for _ in range(2))
    v = torch.randn(B, T, H, V, generator=g)
    w = -torch.rand(B, T, H, K, generator=g) * 0.9 - 0.05  # log-decays in (-0.95, -0.05)
    u = torch.randn(H, K, generator=g) * 0.5
    h0 = torch.randn(B, H, K, V, generator=g) * 0.1
    do, dht = torch.randn(B, T, H, V, generator=g), torch.randn(B, H, K, V, generator=g)
    return dict(r=r, k=k, v=v, w=w, u=u, initial_state=h0), do, dht


def forward_backward(fn, x: dict, do, dht, device, dtype):
    leaves = {n: t.to(device, dtype if n != "initial_state" or dtype == torch.float64 else torch.float32)
              .requires_grad_() for n, t in x.items()}
    o, ht = fn(**leaves)
    loss = (o * do.to(o)).sum() + ((ht * dht.to(ht)).sum() if dht is not None else 0.0)
    loss.backward()
    return {"o": o, "ht": ht, **{f"d{n}": t.grad for n, t in leaves.items()}}


def rel(got, exact):
    got, exact = got.detach().double().cpu(), exact.detach().double().cpu()
    return float((got - exact).norm() / exact.norm().clamp_min(1e-300))


def fla_commit() -> str:
    """The commit pip recorded for a git install (PEP 610 direct_url.json); a wheel from the index records none."""
    for dist in ("fla-core", "flash-linear-attention"):
        try:
            text = importlib.metadata.distribution(dist).read_text("direct_url.json")
        except importlib.metadata.PackageNotFoundError:
            continue
        if text:
            return json.loads(text).get("vcs_info", {}).get("commit_id", "none recorded")
    return "none recorded (installed from a release wheel)"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--no-control", action="store_true",
                        help="skip chunk_rwkv6, the control (FLA autotunes its chunk kernels for minutes when cold)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device (FLA's kernels)")
        return 2
    import triton
    from fla.ops.rwkv6 import chunk_rwkv6, fused_recurrent_rwkv6

    meta = {"fla": importlib.metadata.version("fla-core"), "fla_commit": fla_commit(), "torch": torch.__version__,
            "triton": triton.__version__, "device": torch.cuda.get_device_name(), "shape": [B, T, H, K, V]}
    print(" ".join(f"{k}={v}" for k, v in meta.items()))
    x, do, dht = inputs()

    rows, bad = [], False
    for case, cotangent in (("no dht", None), ("with dht", dht)):
        want = forward_backward(exact_rwkv6, x, do, cotangent, "cpu", torch.float64)
        ops = (("fused_recurrent_rwkv6", fused_recurrent_rwkv6),) + (() if args.no_control else
                                                                     (("chunk_rwkv6", chunk_rwkv6),))
        for name, op in ops:
            def call(**t):
                return op(**t, scale=1.0, output_final_state=True)
            got = forward_backward(call, x, do, cotangent, "cuda", torch.float32)
            errors = {n: rel(got[n], want[n]) for n in want}
            worst = max(errors, key=errors.get)
            bad |= errors[worst] > TOLERANCE
            rows.append({"op": name, "case": case, "errors": errors})
            print(f"{name:<22} {case:<9} " + " ".join(f"{n}={e:.1e}" for n, e in errors.items())
                  + f"   worst {worst} {errors[worst]:.2g} (expected <= {TOLERANCE:g})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**meta, "tolerance": TOLERANCE, "rows": rows}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

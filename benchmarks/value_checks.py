"""What fla_lab's input value checks cost on a GPU, for `python -m benchmarks.scaling --checks`: off, deferred (the
default) and now (a sync per call).

bf16 at the reference shape B=8, T=4096, H=16, K=V=64 (GSA: M=64 slots; RWKV-7's log-decay w in fp32, as the layer
passes it), `do_bench` medians of forward+backward. The three modes run in one process, in a rotated order each
round, and each mode's time is the median over rounds. Then the host syncs of one training step of 12
RWKV7Attention layers in each mode (a default, deferred step must make none).

`--forward` (`scaling --checks --forward`): forwards alone, in the modes off, deferred and "flag pass" (deferred, but
the inputs the ops' kernels check as they read them go through the separate flag pass instead, as before those
kernels did: what checking inside the kernels saves); no sync count.
"""
import contextlib
import statistics
import warnings

import torch

from benchmarks import common
from fla_lab import ops
from fla_lab.ops import contract
from fla_lab.spec import harness

B, T, H, K, V, M = common.B, common.T, common.H, common.K, common.V, common.M
MODES = {"off": False, "deferred": None, "now": True}  # value_checks(...) setting of each mode


def cases() -> dict:
    """{op name: (op, inputs by argument name, names kept in fp32)}; inputs on the CPU, fp32."""
    rwkv7 = harness.rwkv7_inputs(B, T, H, K, V, initial_state=False)
    return {
        "chunk_gla": (ops.chunk_gla, harness.gated_inputs(B, T, H, K, V, initial_state=False), ()),
        "chunk_rwkv6": (ops.chunk_rwkv6, harness.gated_inputs(B, T, H, K, V, initial_state=False, bonus=True,
                                                              names=("r", "k", "v", "w")), ()),
        "chunk_gsa": (ops.chunk_gsa, harness.gsa_inputs(B, T, H, K, V, M, initial_state=False), ()),
        "chunk_rwkv7": (ops.chunk_rwkv7, rwkv7, ("w",)),
        "fused_recurrent_rwkv6": (ops.fused_recurrent_rwkv6, harness.gated_inputs(
            B, T, H, K, V, initial_state=False, bonus=True, names=("r", "k", "v", "w")), ()),
        "fused_recurrent_rwkv7": (ops.fused_recurrent_rwkv7, rwkv7, ("w",)),
    }


@contextlib.contextmanager
def flag_pass_only():
    """Deferred checks with no share done inside the ops' kernels: every input through the flag pass."""
    gated, rwkv7 = contract.check_gated_inputs, contract.check_rwkv7_inputs
    contract.check_gated_inputs = lambda *a, **kw: gated(*a, **{**kw, "in_kernel": False})
    contract.check_rwkv7_inputs = lambda *a, **kw: rwkv7(*a, **{**kw, "in_kernel": ()})
    try:
        yield
    finally:
        contract.check_gated_inputs, contract.check_rwkv7_inputs = gated, rwkv7


def forward_ms(op, inputs: dict, fp32: tuple, mode: str) -> float:
    """A forward's median in `mode`: one of MODES, or "flag pass" (`flag_pass_only`)."""
    names = list(inputs)
    x = [t.to("cuda", torch.float32 if n in fp32 else common.DTYPE) for n, t in inputs.items()]
    setting = contextlib.nullcontext() if mode == "flag pass" else contract.value_checks(MODES[mode])
    with setting, (flag_pass_only() if mode == "flag pass" else contextlib.nullcontext()):
        ms = common.forward_ms(lambda *xs: op(**dict(zip(names, xs))), x, {})
        contract.flush_value_checks()
    return ms


def forward_backward_ms(op, inputs: dict, fp32: tuple, mode: str) -> float:
    names = list(inputs)
    x = [t.to("cuda", torch.float32 if n in fp32 else common.DTYPE).requires_grad_() for n, t in inputs.items()]
    do = torch.randn(B, T, H, V, device="cuda", dtype=common.DTYPE)
    with contract.value_checks(MODES[mode]):
        ms = common.forward_backward_ms(lambda *xs: op(**dict(zip(names, xs))), x, do, {})
        contract.flush_value_checks()  # valid inputs: nothing to report, but the queue is left empty
    return ms


def time_modes(rounds: int, only: list[str] | None, forward: bool = False) -> list[dict]:
    modes = ("off", "deferred", "flag pass") if forward else tuple(MODES)
    timer = forward_ms if forward else forward_backward_ms
    rows = []
    for name, (op, inputs, fp32) in cases().items():
        if only and name not in only:
            continue
        times = {mode: [] for mode in modes}
        for r in range(rounds):  # rotate the order: no mode always runs first (cold) or last
            for mode in modes[r % 3:] + modes[:r % 3]:
                times[mode].append(timer(op, inputs, fp32, mode))
        row = {"op": name, **{f"{mode}_ms": statistics.median(t) for mode, t in times.items()}, "runs": times}
        rows.append(row)
        print_row(row, modes)
    return rows


def print_row(row: dict, modes) -> None:
    off = row["off_ms"]
    print(f"{row['op']:<24} {off:8.3f}" + "".join(f" {row[f'{m}_ms']:11.3f} {100 * (row[f'{m}_ms'] / off - 1):+7.1f}%"
                                             for m in modes[1:]), flush=True)


def rwkv7_stack(layers=12, hidden=512, heads=8) -> torch.nn.ModuleList:
    from fla_lab.layers import RWKV7Attention

    return torch.nn.ModuleList(
        RWKV7Attention("chunk", hidden_size=hidden, num_heads=heads, layer_idx=i, num_hidden_layers=layers)
        for i in range(layers)).to("cuda", common.DTYPE)


def training_step(stack, x) -> None:
    v_first = None
    for layer in stack:
        o, _, _, v_first = layer(x, v_first=v_first)
        x = x + o
    x.float().square().mean().backward()


def count_syncs(stack, x, mode: str) -> dict:
    """One forward+backward step in `mode` under the sync debug mode: "warn" counts the syncs ("error" would stop
    at the first); also the number of checked op calls."""
    calls = sum(contract.values._calls.values())
    with contract.value_checks(MODES[mode]), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            training_step(stack, x)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    contract.flush_value_checks()
    syncs = [w for w in caught if "synchronizing" in str(w.message)]
    return {"mode": mode, "checked_calls": sum(contract.values._calls.values()) - calls, "syncs": len(syncs),
            "first_sync": str(syncs[0].message).splitlines()[0] if syncs else None}


def sync_count(batch=4, steps=2048) -> list[dict]:
    stack = rwkv7_stack()
    x = torch.randn(batch, steps, 512, device="cuda", dtype=common.DTYPE, requires_grad=True)
    training_step(stack, x)  # warm-up: compile every kernel (compilation may sync)
    contract.flush_value_checks()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # the claim itself: a default (deferred) step never syncs
    try:
        training_step(stack, x)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    print("deferred (default) checks: one training step of 12 RWKV7Attention layers ran under "
          "torch.cuda.set_sync_debug_mode('error') without a host sync")
    rows = [count_syncs(stack, x, mode) for mode in MODES]
    for row in rows:
        print(f"  {row['mode']:<9} checked op calls {row['checked_calls']:3d}   host syncs {row['syncs']:3d}"
              + (f"   (first: {row['first_sync']})" if row["first_sync"] else ""))
    return rows


def main(json_path, rounds: int, only: list[str] | None, sync_only: bool, forward: bool = False) -> None:
    """Time the modes (unless `sync_only`), count the syncs (unless `forward`), write the result to `json_path`
    (and $OUT)."""
    result = {**common.environment(), "shape": {"B": B, "T": T, "H": H, "K": K, "V": V, "M": M},
              "dtype": "bf16 (RWKV-7 w: fp32)", "timed": "forward" if forward else "forward+backward"}
    if not sync_only:
        later = ("deferred ms", "flag pass ms") if forward else ("deferred ms", "now ms")
        print(f"{'op':<24} {'off ms':>8}" + "".join(f" {m:>11} {'+%':>8}" for m in later))
        result["rows"] = time_modes(rounds, only, forward)
    if not forward:
        result["sync_count"] = sync_count()
    common.write_json(result, json_path)

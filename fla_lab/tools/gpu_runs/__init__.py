"""The GPU runs the lessons show, shipped with the package: each a JSON file beside this module, read with `load`.

The notebooks run on the CPU (the Triton interpreter) and cannot remeasure these; they print what a GPU run wrote,
with the device, versions and date the file records. Each file comes from one command, run from the repository
root on a CUDA machine with flash-linear-attention 0.6.0 installed:

- `atlas_gpu.json`: `python -m benchmarks.atlas_gpu`, the stability atlas of fla_lab's ops beside FLA's (bf16,
  B=1, H=4, K=V=M=64, T in {512, 4096}); it writes the file here.
- `bench_hunt.json`: `python -m benchmarks.hunt_cost`, what the NaN locator and the audit cost one training step of
  a 12-layer RWKV-7 model; on a GPU it writes the file here.
- `fla_audit_rwkv6_fused.json`: `python -m fla_lab audit --fla rwkv6 --mode fused_recurrent --layers 2 --T 512
  --tbptt 2 --dtype bf16 --json PATH` (a step of `benchmarks/fla_audit_gpu.sh`), the audit of a model built from
  FLA's own layers; copy its PATH here.
"""
from __future__ import annotations

import json
from pathlib import Path

FOLDER = Path(__file__).resolve().parent
FILES = ("atlas_gpu", "bench_hunt", "fla_audit_rwkv6_fused")


def path(name: str) -> Path:
    """The shipped file of run `name` (one of FILES)."""
    if name not in FILES:
        raise ValueError(f"no shipped GPU run {name!r}: one of {FILES}")
    return FOLDER / f"{name}.json"


def load(name: str) -> dict:
    """The JSON that run `name` wrote."""
    return json.loads(path(name).read_text())

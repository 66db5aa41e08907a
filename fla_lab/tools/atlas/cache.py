"""The atlas's disk cache: one JSON record per setting, keyed by the setting, the op's source hash (`source_hash`),
the torch/triton versions and the device (`environment`), so a widget redraws at once and a sweep resumes.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
from dataclasses import asdict
from pathlib import Path

from fla_lab import runtime
from fla_lab.tools.atlas.measurement import Setting, _split


@functools.cache
def source_hash(label: str) -> str:
    """fla_lab: a hash of the kernels, the reference and the harness; an external library: its version."""
    name, library = _split(label)
    if library != "fla_lab":
        return "flash-linear-attention " + _version("flash-linear-attention")
    package = Path(__file__).resolve().parents[2]
    files = sorted((package / "ops").rglob("*.py")) + [package / "spec" / n for n in ("reference.py", "harness.py", "check.py")]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def environment() -> dict:
    info = runtime.describe()
    return {"torch": info["torch"], "triton": info["triton"], "device": info.get("gpu", info["mode"])}


class Cache:
    """One JSON file per setting under `folder`, named by the hash of (setting, source hash, environment)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def path(self, setting: Setting) -> Path:
        fields = asdict(setting)
        if fields["q_scale"] == 1.0:  # the key of a setting from before the axis existed
            del fields["q_scale"]
        key = json.dumps([fields, source_hash(setting.op), environment()], sort_keys=True)
        return self.folder / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"

    def get(self, setting: Setting) -> dict | None:
        path = self.path(setting)
        return json.loads(path.read_text()) if path.exists() else None

    def put(self, setting: Setting, record: dict) -> None:
        self.path(setting).write_text(json.dumps(record, default=_jsonable))


def _jsonable(x):
    return float(x) if isinstance(x, (float, int)) else str(x)


def default_cache() -> Cache:
    return Cache(Path.home() / ".cache" / "fla_lab" / "atlas")

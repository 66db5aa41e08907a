"""One launch mechanism: every family's tiles and warps are a frozen, validated launch object passed per call
(`fla_lab.ops.common.launch`), the defaults chosen per device model in one place, the chunk kernels' precision one
object resolved per call, and no launch state at module level.
Also the package's import graph (no cycles between its packages) and, on a GPU, the shared memory of every kernel
compiled with the launch choices for a card with 99 KB of shared memory per block."""
from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch

from conftest import ROOT, run_python
from fla_lab import runtime
from fla_lab.ops.common import launch as L

PACKAGE = Path(ROOT) / "fla_lab"
SMALL_CARD_SMEM = 101376  # shared memory per block (opt-in) of a 99 KB card


# --- the launch objects ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(L.FAMILIES))
def test_every_default_validates_and_is_frozen(family):
    launches = [L.measured(family, name) for name in L.TUNED] + [L.launch_for(family, SMALL_CARD_SMEM),
                                                                   L.default_launch(family, "cpu")]
    for launch in launches:
        assert type(launch) is L.FAMILIES[family]
        type(launch)(**{f.name: getattr(launch, f.name) for f in dataclasses.fields(launch)})  # validates again
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(launch, dataclasses.fields(launch)[0].name, None)


def test_the_tuned_table_names_real_fields():
    for card, families in L.TUNED.items():
        for family, values in families.items():
            L.FAMILIES[family](**values)  # an unknown field raises TypeError, a bad value ValueError
    assert L.MEASURED_ON in L.TUNED  # other cards start from its entry
    for card, families in L.TUNED.items():  # an entry names only what differs from the class defaults
        for family, values in families.items():
            defaults = L.FAMILIES[family]()
            assert all(getattr(defaults, field) != value for field, value in values.items()), (card, family)


@pytest.mark.parametrize("cls, field, value, says", [
    (L.RecurrentLaunch, "fwd_BV", 8, "powers of two >= 16"),
    (L.RecurrentLaunch, "dkv_warps", 3, "num_warps"),
    (L.RecurrentLaunch, "softmax_rows", 12, "power of two"),
    (L.RWKV7RecurrentLaunch, "fwd_launch", (32, 3), "num_warps"),
    (L.RWKV7RecurrentLaunch, "bwd_launch", 32, "pair"),
    (L.RWKV7RecurrentLaunch, "keys_last_launches", ((24, 1),), "powers of two"),
    (L.RecurrentLaunch, "fwd_fallback_tiles", ((64, 16),), "triple"),
    (L.RWKV7RecurrentLaunch, "fwd_launch_by_load", ((2, (32, 1)), (4, (64, 1)), (0, (32, 4))), "falling to 0"),
    (L.RWKV7RecurrentLaunch, "fwd_launch_by_load", ((4, (64, 1)), (1, (32, 4))), "falling to 0"),
    (L.RWKV7RecurrentLaunch, "fwd_launch_by_load", ((0, (32, 3)),), "num_warps"),
    (L.RecurrentLaunch, "fwd_fallback_tiles", ((64, 16, 3),), "num_warps"),
    (L.RWKV7ChunkLaunch, "bwd_BV", 48, "powers of two"),
    (L.RWKV7ChunkLaunch, "intra_warps", 32, "num_warps"),
    (L.ChunkLaunch, "state_stages", 9, "num_stages"),
])
def test_a_bad_field_is_refused_by_name(cls, field, value, says):
    with pytest.raises(ValueError, match=rf"{cls.__name__}\.{field}=.*{says}"):
        cls(**{field: value})


def test_an_op_refuses_another_familys_launch():
    from fla_lab.spec import harness
    from fla_lab.ops import fused_recurrent_rwkv7

    from fla_lab import runtime

    inputs = {name: None if x is None else x.to(runtime.device()) for name, x in
              harness.rwkv7_inputs(1, 4, 1, 16, 16).items()}  # on the GPU where there is one: the kernels' device
    with pytest.raises(TypeError, match="RWKV7RecurrentLaunch"):
        fused_recurrent_rwkv7(**inputs, launch=L.RecurrentLaunch())


def test_the_small_card_shrinks_what_would_not_fit():
    """The chunk ops' state passes hold pipelined key and value tiles: a 99 KB card gets fewer stages than the
    measured card, within its shared memory by the estimate; the families without dots keep the measured choices."""
    small, measured = L.launch_for("chunk", SMALL_CARD_SMEM), L.measured("chunk")
    assert L.chunk_state_smem(measured) > SMALL_CARD_SMEM >= L.chunk_state_smem(small)
    assert small.state_stages < measured.state_stages
    assert dataclasses.replace(small, state_stages=measured.state_stages) == measured  # nothing else changed
    big = torch.cuda.get_device_properties(0).shared_memory_per_block_optin if torch.cuda.is_available() else 232448
    assert L.launch_for("chunk", big) == measured
    for family in ("recurrent", "rwkv7_recurrent", "rwkv7_chunk"):
        assert L.launch_for(family, SMALL_CARD_SMEM) == L.measured(family)


def test_off_the_gpu_one_config():
    assert L.default_launch("rwkv7_chunk", torch.empty(1)) == L.RWKV7ChunkLaunch(state_BV=32)
    assert L.default_launch("recurrent", "cpu") == L.RecurrentLaunch()
    assert L.default_launch("chunk") is L.default_launch("chunk", torch.device("cpu"))  # cached


@pytest.mark.parametrize("name, model", [
    ("NVIDIA H100 80GB HBM3", "H100"),  # the H100 measured here (SXM)
    ("NVIDIA H100 PCIe", "H100"),
    ("NVIDIA H200", "H200"),  # the H200 measured here (SXM)
    ("NVIDIA H200 NVL", "H200"),
    ("NVIDIA GH200 480GB", None),  # another model: the shared-memory rule
    ("NVIDIA A100-SXM4-80GB", None),
    ("NVIDIA GeForce RTX 4090", None),
])
def test_a_card_runs_its_models_entry_else_the_shared_memory_rule(name, model):
    """TUNED is keyed by GPU model, so an H100 PCIe runs the H100's entry and an H200 NVL the H200's; a card of a model
    TUNED does not hold runs the measured settings shrunk to its shared memory (`launch_for`)."""
    assert L.tuned_model(name) == model
    for family in L.FAMILIES:
        expected = L.measured(family, model) if model else L.launch_for(family, SMALL_CARD_SMEM)
        assert L.card_launch(family, name, SMALL_CARD_SMEM) == expected, (name, family)
    h100, h200 = (L.card_launch("rwkv7_recurrent", card, SMALL_CARD_SMEM) for card in ("NVIDIA H100 PCIe",
                                                                                        "NVIDIA H200 NVL"))
    assert h100 != h200  # the two models' entries differ: the lookup picks between them


# --- precision: one object, resolved per call -------------------------------------------------------------------


@pytest.mark.parametrize("field, value", [("dot_dtype", torch.float64), ("split_states", 0), ("solve", "tf64")])
def test_a_bad_precision_is_refused_by_name(field, value):
    with pytest.raises(ValueError, match=rf"Precision\.{field}="):
        L.Precision(**{field: value})
    with pytest.raises(ValueError, match=r"ChunkLaunch\.precision="):
        L.ChunkLaunch(precision=torch.float32)


def test_the_precision_resolves_per_call(monkeypatch):
    """The interpreter or a GPU is asked when a call resolves its precision, not when the package is imported."""
    x16 = torch.empty(1, dtype=torch.bfloat16)
    monkeypatch.setattr(runtime, "interpreting", lambda: True)
    assert L.Precision().dot(x16) == L.tl.float32 and L.Precision().solve_precision() == "ieee"
    monkeypatch.setattr(runtime, "interpreting", lambda: False)
    assert L.Precision().dot(x16) == L.tl.bfloat16 and L.Precision().solve_precision() == "tf32x3"
    assert L.Precision(dot_dtype=torch.float32).dot(x16) == L.tl.float32
    assert L.Precision(solve="ieee").solve_precision() == "ieee"


@pytest.mark.parametrize("B, T, tiles", [
    (8, 4096, (32, 16, 8)),  # 1024 programs of 8 warps: one wave of an H100's 132 SMs x 64 warps
    (16, 4096, (64, 16, 4)),  # 2048 of 8 would take two waves; 1024 of 4 take one
    (64, 1024, (32, 64, 2)),  # neither narrow launch fits; the last fallback
    (1, 65536, (32, 16, 8)),
])
def test_the_recurrent_forward_falls_back_to_one_wave(monkeypatch, B, T, tiles):
    """On a GPU the forward takes the first of its launches whose programs run in one wave of resident warps."""
    monkeypatch.setattr(L, "gpu_sms", lambda x: 132)
    monkeypatch.setattr(L, "resident_warps", lambda x: 132 * 64)
    q = torch.empty(B, T, 16, 64, device="meta")
    assert L.measured("recurrent", "H100").forward_tiles(q, 64, None) == tiles
    assert L.RecurrentLaunch().forward_tiles(q, 64, None) == (64, 16, 4)  # no fallbacks: the fields'


class _Stop(Exception):
    pass


def _first_launch_of(module, kernel_name: str, monkeypatch) -> dict:
    """Replace `module.kernel_name` by a recorder: the constexprs of its first launch, then `_Stop`."""
    seen = {}

    def launch(*args, **kwargs):
        seen.update(kwargs)
        raise _Stop

    monkeypatch.setattr(module, kernel_name, type("Recorder", (), {"__getitem__": lambda self, grid: launch})())
    return seen


def test_the_launchs_precision_is_what_the_kernels_get(monkeypatch):
    """`split_states` reaches the kernels that call `mma_split` as SPLIT_STATES, `solve` RWKV-7's solve as
    SOLVE_PRECISION, and DOT is the precision's, for the call's inputs."""
    from fla_lab.ops import chunk_gla, chunk_rwkv7
    from fla_lab.ops.common import chunk as common_chunk
    from fla_lab.ops.rwkv7 import chunk as rwkv7_chunk
    from fla_lab.spec import harness

    precision = L.Precision(split_states=False, solve="tf32")
    x = harness.on_device(harness.gated_inputs(1, 20, 1, 16, 16, initial_state=False))
    seen = _first_launch_of(common_chunk, "chunk_fwd_h_kernel", monkeypatch)
    with pytest.raises(_Stop):
        chunk_gla(**x, launch=L.ChunkLaunch(precision=precision))
    assert seen["SPLIT_STATES"] is False and seen["DOT"] == precision.dot(x["q"])
    y = harness.on_device(harness.rwkv7_inputs(1, 20, 1, 16, 16, initial_state=False))
    seen = _first_launch_of(rwkv7_chunk, "dplr_intra_kernel", monkeypatch)
    with pytest.raises(_Stop):
        chunk_rwkv7(**y, launch=L.RWKV7ChunkLaunch(precision=precision))
    assert seen["SOLVE_PRECISION"] == "tf32"


# --- no launch state at module level ---------------------------------------------------------------------------

LAUNCH_NAME = re.compile(r"WARPS|_B[KV]$|^B[KV]_|LAUNCH|TILES|_STAGES$")
ALGORITHMIC = {"WARP_CHOICES", "STAGE_CHOICES"}  # what a launch object may hold, not what it holds


def module_assignments(tree: ast.Module):
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        for target in targets:
            for name in ast.walk(target):
                if isinstance(name, ast.Name):
                    yield node.lineno, name.id


def test_no_launch_state_at_module_level_in_ops():
    found = []
    for path in sorted((PACKAGE / "ops").rglob("*.py")):
        tree = ast.parse(path.read_text())
        found += [f"{path.relative_to(ROOT)}:{line} {name}" for line, name in module_assignments(tree)
                  if LAUNCH_NAME.search(name) and name not in ALGORITHMIC]
        if "contract" not in path.parts:  # the value checks' setting is the contract's module state, by design
            found += [f"{path.relative_to(ROOT)}:{node.lineno} global" for node in ast.walk(tree)
                      if isinstance(node, ast.Global)]
    assert not found, "launch settings belong in a launch object (fla_lab/ops/common/launch.py): " + \
        ", ".join(found)


# --- the import graph ------------------------------------------------------------------------------------------


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def node_of(module: str, packages: set[str]) -> str:
    """A module's node in the graph: its package below `fla_lab` (fla_lab.ops.gla), else the module itself."""
    return module if module in packages or module.count(".") < 2 else module.rsplit(".", 1)[0]


def imports_of(path: Path, modules: set[str]):
    """Every fla_lab module `path` imports, at module level or inside a function."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            yield from (f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)


def package_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    packages = {module_name(p) for p in paths if p.name == "__init__.py"}
    graph: dict[str, set[str]] = {}
    for path in paths:
        source = node_of(module_name(path), packages)
        for target in imports_of(path, modules):
            if target.split(".")[0] == "fla_lab" and node_of(target, packages) != source:
                graph.setdefault(source, set()).add(node_of(target, packages))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_packages():
    graph = package_graph()
    assert "fla_lab.ops.common" in graph.get("fla_lab.ops.gla", set())  # the graph sees the imports
    assert not cycles(graph), f"packages that import each other: {cycles(graph)}"


# --- on a GPU: the 99 KB card's choices fit in 99 KB -----------------------------------------------------------

FAMILY = {"chunk_gla": "chunk", "chunk_rwkv6": "chunk", "chunk_gsa": "chunk", "chunk_rwkv7": "rwkv7_chunk",
          "fused_recurrent_gla": "recurrent", "fused_recurrent_rwkv6": "recurrent", "fused_recurrent_gsa": "recurrent",
          "fused_recurrent_rwkv7": "rwkv7_recurrent"}

COMPILE_ONE = """
import json, torch
from fla_lab.spec import harness, registry
from fla_lab.ops.common import launch as L
from fla_lab.ops.common.utils import registered_kernels

spec, launch = registry.get(NAME), L.launch_for(FAMILY, SMEM)
for D in (64, 128):
    for lengths in ((300,), (5, 0, 64, 130, 19)):  # dense, then packed
        shape = dict(H=2, K=D, V=D, M=64)
        B, T = (2, lengths[0]) if len(lengths) == 1 else (1, sum(lengths))
        x = spec.inputs(registry.Shape(B, T, **shape), decay=1.0, initial_state=False)
        x["initial_state"] = spec.inputs(registry.Shape(B if len(lengths) == 1 else len(lengths), 1, **shape),
                                         initial_state=True)["initial_state"]
        kw = {"launch": launch}
        if len(lengths) > 1:
            offsets = [0] + torch.tensor(lengths).cumsum(0).tolist()
            kw["cu_seqlens"] = torch.tensor(offsets, dtype=torch.int32, device="cuda")
        leaves = harness.leaves(harness.on_device(x), dtype=torch.bfloat16)
        draw = lambda o, s: harness.cotangents(o.shape, {n: t.shape for n, t in s.items()}, 0)
        harness.run(spec.fn, leaves, draw, **kw)
torch.cuda.synchronize()
shared = {}
for kname, k in registered_kernels().items():
    for cache in getattr(k, "device_caches", {}).values():
        for compiled in cache[0].values():
            shared[kname] = max(shared.get(kname, 0), compiled.metadata.shared)
print(json.dumps(shared))
"""


@pytest.mark.gpu
@pytest.mark.skipif(runtime.device() != "cuda", reason="needs a CUDA device")
@pytest.mark.parametrize("name", FAMILY)
def test_every_kernel_fits_the_small_cards_shared_memory(name):
    """Every op, forward and backward, fixed variant, dense and packed, bf16, K = V = 64 and 128, with the launch
    choices for a 99 KB card, in a fresh process (its compiled kernels only): each compiled kernel's shared memory.
    One process per op, so the compiles spread over the test workers (one process for all took 200 s on an H100)."""
    code = f"SMEM = {SMALL_CARD_SMEM}\nNAME, FAMILY = {name!r}, {FAMILY[name]!r}\n" + COMPILE_ONE
    done = run_python(code, drop=("TRITON_INTERPRET",))
    assert done.returncode == 0, done.stderr[-3000:]
    shared = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(shared) >= 2, f"too few compiled kernels found for {name}: {sorted(shared)}"
    too_big = {kernel: size for kernel, size in shared.items() if size > SMALL_CARD_SMEM}
    assert not too_big, f"{name}: kernels over {SMALL_CARD_SMEM} bytes of shared memory: {too_big}"

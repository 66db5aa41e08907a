"""The op registry and the stability atlas: specs are complete, records are right, the cache keys what matters,
and the CLI writes its PNG and JSON (on the CPU here, small sizes; on a GPU at training sizes)."""
import json
import math

import pytest

from fla_lab import atlas, bugs, registry
from fla_lab.__main__ import main

SMALL = dict(B=1, H=1, K=16, V=16, M=16)


def test_registry_holds_every_op_and_every_kernel_bug():
    from fla_lab import ops

    assert set(registry.names()) == {n for n in ops.__all__ if n.startswith(("chunk_", "fused_recurrent_"))}
    switchable = {b.name for b in bugs.CATALOGUE if registry.for_bug(b.name)}
    assert switchable == {b.name for b in bugs.CATALOGUE if b.op in registry.names()}
    for spec in registry.ops().values():
        x = spec.inputs(registry.Shape(1, 5, 1, 16, 16, 16), decay=3.0)
        assert spec.decay_name in x and "initial_state" in x
        assert float(x[spec.decay_name].max()) <= 0


def test_unknown_variant_and_missing_chunk_size_are_refused():
    with pytest.raises(ValueError, match="no variant"):
        registry.get("chunk_gla").op("exclusive_reference")
    with pytest.raises(ValueError, match="no chunk_size"):
        registry.get("fused_recurrent_gla").op(chunk_size=16)


def test_fla_adapter_is_empty_without_the_package_or_a_gpu():
    if not registry.fla_available():
        assert registry.register_fla() == []


def test_records_tell_right_from_nonfinite():
    todo = atlas.settings(["chunk_rwkv6"], dtypes=("fp32",), decays=(1.0, 200.0), lengths=(40,), chunk_sizes=(32,),
                          **SMALL)
    records = {(r["variant"], r["decay"]): r for r in atlas.sweep(todo, progress=False)}
    assert len(records) == 4
    assert records["fixed", 200.0]["status"] == "right" and records["fixed", 1.0]["status"] == "right"
    bad = records["exclusive_reference", 200.0]
    assert bad["status"] == "nonfinite" and bad["nonfinite"]["o"] > 0 and math.isinf(atlas.worst_error(bad))
    assert set(bad["errors"]) >= {"o", "ht", "dr", "dk", "dv", "dw", "du", "dinitial_state"}
    assert records["exclusive_reference", 1.0]["status"] == "right"


def test_a_raising_kernel_is_a_record():
    todo = atlas.settings(["fused_recurrent_rwkv6"], ["transposed_h0_mask"], decays=(1.0,), lengths=(9,),
                          B=1, H=1, K=32, V=64)
    record, = atlas.sweep(todo, progress=False)
    assert record["status"] == "raises" and "64 and 16" in record["message"]


def test_cache_hits_and_keys_on_the_setting(tmp_path):
    cache = atlas.Cache(tmp_path)
    setting = atlas.Setting("chunk_gla", "fixed", "fp32", 1.0, 20, 16, **SMALL)
    first = atlas.sweep([setting], cache, progress=False)[0]
    assert cache.get(setting) == json.loads(json.dumps(first))
    other = atlas.Setting("chunk_gla", "fixed", "fp32", 2.0, 20, 16, **SMALL)
    assert cache.path(other) != cache.path(setting) and cache.get(other) is None
    first["status"] = "poisoned"  # a hit returns what is on disk, without running the kernel
    cache.put(setting, first)
    assert atlas.sweep([setting], cache, progress=False)[0]["status"] == "poisoned"


def test_cli_writes_png_and_json(tmp_path, capsys):
    code = main(["atlas", "--op", "chunk_gsa", "--dtype", "bf16", "--decay", "1", "100", "--length", "45",
                 "--chunk-size", "64", "--shape", "1,1,16,16,16", "--out", str(tmp_path), "--no-cache"])
    assert code == 0
    data = json.loads((tmp_path / "atlas.json").read_text())
    assert {(r["variant"], r["decay"], r["status"]) for r in data["records"]} == {
        ("fixed", 1.0, "right"), ("fixed", 100.0, "right"),
        ("unmasked_padding", 1.0, "right"), ("unmasked_padding", 100.0, "nonfinite")}
    assert (tmp_path / "atlas.png").stat().st_size > 10_000
    assert "100 (nonfinite)" in capsys.readouterr().out


def test_short_error_keeps_two_significant_digits():
    assert [atlas.short_error(x) for x in (0.0184, 0.0244, 3.46e-3, 9.96e-3, 1.0)] == [
        "1.8e-2", "2.4e-2", "3.5e-3", "1.0e-2", "1.0e0"]

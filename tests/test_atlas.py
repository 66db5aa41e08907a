"""The op registry and the stability atlas: specs are complete, records are right, the cache keys what matters,
and the CLI writes its PNG and JSON (on the CPU here, small sizes; on a GPU at training sizes)."""
import importlib.machinery
import json
import math
import sys
import types
from dataclasses import replace

import pytest
import torch

from fla_lab.tools import atlas
from fla_lab.teaching import bugs
from fla_lab.spec import registry
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


def _fake_fla(monkeypatch, missing=()):
    """A minimal `fla` package: each op of `registry.FLA_MODULES` as a function in its module, but `missing`."""
    fakes = {}
    for name in ("fla", "fla.ops", *sorted(set(registry.FLA_MODULES.values()))):
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)  # find_spec reads it from sys.modules
        monkeypatch.setitem(sys.modules, name, module)
    for op, module in registry.FLA_MODULES.items():
        if op not in missing:
            fakes[op] = lambda *a, **k: None
            setattr(sys.modules[module], op, fakes[op])
    return fakes


def test_fla_adapter_is_empty_without_the_package_or_a_gpu(monkeypatch):
    monkeypatch.setattr(registry, "OPS", dict(registry.ops()))  # what the adapter adds goes away with the test
    before = set(registry.ops())

    monkeypatch.setitem(sys.modules, "fla", None)  # importlib's mark of a package that is not there
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not registry.fla_available() and registry.register_fla() == []

    fakes = _fake_fla(monkeypatch, missing=("chunk_gsa",))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not registry.fla_available() and registry.register_fla() == []
    assert set(registry.ops()) == before

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert registry.fla_available()
    added = registry.register_fla()
    assert sorted(added) == sorted(f"fla:{op}" for op in registry.FLA_MODULES if op != "chunk_gsa")
    for op, fn in fakes.items():
        spec = registry.get(op, library="fla")
        assert spec.fn is fn and spec.requires_cuda and spec.variants == (registry.FIXED,)
        assert spec.reference is registry.get(op).reference


def test_records_tell_right_from_nonfinite():
    todo = atlas.settings(["chunk_rwkv6"], dtypes=("fp32",), decays=(1.0, 200.0), lengths=(40,), chunk_sizes=(32,),
                          combinations=[(True, True)], **SMALL)
    records = {(r["variant"], r["decay"]): r for r in atlas.sweep(todo, progress=False)}
    assert len(records) == 4
    assert records["fixed", 200.0]["status"] == "right" and records["fixed", 1.0]["status"] == "right"
    bad = records["exclusive_reference", 200.0]
    assert bad["status"] == "nonfinite" and bad["nonfinite"]["o"] > 0 and math.isinf(atlas.worst_error(bad))
    assert set(bad["errors"]) >= {"o", "ht", "dr", "dk", "dv", "dw", "du", "dinitial_state"}
    assert records["exclusive_reference", 1.0]["status"] == "right"


def test_settings_sweep_the_four_combinations_unless_told():
    grid = atlas.settings(["chunk_gla"], ["fixed"], decays=(1.0,), lengths=(20,), chunk_sizes=(16,), **SMALL)
    assert [(s.h0, s.dht) for s in grid] == list(atlas.COMBINATIONS)
    one = atlas.settings(["chunk_gla"], ["fixed"], decays=(1.0,), lengths=(20,), combinations=["no-h0,dht"])
    assert [(s.h0, s.dht) for s in one] == [(False, True)]
    with pytest.raises(ValueError, match="no combination"):
        atlas.settings(["chunk_gla"], combinations=["h0"])


def test_old_records_read_as_an_initial_state_and_a_final_state_cotangent():
    old = {"op": "chunk_gsa", "variant": "fixed", "dtype": "bf16", "decay": 1.0, "T": 512, "chunk_size": None,
           "status": "wrong", "errors": {"dg": 0.5}}
    assert atlas.combination_of(old) == (True, True)
    assert atlas.table([old])[0][-1] == {"h0,dht": "wrong"}


def _drops_decay_grad_through_final_state(spec: registry.OpSpec):
    """`spec`'s op, but without an initial state its final state carries no gradient to the decay: right values,
    a wrong (finite) decay gradient only when the final state has a cotangent (a truncated-BPTT segment)."""
    def op(**kwargs):
        o, ht = spec.fn(**kwargs)
        if kwargs.get("initial_state") is None and ht is not None:
            _, ht = spec.fn(**(kwargs | {spec.decay_name: kwargs[spec.decay_name].detach()}))
        return o, ht
    return op


def test_atlas_catches_a_bug_only_without_initial_state_and_with_final_state_cotangent(monkeypatch):
    spec = registry.get("chunk_gla")
    planted = replace(spec, fn=_drops_decay_grad_through_final_state(spec), library="planted", bug_names=())
    monkeypatch.setitem(registry.ops(), planted.label, planted)
    todo = atlas.settings(["chunk_gla", planted.label], decays=(0.1,), lengths=(32,), chunk_sizes=(16,), **SMALL)
    records = {(r["op"], r["h0"], r["dht"]): r for r in atlas.sweep(todo, progress=False)}
    assert len(records) == 8
    for h0, dht in atlas.COMBINATIONS:
        assert records["chunk_gla", h0, dht]["status"] == "right"
        assert ("dinitial_state" in records["chunk_gla", h0, dht]["errors"]) == h0
        bugged = records[planted.label, h0, dht]
        caught = (h0, dht) == (False, True)
        assert bugged["status"] == ("wrong" if caught else "right")
        assert bugged["beyond_tolerance"] == (["dg"] if caught else [])
    *_, failing = {row[0]: row for row in atlas.table(list(records.values()))}[planted.label]
    assert failing == {"no-h0,dht": "wrong"}
    assert "no-h0,dht (wrong)" in atlas.format_table(list(records.values()))


def test_a_raising_kernel_is_a_record():
    todo = atlas.settings(["fused_recurrent_rwkv6"], ["transposed_h0_mask"], decays=(1.0,), lengths=(9,),
                          combinations=[(True, True)], B=1, H=1, K=32, V=64)
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
    # two of the four combinations at one decay: as many settings and float64 references (and seconds) as before
    code = main(["atlas", "--op", "chunk_gsa", "--dtype", "bf16", "--decay", "100", "--length", "45",
                 "--chunk-size", "64", "--shape", "1,1,16,16,16", "--combination", "h0,dht", "no-h0,dht",
                 "--out", str(tmp_path), "--no-cache"])
    assert code == 0
    data = json.loads((tmp_path / "atlas.json").read_text())
    assert {(r["variant"], r["h0"], r["dht"], r["status"]) for r in data["records"]} == {
        ("fixed", True, True, "right"), ("fixed", False, True, "right"),
        ("unmasked_padding", True, True, "nonfinite"), ("unmasked_padding", False, True, "nonfinite")}
    assert (tmp_path / "atlas.png").stat().st_size > 10_000
    out = capsys.readouterr().out
    assert "100 (nonfinite)" in out and "h0,dht (nonfinite), no-h0,dht (nonfinite)" in out


def test_heatmap_has_a_row_per_combination_and_length():
    import matplotlib
    matplotlib.use("Agg")
    records = [{"op": "chunk_gla", "variant": "fixed", "dtype": "fp32", "chunk_size": None, "decay": m, "T": T,
                "h0": h0, "dht": dht, "status": "right", "errors": {"o": 1e-7}}
               for m in (1.0, 10.0) for T in (16, 32) for h0, dht in atlas.COMBINATIONS]
    ax = atlas.plot_heatmap(records, "chunk_gla", "fixed", "fp32")
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[:3] == ["h0,dht T16", "h0,dht T32", "h0,no-dht T16"] and len(labels) == 8
    assert "dht" in ax.get_ylabel() and "decay" in ax.get_xlabel()


def test_short_error_keeps_two_significant_digits():
    assert [atlas.short_error(x) for x in (0.0184, 0.0244, 3.46e-3, 9.96e-3, 1.0)] == [
        "1.8e-2", "2.4e-2", "3.5e-3", "1.0e-2", "1.0e0"]


# --- the saved GPU atlas, a few lines at a time (issue 44: figures legible at notebook width) ----------------------

def _texts(fig):
    import matplotlib.text

    return [t for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text().strip()]


def assert_legible_at_notebook_width(fig):
    """Shown unscaled in a ~900 px notebook column (saved at viz.DPI, and inline at 100 dpi), every label 9 pt or
    more: a figure wider than the column is shrunk to fit, and its text with it."""
    from fla_lab.tools import viz

    width_px = fig.get_size_inches()[0] * viz.DPI
    scale = min(1.0, viz.NOTEBOOK_WIDTH_PX / width_px)
    small = {t.get_text() for t in _texts(fig) if t.get_fontsize() * scale < 9}
    assert not small, f"text below 9 pt at {viz.NOTEBOOK_WIDTH_PX} px ({width_px:.0f} px figure): {sorted(small)[:5]}"


def test_the_whole_gpu_atlas_figure_is_not_legible_at_notebook_width():
    """What the check below measures: figures/atlas_gpu.png's grid of thirteen heatmaps fails it."""
    import matplotlib
    import matplotlib.pyplot as plt
    matplotlib.use("Agg")
    fig = atlas.plot_atlas(atlas.load())
    with pytest.raises(AssertionError, match="below 9 pt"):
        assert_legible_at_notebook_width(fig)
    plt.close(fig)


def test_lines_of_one_op_put_fla_lab_fixed_first_then_its_bugs_then_other_libraries():
    records = atlas.load()
    assert [line[:2] for line in atlas.lines(records, "fused_recurrent_rwkv6")] == [
        ("fused_recurrent_rwkv6", "fixed"), ("fused_recurrent_rwkv6", "transposed_h0_mask"),
        ("fla:fused_recurrent_rwkv6", "fixed")]
    assert len(atlas.lines(records)) == 13
    with pytest.raises(ValueError, match="no op"):
        atlas.plot_op(records, "chunk_nothing")
    with pytest.raises(ValueError, match="no line"):
        atlas.plot_lines(records, [("chunk_gsa", "exclusive_reference")])


def test_named_lines_figure_is_legible_and_says_what_the_records_say():
    """Each panel of the figure notebook 06 shows: one line of the saved GPU atlas, every cell's text the record's
    worst error (two digits), NaN or err, at 9 pt or more at notebook width."""
    import matplotlib
    import matplotlib.pyplot as plt
    matplotlib.use("Agg")
    records = atlas.load()
    fig = atlas.plot_lines(records, atlas.NAMED_LINES)
    assert_legible_at_notebook_width(fig)
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == len(atlas.NAMED_LINES)
    for ax, (op, variant) in zip(panels, atlas.NAMED_LINES):
        assert ax.get_title().startswith(f"{op} [{variant}] bf16")
        chosen = [r for r in records if (r["op"], r["variant"]) == (op, variant)]
        shown = {"nonfinite": "NaN", "raises": "err"}
        expected = sorted(shown.get(r["status"], atlas.short_error(atlas.worst_error(r))) for r in chosen)
        assert sorted(t.get_text() for t in ax.texts) == expected
    titles = [ax.get_title() for ax in panels]
    assert "upstream #77's bug" in titles[0] and "upstream #18's bug" in titles[1]
    plt.close(fig)


def test_committed_lines_figure_is_the_named_lines_at_notebook_width():
    """figures/atlas_gpu_lines.png (notebook 06 shows it) is `plot_lines(load(), NAMED_LINES)` saved by viz.save:
    no wider than the notebook's column, and as large as a fresh drawing."""
    import struct

    import matplotlib
    import matplotlib.pyplot as plt
    from fla_lab.tools import viz
    matplotlib.use("Agg")
    path = viz.figures_dir() / "atlas_gpu_lines.png"
    width, height = struct.unpack(">II", path.read_bytes()[16:24])  # the PNG header's IHDR
    fig = atlas.plot_lines(atlas.load(), atlas.NAMED_LINES)
    assert (width, height) == tuple(round(x * viz.DPI) for x in fig.get_size_inches())
    assert width <= viz.NOTEBOOK_WIDTH_PX
    plt.close(fig)


def test_op_view_and_explorer_draw_every_op_of_the_gpu_atlas():
    import matplotlib
    import matplotlib.pyplot as plt
    matplotlib.use("Agg")
    records = atlas.load()
    ops = sorted({r["op"].rpartition(":")[2] for r in records})
    for op in ops:
        fig = atlas.plot_op(records, op)
        assert_legible_at_notebook_width(fig)
        assert len([ax for ax in fig.axes if ax.images]) == len(atlas.lines(records, op))
        plt.close(fig)
    widget = atlas.explorer(op="chunk_rwkv6")
    dropdown, = [w for w in widget.children if hasattr(w, "options")]
    assert list(dropdown.options) == ops and dropdown.value == "chunk_rwkv6"
    dropdown.value = "chunk_gsa"  # redraws from the saved records: no kernel runs
    plt.close("all")

"""dev/fla_tests.py without FLA or a network: the size-shrinking rules and the JUnit table parser."""
import pytest

from dev import fla_tests as ft


def test_lengths_keep_a_partial_last_chunk_partial_and_short_ones_whole():
    assert [ft.shrink_length(n) for n in (1, 15, 63, 100, 128, 200, 1000, 1024, 2048)] == \
        [1, 15, 63, 100, 128, 72, 104, 128, 128]
    assert ft.shrink_cu_seqlens([0, 0, 16]) == [0, 0, 16]
    assert ft.shrink_cu_seqlens([0, 256, 500, 1000]) == [0, 128, 244, 360]


def test_cases_shrink_by_name_and_keep_gqa_ratio_and_wide_heads():
    assert ft.shrink_case(dict(B=4, T=2048, H=8, D=128, M=128, dtype="fp16")) == \
        dict(B=1, T=128, H=2, D=64, M=64, dtype="fp16")
    assert ft.shrink_case(dict(B=2, T=256, HQ=16, H=4, D=128, M=64)) == dict(B=1, T=128, HQ=8, H=2, D=64, M=64)
    assert ft.shrink_case(dict(B=1, T=128, H=4, D=512)) == dict(B=1, T=64, H=2, D=512)


def test_parametrize_values_shrink_with_ids_kept():
    argvalues = [pytest.param(2, 1024, 0.1, id="B2-T1024"), (1, 63, 1.0)]
    new = ft.shrink_argvalues(("B", "T", "gate"), argvalues)
    assert new[0].values == (1, 128, 0.1) and new[0].id == "B2-T1024"
    assert new[1] == (1, 63, 1.0)
    assert ft.shrink_argvalues("T", [1, 1024]) == [1, 128]
    assert ft.shrink_argvalues("H, D", [(8, 128)]) == [(2, 64)]


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="4">
<testcase classname="test_gla" name="test_chunk[B1-T63]" time="1.0"/>
<testcase classname="test_gla" name="test_chunk[B1-T128-D512]" time="2.0">
<failure message="AssertionError:                o diff: 0.012500 ratio: 0.004180&#10;assert 0.00418 &lt; 0.004">x</failure>
</testcase>
<testcase classname="test_rwkv7" name="test_chunk_wrapper_chunk_size[32]" time="0.1">
<failure message="ValueError: chunk_rwkv7: chunk_size must be 16, got 32">x</failure></testcase>
<testcase classname="test_gsa" name="test_chunk[D256]" time="0.0">
<skipped type="pytest.skip" message="Current CI do not support this config">s</skipped></testcase>
</testsuite></testsuites>"""


def test_junit_parses_into_counts_and_one_line_reasons():
    results = ft.parse_junit(JUNIT)
    assert results["test_gla.py"]["passed"] == ["test_chunk[B1-T63]"]
    assert results["test_gla.py"]["failed"] == [
        ("test_chunk[B1-T128-D512]", "o: error ratio 0.004180 > 0.004 (max abs diff 0.012500)")]
    assert results["test_rwkv7.py"]["failed"][0][1] == "ValueError: chunk_rwkv7: chunk_size must be 16, got 32"
    assert results["test_gsa.py"]["skipped"] == [("test_chunk[D256]", "Current CI do not support this config")]
    lines = ft.table(results, ["test_gla.py", "test_rwkv7.py", "test_gsa.py"])
    assert "| test_gla.py | 1 | 1 | 0 | 0 functions |" in lines
    assert lines[-1].startswith("| **total** | **1** | **2** | **1** |")


def test_gpu_run_keeps_fla_sizes_and_its_shared_memory_gate():
    cpu, gpu = ft.conftest(gpu=False), ft.conftest(gpu=True)
    assert "shrink_marks" in cpu and "shrink_marks" not in gpu
    assert "install_shim" in gpu and "check_ops_and_bind_references" in gpu
    compile(cpu, "conftest.py", "exec"), compile(gpu, "conftest.py", "exec")
    results = {"test_gla.py": {"passed": ["a"], "failed": [], "skipped": []}}
    on_gpu = ft.report(results, ["test_gla.py"], "abc", "`fla`", 12.0, None, gpu="NVIDIA H100 80GB HBM3")
    assert "NVIDIA H100 80GB HBM3 (CUDA, FLA's own sizes)" in on_gpu and "B -> 1" not in on_gpu
    assert "B -> 1" in ft.report(results, ["test_gla.py"], "abc", "`fla`", 12.0, None)

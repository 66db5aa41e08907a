"""benchmarks/scaling.py on the CPU: the dry run writes a row, a table and a figure; the plot works from a JSON
alone (a synthetic one here, with an error row like FLA's fused_recurrent_rwkv7 without a backward)."""
import json
import os
import subprocess
import sys

import pytest

from benchmarks import scaling
from conftest import ROOT

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_script(*args):
    return subprocess.run([sys.executable, "-m", "benchmarks.scaling", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


@pytest.fixture(autouse=True)
def _no_copies_to_out(monkeypatch):
    """On the GPU machine $OUT is set: the script would copy these test files there."""
    monkeypatch.delenv("OUT", raising=False)


def assert_figure(path):
    with open(path, "rb") as f:
        assert f.read(8) == PNG_MAGIC
    assert os.path.getsize(path) > 10_000


def synthetic_row(op, B, T, *, fla=True, fla_backward=True):
    tokens = B * T
    row = {"op": op, "B": B, "T": T, "H": 16, "shape": "ref" if (B, T) == (8, 4096) else "scaling",
           "bytes": {"inputs": 4 * tokens * 16 * 64 * 2, "output": tokens * 16 * 64 * 2}, "errors": {},
           "device": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0", "fla_version": "0.6.0",
           "date": "2026-01-01", "seconds": 1.0,
           "fla_lab": {"fwd_ms": 0.2 * T / 1024, "fwd_bwd_ms": 0.8 * T / 1024, "fwd_bwd_checks_off_ms": 0.79 * T / 1024,
                       "peak_MiB": 1000.0, "runs": {}}}
    if fla:
        row["fla"] = {"fwd_ms": 0.25 * T / 1024, "peak_MiB": 1200.0, "runs": {}}
        if fla_backward:
            row["fla"]["fwd_bwd_ms"] = 0.7 * T / 1024
        else:
            row["errors"]["fla"] = {"at": "fla fwd_bwd_ms", "error": "NotImplementedError: Backward pass ..."}
    return row


def synthetic_result():
    rows = [synthetic_row(op, 65536 // T, T, fla_backward=op != "fused_recurrent_rwkv7")
            for op in ("chunk_gla", "fused_recurrent_rwkv7") for T in (1024, 4096, 65536)]
    rows.append(synthetic_row("chunk_gla", 8, 4096))
    meta = {"hbm_TBps": 4.8, "dtype": "bf16", "H": 16, "K": 64, "V": 64, "M": 64, "tokens": 65536,
            "reference": [8, 4096], "rounds": 2, "do_bench": "warmup 50 ms, rep 300 ms, median"}
    return {"meta": meta, "rows": rows}


def test_dry_run_writes_row_table_and_figure(tmp_path):
    proc = run_script("--dry-run", "--only", "chunk_gla", "--out-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    with open(tmp_path / "scaling.json") as f:
        rows = json.load(f)["rows"]
    assert [(r["op"], r["B"], r["T"]) for r in rows] == [("chunk_gla", 1, 32)]
    assert rows[0]["errors"] == {} and rows[0]["fla_lab"]["fwd_bwd_ms"] > 0
    assert rows[0]["fla_lab"]["fwd_bwd_checks_off_ms"] > 0
    table = (tmp_path / "scaling.md").read_text()
    assert "| chunk_gla | CPU | scaling | 1 | 32 |" in table
    assert_figure(tmp_path / "scaling.png")


def test_plot_from_json_alone(tmp_path):
    with open(tmp_path / "scaling.json", "w") as f:
        json.dump(synthetic_result(), f)
    scaling.main(["--plot", "--out-dir", str(tmp_path)])
    table = (tmp_path / "scaling.md").read_text()
    # fla_lab / FLA: fwd 0.2 / 0.25, fwd+bwd 0.8 / 0.7, peak 1000 / 1200 MiB, checks 0.8 / 0.79
    assert "| chunk_gla | H200 | scaling | 64 | 1024 | 0.200 | 0.250 | 0.80x | 0.800 | 0.700 | 1.14x | 1000 | 1200 | 0.83x " \
           "| +1.3% |" in table
    assert "| chunk_gla | H200 | ref | 8 | 4096 |" in table
    assert "NotImplementedError" in table and "NVIDIA H200" in table and "4.8 TB/s" in table
    # floor: (4 inputs + 1 output) * 65536 tokens * 16 heads * 64 * 2 bytes at 4.8 TB/s
    floor_fwd = 5 * 65536 * 16 * 64 * 2 / 4.8e12 * 1e3
    assert f"| {floor_fwd:.3g} | {2 * floor_fwd:.3g} |" in table
    assert_figure(tmp_path / "scaling.png")


def test_merge_joins_runs(tmp_path):
    first, second = synthetic_result(), synthetic_result()
    first["rows"] = first["rows"][:2]
    second["rows"] = second["rows"][1:3]
    for name, result in (("a.json", first), ("b.json", second)):
        with open(tmp_path / name, "w") as f:
            json.dump(result, f)
    scaling.main(["--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out-dir", str(tmp_path)])
    with open(tmp_path / "scaling.json") as f:
        assert [(r["op"], r["T"]) for r in json.load(f)["rows"]] == [("chunk_gla", 1024), ("chunk_gla", 4096),
                                                                       ("chunk_gla", 65536)]
    assert (tmp_path / "scaling.md").exists()
    assert_figure(tmp_path / "scaling.png")


def test_resume_keeps_rows_and_skips_them(tmp_path, capsys):
    row = synthetic_row("chunk_gla", 1, 32, fla=False)
    row["H"] = 2
    result = synthetic_result()
    result["rows"].append(row)
    with open(tmp_path / "scaling.json", "w") as f:
        json.dump(result, f)
    scaling.main(["--dry-run", "--only", "chunk_gla", "--resume", "--out-dir", str(tmp_path)])
    assert "[chunk_gla B=1 T=32] in " in capsys.readouterr().out
    with open(tmp_path / "scaling.json") as f:
        assert len(json.load(f)["rows"]) == len(result["rows"])


def test_a_failing_op_is_a_row_with_its_error(tmp_path, monkeypatch):
    def out_of_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory (raised by the test)")

    monkeypatch.setattr(scaling.ops, "chunk_gla", out_of_memory)
    scaling.main(["--dry-run", "--only", "chunk_gla", "--out-dir", str(tmp_path)])
    with open(tmp_path / "scaling.json") as f:
        (row,) = json.load(f)["rows"]
    assert row["errors"]["fla_lab"] == {"at": "fla_lab fwd_ms", "error": "RuntimeError: CUDA out of memory (raised by "
                                                                           "the test)"}
    assert "CUDA out of memory" in (tmp_path / "scaling.md").read_text()
    assert_figure(tmp_path / "scaling.png")


def test_bugs_are_timed_beside_the_fixed_op(tmp_path):
    """`--bugs`: the catalogued bug a fix replaced is timed in the same case as the fixed op, and the table gives the
    fixed / buggy ratios; `--ref-only` keeps the reference shape alone."""
    scaling.main(["--dry-run", "--only", "chunk_rwkv6", "--bugs", "--out-dir", str(tmp_path)])
    with open(tmp_path / "scaling.json") as f:
        (row,) = json.load(f)["rows"]
    assert row["errors"] == {} and row["fla_lab bug=exclusive_reference"]["fwd_bwd_ms"] > 0
    assert "| chunk_rwkv6 | scaling | 1 | 32 | exclusive_reference |" in (tmp_path / "scaling.md").read_text()
    assert scaling.shapes([1024, 2048], 65536, reference=True, ref_only=True) == [scaling.REFERENCE_SHAPE]

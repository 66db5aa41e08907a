"""The catalogue is real: every entry points at its switch, has a reproduction test, and transposed_h0_mask
reproduces exactly its symptom (other entries are reproduced beside their kernels and layers)."""
import pathlib

import pytest

from fla_lab import bugs, harness, reference
from fla_lab.ops import fused_recurrent_rwkv6

TESTS = pathlib.Path(__file__).parent


@pytest.mark.parametrize("bug", bugs.CATALOGUE, ids=lambda b: b.name)
def test_entry_points_at_its_switch(bug):
    where = bugs.locate(bug.name)
    path, line = where.rsplit(":", 1)
    text = (pathlib.Path(bugs.__file__).parent.parent / path).read_text().splitlines()[int(line) - 1]
    assert bug.anchor[1] in text
    assert bug.issue > 0 and bug.fix and bug.trigger and bug.symptom


@pytest.mark.parametrize("bug", bugs.CATALOGUE, ids=lambda b: b.name)
def test_entry_has_a_reproduction_test(bug):
    test_files = [p for p in TESTS.rglob("test_*.py") if p.name != "test_bugs.py"]
    assert any(f'"{bug.name}"' in p.read_text() for p in test_files) or bug.name == "transposed_h0_mask"


def test_unknown_bug_name_is_rejected():
    x = harness.gated_inputs(1, 4, 1, 16, 16, bonus=True, names=("r", "k", "v", "w"))
    with pytest.raises(ValueError, match="unknown bug='nope'.*transposed_h0_mask"):
        fused_recurrent_rwkv6(**x, bug="nope")


def _backward(bug, tiles, h0=True, K=32, V=64):
    x = harness.gated_inputs(1, 8, 1, K, V, initial_state=h0, bonus=True, names=("r", "k", "v", "w"))
    return harness.compare(lambda **kw: fused_recurrent_rwkv6(**kw, bug=bug, dq_tiles=tiles),
                           reference.recurrent_rwkv6, x)


def test_transposed_h0_mask_breaks_non_square_tiles_with_an_initial_state():
    with pytest.raises(Exception, match=r"(64 and 16|16 and 64|\[16, 64\]|\[64, 16\])"):
        _backward("transposed_h0_mask", (16, 64))


def test_transposed_h0_mask_is_silent_without_initial_state_or_with_full_square_tiles():
    assert _backward("transposed_h0_mask", (16, 64), h0=False).ok
    assert _backward("transposed_h0_mask", (32, 32), K=32, V=64).ok  # square tiles that K and V fill exactly


def test_fixed_path_returns_the_right_dh0():
    result = _backward(None, (16, 64))
    assert result.ok and result.errors["initial_state"] < 1e-6

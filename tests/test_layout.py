"""The layout a newcomer reads: each public op lives in its family's file, and the kernel that holds a bug's line
is at most two calls from the op (the op, its forward or backward launcher, the kernel launch)."""
import ast
import inspect
import textwrap

import pytest

from fla_lab.teaching import bugs
from fla_lab.ops.gla import chunk as gla_chunk
from fla_lab.ops.gsa import chunk as gsa_chunk
from fla_lab.ops.rwkv6 import chunk as rwkv6_chunk
from fla_lab.ops.common import fused_recurrent as common_fused
from fla_lab.ops.rwkv6 import fused_recurrent as rwkv6_fused


def _calls(fn) -> set[str]:
    """Names called in a function's body (`f(...)`, `obj.f(...)`) and kernels launched (`kernel[grid](...)`)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func.value if isinstance(node.func, ast.Subscript) else node.func
            names.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""))
    return names


@pytest.mark.parametrize("module, op", [("fla_lab.ops.gla.chunk", "chunk_gla"),
                                        ("fla_lab.ops.gla.fused_recurrent", "fused_recurrent_gla"),
                                        ("fla_lab.ops.rwkv6.chunk", "chunk_rwkv6"),
                                        ("fla_lab.ops.rwkv6.fused_recurrent", "fused_recurrent_rwkv6"),
                                        ("fla_lab.ops.gsa.chunk", "chunk_gsa"),
                                        ("fla_lab.ops.gsa.fused_recurrent", "fused_recurrent_gsa"),
                                        ("fla_lab.ops.rwkv7.chunk", "chunk_rwkv7"),
                                        ("fla_lab.ops.rwkv7.fused_recurrent", "fused_recurrent_rwkv7")])
def test_each_public_op_is_defined_in_its_family_file(module, op):
    import fla_lab.ops

    assert getattr(fla_lab.ops, op).__module__ == module


def test_rwkv6_reference_row_kernel_is_two_calls_from_chunk_rwkv6():
    """chunk_rwkv6 -> ChunkGLAFunction (forward: chunk_gla_fwd, backward: chunk_gla_bwd) -> the kernels that take
    the REFERENCE_ROW slot, whose shipped and historical helpers sit next to each other."""
    assert "apply" in _calls(rwkv6_chunk.chunk_rwkv6)
    assert "chunk_gla_fwd" in _calls(gla_chunk.ChunkGLAFunction.forward)
    assert "chunk_gla_bwd" in _calls(gla_chunk.ChunkGLAFunction.backward)
    assert "gated_scores_kernel" in _calls(gla_chunk.chunk_gla_fwd)
    assert "chunk_bwd_dqk_kernel" in _calls(gla_chunk.chunk_gla_bwd)
    for kernel in (gla_chunk.gated_scores_kernel, gla_chunk.chunk_bwd_dqk_kernel):
        assert "REFERENCE_ROW" in inspect.signature(kernel.fn).parameters


def test_gsa_padded_rows_kernel_is_two_calls_from_chunk_gsa():
    """chunk_gsa -> ChunkGSAFunction (backward: slot_pass_bwd) -> slot_rows_kernel."""
    assert "apply" in _calls(gsa_chunk.chunk_gsa)
    assert "slot_pass_bwd" in _calls(gsa_chunk.ChunkGSAFunction.backward)
    assert "slot_rows_kernel" in _calls(gsa_chunk.slot_pass_bwd)
    assert "EXPONENT" in inspect.signature(gsa_chunk.slot_rows_kernel.fn).parameters


def test_h0_mask_kernel_is_two_calls_from_fused_recurrent_rwkv6():
    """fused_recurrent_rwkv6 -> FusedRecurrentFunction (backward: fused_recurrent_bwd) -> the dq kernel, in
    common/fused_recurrent.py, the kernels GLA and GSA run too."""
    assert "apply" in _calls(rwkv6_fused.fused_recurrent_rwkv6)
    assert rwkv6_fused.FusedRecurrentFunction is common_fused.FusedRecurrentFunction
    assert "fused_recurrent_bwd" in _calls(common_fused.FusedRecurrentFunction.backward)
    assert "fused_recurrent_bwd_dq_kernel" in _calls(common_fused.fused_recurrent_bwd)
    assert "H0_MASK" in inspect.signature(common_fused.fused_recurrent_bwd_dq_kernel.fn).parameters


@pytest.mark.parametrize("name", [b.name for b in bugs.CATALOGUE])
def test_every_switch_is_found_in_the_file_the_catalogue_names(name):
    """`bugs.locate` reads the file the entry names for the line its `# bug: <name>` marker marks."""
    assert bugs.locate(name).startswith(f"fla_lab/{bugs.get(name).switch_file}:")

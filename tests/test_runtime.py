import pytest
import torch

from conftest import run_python

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU (interpreter) path")


@no_cuda
def test_import_turns_the_interpreter_on_without_cuda():
    out = run_python("import os, fla_lab; print(os.environ['TRITON_INTERPRET'], fla_lab.device(), fla_lab.interpreting())")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "cpu", "True"]


def test_user_setting_is_respected():
    out = run_python("import fla_lab; print(fla_lab.runtime.describe()['TRITON_INTERPRET'])",
                     {"TRITON_INTERPRET": "1"})
    assert "set by you" in out.stdout


@no_cuda
def test_kernels_decorated_before_the_switch_are_reported():
    # TRITON_INTERPRET=0 without CUDA: kernels get compiled-mode decorators, as when a kernel module is imported
    # before fla_lab; doctor must say so and say what to do, not crash.
    code = ("import fla_lab, fla_lab.ops; from fla_lab import runtime; from fla_lab.tools import health; runtime._STATE['interpret'] = True; "
            "print('\\n'.join(health.problems()))")
    out = run_python(code, {"TRITON_INTERPRET": "0"})
    assert out.returncode == 0, out.stderr
    assert "decorated before the Triton interpreter was switched on" in out.stdout
    assert "Restart the Python kernel" in out.stdout


@no_cuda
def test_triton_imported_before_fla_lab_is_reported():
    # Triton's own library (tl.sum, tl.cdiv) is decorated at `import triton`, before fla_lab turns the interpreter
    # on: the kernels would fail with "Cannot call @triton.jit'd outside of the scope of a kernel".
    out = run_python("import triton, fla_lab; print(fla_lab.doctor())")
    assert "triton was imported before fla_lab" in out.stdout and out.stdout.strip().endswith("False"), out.stdout
    assert "health check" not in out.stdout  # the cause is named instead of the kernel's failure


@no_cuda
def test_interpreter_off_without_cuda_is_a_clear_problem():
    out = run_python("import fla_lab; print(fla_lab.doctor())", {"TRITON_INTERPRET": "0"})
    assert "TRITON_INTERPRET=0" in out.stdout and out.stdout.strip().endswith("False")


def test_doctor_cli_passes():
    out = run_python("import sys; from fla_lab.__main__ import main; sys.exit(main(['doctor']))")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "doctor: all good" in out.stdout
    assert "health check: fused_recurrent_gla" in out.stdout


def test_unsupported_triton_is_reported(monkeypatch):
    from fla_lab.tools import health
    from fla_lab import runtime

    monkeypatch.setattr(runtime, "triton_version", lambda: (2, 2))
    assert any("outside the tested range" in p for p in health.problems())
    monkeypatch.setattr(runtime, "triton_version", lambda: None)
    assert any("triton is not installed" in p for p in health.problems())


@no_cuda
def test_interpreter_overflow_warnings_stay_out_of_output():
    # exp(+100) overflows in fp32: numpy warns inside the interpreter unless fla_lab filtered it
    code = ("import fla_lab, torch; from fla_lab.ops import fused_recurrent_gla, set_value_checks\n"
            "set_value_checks(False); x = torch.randn(1, 4, 1, 16); g = torch.full((1, 4, 1, 16), 100.0)\n"
            "o, _ = fused_recurrent_gla(x, x, x, g); print(bool(torch.isfinite(o).all()))")
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"  # the overflow really happened
    assert "RuntimeWarning" not in out.stderr and "overflow" not in out.stderr, out.stderr


def test_interpreter_noise_is_hidden_even_under_an_error_filter():
    """Triton 3.6's interpreter calls int() on 1-element arrays, which numpy >= 1.25 deprecates (seen on the H200:
    a contract verdict then listed that DeprecationWarning as something the contract said). Caller warnings stay."""
    import warnings

    from fla_lab import runtime

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("error")
        runtime.hide_interpreter_noise()
        warnings.warn("Conversion of an array with ndim > 0 to a scalar is deprecated, and will error in future.",
                      DeprecationWarning)
        warnings.simplefilter("always")
        runtime.hide_interpreter_noise()
        warnings.warn("this API is deprecated", DeprecationWarning)
    assert [str(w.message) for w in caught] == ["this API is deprecated"]


def test_bf16_rounding_is_round_to_nearest_even():
    """fla_lab's fp32 -> bf16 bit patterns against torch's cast (round to nearest even): random values, ties both
    ways, the largest finite values (carry to inf), infinities, zeros, subnormals; NaN stays NaN."""
    import numpy as np

    from fla_lab.runtime import bf16_round_to_nearest_even
    ties = torch.tensor([1.00390625, 1.01171875, -1.00390625, 3.4e38, -3.4e38, 3.3895e38, float("inf"),
                         float("-inf"), 0.0, -0.0, 1e-40, -1e-39])
    x = torch.cat([torch.randn(50000, generator=torch.Generator().manual_seed(0)) * 100, ties])
    ours = torch.from_numpy(bf16_round_to_nearest_even(x.numpy()).view(np.int16)).view(torch.bfloat16)
    assert torch.equal(ours, x.to(torch.bfloat16))
    nan = torch.from_numpy(bf16_round_to_nearest_even(np.array([float("nan")], np.float32)).view(np.int16))
    assert nan.view(torch.bfloat16).isnan().all()


def test_interpreted_bf16_stores_round_as_a_gpu_does():
    """A kernel's `x.to(tl.bfloat16)` and an fp32 value stored to a bf16 pointer, under the interpreter: torch's
    round-to-nearest, not the interpreter's truncation (up to 1 ulp, biased towards zero)."""
    import triton
    import triton.language as tl

    from fla_lab import runtime
    if not runtime.interpreting():
        pytest.skip("the GPU rounds its casts itself")

    @triton.jit
    def cast_and_store(x, y, z, N: tl.constexpr):
        o = tl.arange(0, N)
        b_x = tl.load(x + o)
        tl.store(y + o, b_x.to(tl.bfloat16))
        tl.store(z + o, b_x)

    x = torch.randn(1024, generator=torch.Generator().manual_seed(1)) * 7
    y, z = torch.empty(1024, dtype=torch.bfloat16), torch.empty(1024, dtype=torch.bfloat16)
    cast_and_store[(1,)](x, y, z, N=1024)
    assert torch.equal(y, x.to(torch.bfloat16)) and torch.equal(z, x.to(torch.bfloat16))


def test_loop_bounds_computed_in_a_kernel_run_under_triton_3_6s_interpreter(monkeypatch):
    """Triton 3.6's interpreter made a scalar tensor an index with `int()` of a one-element array, which numpy 2.4
    rejects: every kernel that computes a loop bound (a chunk count, a packed sequence's length) failed there,
    chunk_gla's dry run on the H200 machine (Triton 3.6) among them. Stand in 3.6's hook, apply the fix, and run
    a kernel whose loop bound it computes."""
    import triton
    import triton.language as tl
    from triton.runtime import interpreter

    from fla_lab import runtime
    if not runtime.interpreting():
        pytest.skip("compiled kernels have no such hook")

    def triton_3_6_hook(tensor, scope):
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", triton_3_6_hook)
    assert runtime.index_tensors_as_scalars()

    @triton.jit
    def count_chunks(x, y, T, BT: tl.constexpr):
        n = 0
        for _ in range(0, tl.cdiv(tl.load(x + T * 0), BT)):
            n += 1
        tl.store(y, n)

    y = torch.zeros(1, dtype=torch.int32)
    count_chunks[(1,)](torch.tensor([37], dtype=torch.int32), y, 0, BT=16)
    assert y.item() == 3


def test_the_first_launch_is_announced_once_and_every_launch_runs(monkeypatch):
    from types import SimpleNamespace

    from fla_lab import runtime

    monkeypatch.setitem(runtime._STATE, "device", "cuda")
    monkeypatch.setattr(runtime, "_ANNOUNCED", [])
    launched, said = [], []
    kernels = [SimpleNamespace(run=lambda *a, i=i, **kw: launched.append((i, a, kw)) or i) for i in range(2)]
    originals = [k.run for k in kernels]
    for k in kernels:
        runtime.announce_first_launch(k, say=said.append)
    assert kernels[0].run(1, grid=2) == 0 and kernels[0].run is originals[0]  # unwrapped after its first launch
    assert kernels[1].run() == 1 and kernels[1].run is originals[1]
    assert said == [runtime.COMPILE_NOTE] and launched == [(0, (1,), {"grid": 2}), (1, (), {})]


def test_no_triton_hook_is_installed():  # a jit_cache_hook makes Triton JSON-serialise constexprs (helpers fail)
    import triton

    import fla_lab.ops  # noqa: F401  (every kernel registered)

    assert getattr(getattr(triton, "knobs", None), "runtime", None) is None or \
        triton.knobs.runtime.jit_cache_hook is None


AMP_STEP_DIGEST = """
import hashlib, torch, fla_lab
from fla_lab.teaching.lessons import amp
step = amp.amp_step("bf16_decay", T=48, hidden_size=64)
print(torch.get_num_threads(), torch.backends.mkldnn.enabled,
      hashlib.sha256(step.output.float().numpy().tobytes()).hexdigest())
"""


def test_cpu_arithmetic_is_pinned_so_another_cpu_prints_the_same_digits():
    """Issue 42: `import fla_lab` on the CPU sets one thread, no oneDNN and MKL's AVX2 path, so a bf16 autocast
    step (bf16 matmuls, norms, the kernel) gives the same bits whatever thread count or vector width the machine
    would have chosen: here, this machine's defaults against what an AVX2 machine with another core count
    presents (workbook.another_cpu)."""
    here = run_python(AMP_STEP_DIGEST, {"CUDA_VISIBLE_DEVICES": ""})
    other = run_python(AMP_STEP_DIGEST, {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "3",
                                         "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                                         "MKL_ENABLE_INSTRUCTIONS": "AVX2"})
    assert here.returncode == 0 == other.returncode, here.stderr + other.stderr
    assert here.stdout.split()[:2] == ["1", "False"]
    assert here.stdout == other.stdout


def test_doctor_names_the_cpu_arithmetic():
    out = run_python("import fla_lab; fla_lab.doctor()", {"CUDA_VISIBLE_DEVICES": ""})
    assert "cpu arithmetic   : 1 thread(s), oneDNN off, MKL_CBWR=AVX2" in out.stdout, out.stdout

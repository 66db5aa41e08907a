import math

import pytest
import torch

from fla_lab.spec import check


def test_rel_error_basics():
    ref = torch.ones(10, dtype=torch.float64)
    assert check.rel_error(ref.float(), ref) == 0.0
    assert check.rel_error(ref * 1.01, ref) == pytest.approx(0.01)
    bad = ref.clone()
    bad[3] = float("nan")
    assert check.rel_error(bad, ref) == math.inf
    with pytest.raises(ValueError, match="shape"):
        check.rel_error(ref[:5], ref)


def test_grad_floor_uses_the_whole_gradient_scale():
    # dg's exact value underflows (1e-21) while the kernel returns rounding noise of 1e-7: judged against the
    # scale of the other gradients it is tiny; judged against its own norm it would be 1e14.
    ref = {"dq": torch.randn(1000, dtype=torch.float64), "dg": torch.full((1000,), 1e-21, dtype=torch.float64)}
    got = {"dq": ref["dq"].clone(), "dg": ref["dg"] + 1e-7 * torch.randn(1000, dtype=torch.float64)}
    errors = check.grad_errors(ref, got)
    assert errors["dq"] == 0.0
    assert 1e-8 < errors["dg"] < 1e-6
    assert check.rel_error(got["dg"], ref["dg"]) > 1e10
    # an error as large as the gradients themselves still fails
    got["dg"] = ref["dg"] + torch.randn(1000, dtype=torch.float64)
    assert check.grad_errors(ref, got)["dg"] > 0.5


def _small_and_large_grads(seed=0):
    # du is 1e-4 of dq's scale: small enough that the floor sqrt(n) * RMS(all) would forgive zeroing it
    gen = torch.Generator().manual_seed(seed)
    ref = {"dq": torch.randn(1000, generator=gen, dtype=torch.float64),
           "du": 1e-4 * torch.randn(64, generator=gen, dtype=torch.float64)}
    got = {n: r + 1e-3 * r.abs().max() * torch.randn(r.shape, generator=gen, dtype=torch.float64)
           for n, r in ref.items()}
    return ref, got


def test_a_zeroed_small_gradient_fails():
    ref, got = _small_and_large_grads()
    got["du"] = torch.zeros_like(got["du"])
    floor = math.sqrt(64) * math.sqrt(sum(float((r ** 2).sum()) for r in ref.values()) / 1064)
    assert float(ref["du"].norm()) / floor < 2e-3  # the floored error alone would pass even the fp32 tolerance
    errors = check.grad_errors(ref, got)
    assert errors["du"] == 1.0 and errors["du"] > check.tolerance(torch.bfloat16).grad
    assert check.grad_errors({"a": torch.zeros(3)}, {"a": torch.zeros(3)})["a"] == 0.0  # an exact zero is right


def test_an_exact_gradient_that_underflows_may_come_back_zero():
    """GSA's dg at decay knob 1e3 is about 4e-24 of the other gradients (notebook 03b): the kernel's exp underflows
    and returns 0, which is right to every digit that matters; it stays floored, not counted as dropped."""
    ref, got = _small_and_large_grads()
    ref["du"] = ref["du"] * 1e-20
    got["du"] = torch.zeros_like(got["du"])
    assert check.grad_errors(ref, got)["du"] < 1e-12
    ref["du"] = ref["du"] * 1e19  # 1e-5 of the others (du was 1e-4): not negligible, so zeros are a dropped gradient
    assert check.grad_errors(ref, got)["du"] == 1.0


def test_the_floored_error_of_a_gradient_that_is_not_zeroed_is_unchanged():
    ref, got = _small_and_large_grads()
    # the floored formula as it was before zeroed gradients were singled out (the notebooks print its values)
    rms_all = math.sqrt(sum(check._norm(r) ** 2 for r in ref.values()) / 1064)
    errors = check.grad_errors(ref, got)
    for name, r in ref.items():
        assert errors[name] == check.rel_error(got[name], r, floor=math.sqrt(r.numel()) * rms_all)
    assert errors["du"] < check.rel_error(got["du"], ref["du"])  # and the floor is in effect for du
    got["du"][1:] = 0.0  # mostly zero is not zeroed: still floored
    assert check.grad_errors(ref, got)["du"] < 0.1


def test_plain_grad_errors_are_unfloored_and_never_below_the_floored():
    ref, got = _small_and_large_grads()
    plain, floored = check.plain_grad_errors(ref, got), check.grad_errors(ref, got)
    assert plain == {n: check.rel_error(got[n], r) for n, r in ref.items()}
    assert all(plain[n] >= floored[n] for n in ref)
    assert plain["du"] > 100 * floored["du"]  # the small gradient is where the floor matters
    with pytest.raises(ValueError, match="missing"):
        check.plain_grad_errors({"a": torch.ones(2)}, {})


def test_comparison_carries_the_plain_errors_beside_the_floored():
    from fla_lab.spec import harness, reference

    # the float64 reference as the op on bf16 leaves: no kernel, but gradients rounded to bf16
    comp = harness.compare(reference.recurrent_gla, reference.recurrent_gla,
                           harness.gated_inputs(1, 8, 1, 4, 4, decay=5.0), dtype=torch.bfloat16)
    grads = [n for n in comp.plain_errors]
    assert grads and all(comp.plain_errors[n] >= comp.errors[n] for n in grads)
    assert "plain" not in str(comp) and str(comp) == "  ".join(f"{n}={e:.1e}" for n, e in comp.errors.items())


def test_grad_errors_reports_missing():
    with pytest.raises(ValueError, match="missing"):
        check.grad_errors({"a": torch.ones(2)}, {})


def test_census_locates_the_earliest_time_step():
    x = torch.zeros(2, 8, 3, 4)
    x[0, 5, 2, 1] = float("inf")
    x[1, 3, 1, 2] = float("nan")
    x[1, 3, 0, 3] = float("nan")
    census = check.nonfinite_census(x)
    assert census.count == 3 and census.total == x.numel()
    assert census.first == {"t": 3, "b": 1, "h": 0, "d": 3}
    assert "first at t=3" in str(census)
    assert str(check.nonfinite_census(torch.zeros(3))) == "all 3 values finite"


def test_tolerances_cover_the_kernel_dtypes_only():
    kernel_dtypes = (torch.float32, torch.float16, torch.bfloat16)
    assert set(check.TOLERANCES) == set(kernel_dtypes)
    for dtype in kernel_dtypes:
        tol = check.tolerance(dtype)
        assert 0 < tol.fwd <= tol.grad, (dtype, tol)
        # every stored output is rounded to the dtype: a tolerance below its unit roundoff could never pass
        assert tol.fwd >= torch.finfo(dtype).eps / 2, (dtype, tol)
    f32, f16, bf16 = (check.tolerance(d) for d in kernel_dtypes)
    assert f32.fwd < f16.fwd < bf16.fwd and f32.grad < f16.grad < bf16.grad
    with pytest.raises(ValueError):
        check.tolerance(torch.float64)


def test_report_marks_failures():
    text = check.report({"o": 1e-7, "dq": 1e-2}, check.Tolerance(fwd=1e-5, grad=1e-5))
    assert "o   1.0e-07  ok" in text and "dq  1.0e-02  FAIL" in text


def test_report_judges_outputs_and_states_by_the_forward_tolerance():
    tol = check.Tolerance(fwd=2e-5, grad=5e-5)
    lines = check.report({"o": 3e-5, "ht": 3e-5, "dq": 3e-5}, tol).splitlines()
    assert [line.split()[-1] for line in lines] == ["FAIL", "FAIL", "ok"]

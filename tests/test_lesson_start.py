"""Notebook 00's module: the fused recurrent kernels match their float64 references, the naive chunk split overflows
exactly where log(max)/C says (the lead figure's setting does overflow), reference rows between s and t keep both
factors <= 1 without any clamp, and the figures draw what their titles say. What the notebook's text and saved
outputs must show: tests/test_notebook_prose.py (`NOTEBOOK_00`)."""
import math

import matplotlib
import pytest
import torch

from fla_lab.spec import check
from fla_lab.teaching.lessons import start

matplotlib.use("Agg")
EXP_MAX = math.log(torch.finfo(torch.float32).max)  # 88.72


def test_kernel_health_within_fp32_tolerance():
    tol = check.tolerance(torch.float32).grad
    for op, errors in start.kernel_health().items():
        assert all(err <= tol for err in errors.values()), (op, errors)


def test_lead_figure_setting_overflows():
    """fp32, |g| = 2, C = 64 (the explorer's default and figures/00_chunk_factors.png): the key factor exp(2(s+1))
    is inf from row 44 on, and the chunk's naive scores hold NaN; the exact ones are all finite."""
    census = start.naive_split_census(2.0, 64, torch.float32)
    assert census["first key row inf"] == math.ceil(EXP_MAX / 2.0) - 1 == 44
    assert census["NaN scores"] + census["inf scores"] > 0
    assert census["causal scores"] == 64 * 65 // 2
    naive, exact = start.naive_scores(2.0, 64, torch.float32)
    assert torch.isfinite(exact).all()
    assert not torch.isfinite(naive[44:, 44:].diagonal()).any()


def test_short_chunk_survives_the_same_decay():
    census = start.naive_split_census(2.0, 32, torch.bfloat16)
    assert census["first key row inf"] is None and census["NaN scores"] == census["inf scores"] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("magnitude", [1e-3, 2.0, 100.0, 1e4])
def test_reference_row_factors_never_exceed_one(dtype, magnitude):
    f = start.chunk_factors(magnitude, 64, dtype)
    for key in ("query_with_reference", "key_with_reference"):
        values = f[key].double()
        assert torch.isfinite(values).all() and (values <= 1).all() and (values >= 0).all(), key


def test_reference_rows():
    n_query, n_key = start.query_reference_rows(64), start.key_reference_rows(64)
    assert n_query[[0, 15, 16, 40, 63]].tolist() == [0, 0, 16, 32, 48]
    assert n_key[[0, 15, 16, 47, 48, 63]].tolist() == [16, 16, 32, 48, 63, 63]
    assert (n_query <= torch.arange(64)).all() and (n_key >= torch.arange(64)).all()


def test_split_is_exact_and_bounded_only_between():
    G = torch.cumsum(start.example_decays(64), 0)
    for n in range(10, 41):  # every n from s to t
        split = start.split_around(G, t=40, s=10, n=n)
        assert split["query factor <= 1"] and split["key factor <= 1"]
        assert math.isclose(split["query exponent G_t - G_n"] + split["key exponent G_n - G_s"],
                            split["exact exponent G_t - G_s"], abs_tol=1e-12)
    after, before = start.split_around(G, 40, 10, 56), start.split_around(G, 40, 10, 4)
    assert not after["query factor <= 1"] and after["key factor <= 1"]
    assert before["query factor <= 1"] and not before["key factor <= 1"]


def test_block_kinds():
    kinds = start.block_kinds(64)
    assert int((kinds == 0).sum()) == 64 * 63 // 2  # above the diagonal
    assert int((kinds == 1).sum()) == 4 * 16 * 17 // 2  # four diagonal sub-chunk blocks, lower triangles
    assert int((kinds == 2).sum()) == 6 * 16 * 16  # six blocks against an earlier sub-chunk
    assert kinds[40, 10] == 2 and kinds[40, 33] == 1


def test_overflow_thresholds():
    assert start.overflow_threshold(16, torch.float16) == pytest.approx(math.log(65504) / 16)
    assert start.overflow_threshold(64, torch.float32) == pytest.approx(EXP_MAX / 64)
    ratio = start.overflow_threshold(64, torch.bfloat16) / start.overflow_threshold(64, torch.float32)
    assert 0.999 < ratio < 1.0  # bf16's largest value is a hair below fp32's: same exponent, fewer mantissa bits


def test_figures_say_what_they_show():
    fig = start.plot_chunk_factors(2.0, torch.float32, 64)
    assert "key factor inf from row 44" in fig._suptitle.get_text()
    assert "of 2080" in fig.axes[1].get_title() and "0 inf + 0 NaN" not in fig.axes[1].get_title()
    fig = start.plot_chunk_factors(2.0, torch.bfloat16, 32)
    assert "nothing overflows" in fig._suptitle.get_text()
    fig = start.plot_subchunk_reference()
    titles = [ax.get_title() for ax in fig.axes]
    assert "n = 32 between s and t" in titles[1] and "n = 56 after t" in titles[2]
    for fig in (start.plot_overflow_thresholds(), start.plot_decay_weights()):
        assert fig.axes
    import matplotlib.pyplot as plt

    plt.close("all")


def test_threshold_figure_draws_the_printed_table():
    """The figure's points are the table the notebook prints, at the explorer's chunk sizes, and nothing else (no
    line for bug #77's kernel: notebook 03a asks where that one fails)."""
    assert start.CHUNK_SIZES == tuple(start.widgets.chunk_size_choice().options)
    fig = start.plot_overflow_thresholds()
    lines = fig.axes[0].get_lines()
    assert len(lines) == 3
    for line, dtype in zip(lines, (torch.float16, torch.bfloat16, torch.float32)):
        table = start.overflow_thresholds(dtype)
        assert list(line.get_xdata()) == list(start.CHUNK_SIZES) == list(table)
        assert list(line.get_ydata()) == list(table.values())
    assert fig.axes[0].get_ylim()[1] < EXP_MAX
    import matplotlib.pyplot as plt

    plt.close("all")

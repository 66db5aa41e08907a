"""Per-kernel GPU time of one fla_lab op's forward+backward (torch.profiler), to see where the time goes.

Usage on a GPU: python benchmarks/profile_op.py chunk_gsa   (the benchmark shape of bench.py)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import bench  # noqa: E402


def main(name: str) -> None:
    fn, inputs, kwargs = bench.cases()[0][name]
    x = [t.to("cuda", bench.DTYPE).requires_grad_() for t in inputs]
    do = torch.randn(bench.B, bench.T, bench.H, bench.V, device="cuda", dtype=bench.DTYPE)
    for _ in range(3):  # compile and warm up
        fn(*x, **kwargs)[0].backward(do)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn(*x, **kwargs)[0].backward(do)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=48))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "chunk_gsa")

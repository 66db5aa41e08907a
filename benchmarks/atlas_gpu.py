"""On a GPU: the stability atlas of fla_lab's ops beside flash-linear-attention 0.6.0's, at training sizes.

bf16, B=1, H=4, K=V=M=64, T in {512, 4096}, per-step log-decay magnitudes 1e-3..1e4, every variant (fixed, each
catalogued bug, upstream's op). The atlas measures accuracy, not speed: upstream's autotuning is pinned to its
first config (as in upstream_agreement) and fp32 dots are IEEE. Writes atlas_gpu.json where the lessons read it
(`fla_lab.tools.gpu_runs`, shipped with the package), the heatmaps atlas_gpu.png and the error figure
atlas_gpu_errors.png to figures/ (`--out DIR`: all three there), copies of all three to $OUT, and prints a table.

    python -m benchmarks.atlas_gpu [--out DIR]       # needs CUDA and `fla` importable

The sweep's cache (ATLAS_CACHE, default fla_lab's atlas cache) outlives one call on a warm machine: a second call
resumes where a timed-out one stopped.
"""
import argparse
import os
import shutil
from pathlib import Path

os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")

from benchmarks import common  # noqa: E402
from fla_lab.spec import registry, upstream  # noqa: E402
from fla_lab.tools import atlas, gpu_runs  # noqa: E402

OPS = ("chunk_gla", "chunk_rwkv6", "fused_recurrent_rwkv6", "chunk_gsa", "chunk_rwkv7")


def folders(out: str | None) -> tuple[Path, Path]:
    """Where the JSON and the figures go: `out` for both, else the shipped JSON and the repository's figures/."""
    return (Path(out), Path(out)) if out else (gpu_runs.FOLDER, common.ROOT / "figures")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="folder for the JSON and both figures (default: see above)")
    args = p.parse_args(argv)
    common.require_cuda("atlas_gpu")
    upstream.pin_autotune_to_first_config()
    added = registry.register_fla()
    print("registered:", added, flush=True)
    ops = [*OPS, *(f"fla:{op}" for op in OPS if f"fla:{op}" in added)]
    todo = atlas.settings(ops, dtypes=("bf16",), lengths=(512, 4096), B=1, H=4, K=64, V=64, M=64)
    cache = atlas.Cache(os.environ["ATLAS_CACHE"]) if "ATLAS_CACHE" in os.environ else atlas.default_cache()
    records = atlas.sweep(todo, cache, progress=False)
    data, figures = folders(args.out)
    json_path, heatmaps = atlas.write(records, data, "atlas_gpu")
    if figures != data:
        figures.mkdir(parents=True, exist_ok=True)
        heatmaps = Path(shutil.move(heatmaps, figures / heatmaps.name))
    errors = figures / "atlas_gpu_errors.png"
    atlas.plot_errors(records, list(OPS), "bf16", 4096).savefig(errors, dpi=110, metadata={"Software": None})
    for path in (json_path, heatmaps, errors):
        common.copy_to_out(path)
    print(atlas.format_table(records))


if __name__ == "__main__":
    main()

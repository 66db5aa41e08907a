"""On a GPU: the stability atlas of fla_lab's ops beside flash-linear-attention 0.6.0's, at training sizes.

bf16, B=1, H=4, K=V=M=64, T in {512, 4096}, per-step log-decay magnitudes 1e-3..1e4, every variant (fixed, each
catalogued bug, upstream's op). The atlas measures accuracy, not speed: upstream's autotuning is pinned to its
first config (as in upstream_agreement.py) and fp32 dots are IEEE. Writes $OUT/atlas_gpu.{json,png}, the error
figure, and a table. Run: `python benchmarks/atlas_gpu.py` (needs CUDA and `fla` importable).
"""
import os
import sys

os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from upstream_agreement import pin_autotune_to_first_config  # noqa: E402

from fla_lab.tools import atlas  # noqa: E402
from fla_lab.spec import registry

OPS = ("chunk_gla", "chunk_rwkv6", "fused_recurrent_rwkv6", "chunk_gsa", "chunk_rwkv7")


def main():
    out = os.environ.get("OUT", ".")
    pin_autotune_to_first_config()
    added = registry.register_fla()
    print("registered:", added, flush=True)
    ops = [*OPS, *(f"fla:{op}" for op in OPS if f"fla:{op}" in added)]
    todo = atlas.settings(ops, dtypes=("bf16",), lengths=(512, 4096), B=1, H=4, K=64, V=64, M=64)
    # the cache outlives one call on a warm machine: a second call resumes where a timed-out one stopped
    records = atlas.sweep(todo, atlas.Cache(os.environ.get("ATLAS_CACHE", "/tmp/atlas_cache")), progress=False)
    atlas.write(records, out, "atlas_gpu")
    fig = atlas.plot_errors(records, list(OPS), "bf16", 4096)
    fig.savefig(os.path.join(out, "atlas_gpu_errors.png"), dpi=110, metadata={"Software": None})
    print(atlas.format_table(records))


if __name__ == "__main__":
    main()

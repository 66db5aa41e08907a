"""Merge one benchmark run's JSON (from $OUT) into benchmarks/results/bench.json under a run tag, then redraw.

    python benchmarks/merge_bench.py RUN_JSON TAG "description of the run"

Rows of the new run replace rows of the same (lib, op) only when the old row's partner (same op, other lib) is
not kept, so every ratio in the table still compares two ops timed in one run.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main(path, tag, description):
    results = os.path.join(HERE, "results", "bench.json")
    with open(results) as f:
        merged = json.load(f)
    with open(path) as f:
        new = json.load(f)
    new_keys = {(r["lib"], r["op"]) for r in new["rows"]}
    merged["rows"] = [r for r in merged["rows"] if (r["lib"], r["op"]) not in new_keys]
    merged["rows"] += [{**r, "run": tag} for r in new["rows"]]
    merged["runs"][tag] = description
    with open(results, "w") as f:
        json.dump(merged, f, indent=1)
    import plot_bench

    plot_bench.main()


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    main(*sys.argv[1:4])

"""Sweeps: every setting of a grid (`settings`), measured or read from the cache (`sweep`), and the text table of
where each line of the atlas stops being right (`table`, `format_table`).
"""
from __future__ import annotations

from fla_lab.spec import registry
from fla_lab.tools.atlas.cache import Cache
from fla_lab.tools.atlas.measurement import (COMBINATIONS, DECAYS, STATUSES, Setting, _split, combination_name,
                                             combination_of, line_label, measure, parse_combination, worst_error)


def settings(ops, variants=None, dtypes=("fp32",), decays=DECAYS, lengths=(64,), chunk_sizes=(None,),
             combinations=COMBINATIONS, q_scales=(1.0,), **shape):
    """Every setting of the grid, ordered so that settings sharing a float64 reference run back to back.
    `combinations`: the (h0, dht) pairs to sweep (`COMBINATIONS`), or their names (`combination_name`);
    `q_scales`: the queries' scales (`Setting.q_scale`)."""
    pairs = [parse_combination(c) if isinstance(c, str) else tuple(c) for c in combinations]
    out = []
    for op in ops:
        spec = registry.get(*_split(op))
        wanted = [v for v in (variants or spec.variants) if v in spec.variants]
        sizes = [c for c in chunk_sizes if c is None or c in spec.chunk_sizes] or [None]
        for dtype in dtypes:
            for T in lengths:
                for decay in decays:
                    for q_scale in q_scales:
                        for h0, dht in pairs:
                            out += [Setting(spec.label, v, dtype, float(decay), T, c, **shape, h0=h0, dht=dht,
                                            q_scale=float(q_scale)) for v in wanted for c in sizes]
    return out


def sweep(todo: list[Setting], cache: Cache | None = None, progress: bool = True) -> list[dict]:
    """Measure every setting (from the cache when it holds it), with a progress bar."""
    from tqdm.auto import tqdm

    records = []
    for setting in tqdm(todo, desc="atlas", disable=not progress, leave=False):
        record = cache.get(setting) if cache else None
        if record is None:
            record = measure(setting)
            if cache:
                cache.put(setting, record)
        records.append(record)
    return records


def table(records: list[dict]) -> list[tuple]:
    """(op, variant, dtype, T, chunk, first decay not right, status there, worst error where right, combinations not
    right): one row per line of the atlas over every (h0, dht) combination, the short form the README shows. The last
    item maps each combination that is not right at some decay to its statuses there, e.g. {"no-h0,dht": "wrong"}."""
    rows = {}
    for r in sorted(records, key=lambda r: r["decay"]):
        key = (r["op"], line_label(r), r["dtype"], r["T"], r["chunk_size"])
        first = rows.setdefault(key, {"bad": None, "status": "right", "worst": 0.0, "failing": {}})
        if r["status"] != "right" and first["bad"] is None:
            first.update(bad=r["decay"], status=r["status"])
        if r["status"] == "right":
            first["worst"] = max(first["worst"], worst_error(r))
        else:
            first["failing"].setdefault(combination_name(*combination_of(r)), set()).add(r["status"])
    return [(*k, v["bad"], v["status"], v["worst"], _statuses_by_combination(v["failing"])) for k, v in rows.items()]


def _statuses_by_combination(failing: dict[str, set]) -> dict[str, str]:
    order = [combination_name(*c) for c in COMBINATIONS]
    return {name: "/".join(s for s in STATUSES if s in failing[name])
            for name in sorted(failing, key=lambda n: order.index(n) if n in order else len(order))}


def format_table(records: list[dict]) -> str:
    """`table` as aligned text; the last column names the (h0, dht) combinations that are not right somewhere."""
    lines = [f"{'op':<28} {'variant':<20} {'dtype':<5} {'T':>5} {'chunk':>5}  {'first m not right':<22} "
             f"{'worst error while right':>10}  combinations not right"]
    for op, variant, dtype, T, chunk, bad, status, worst, failing in table(records):
        where = "-" if bad is None else f"{bad:g} ({status})"
        which = ", ".join(f"{name} ({statuses})" for name, statuses in failing.items()) or "-"
        lines.append(f"{op:<28} {variant:<20} {dtype:<5} {T:>5} {chunk or '-':>5}  {where:<22} {worst:>23.1e}  "
                     f"{which}")
    return "\n".join(lines)

"""The stability atlas: where does an op stay right, go wrong but finite, go non-finite, or raise?

A sweep of op x variant (fixed, each catalogued bug, an external library's op) x dtype x per-step decay magnitude
x sequence length (x chunk size) x combination (initial state passed or not, random final-state cotangent or none)
(x query scale: the queries multiplied by it, which moves GSA's slot-softmax logits far from zero) gives one tidy
record per setting: the non-finite census of the output, the final state(s) and every gradient, relative errors
against the float64 reference (scale-aware for gradients, and unfloored), the largest state magnitude and a status
(`STATUSES`). The combinations matter: a truncated-BPTT segment starts from no state yet sends a
gradient into its final state, and a gradient path that only that case takes is invisible to the other three.

Records are cached on disk, keyed by the setting, the op's source hash, the torch/triton versions and the device:
a widget redraws at once, an interrupted sweep resumes. `python -m fla_lab atlas ...` writes a PNG and a JSON.

One module per concern, each importing only those above it in this list:

    measurement  the grid's axes, a `Setting`, and its record against float64 (`measure`)
    cache        the disk cache of records (`Cache`, `source_hash`, `environment`)
    grid         the settings of a grid, their sweep, and the text table
    figures      heatmaps and error curves of records
    saved        a saved atlas written, read back, drawn a few lines at a time, and its widget explorer
"""
from fla_lab.tools.atlas.measurement import (COMBINATIONS, DECAYS, DTYPES, STATUSES, Setting, combination_name,
                                             combination_of, line_label, measure, parse_combination, scale_queries,
                                             worst_error)
from fla_lab.tools.atlas.cache import Cache, default_cache, environment, source_hash
from fla_lab.tools.atlas.grid import format_table, settings, sweep, table
from fla_lab.tools.atlas.figures import (STATUS_COLORS, TEXT_COLORS, plot_atlas, plot_error_vs_decay, plot_errors,
                                         plot_heatmap, short_error)
from fla_lab.tools.atlas.saved import GPU_RESULTS, NAMED_LINES, explorer, lines, load, plot_lines, plot_op, write

__all__ = ["COMBINATIONS", "Cache", "DECAYS", "DTYPES", "GPU_RESULTS", "NAMED_LINES", "STATUSES", "STATUS_COLORS",
           "Setting", "TEXT_COLORS", "combination_name", "combination_of", "default_cache", "environment", "explorer",
           "format_table", "line_label", "lines", "load", "measure", "parse_combination", "plot_atlas",
           "plot_error_vs_decay", "plot_errors", "plot_heatmap", "plot_lines", "plot_op", "scale_queries", "settings",
           "short_error", "source_hash", "sweep", "table", "worst_error", "write"]

"""Hunting NaNs: which module, which op, which Triton kernel, which (batch, head, step), forward or backward, and why.

    with fla_lab.tools.hunt.locate(model) as found:
        loss = model(x).float().pow(2).mean()
        loss.backward()
    print(found.report)

`locate` wraps every fla_lab op (the layers look theirs up at call time) and every module of `model`. It keeps a
copy of each op call's inputs, checks each output in the forward and each gradient in the backward, and stops
at the first non-finite value (or the first exception). On leaving the block it replays that one call with
`trace_kernels` (which watches every Triton launch and notes the first kernel to write a non-finite value into
one of its arguments) and against the float64 reference (is the exact answer representable? then the kernel is
at fault; if not, the input is), and classifies the cause (`CAUSES`). Without a non-finite value it still audits
precision: a decay that reached the op in 16 bits is #181's pattern.

Cost: a copy of every op input and one sync per op output and gradient while the block runs (a debugging tool:
off unless you enter it; `python -m benchmarks.hunt_cost` measures it), plus the replay on leaving.

One module per concern, each importing only those above it in this list:

    trace     the kernel tracer: the first launch that writes NaN/inf, forward or backward
    scores    the score-block census: which sub-chunk blocks of a score matrix hold the NaN
    causes    the cause classes, the fix lines and the `Diagnosis` of one call
    diagnose  one call replayed with its kernels traced and against float64, and its cause
    report    the recorded calls, the first event, the report and its catalogue suspects
    locator   `locate(model)`: the op and module wrappers and the hooks that stop at the first NaN
"""
from fla_lab.tools.hunt.trace import KernelTracer, Launch, autograd_phase, trace_kernels
from fla_lab.tools.hunt.scores import ScoreBlocks, score_blocks
from fla_lab.tools.hunt.causes import CAUSES, OVERFLOW_ADVICE, Diagnosis
from fla_lab.tools.hunt.diagnose import FP32_MAX, input_stats, reference_for_call, replay
from fla_lab.tools.hunt.report import Call, Event, Report, Suspects, spec_of
from fla_lab.tools.hunt.locator import GARBAGE, Locator, LocatorError, locate

# `fla_lab.tools.audit` replays recorded calls with these two helpers as `hunt._tensors` and `hunt._quiet`
from fla_lab.tools.hunt.diagnose import _quiet, _tensors  # noqa: F401

__all__ = ["CAUSES", "Call", "Diagnosis", "Event", "FP32_MAX", "GARBAGE", "KernelTracer", "Launch", "Locator",
           "LocatorError", "OVERFLOW_ADVICE", "Report", "ScoreBlocks", "Suspects", "autograd_phase", "input_stats",
           "locate", "reference_for_call", "replay", "score_blocks", "spec_of", "trace_kernels"]

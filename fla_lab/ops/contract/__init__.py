"""Input checks shared by every op: bad input gets an error that names the argument and says how to fix it.

One job per file:

- `metadata.py`: keywords, types, rank, device, dtypes, shapes, layout and packed offsets (`cu_seqlens`); they
  read no tensor data and always run;
- `values.py`: the value checks (non-finite values, a positive log-decay, an RWKV-7 transition that can grow the
  state), their single-pass flag, when it is read (`value_check_mode`: now, deferred or off) and the switches;
- `messages.py`: what the value checks say, and `transition_radius`, the number a `TransitionWarning` reports;
- `inputs.py`: the entry points the ops call, `check_gated_inputs`, `check_rwkv7_inputs`, `check_gsa_inputs`.

Every public name is re-exported here: `from fla_lab.ops import contract; contract.value_checks(False)`. Module
state (the pending checks, the setting) lives in `values.py`: patch it there, not here.
"""
from fla_lab.ops.common.value_flags import TRANSITION_TOL
from fla_lab.ops.contract.inputs import check_gated_inputs, check_gsa_inputs, check_rwkv7_inputs
from fla_lab.ops.contract.messages import TRANSITION_SAMPLES, TransitionWarning, transition_radius
from fla_lab.ops.contract.metadata import (SUPPORTED_DTYPES, LayoutWarning, check_cu_seqlens, check_dtypes,
                                           check_kernel_device, check_same_device, check_shape, reject_kwargs,
                                           warn_if_head_first)
from fla_lab.ops.contract.values import (MAX_PENDING, KernelChecks, flush_value_checks, set_value_checks,
                                         value_check_mode, value_checks, value_checks_enabled)

__all__ = ["check_gated_inputs", "check_rwkv7_inputs", "check_gsa_inputs",
           "SUPPORTED_DTYPES", "LayoutWarning", "reject_kwargs", "check_same_device", "check_kernel_device",
           "check_cu_seqlens",
           "check_dtypes", "check_shape", "warn_if_head_first",
           "set_value_checks", "value_checks", "value_check_mode", "value_checks_enabled", "flush_value_checks",
           "KernelChecks", "MAX_PENDING",
           "TransitionWarning", "transition_radius", "TRANSITION_SAMPLES", "TRANSITION_TOL"]

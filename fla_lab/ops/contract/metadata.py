"""Metadata checks: keywords, types, rank, device, dtypes, shapes and layout. They read no data and always run."""
from __future__ import annotations

import warnings

import torch

from fla_lab.ops.common.conventions import check_cu_seqlens  # noqa: F401 (re-exported by the contract)
from fla_lab.ops.common.conventions import describe_tensor as _describe

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class LayoutWarning(UserWarning):
    """Inputs look like [B, H, T, D] where [B, T, H, D] is expected. Silence with `warnings.simplefilter('ignore', LayoutWarning)`."""


def reject_kwargs(op: str, kwargs: dict) -> None:
    if not kwargs:
        return
    if "head_first" in kwargs:
        raise TypeError(
            f"{op}: `head_first` was removed upstream (flash-linear-attention #853) and fla_lab never had it. "
            "Pass tensors as [B, T, H, D]; from [B, H, T, D] use `x.transpose(1, 2)`.")
    raise TypeError(f"{op}: unexpected keyword argument(s) {sorted(kwargs)}")


def check_same_device(op: str, tensors: dict[str, torch.Tensor]) -> None:
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        raise ValueError(f"{op}: tensors are on different devices: {devices}. Move them with `.to(device)`.")


def check_kernel_device(op: str, tensors: dict[str, torch.Tensor]) -> None:
    """Compiled kernels read GPU memory: a CPU tensor would reach Triton as an opaque pointer error.

    Called at the kernel launch, after the contract checks, so those report their own (more specific) errors.
    """
    from fla_lab import runtime

    if runtime.device() == "cuda":
        on_cpu = [name for name, t in tensors.items() if t is not None and t.device.type != "cuda"]
        if on_cpu:
            raise ValueError(f"{op}: {on_cpu} are on the CPU, but here the Triton kernels run compiled on the GPU. "
                             "Move the inputs with `.to(fla_lab.device())` (or `.cuda()`).")


def check_dtypes(op: str, tensors: dict[str, torch.Tensor], same: tuple[str, ...]) -> None:
    for name, t in tensors.items():
        if t is not None and t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{op}: `{name}` is {t.dtype}; use float32, float16 or bfloat16 (`{name}.float()`).")
    dtypes = {name: tensors[name].dtype for name in same if tensors.get(name) is not None}
    if len(set(dtypes.values())) > 1:
        raise TypeError(f"{op}: {', '.join(dtypes)} must share a dtype, got {dtypes}. Cast them to one.")


def check_shape(op: str, name: str, x: torch.Tensor, expected: tuple, meaning: str) -> None:
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{op}: `{name}` should be {meaning} = {tuple(expected)}, got {_describe(x)}.")


def warn_if_head_first(op: str, name: str, x: torch.Tensor) -> None:
    B, T, H, D = x.shape
    if T < H:  # upstream's heuristic (#457): fewer steps than heads usually means [B, H, T, D]
        warnings.warn(
            f"{op}: `{name}` has T={T} < H={H}; inputs are [B, T, H, D], so this looks like [B, H, T, D]. "
            "If so, pass `x.transpose(1, 2)`. Silence: warnings.simplefilter('ignore', fla_lab.ops.LayoutWarning).",
            LayoutWarning, stacklevel=4)


def _check_metadata(op: str, tensors: dict, first: str, same_dtype: tuple[str, ...], kwargs) -> tuple:
    """Keywords, types, rank, device and dtypes: everything but the shapes; returns `first`'s [B, T, H, K]."""
    reject_kwargs(op, kwargs or {})
    for name, t in tensors.items():
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: `{name}` must be a torch.Tensor, got {type(t).__name__}")
    x = tensors[first]
    if x.dim() != 4:
        raise ValueError(f"{op}: `{first}` must be 4-D [B, T, H, K], got {_describe(x)}")
    check_same_device(op, tensors)
    check_dtypes(op, tensors, same=same_dtype)
    if x.shape[1] == 0:
        raise ValueError(f"{op}: the sequence is empty (T = 0)")
    return tuple(x.shape)


def _check_value_shape(op: str, nv: str, v: torch.Tensor, B: int, T: int, H: int) -> int:
    if v.dim() != 4 or tuple(v.shape[:3]) != (B, T, H):
        raise ValueError(f"{op}: `{nv}` should be [B, T, H, V] = ({B}, {T}, {H}, V), got {_describe(v)}")
    return v.shape[-1]

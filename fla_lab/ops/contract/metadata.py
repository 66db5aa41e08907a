"""Metadata checks: keywords, types, rank, device, dtypes, shapes and layout. They read no data and always run."""
from __future__ import annotations

import warnings

import torch

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


def _describe(x: torch.Tensor) -> str:
    return f"shape {tuple(x.shape)}, {x.dtype}, {x.device}"


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


def check_cu_seqlens(op: str, cu_seqlens, B: int, T: int, initial_state=None,
                     bounds: list | None = None) -> list[tuple[int, int]]:
    """A packed batch's offsets, as flash-linear-attention takes them: B = 1, `cu_seqlens` a 1-D integer tensor
    `[0, ..., T]`, non-decreasing (an empty sequence, as FLA allows, passes its initial state through), one initial
    state per sequence (`[N, H, K, V]`). Returns each sequence's `(bos, eos)`. Reads the offsets on the host: one
    sync on a GPU, unless `bounds` holds what an earlier read of the same tensor returned."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"{op}: `cu_seqlens` must be a 1-D integer torch.Tensor [0, ..., T], got "
                        f"{type(cu_seqlens).__name__}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 or cu_seqlens.dtype.is_floating_point \
            or cu_seqlens.dtype.is_complex or cu_seqlens.dtype == torch.bool:
        raise ValueError(f"{op}: `cu_seqlens` must be a 1-D integer tensor of N + 1 offsets [0, ..., T], got "
                         f"{_describe(cu_seqlens)}")
    if B != 1:
        raise ValueError(f"{op}: with `cu_seqlens` the sequences are packed along T, so B must be 1, got B = {B}. "
                         f"Pack them: x.reshape(1, B * T, H, D) with cu_seqlens = [0, T, 2T, ...]")
    offsets = [int(x) for x in cu_seqlens.tolist()] if bounds is None else [0, *(eos for _, eos in bounds)]
    if offsets[0] != 0 or offsets[-1] != T or T == 0:
        raise ValueError(f"{op}: `cu_seqlens` must start at 0 and end at T = {T} > 0, got {offsets[0]} ... "
                         f"{offsets[-1]}")
    for n, (bos, eos) in enumerate(zip(offsets[:-1], offsets[1:])):
        if eos < bos:
            raise ValueError(f"{op}: `cu_seqlens` must not decrease: sequence {n} runs from {bos} to {eos} (offsets "
                             "out of order)")
    N = len(offsets) - 1
    for h0 in (initial_state if isinstance(initial_state, (tuple, list)) else (initial_state,)):
        if h0 is not None and (not isinstance(h0, torch.Tensor) or h0.dim() < 1 or h0.shape[0] != N):
            raise ValueError(f"{op}: with `cu_seqlens` of {N} sequences, `initial_state` holds one state per "
                             f"sequence, [N = {N}, ...]; got "
                             f"{_describe(h0) if isinstance(h0, torch.Tensor) else type(h0).__name__}")
    return list(zip(offsets[:-1], offsets[1:]))

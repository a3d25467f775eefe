"""This process's device: the one resolver of device, scale and dtype names, and ``detect()``.

``resolve_device`` turns ``"auto"``/``"cpu"``/``"cuda:1"``/a ``torch.device`` into a ``torch.device`` (or its string
with :func:`device_string`); ``resolve_scale`` picks ``ci`` on a CPU and ``full`` on a GPU for ``"auto"``;
``torch_dtype`` maps memlab's dtype names to torch's. ``detect()`` describes the device with its sourced (GPU) or
measured (CPU) peaks. torch is imported lazily, so this module imports without it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from memlab.errors import MemlabError, SetupError, unknown_name
from memlab.predict.precision import DTYPE_BYTES

if TYPE_CHECKING:
    import torch

SCALES = ("auto", "ci", "full")
"""Chapter and benchmark scales: ``ci`` (small, seconds on a CPU), ``full`` (real size), ``auto`` (ci on CPU)."""

_TORCH_DTYPES = {
    "fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8": "float8_e4m3fn",
    "int8": "int8",
}
_DEVICE_FORMS = "'auto', 'cpu', 'cuda' or 'cuda:N' (or a CUDA index N)"


def resolve_device(device: int | str | torch.device | None = "auto") -> torch.device:
    """The one device resolver: a ``torch.device`` that exists in this process.

    ``None`` and ``"auto"`` give the current CUDA device when torch sees one, else the CPU. Names are read
    case-insensitively (``" CUDA:0 "`` is ``cuda:0``, ``cpu:0`` is ``cpu``); an int is a CUDA index. Only CPU and
    CUDA are measured by memlab: any other name, a CUDA device on a machine without one, or an index that does
    not exist raises :class:`SetupError` with the forms that work.
    """
    import torch

    if isinstance(device, bool):
        raise SetupError(f"device must be {_DEVICE_FORMS}, got {device!r}")
    if device is None or (isinstance(device, str) and device.strip().lower() == "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
    if isinstance(device, int):
        dev = torch.device("cuda", device) if device >= 0 else None
    elif isinstance(device, torch.device):
        dev = device
    elif isinstance(device, str):
        text = device.strip().lower()
        dev = torch.device(text) if re.fullmatch(r"cpu(:0)?|cuda(:\d+)?", text) else None
    else:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise SetupError(f"device must be {_DEVICE_FORMS}, got {device!r}")
    if dev.type == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SetupError(f"device {device!r} asked for CUDA but torch sees no CUDA GPU here: use 'cpu' or 'auto'")
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if not 0 <= index < count:
        raise SetupError(f"CUDA device {index} does not exist: this process sees {count} device(s)")
    return torch.device("cuda", index)


def device_string(device: int | str | torch.device | None = "auto") -> str:
    """:func:`resolve_device` as a string (``"cpu"``, ``"cuda:0"``), for JSON, papermill parameters and keys."""
    return str(resolve_device(device))


def resolve_scale(scale: str = "auto", device: int | str | torch.device | None = "auto") -> str:
    """``"ci"`` or ``"full"``: ``"auto"`` is ``full`` on CUDA and ``ci`` elsewhere; explicit scales are kept."""
    if not isinstance(scale, str) or scale.strip().lower() not in SCALES:
        raise SetupError(f"scale must be one of {', '.join(SCALES)}, got {scale!r}")
    scale = scale.strip().lower()
    if scale != "auto":
        return scale
    return "full" if resolve_device(device).type == "cuda" else "ci"


def torch_dtype(name: str) -> torch.dtype:
    """The torch storage dtype of a memlab dtype name (fp32, tf32, bf16, fp16, fp8, int8)."""
    import torch

    if name not in DTYPE_BYTES:
        raise unknown_name("dtype", name, list(DTYPE_BYTES))
    attr = _TORCH_DTYPES.get(name)
    dtype = getattr(torch, attr, None) if attr else None
    if dtype is None:
        raise MemlabError(f"dtype {name!r} has no dense torch tensor type in torch {torch.__version__}")
    return dtype

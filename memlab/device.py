"""The one resolver of device, scale and dtype names.

``resolve_device`` turns ``"auto"``/``"cpu"``/``"cuda:1"``/a CUDA index/a ``torch.device`` into a ``torch.device``
that exists in this process (or its string with :func:`device_string`); :func:`device_type` and
:func:`canonical_device` read a device's type and recorded name without asking this machine for it (a measurement
recorded on a GPU, read on a laptop). ``resolve_scale`` picks ``ci`` on a CPU and ``full`` on a GPU for ``"auto"``;
``torch_dtype`` maps memlab's dtype names to torch's. Every other module reads device arguments through these
functions. torch is imported lazily, so this module imports without it (the machine's description, ``detect()``,
lives in :mod:`memlab.measure.machine`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Literal, TypeAlias

from memlab.errors import MemlabError, SetupError, unknown_name
from memlab.predict.spec.precision import DTYPE_BYTES
from memlab.predict.spec.validate import canonical_choice

if TYPE_CHECKING:
    import torch

Device: TypeAlias = "int | str | torch.device | None"
"""What a ``device`` argument may be: ``"auto"`` or None, ``"cpu"``, ``"cuda"``/``"cuda:N"``, a CUDA index, a
``torch.device``."""

SCALES = ("auto", "ci", "full")
"""Chapter and benchmark scales: ``ci`` (small, seconds on a CPU), ``full`` (real size), ``auto`` (ci on CPU)."""

_TORCH_DTYPES = {
    "fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8": "float8_e4m3fn",
    "int8": "int8",
}
_DEVICE_FORMS = "'auto', 'cpu', 'cuda' or 'cuda:N' (or a CUDA index N)"


def _parse(device: Device) -> tuple[str, int | None]:
    """``device`` read without asking this machine: ``("auto", None)``, ``("cpu", None)`` or ``("cuda", index or
    None)``. Names are case-insensitive (``" CUDA:0 "``, ``cpu:0``); an int is a CUDA index. Anything else, and
    device types memlab does not measure (``meta``, ``mps``), raise :class:`SetupError` naming the forms."""
    if device is None:
        return "auto", None
    if isinstance(device, str):
        text = device.strip().lower()
        match = re.fullmatch(r"auto|cpu(?::0)?|cuda(?::(\d+))?", text)
        if match is not None:
            return text.partition(":")[0], int(match.group(1)) if match.group(1) is not None else None
    elif isinstance(device, int) and not isinstance(device, bool):
        if device >= 0:
            return "cuda", device
    else:
        import torch

        if isinstance(device, torch.device) and device.type in ("cpu", "cuda"):
            return device.type, device.index if device.type == "cuda" else None
    raise SetupError(f"device must be {_DEVICE_FORMS}, got {device!r}")


def resolve_device(device: Device = "auto") -> torch.device:
    """The one device resolver: a ``torch.device`` that exists in this process.

    ``None`` and ``"auto"`` give the current CUDA device when torch sees one, else the CPU; a bare ``"cuda"`` is the
    current CUDA device. Resolving never creates a CUDA context (before CUDA is initialised the current device is
    0). Names are read case-insensitively (``" CUDA:0 "`` is ``cuda:0``, ``cpu:0`` is ``cpu``); an int is a CUDA
    index. Only CPU and CUDA are measured by memlab: any other name, a CUDA device on a machine without one, or an
    index that does not exist raises :class:`SetupError` with the forms that work.
    """
    import torch

    kind, index = _parse(device)
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    elif kind == "cuda" and not torch.cuda.is_available():
        raise SetupError(f"device {device!r} asked for CUDA but torch sees no CUDA GPU here: use 'cpu' or 'auto'")
    if kind == "cpu":
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if index is None:
        index = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    if not 0 <= index < count:
        raise SetupError(f"CUDA device {index} does not exist: this process sees {count} device(s)")
    return torch.device("cuda", index)


def device_string(device: Device = "auto") -> str:
    """:func:`resolve_device` as a string (``"cpu"``, ``"cuda:0"``), for JSON, papermill parameters and keys."""
    return str(resolve_device(device))


def device_type(device: Device = "auto") -> Literal["cpu", "cuda"]:
    """``"cpu"`` or ``"cuda"``: the type of ``device``, for the calls that take a device type (autocast, the
    estimator's kernel choices). ``"auto"``/None is this machine's (CUDA when torch sees a GPU); an explicit name is
    read as written, without checking this machine has it, so a measurement recorded on a GPU reads as ``cuda``
    anywhere. A name :func:`resolve_device` would not accept raises :class:`SetupError`."""
    kind, _ = _parse(device)
    if kind == "auto":
        return "cuda" if resolve_device("auto").type == "cuda" else "cpu"
    return "cuda" if kind == "cuda" else "cpu"


def canonical_device(device: Device) -> str:
    """The recorded name of ``device``: ``"cpu"`` or ``"cuda:N"`` (a bare ``"cuda"`` is ``cuda:0``), read without
    checking this machine has it, so keys made on one machine match another's (``cpu:0`` == ``cpu``).
    ``"auto"``/None is :func:`device_string` of this machine."""
    kind, index = _parse(device)
    if kind == "auto":
        return device_string("auto")
    return "cpu" if kind == "cpu" else f"cuda:{index or 0}"


def resolve_scale(scale: str = "auto", device: Device = "auto") -> str:
    """``"ci"`` or ``"full"``: ``"auto"`` is ``full`` on CUDA and ``ci`` elsewhere; explicit scales are kept."""
    if not isinstance(scale, str) or scale.strip().lower() not in SCALES:
        raise SetupError(f"scale must be one of {', '.join(SCALES)}, got {scale!r}")
    scale = scale.strip().lower()
    if scale != "auto":
        return scale
    return "full" if resolve_device(device).type == "cuda" else "ci"


def torch_dtype(name: str) -> torch.dtype:
    """The torch storage dtype of a memlab dtype name (fp32, tf32, bf16, fp16, fp8, int8; any case)."""
    import torch

    name = canonical_choice(name, DTYPE_BYTES)
    if name not in DTYPE_BYTES:
        raise unknown_name("dtype", name, list(DTYPE_BYTES))
    attr = _TORCH_DTYPES.get(name)
    dtype = getattr(torch, attr, None) if attr else None
    if dtype is None:
        raise MemlabError(f"dtype {name!r} has no dense torch tensor type in torch {torch.__version__}")
    return dtype

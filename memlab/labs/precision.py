"""Why fp16 training needs a loss scale and bf16 does not, on real tensors (fp16 and bf16 work on a CPU).

- :func:`real_gradients`: the fp32 gradients of one step of the reference GPT, flattened.
- :func:`activation_gradients`: the gradients flowing between ops in backward (what AMP fp16 keeps in 16 bits);
  :func:`step_gradients` returns both kinds from one step.
- :func:`cast_survival`: multiply gradients by a scale, cast to a 16-bit dtype, and count what is lost: values
  that become 0 (below the smallest subnormal, 2^-24 ~ 6.0e-8 in fp16), that become subnormal (below 2^-14 ~
  6.1e-5: fewer significant bits) and that overflow to inf (above 65504). bf16 keeps fp32's 8 exponent bits, so
  its range is fp32's and nothing underflows that fp32 keeps ([micikevicius2018] Section 3.2 for fp16;
  [kalamkar2019] for bf16).
- :func:`scaler_trajectory`: ``torch.amp.GradScaler`` over a few real autocast-fp16 steps: the scale halves and
  the step is skipped on each overflow, and doubles after ``growth_interval`` clean steps.
- :func:`deprecated_amp_calls`: the ``torch.cuda.amp`` calls seed 004 writes, and the warnings torch prints.
- :func:`update_swamping`: why master weights exist (update precision, not range): small updates added to a
  16-bit weight are rounded away, an fp32 master copy keeps them.

Introduced for chapter 03 (mixed precision).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import torch

from memlab.device import resolve_device
from memlab.errors import SetupError
from memlab.model.gpt import GPT
from memlab.model.step import token_batch
from memlab.predict.spec.model import TransformerConfig

if TYPE_CHECKING:
    import pandas as pd

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def real_gradients(config: TransformerConfig, *, batch: int = 4, seq: int = 64, seed: int = 0,
                   device: torch.device | str = "cpu") -> torch.Tensor:
    """All parameter gradients of one fp32 forward + backward of the reference GPT, as one flat fp32 tensor."""
    return step_gradients(config, batch=batch, seq=seq, seed=seed, device=device)["parameters"]


def activation_gradients(config: TransformerConfig, *, batch: int = 4, seq: int = 64, seed: int = 0,
                         device: torch.device | str = "cpu") -> torch.Tensor:
    """The gradients flowing *between* ops in backward (w.r.t. every Attention, MLP and Block output of the
    reference GPT), from one fp32 forward + backward, as one flat fp32 tensor.

    Under AMP fp16 these are the tensors that are fp16 and can underflow (Micikevicius et al. 2018, Fig. 3, is a
    histogram of them [micikevicius2018]); the parameters' ``.grad`` stay fp32. Casting these values shows what an
    fp16 backward would flush, to first order (the fp16 backward's own rounding is not replayed).
    """
    return step_gradients(config, batch=batch, seq=seq, seed=seed, device=device)["activations"]


def step_gradients(config: TransformerConfig, *, batch: int = 4, seq: int = 64, seed: int = 0,
                   device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Both kinds of gradient of one fp32 forward + backward of the reference GPT, each one flat fp32 tensor:
    ``"parameters"`` (every ``.grad``) and ``"activations"`` (see :func:`activation_gradients`)."""
    from memlab.model.gpt import MLP, Attention, Block

    dev = resolve_device(device)
    torch.manual_seed(seed)
    model = GPT(config, device=dev).train()
    grads: list[torch.Tensor] = []

    def keep(_module: Any, _inputs: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda g: grads.append(g.detach().float().flatten()))

    handles = [m.register_forward_hook(keep) for m in model.modules() if isinstance(m, (Attention, MLP, Block))]
    try:
        idx, tgt = token_batch(config.vocab_size, batch, seq, dev, seed)
        model(idx, tgt).backward()
    finally:
        for h in handles:
            h.remove()
    if not grads:
        raise SetupError("no activation gradient was recorded: the model has no Attention, MLP or Block module")
    params = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return {"parameters": params, "activations": torch.cat(grads)}


def cast_survival(grads: torch.Tensor, scales: list[float], dtypes: tuple[str, ...] = ("fp16", "bf16")) -> pd.DataFrame:
    """For each scale and 16-bit dtype: fractions of the nonzero fp32 gradients that the cast flushes to zero,
    makes subnormal, or overflows to inf, and the fraction that survives as a normal number."""
    import pandas as pd

    if grads.dtype != torch.float32:
        raise SetupError(f"cast_survival expects fp32 gradients, got {grads.dtype}")
    g = grads[grads != 0]
    if g.numel() == 0:
        raise SetupError("cast_survival needs at least one nonzero gradient")
    rows: list[dict[str, Any]] = []
    for scale in scales:
        if not scale > 0:
            raise SetupError(f"scales must be positive numbers, got {scale!r}")
        scaled = g * float(scale)
        for name in dtypes:
            dt = _DTYPES[name]
            info = torch.finfo(dt)
            c = scaled.to(dt)
            zero = (c == 0).float().mean().item()
            inf = torch.isinf(c).float().mean().item()
            sub = ((c != 0) & (c.abs() < info.smallest_normal)).float().mean().item()
            rows.append({"scale": float(scale), "dtype": name, "flushed to zero": zero, "subnormal": sub,
                         "overflow to inf": inf, "normal": 1.0 - zero - inf - sub})
    return pd.DataFrame(rows)


def scaler_trajectory(config: TransformerConfig, *, steps: int = 8, init_scale: float = 2.0**24,
                      growth_interval: int = 3, batch: int = 4, seq: int = 64, seed: int = 0,
                      device: torch.device | str = "cpu") -> pd.DataFrame:
    """Run ``steps`` autocast-fp16 AdamW steps with ``torch.amp.GradScaler`` and record, per step, the scale used,
    whether the step was skipped (inf/NaN gradients found) and the scale after ``update()``."""
    import pandas as pd

    if not isinstance(steps, int) or steps < 1:
        raise SetupError(f"steps must be a positive integer, got {steps!r}")
    dev = resolve_device(device)
    torch.manual_seed(seed)
    model = GPT(config, device=dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(dev.type, init_scale=init_scale, growth_interval=growth_interval)
    idx, tgt = token_batch(config.vocab_size, batch, seq, dev, seed)
    rows = []
    for i in range(steps):
        with torch.autocast(dev.type, dtype=torch.float16):
            loss = model(idx, tgt)
        used = scaler.get_scale()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        after = scaler.get_scale()
        opt.zero_grad(set_to_none=True)
        rows.append({"step": i + 1, "scale used": used, "skipped": after < used, "scale after update": after,
                     "loss": float(loss.detach())})
    return pd.DataFrame(rows)


def deprecated_amp_calls() -> pd.DataFrame:
    """Call seed 004's ``torch.cuda.amp.autocast()`` and ``GradScaler()`` and record every warning torch prints,
    beside the ``torch.amp`` spelling that replaces each (torch 2.4 deprecated the ``torch.cuda.amp`` names)."""
    import pandas as pd

    rows = []
    calls = {
        "torch.cuda.amp.autocast()": ("torch.amp.autocast('cuda', dtype=torch.float16)",
                                     lambda: torch.cuda.amp.autocast()),
        "torch.cuda.amp.GradScaler()": ("torch.amp.GradScaler('cuda')", lambda: torch.cuda.amp.GradScaler()),
    }
    for call, (replacement, fn) in calls.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
        for w in caught:
            rows.append({"seed 004 writes": call, "warning": w.category.__name__, "message": str(w.message),
                         "torch.amp form": replacement})
    return pd.DataFrame(rows)


def update_swamping(*, weight: float = 1.0, update: float = 2.0**-10, steps: int = 1000,
                    dtypes: tuple[str, ...] = ("bf16", "fp16")) -> pd.DataFrame:
    """Why master weights exist: ``steps`` equal updates ``w += update`` kept in fp32 and in each 16-bit dtype.

    Each 16-bit weight is rounded to its format after every update (round to nearest even), so an update smaller
    than half a unit in the last place of ``weight`` is lost every time: the weight never moves. An fp32 master
    copy accumulates it. One row per step (``step``; one column per format, the weight after that step).
    """
    import pandas as pd

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise SetupError(f"steps must be a positive integer, got {steps!r}")
    for name, v in (("weight", weight), ("update", update)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or abs(v) == float("inf"):
            raise SetupError(f"{name} must be a finite number, got {v!r}")
    unknown = [d for d in dtypes if d not in _DTYPES]
    if unknown:
        raise SetupError(f"dtypes must be among {', '.join(_DTYPES)}, got {unknown}")
    formats = {"fp32 master": torch.float32, **{f"{d} weight": _DTYPES[d] for d in dtypes}}
    w = {k: torch.tensor(weight, dtype=t) for k, t in formats.items()}
    rows = []
    for step in range(1, steps + 1):
        for k, t in formats.items():
            w[k] = (w[k] + torch.tensor(update, dtype=t)).to(t)
        rows.append({"step": step, **{k: float(v) for k, v in w.items()}})
    return pd.DataFrame(rows)

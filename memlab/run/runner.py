"""Run the reference GPT under a :class:`~memlab.predict.spec.setup.Setup` and measure it: the twin of the estimator.

:func:`run_step` builds :class:`memlab.model.gpt.GPT` with the setup's attention and recompute policy, wires the
precision policy (:mod:`memlab.model.step`) and optimizer (:mod:`memlab.model.optimizers`), feeds synthetic
tokens and returns a :class:`Measurement`:

- exact bytes of parameters, gradients and optimizer state, and of activations saved for backward by category
  (:mod:`memlab.measure.accounting`: the measured truth on a CPU);
- the same bytes at every phase boundary of the first training step (built, forward, backward, optimizer step,
  zero_grad), which shows optimizer state appearing at the first step;
- on CUDA: the allocator's peaks over a steady-state step, and an NVML reading;
- step time (CUDA events on a GPU, ``perf_counter`` on a CPU), tokens/s, FLOPs (analytic, and counted by
  ``torch.utils.flop_counter.FlopCounterMode``), MFU and HFU, or "unknown peak" with the reason;
- a CUDA out-of-memory error is caught, parsed and returned as ``status="oom"``, with the allocator cleaned.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from memlab.device import resolve_device, torch_dtype
from memlab.errors import SetupError
from memlab.measure.accounting import SavedTensorRecorder, model_states
from memlab.measure.cuda import synchronize
from memlab.measure.live_bytes import PhasePeaks
from memlab.measure.timing import time_fn
from memlab.model.gpt import GPT
from memlab.model.kv_cache import DynamicKVCache, KVCache
from memlab.model.saved import saved_tensor_category
from memlab.model.step import (
    Meter,
    Meters,
    PhaseMeter,
    TrainingStep,
    build_training,
    check_single_process,
    model_dtype,
    token_batch,
    token_ids,
    train_step,
)
from memlab.predict.compute import flops as flops_mod
from memlab.predict.memory.phases import PhaseRow, find_phase
from memlab.predict.spec.model import TransformerConfig
from memlab.predict.spec.setup import Setup
from memlab.predict.spec.validate import LIMITS, check_int


@dataclass(frozen=True)
class Measurement:
    """What one run of the reference model measured. Bytes are per device; times in seconds."""

    model: str
    setup: dict[str, Any]
    device: str
    device_name: str
    status: str = "ok"
    """ok, oom, or error."""
    error: str | None = None
    params_bytes: int | None = None
    grads_bytes: int | None = None
    optimizer_bytes: int | None = None
    optimizer_by_key: dict[str, int] = field(default_factory=dict)
    activations_bytes: int | None = None
    activations_by_category: dict[str, int] = field(default_factory=dict)
    kv_cache_bytes: int | None = None
    phases: tuple[dict[str, Any], ...] = ()
    """Exact bytes at each phase boundary of the first step: phase, params, grads, optimizer, activations."""
    phase_peaks: tuple[PhaseRow, ...] = ()
    """Peak bytes *inside* each phase of the first and one steady step (:class:`~memlab.predict.memory.phases.PhaseRow`:
    step, phase, peak_bytes, end_bytes, source: live tensor bytes on a CPU, ``max_memory_allocated`` reset per phase
    on CUDA)."""
    peak_bytes: int | None = None
    """The largest phase peak (what the estimator's ``peak_bytes`` predicts)."""
    peak_phase: str | None = None
    timeline: tuple[dict[str, Any], ...] = ()
    """With ``timeline=True``: samples over the first step (t_s, phase, allocator/NVML bytes on CUDA, host RSS)."""
    cuda_peak_allocated_bytes: int | None = None
    cuda_peak_reserved_bytes: int | None = None
    cuda_first_step_peak_allocated_bytes: int | None = None
    cuda: dict[str, Any] | None = None
    nvml: dict[str, Any] | None = None
    host_rss_bytes: int | None = None
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    prefill_time_s: float | None = None
    decode_time_per_token_s: float | None = None
    flops_per_step: float | None = None
    """Analytic model FLOPs of one step, no recompute (memlab.predict.compute.flops): the MFU numerator's count."""
    hardware_flops_per_step: float | None = None
    """Analytic FLOPs including the setup's recompute (memlab.predict.compute.flops): the HFU numerator's count."""
    counted_flops_per_step: float | None = None
    """FLOPs FlopCounterMode counts over one step (training: forward + backward, with recompute as torch runs
    it: non-reentrant checkpoint stops recomputing once the tensors backward needs exist, and the flash
    kernels' backward recomputes QK^T, so this can differ from the analytic hardware count)."""
    mfu: float | None = None
    hfu: float | None = None
    mfu_reason: str | None = None
    peak_source: str | None = None
    loss: float | None = None
    oom: dict[str, Any] | None = None
    torch_version: str = torch.__version__

    def phase_peak(self, phase: str, step: str = "steady") -> PhaseRow:
        """The :attr:`phase_peaks` row of one phase of one step (``first`` or ``steady``;
        :func:`~memlab.predict.memory.phases.find_phase`)."""
        return find_phase(self.phase_peaks, phase, step)

    def model_state_bytes(self, *, step_counters: bool = True) -> int:
        """Measured parameters + gradients + optimizer state, bytes; ``step_counters=False`` leaves out the
        optimizer's ``step`` tensors, the twin of :meth:`memlab.predict.estimate.MemoryBreakdown.model_state_bytes`."""
        counters = 0 if step_counters else self.optimizer_by_key.get("step", 0)
        return (self.params_bytes or 0) + (self.grads_bytes or 0) + (self.optimizer_bytes or 0) - counters

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict of every field."""
        return asdict(self)

    def to_row(self) -> dict[str, Any]:
        """One flat row for a DataFrame: setup fields, scalars, and ``act_<category>_bytes`` columns."""
        row: dict[str, Any] = {"model": self.model, **self.setup}
        for k, v in asdict(self).items():
            if k in ("model", "setup", "phases", "phase_peaks", "timeline", "cuda", "nvml", "oom", "optimizer_by_key",
                     "activations_by_category"):
                continue
            row[k] = v
        for cat, n in self.activations_by_category.items():
            row[f"act_{cat}_bytes"] = n
        return row


def _flop_mapping() -> dict[Any, Any]:
    """FLOP formulas FlopCounterMode lacks in torch 2.13: the CPU flash-attention kernel (counts 0 otherwise)."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    aten = torch.ops.aten
    out: dict[Any, Any] = {}
    fwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    bwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if fwd is not None:
        out[fwd] = lambda q, k, v, *a, out_shape=None, **kw: sdpa_flop_count(q, k, v)
    if bwd is not None:
        out[bwd] = lambda g, q, k, v, *a, out_shape=None, **kw: sdpa_backward_flop_count(g, q, k, v)
    return out


def count_flops(fn: Callable[[], Any]) -> int:
    """FLOPs torch's FlopCounterMode counts while ``fn`` runs (with memlab's CPU flash-attention formula)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False, custom_mapping=_flop_mapping()) as counter:
        fn()
    return int(counter.get_total_flops())


def _states(model: torch.nn.Module, step: TrainingStep | None, device: torch.device) -> dict[str, int]:
    st = model_states(model, step.state_holder() if step else None, device=device)
    return {"params": st.params_bytes, "grads": st.grads_bytes, "optimizer": st.optimizer_bytes}


def _cuda_stats(device: torch.device) -> dict[str, Any] | None:
    if device.type != "cuda":
        return None
    from memlab.measure.cuda import cuda_memory_stats

    return cuda_memory_stats(device).to_dict()


def _nvml(device: torch.device) -> dict[str, Any] | None:
    if device.type != "cuda":
        return None
    from memlab.measure.nvml import nvml_index_for_cuda, nvml_reading

    return nvml_reading(nvml_index_for_cuda(device.index or 0)).to_dict()


def _mfu_fields(config: TransformerConfig, setup: Setup, device: torch.device, tokens_per_s: float) -> dict[str, Any]:
    from memlab.measure.machine import detect

    info = detect(device=device)
    dtype = setup.policy.compute_dtype if setup.mode == "train" else setup.inference_weights
    res = flops_mod.mfu(config, tokens_per_s, accelerator=info, dtype=dtype, seq=setup.seq, recompute=setup.recompute)
    return {"mfu": res.mfu, "hfu": res.hfu, "mfu_reason": res.reason, "peak_source": res.peak_source}


class _FirstStep(Meter):
    """The runner's first step: exact states after each phase, the forward's saved tensors (a
    :class:`~memlab.measure.accounting.SavedTensorRecorder` around it) and a timeline mark at each phase start.
    Outermost of the first step's meters, so its counts are read after the peak meter's phase has closed."""

    def __init__(self, model: torch.nn.Module, step: TrainingStep, device: torch.device,
                 mark: Callable[[str], None]) -> None:
        self.model, self.step, self.device, self.mark = model, step, device, mark
        self.recorder = SavedTensorRecorder(model, categorize=saved_tensor_category)
        self.rows = [{"phase": "built", **_states(model, step, device), "activations": 0}]
        self.saved: Any = None

    @contextlib.contextmanager
    def phase(self, step: Any, name: str) -> Iterator[None]:
        self.mark(name)
        # Autocast is exited inside the recorder, so its weight-cast cache is gone when the count is read.
        with self.recorder if name == "forward" else contextlib.nullcontext():
            yield
        if name == "forward":
            self.saved = self.recorder.result()
        activations = self.saved.total_bytes if name == "forward" else 0
        self.rows.append({"phase": name, **_states(self.model, self.step, self.device), "activations": activations})


class _Timed(Meter):
    """The timed steps: the gradients' bytes just before the optimizer step, and the loss (kept to the end of
    the step, as a loop that reads it keeps it)."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model, self.device = model, device
        self.grad_bytes: list[int] = []
        self.last_loss: torch.Tensor | None = None

    @contextlib.contextmanager
    def phase(self, step: Any, name: str) -> Iterator[None]:
        yield
        if name == "backward":
            self.grad_bytes.append(model_states(self.model, None, device=self.device).grads_bytes)

    def loss(self, step: Any, loss: torch.Tensor) -> None:
        self.last_loss = loss.detach()


def _train(config: TransformerConfig, setup: Setup, device: torch.device, *, steps: int, seed: int, lr: float,
           with_counted_flops: bool, with_mfu: bool, timeline: bool, with_phase_peaks: bool = True) -> dict[str, Any]:
    model, step = build_training(config, setup, device, seed=seed, lr=lr)
    idx, tgt = token_batch(config.vocab_size, setup.batch, setup.seq, device, seed)

    def loss_fn() -> torch.Tensor:
        return model(idx, tgt)

    out: dict[str, Any] = {}
    holder = step.state_holder()
    extra = holder.memlab_state_tensors() if hasattr(holder, "memlab_state_tensors") else {}
    peaks = PhasePeaks(device, track=[*model.parameters(), *model.buffers(), idx, tgt, *extra.values()]) \
        if with_phase_peaks else None
    peak_meter = PhaseMeter(peaks.phase) if peaks is not None else Meter()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sampler = _sampler(device) if timeline else None
    first = _FirstStep(model, step, device, sampler.mark if sampler is not None else (lambda phase: None))
    with sampler if sampler is not None else contextlib.nullcontext(), peaks or contextlib.nullcontext():
        train_step(step, loss_fn, meter=Meters(first, peak_meter), label="first")
        first.mark("done")
    rows = peaks.rows if peaks is not None else []
    first_peak = None
    if device.type == "cuda":  # the meter resets the allocator's peak per phase: the first step's is their max
        first_peak = max((r.peak_bytes for r in rows if r.step == "first"),
                         default=torch.cuda.max_memory_allocated(device))
    if peaks is not None:  # one steady step, phase by phase (optimizer state now exists)
        with peaks:
            train_step(step, loss_fn, meter=peak_meter, label="steady")
    if sampler is not None:
        out["timeline"] = tuple(sampler.frame().to_dict("records"))
    if rows:
        top = max((r for r in rows if r.phase != "zero_grad"), key=lambda r: r.peak_bytes)
        out.update(phase_peaks=tuple(rows), peak_bytes=top.peak_bytes, peak_phase=top.phase)
    saved = first.saved
    out.update(phases=tuple(first.rows), activations_bytes=saved.total_bytes,
               activations_by_category=saved.by_category(), cuda_first_step_peak_allocated_bytes=first_peak)

    losses: list[float] = []
    timed = _Timed(model, device)

    def one_step() -> None:
        train_step(step, loss_fn, meter=timed)
        assert timed.last_loss is not None
        losses.append(float(timed.last_loss))
        timed.last_loss = None

    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = time_fn(one_step, device=device, repeats=steps, warmup=0)
    # States as the steady state holds them: gradients just before the step, optimizer state after it.
    final = model_states(model, step.state_holder(), device=device)
    out.update(
        params_bytes=final.params_bytes, grads_bytes=max(timed.grad_bytes) + final.grads_bytes,
        optimizer_bytes=final.optimizer_bytes, optimizer_by_key=final.optimizer_by_key, loss=losses[-1],
        step_time_s=statistics.median(times), cuda=_cuda_stats(device), nvml=_nvml(device),
    )
    if device.type == "cuda":
        out["cuda_peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        out["cuda_peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    out["tokens_per_s"] = setup.tokens / out["step_time_s"]
    out["flops_per_step"] = float(flops_mod.megatron_iteration_flops(config, setup.batch, setup.seq, "none"))
    out["hardware_flops_per_step"] = float(
        flops_mod.megatron_iteration_flops(config, setup.batch, setup.seq, setup.recompute,
                                           recompute_every=setup.recompute_every)
    )
    if with_counted_flops:  # forward + backward (+ zero_grad), no update
        out["counted_flops_per_step"] = count_flops(lambda: train_step(step, loss_fn, optimizer_step=False))
    if with_mfu:
        out.update(_mfu_fields(config, setup, device, out["tokens_per_s"]))
    return out


def _sampler(device: torch.device) -> Any:
    """A TimelineSampler for the first step: allocator and NVML on CUDA, host RSS everywhere."""
    from memlab.measure.timeline import TimelineSampler

    return TimelineSampler(interval_s=0.002, device=device if device.type == "cuda" else None)


def _infer(config: TransformerConfig, setup: Setup, device: torch.device, *, steps: int, seed: int,
           with_counted_flops: bool, with_mfu: bool) -> dict[str, Any]:
    if setup.inference_weights not in ("fp32", "bf16", "fp16"):
        raise SetupError(
            f"the reference runner serves fp32/bf16/fp16 weights; {setup.inference_weights} weights are "
            "estimated (memlab estimate) but not run here"
        )
    if setup.kv_cache_dtype != setup.inference_weights:
        raise SetupError("the reference runner keeps the KV cache in the weight dtype: set kv_cache_dtype to match")
    dtype = torch_dtype(setup.inference_weights)
    torch.manual_seed(seed)
    model = GPT(config, attention=setup.attention, device=device, dtype=dtype).eval()
    prompt = setup.seq - steps  # run_step checked steps <= seq - 1: at least one prompt token
    data = token_ids(config.vocab_size, setup.batch, setup.seq + 1, device, seed)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with torch.no_grad():
        # the setup's cache (generate()'s dynamic one by default, or preallocated) and kept logits (generate(): 1)
        cache = KVCache(config, setup.batch, setup.seq, device=device, dtype=dtype) if setup.kv_cache == "static" \
            else DynamicKVCache(config, setup.batch, device=device, dtype=dtype)
        keep = setup.logits_to_keep
        prefill = time_fn(lambda: model(data[:, :prompt], cache=cache, logits_to_keep=keep), device=device,
                          repeats=1, warmup=0)[0]
        decode = [time_fn(lambda i=i: model(data[:, i : i + 1], cache=cache, logits_to_keep=keep), device=device,
                          repeats=1, warmup=0)[0] for i in range(prompt, setup.seq)]
        counted = None
        if with_counted_flops:
            counted = count_flops(lambda: model(data[:, :prompt], cache=KVCache(config, setup.batch, prompt,
                                                                               device=device, dtype=dtype)))
    per_token = statistics.median(decode) if decode else None
    out: dict[str, Any] = {
        "params_bytes": model_states(model, device=device).params_bytes, "grads_bytes": 0, "optimizer_bytes": 0,
        "kv_cache_bytes": cache.nbytes(), "prefill_time_s": prefill, "decode_time_per_token_s": per_token,
        "tokens_per_s": setup.batch / per_token if per_token else None, "counted_flops_per_step": counted,
        "flops_per_step": float(flops_mod.forward_flops(config, setup.batch, prompt)),
        "cuda": _cuda_stats(device), "nvml": _nvml(device),
    }
    if device.type == "cuda":
        out["cuda_peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        out["cuda_peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    if with_mfu and per_token:
        out.update(_mfu_fields(config, setup, device, out["tokens_per_s"]))
    return out


def run_step(
    config: TransformerConfig,
    setup: Setup,
    device: str | torch.device = "auto",
    *,
    steps: int = 2,
    seed: int = 0,
    lr: float = 1e-4,
    with_counted_flops: bool = True,
    with_mfu: bool = True,
    timeline: bool = False,
    with_phase_peaks: bool = True,
) -> Measurement:
    """Run and measure ``config`` under ``setup`` on ``device``.

    Training: one instrumented first step (exact states at each phase, saved activations), then ``steps`` timed
    steady-state steps (median time; CUDA peaks over them), then one forward+backward under FlopCounterMode when
    ``with_counted_flops``; ``with_mfu`` adds MFU and HFU against the detected peak. Inference: a prefill of
    ``seq - steps`` tokens into a preallocated KV cache and ``steps`` one-token decodes (``steps`` <= ``seq - 1``,
    else a :class:`SetupError`: no prefill is no inference). ``timeline`` samples
    memory over the first training step with :class:`memlab.measure.timeline.TimelineSampler` (the allocator on
    CUDA; on a CPU only the process RSS, which is coarse: the exact per-phase bytes are in ``phases`` either way).
    Every step is :func:`memlab.model.step.train_step` of :func:`memlab.model.step.build_training`'s step, so
    every field of ``setup`` that changes a step is honoured (``zero_grad_to_none=False``: every ``zero_grad``
    zero-fills the gradients, which then persist into the next forward). ``phase_peaks`` holds the peak
    inside each phase of the first and one steady step (:class:`memlab.measure.live_bytes.PhasePeaks`;
    ``with_phase_peaks=False`` skips it, and the extra step, for speed). Bad setups raise
    :class:`memlab.errors.SetupError`; an out-of-memory error is returned as a Measurement with ``status="oom"``
    and the parsed message.
    """
    from memlab.measure.host import host_reading
    from memlab.measure.oom import clean_allocator, is_oom_error, parse_oom_message

    check_int("steps", steps, hi=LIMITS["steps"].max, why=LIMITS["steps"].why, err=SetupError)
    if not isinstance(config, TransformerConfig) or not isinstance(setup, Setup):
        raise SetupError(f"run_step needs a TransformerConfig and a Setup, got {type(config).__name__} and "
                         f"{type(setup).__name__}")
    if setup.mode == "inference" and steps > setup.seq - 1:
        # seq tokens = a prompt of seq - steps (prefilled) + steps decoded: both must be at least one token
        raise SetupError(f"inference decodes steps={steps} tokens after a prefill of seq - steps tokens, so seq must "
                         f"be at least steps + 1, got seq={setup.seq}: raise seq or lower steps (the prefill would "
                         f"be {setup.seq - steps} tokens)")
    check_single_process(setup)
    dev = resolve_device(device)
    if setup.attention != "eager":
        from memlab.model.gpt import available_attention

        dtype = model_dtype(setup.policy) if setup.mode == "train" else torch_dtype(setup.inference_weights)
        works = available_attention(dev, torch.bfloat16 if setup.policy.autocast else dtype)
        if setup.attention not in works:
            raise SetupError(f"attention {setup.attention!r} does not run on {dev.type} with this torch build; "
                             f"available here: {', '.join(works)}")
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    base = {"model": config.name, "setup": setup.to_dict(), "device": str(dev), "device_name": name}
    try:
        if setup.mode == "train":
            fields = _train(config, setup, dev, steps=steps, seed=seed, lr=lr, with_counted_flops=with_counted_flops,
                            with_mfu=with_mfu, timeline=timeline, with_phase_peaks=with_phase_peaks)
        else:
            fields = _infer(config, setup, dev, steps=steps, seed=seed, with_counted_flops=with_counted_flops,
                            with_mfu=with_mfu)
    except (torch.OutOfMemoryError, RuntimeError) as exc:
        if not is_oom_error(exc):
            raise
        info = parse_oom_message(str(exc))
        fields = None
    if fields is None:
        # Cleaned after the except block: the exception's frames (the failed attempt's model) are gone by now.
        clean_allocator(dev if dev.type == "cuda" else None)
        return Measurement(**base, status="oom", error=info.raw.splitlines()[0] if info.raw else "out of memory",
                           oom=info.to_dict())
    fields["host_rss_bytes"] = host_reading().rss_bytes
    return Measurement(**base, **fields)

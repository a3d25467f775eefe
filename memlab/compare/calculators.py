"""The calculator shoot-out: every public memory estimator asked about the same runs, next to what was measured.

One function per estimator takes a :class:`Run` (an HF config, batch, seq, dtype, attention) and returns a
:class:`CalculatorResult` with its prediction per component: model ``states`` (parameters + gradients + optimizer),
``activations`` (saved for backward) and their sum. Where an estimator has code, its own code is called; where it
is a formula, the formula is written here from its source:

- ``accelerate``: ``accelerate estimate-memory``'s own functions (``accelerate.commands.estimate``:
  ``calculate_maximum_sizes`` on an empty model, ``estimate_training_usage``; the command reports the largest of
  its terms as "Training using Adam") ``[accelerate-estimate]``;
- ``deepspeed-zero2`` / ``deepspeed-zero3``: ``estimate_zero2_model_states_mem_needs`` and
  ``estimate_zero3_model_states_mem_needs`` (one GPU, no offload; ZeRO-3's largest layer found as DeepSpeed's
  ``model_to_params`` does) ``[deepspeed-zero]``;
- ``gpu_poor``: ``src/App.js`` of RahulSChand/gpu_poor (its own parameter formula, 2-byte floats, Adam as
  3 x the model, ``getActivationMemory``; its fixed 650 MB "cuda + other overhead" is left out) ``[gpu-poor]``;
- ``transformer-math-101``: EleutherAI's Transformer Math 101 (model 4 or 2 B/param, AdamW 12 B/param, gradients
  4 or 2 B/param; activations ``sbhL(10 + 24/t + 5as/(ht))``) ``[anthony2023]``;
- ``ultrascale-playbook``: the Ultra-Scale Playbook's memory formulas (16 N bytes for full or mixed precision with
  Adam; activations ``L s b h (34 + 5 a s / h)``) ``[tazi2025]``;
- ``memlab``: :func:`memlab.predict.hf.from_hf` and the term-by-term activation model;
- ``memlab-trace``: :func:`memlab.tracing.hf.trace_hf`, the real Hugging Face model's step traced on fake tensors
  (MemTracker counts every storage; nothing is allocated, so full-size configs run on a laptop's CPU)
  ``[pytorch-memtracker]``.

Formulas given a parameter count get the model's exact one (their own count formulas assume the GPT-2 layout), so
the comparison is of bytes per parameter and per token, not of parameter counting. An estimator whose package cannot
be imported on this machine returns ``available=False`` with the reason; its rows are skipped, never imitated. A
fine-tuning run (``Run.finetune`` ``lora`` or ``qlora``) is scored only on what each tool claims for it: gpu_poor's
LoRA and QLoRA modes; accelerate's loaded-model term for LoRA (it has no LoRA mode, and the frozen base is what it
loads); the tools that model full training only give no number. Several tools assume mixed precision (fp32 master
weights and Adam states) for a 16-bit run: on a pure bf16 run (bf16 weights, gradients and Adam states, as
``model.to(torch.bfloat16)`` trains) they over-predict states.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from memlab.compare.ledger import rel_error
from memlab.errors import MemlabError
from memlab.predict.activations import activation_bytes, korthikanti_layer_bytes
from memlab.predict.estimate import estimate
from memlab.predict.hf import from_hf, hf_attention
from memlab.predict.models import TransformerConfig
from memlab.predict.setup import Setup

if TYPE_CHECKING:
    import pandas as pd

    from memlab.tracing.tracer import Trace

COMPONENTS = ("states", "activations", "states + activations")


@dataclass(frozen=True)
class Run:
    """One training step every calculator is asked about: an HF config (dict with ``model_type``) and the shape."""

    hf: dict[str, Any] = field(hash=False)
    batch: int
    seq: int
    dtype: str = "fp32"
    attn_implementation: str = "eager"
    device_type: str = "cpu"
    name: str = ""
    finetune: str = "full"
    """``full``, ``lora`` or ``qlora`` (:attr:`memlab.predict.setup.Setup.finetune`), with the LoRA fields below."""
    lora_rank: int = 0
    lora_targets: str = ""

    @property
    def label(self) -> str:
        ft = "" if self.finetune == "full" else f" {self.finetune} r{self.setup().lora_r}"
        return (f"{self.name or self.hf.get('model_type')} {self.attn_implementation} {self.dtype} "
                f"b{self.batch}x{self.seq}{ft}")

    def setup(self) -> Setup:
        """memlab's Setup for the run (pure 16-bit for bf16: weights, gradients and Adam states in bf16)."""
        cfg = from_hf(self.hf)
        p = cfg.impl.attention_dropout_or(cfg.dropout)
        return Setup(batch=self.batch, seq=self.seq, precision=self.dtype, optimizer="adamw",
                     attention=hf_attention(self.attn_implementation, self.device_type, self.dtype, p),
                     finetune=self.finetune, lora_rank=self.lora_rank, lora_targets=self.lora_targets)


@dataclass(frozen=True)
class CalculatorResult:
    """A calculator's prediction for one run, in bytes (None: the tool does not model that component)."""

    tool: str
    states: float | None
    activations: float | None
    available: bool = True
    note: str = ""

    @property
    def total(self) -> float | None:
        """states + activations (states alone when the tool has no activation model; None if no states)."""
        if self.states is None:
            return None
        return self.states + (self.activations or 0)

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "total": self.total}


def _unavailable(tool: str, reason: str) -> CalculatorResult:
    return CalculatorResult(tool, None, None, available=False, note=reason)


def _params(run: Run) -> int:
    return from_hf(run.hf).param_count()


def _bytes16(run: Run) -> int:
    return 4 if run.dtype == "fp32" else 2


@functools.lru_cache(maxsize=64)
def _empty_model_sizes(hf_items: tuple, base: bool) -> tuple[int, int, int]:
    """(accelerate total_size, DeepSpeed total_params, DeepSpeed largest_layer_params) of an empty fp32 model:
    ``AutoModel`` (the base model, no LM head) when ``base``, as ``accelerate estimate-memory`` builds it
    (``create_empty_model``), else ``AutoModelForCausalLM``, the model one trains and hands DeepSpeed."""
    import torch
    from accelerate import init_empty_weights
    from accelerate.utils import calculate_maximum_sizes
    from transformers import AutoModel, AutoModelForCausalLM

    from memlab.model.hf import hf_config

    with init_empty_weights():
        model = (AutoModel if base else AutoModelForCausalLM).from_config(hf_config(dict(hf_items)),
                                                                          dtype=torch.float32)
    total_size, _ = calculate_maximum_sizes(model)
    total_params = sum({id(p): p.numel() for p in model.parameters()}.values())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return int(total_size), int(total_params), int(largest)


def _hf_key(run: Run) -> tuple:
    return tuple(sorted((k, v) for k, v in run.hf.items() if not isinstance(v, dict | list)))


def accelerate_estimate(run: Run) -> CalculatorResult:
    """``accelerate estimate-memory``: its "Training using Adam" figure, the largest of the terms of
    ``estimate_training_usage(total_size, dtype)`` for the empty ``AutoModel``'s ``total_size`` (fp32 bytes,
    buffers included, no LM head: the command builds the base model). No activations. ``[accelerate-estimate]``"""
    try:
        from accelerate.commands.estimate import estimate_training_usage
    except ImportError as exc:  # pragma: no cover - accelerate is a course dependency
        return _unavailable("accelerate", f"accelerate cannot be imported here: {exc}")
    total_size, _, _ = _empty_model_sizes(_hf_key(run), True)
    usage = estimate_training_usage(total_size, "float32" if run.dtype == "fp32" else "bfloat16")
    if run.finetune == "lora":  # no LoRA mode: the frozen base it loads is what it claims for a fine-tune
        return CalculatorResult("accelerate", float(usage["model"]), None,
                                note="no LoRA mode: its 'model' term (the base weights it loads) scored as the "
                                     "states; adapters, their gradients and states not modelled; no activations")
    if run.finetune != "full":
        return CalculatorResult("accelerate", None, None, note=f"no {run.finetune} mode (no 4-bit weights)")
    return CalculatorResult("accelerate", float(max(usage.values())), None,
                            note="largest of estimate_training_usage's terms; no activation model")


def _quiet_deepspeed_accelerator() -> None:
    """Without CUDA, DeepSpeed's import logs a WARNING ("Setting accelerator to CPU ...") into the page; naming the
    CPU accelerator (``DS_ACCELERATOR``, deepspeed/accelerator/real_accelerator.py) selects it without the warning.
    Set only when unset and only on a machine without CUDA, so a user's choice and a GPU run are left alone."""
    import os

    import torch

    if "DS_ACCELERATOR" not in os.environ and not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"


def _deepspeed(stage: int, run: Run) -> CalculatorResult:
    tool = f"deepspeed-zero{stage}"
    if run.finetune != "full":
        return CalculatorResult(tool, None, None, note="full training only (every parameter has states)")
    try:
        _quiet_deepspeed_accelerator()
        if stage == 2:
            from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs as est
        else:
            from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs as est
    except Exception as exc:  # DeepSpeed can fail at import for many machine reasons (no compiler, no CUDA)
        return _unavailable(tool, f"DeepSpeed cannot be imported here ({type(exc).__name__}: {exc})")
    # total_params as DeepSpeed's model_to_params counts a live model (tied weights once, by data_ptr): the exact
    # count; an empty model's tied weights are separate meta tensors, so only the largest layer is taken from it.
    _, _, largest = _empty_model_sizes(_hf_key(run), False)
    total = _params(run)
    if stage == 2:
        _, gpu = est(total, num_gpus_per_node=1, num_nodes=1, cpu_offload=False)
    else:
        _, gpu, _ = est(total, largest, num_gpus_per_node=1, num_nodes=1, cpu_offload=False,
                        cpu_offload_params=False)
    return CalculatorResult(tool, float(gpu), None, note="GPU bytes, one GPU, no offload; no activation model")


def deepspeed_zero2(run: Run) -> CalculatorResult:
    """DeepSpeed's ``estimate_zero2_model_states_mem_needs`` (2 + 18 B/param on one GPU). ``[deepspeed-zero]``"""
    return _deepspeed(2, run)


def deepspeed_zero3(run: Run) -> CalculatorResult:
    """DeepSpeed's ``estimate_zero3_model_states_mem_needs`` (4 x largest layer + 18 B/param). ``[deepspeed-zero]``"""
    return _deepspeed(3, run)


def _gpu_poor_config(hf: dict[str, Any]) -> dict[str, int]:
    """gpu_poor's ``getParseConfig``: the first key present, else its default."""

    def key(names: Iterable[str], default: int) -> int:
        return next((hf[n] for n in names if hf.get(n) is not None), default)

    h = key(["hidden_size", "d_model", "n_embd"], 768)
    heads = key(["num_attention_heads", "num_heads", "n_head"], 12)
    return {"vocab": key(["vocab_size"], 32000), "h": h, "heads": heads,
            "inter": key(["intermediate_size", "n_inner", "d_ff"], 4 * h),
            "layers": key(["num_layers", "num_hidden_layers", "n_layer"], 12)}


GPU_POOR_APP = "src/App.js @ ad2fc0e (2024-12-03)"
"""The gpu_poor source the formulas below are read from (RahulSChand/gpu_poor)."""


def _gpu_poor_qlora_extra(c: dict[str, int], seq: int) -> float:
    """gpu_poor's ``getExtraMemory(config, "qlora", contextLen)`` (App.js lines 340-383): 0.75 x (15 h + 6 i) L
    x 50 x sqrt(max(1, seq / 50)) bytes per sequence, an empirical 4-bit dequantisation allowance."""
    common = (10 * c["h"] + 5 * c["h"] + 4 * c["inter"] + 2 * c["inter"]) * c["layers"]
    return 0.75 * common * 50 * (seq / 50) ** 0.5 if seq > 50 else 0.75 * common * 50


def gpu_poor(run: Run) -> CalculatorResult:
    """gpu_poor's training estimate (``src/App.js``: ``computeModelSize``, ``getGradOptMemory`` with Adam and no
    quantisation, ``getActivationMemory``; ``convertToBytes`` is 2 for every float type). ``[gpu-poor]``

    Its LoRA mode (``lora_trn``, App.js lines 297-301): 16-bit weights plus ``L * 8 * h * 2 * 4 * 3 * 2`` bytes of
    adapter gradients and Adam states, whatever the rank or target modules; QLoRA (``qlora``, lines 239-245 and
    ``convertToMBModelSize``, lines 770-790): weights ``2N/4 - 2N/64 + 0.06 x 2N`` bytes, states ``L * 8 * h * 0.5 *
    4 * 3`` plus :func:`_gpu_poor_qlora_extra` per sequence. Activations are its full-training ones in every mode
    (its LoRA activation term is commented out, lines 454-457)."""
    c = _gpu_poor_config(run.hf)
    h, inter, heads, L, n = c["h"], c["inter"], c["heads"], c["layers"], run.seq
    params = c["vocab"] * h * 2 + L * 4 * h * h + L * 3 * inter * h
    fb = 2.0
    if run.finetune == "lora":
        states = params * fb + L * 8 * h * 2 * 4 * 3 * 2
    elif run.finetune == "qlora":
        states = params * fb / 4 - params * fb / 64 + 0.06 * params * fb \
            + L * 8 * h * 0.5 * 4 * 3 + _gpu_poor_qlora_extra(c, n) * run.batch
    else:
        states = params * fb + params * 3 * fb
    attn = (n * h * 3 * fb + n * h * 2 * fb + n * n * heads * fb + n * n * heads * 4 + n * n * heads * fb
            + 3 * n * h * fb)
    ffn = 2 * h * n * fb + fb * 5 * n * inter + inter * n * fb
    norm = n * 4 * 2 + n * h * fb * 6
    acts = (attn + ffn + norm) * L * run.batch
    return CalculatorResult("gpu_poor", states, acts, note="its own parameter formula; 650 MB overhead left out")


def _korthikanti_model_bytes(run: Run, cfg: TransformerConfig) -> float:
    """L layers of Korthikanti's ``sbh(34 + 5as/h)`` (no recompute, t = 1). The formula is linear in b, so the L
    layers of batch b are passed as one layer of batch b*L: the integer product s*b*L*h comes first, as both
    sources write it, and the float result is the same to the last bit."""
    return korthikanti_layer_bytes(run.seq, run.batch * cfg.n_layers, cfg.d_model, cfg.n_heads)


def transformer_math_101(run: Run) -> CalculatorResult:
    """EleutherAI's Transformer Math 101: model 4 (fp32) or 2 (16-bit) B/param, AdamW 12 B/param, gradients 4 or 2
    B/param; activations without recomputation ``s b h L (10 + 24/t + 5 a s / (h t))`` with t = 1, i.e. L x
    Korthikanti's layer (:func:`memlab.predict.activations.korthikanti_layer_bytes`). ``[anthony2023]``"""
    if run.finetune != "full":
        return CalculatorResult("transformer-math-101", None, None, note="full training only")
    n, cfg = _params(run), from_hf(run.hf)
    b16 = _bytes16(run)
    states = n * (b16 + 12 + b16)
    acts = _korthikanti_model_bytes(run, cfg)
    return CalculatorResult("transformer-math-101", float(states), float(acts))


def ultrascale_playbook(run: Run) -> CalculatorResult:
    """The Ultra-Scale Playbook: with Adam, 4N + 4N + 8N (full precision) or 2N + 2N + 4N + 8N (mixed precision)
    = 16 N bytes; activations ``L s b h (34 + 5 a s / h)``, L x Korthikanti's layer
    (:func:`memlab.predict.activations.korthikanti_layer_bytes`). ``[tazi2025]``"""
    if run.finetune != "full":
        return CalculatorResult("ultrascale-playbook", None, None, note="full training only")
    n, cfg = _params(run), from_hf(run.hf)
    acts = _korthikanti_model_bytes(run, cfg)
    return CalculatorResult("ultrascale-playbook", float(16 * n), float(acts))


def memlab_formula(run: Run) -> CalculatorResult:
    """memlab: :func:`~memlab.predict.hf.from_hf` traits, term-by-term activations, the estimator's model states."""
    cfg, setup = from_hf(run.hf), run.setup()
    comp = estimate(cfg, setup, device_type=run.device_type).components()
    acts = sum(activation_bytes(cfg, setup, device_type=run.device_type).values())
    return CalculatorResult("memlab", float(comp["params"] + comp["grads"] + comp["optimizer"]), float(acts))


@functools.lru_cache(maxsize=32)
def _trace(hf_items: tuple, batch: int, seq: int, dtype: str, attn: str, device_type: str,
           lora: tuple = ("full", 0, "")) -> Trace:
    from memlab.model.hf import hf_config
    from memlab.tracing.hf import trace_hf

    run = Run(dict(hf_items), batch, seq, dtype, attn, device_type, finetune=lora[0], lora_rank=lora[1],
              lora_targets=lora[2])
    return trace_hf(hf_config(run.hf), run.setup(), device_type=device_type, name=run.hf.get("model_type"))


def trace_run(run: Run) -> Trace:
    """The fake-tensor trace of ``run`` (:func:`memlab.tracing.hf.trace_hf` of its config under ``run.setup()``,
    on CPU, at any size; cached per run). ``[pytorch-memtracker]``"""
    return _trace(_hf_key(run), run.batch, run.seq, run.dtype, run.attn_implementation, run.device_type,
                  (run.finetune, run.lora_rank, run.lora_targets))


def trace_components(trace: Trace) -> dict[str, int]:
    """A trace's bytes as the shoot-out counts them (:meth:`memlab.tracing.tracer.Trace.components`): ``states`` =
    parameters + gradients + optimizer states (buffers left out, as the measurement leaves them); ``activations``
    = what the steady forward leaves alive (the measurement's saved-for-backward count has the input ids but not
    the labels nor the scalar loss: a few bytes per token less)."""
    c = trace.components()
    return {"states": c["params"] + c["grads"] + c["optimizer"], "activations": c["activations"]}


def memlab_trace(run: Run) -> CalculatorResult:
    """memlab's fake-tensor trace of the real Hugging Face model (:func:`trace_run`): model states and the bytes the
    forward leaves for backward (:func:`trace_components`), with the peak inside the step in the note. Unavailable,
    with the reason, when transformers cannot be imported or the setup cannot be traced on CPU.
    ``[pytorch-memtracker]``"""
    try:
        import transformers  # noqa: F401
    except ImportError as exc:  # pragma: no cover - a course dependency
        return _unavailable("memlab-trace", f"transformers cannot be imported here: {exc}")
    try:
        t = trace_run(run)
    except MemlabError as exc:  # e.g. the CPU flash kernel has no dropout: the trace cannot run this setup here
        return _unavailable("memlab-trace", str(exc))
    c = trace_components(t)
    return CalculatorResult("memlab-trace", float(c["states"]), float(c["activations"]),
                            note=f"fake tensors, CPU; peak {t.peak_bytes:,} B in the {t.peak_step} {t.peak_phase}")


CALCULATORS: dict[str, Callable[[Run], CalculatorResult]] = {
    "memlab": memlab_formula,
    "memlab-trace": memlab_trace,
    "accelerate": accelerate_estimate,
    "deepspeed-zero2": deepspeed_zero2,
    "deepspeed-zero3": deepspeed_zero3,
    "gpu_poor": gpu_poor,
    "transformer-math-101": transformer_math_101,
    "ultrascale-playbook": ultrascale_playbook,
}
"""Every calculator, by name, in table order."""


def shoot_out(runs: Iterable[tuple[Run, dict[str, int]]], tools: Iterable[str] | None = None) -> pd.DataFrame:
    """Long table: one row per (tool, run, component) with predicted, measured and relative error.

    ``runs`` pairs each :class:`Run` with its measurement ``{"states": ..., "activations": ...}`` (bytes), data
    from wherever it was measured (:func:`memlab.run.hf.measure_run` runs it on this machine).
    Unavailable tools and components a tool does not model give rows with ``predicted`` NaN and the reason.
    """
    import pandas as pd

    rows = []
    for run, measured in runs:
        meas = {**measured, "states + activations": measured["states"] + measured["activations"]}
        for name in tools or CALCULATORS:
            r = CALCULATORS[name](run)
            pred = {"states": r.states, "activations": r.activations, "states + activations": r.total}
            for comp in COMPONENTS:
                p, m = pred[comp], meas[comp]
                rows.append({"tool": name, "experiment": run.label, "family": run.hf.get("model_type"),
                             "dtype": run.dtype, "component": comp, "predicted": p, "measured": m,
                             "rel_error": rel_error(p, m), "available": r.available,
                             "note": r.note if (p is None or not r.available) else ""})
    return pd.DataFrame(rows)


def error_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per tool and component: median |error| and the signed worst error (largest magnitude), as fractions;
    'not modelled' / 'unavailable' where a tool has no number."""
    import pandas as pd

    out = []
    for tool, g in frame.groupby("tool", sort=False):
        row: dict[str, Any] = {"tool": tool}
        for comp in COMPONENTS:
            e = g[g["component"] == comp]["rel_error"].dropna().astype(float)
            if e.empty:
                row[f"{comp} median"] = row[f"{comp} worst"] = (
                    "unavailable" if not g["available"].all() else "not modelled")
                continue
            row[f"{comp} median"] = float(e.abs().median())
            row[f"{comp} worst"] = float(e.loc[e.abs().idxmax()])
        out.append(row)
    return pd.DataFrame(out)


# -- fine-tuning: the tools that claim something for a LoRA run, scored on that only ----------------------------
FINETUNE_TOOLS = ("memlab", "gpu_poor", "accelerate")
"""The calculators with a number for a LoRA fine-tune: memlab, gpu_poor's LoRA mode, accelerate's loaded-model term
(the other tools model full training only: :func:`finetune_scope` shows each one's claim)."""


def lora_runs(configs: dict[str, dict[str, Any]], batch: int, seq: int, *, lora_rank: int, dtype: str = "fp32",
              attn_implementation: str = "eager", device_type: str = "cpu") -> list[Run]:
    """One LoRA :class:`Run` (peft's default targets, ``lora_rank``) per named HF config, at ``batch`` x ``seq``."""
    return [Run(cfg, batch, seq, dtype, attn_implementation, device_type, name=name, finetune="lora",
                lora_rank=lora_rank) for name, cfg in configs.items()]


def finetune_shoot_out(runs: Iterable[Run], measured: dict[Run, dict[str, int]] | None = None, *, seed: int = 0,
                       tools: Iterable[str] = FINETUNE_TOOLS) -> pd.DataFrame:
    """:func:`shoot_out` over fine-tuning runs: each run's measurement from ``measured`` (``{"states",
    "activations"}`` bytes), or, where absent, measured here with peft (:func:`memlab.run.hf.measure_run`)."""
    from memlab.run.hf import measure_run

    given = measured or {}
    return shoot_out([(run, given[run] if run in given else measure_run(run, seed=seed)) for run in runs],
                     tools=list(tools))


def finetune_scope(run: Run, tools: Iterable[str] | None = None) -> pd.DataFrame:
    """What each calculator claims for the fine-tuning ``run``: per tool, whether it gives a states and an
    activations number, and its own note. The scope, shown beside the errors; a component a tool does not claim is
    not scored (not an error)."""
    import pandas as pd

    rows = []
    for name in tools or CALCULATORS:
        r = CALCULATORS[name](run)
        rows.append({"tool": name, "states": "claimed" if r.states is not None else "not modelled",
                     "activations": "claimed" if r.activations is not None else "not modelled",
                     "available": r.available, "note": r.note})
    return pd.DataFrame(rows)

"""Configs memlab's tests did not choose: seeded draws of every supported Hugging Face family, each built small
and trained two real steps, its saved activations, model states and peaks against the estimate (and, where the
estimate's peak is a range, against the trace of transformers' code), or a refusal.

A draw starts from a small config of the family (the caller's: the bench and the tests pass the tiny ones shipped
in ``memlab/predict/families/configs/tiny``) and changes what its key account
(:mod:`memlab.predict.families.keys`) says memlab reads or refuses: the number of layers, the vocabulary and the MLP
width; every boolean key the account models, flipped at random; a dropout of 0.1 on the keys that carry one; and,
one draw in four, one refused key set to a value its account does not accept. Widened (``joint=True``, issue 36),
every key the account models is then drawn jointly, from a generator of its own
(:func:`memlab.studies.joint_keys.draw_joint`: width 32-512, heads, KV heads, rotary, windows, experts, every
boolean, dropout and activation key, whether the base config spells it out or not). The calling side is drawn too:
eager or SDPA attention (where transformers builds it), fp32, bf16 or an fp32 model under bf16 autocast,
gradient checkpointing on or off (on: half of the draws with torch's reentrant checkpoint, as peft's
``prepare_model_for_kbit_training`` alone leaves it, ``Setup.checkpoint_reentrant``), the call (no attention mask,
an all-ones one, or a batch with 10-50 % padding on the right or the left: ``Setup.attention_mask``,
``Setup.padding_side``, :func:`memlab.run.hf.call_inputs`; one draw in four with a hand-written loss,
``Setup.loss_call``), batch 1-3 and 8-40 tokens.

Each draw runs two consecutive training steps of :func:`memlab.model.step.train_step` on the same model and
AdamW optimizer, on this machine (a CPU: the estimate is asked for ``device_type="cpu"``), measured independently
of the estimator: saved-for-backward bytes of the first forward (``saved_tensors_hooks``, unique storages), the
model states after each optimizer step (unique storages), and the live tensor bytes inside each phase
(:class:`memlab.measure.live_bytes.PhasePeaks`), cross-checked phase by phase against torch's ``MemTracker``
(:func:`memlab.tracing.tracer.fast_mem_tracker`) on the same steps. **Peak** here means: the most bytes of live
tensor storages at once during a step, counted from the parameters, buffers, token ids, labels and mask up (the
bytes above the empty process: no allocator, no interpreter), the largest over the step's phases (forward,
backward, optimizer step; zero_grad counts what it leaves); the first step's (AdamW state appears inside its
optimizer step) is ``peak``, the second's (the steady one) ``steady peak``. Each draw ends in one verdict:

- ``exact``: saved-for-backward bytes, and parameters + gradients + AdamW state after each step, equal the estimate
  to the byte; both peaks within :data:`TOLERANCE` (0.1 %) of the estimate's peak of that step; and the live
  count equals MemTracker's in every phase;
- ``named``: as ``exact``, but a peak is outside 0.1 % and inside the range the terms the estimate names as left
  out give it (:func:`memlab.predict.coverage.peak_range` over the estimate's
  :attr:`~memlab.predict.memory.breakdown.MemoryBreakdown.named_terms`, each term with its size, sign and phases:
  the range ``memlab estimate`` prints beside the peak), widened by the same 0.1 %: a quantified assumption, not a
  silent error;
- ``traced``: as ``named``, and the call is one the trace takes (:func:`traceable`): the trace of
  transformers' code on fake tensors (:func:`memlab.tracing.hf.trace_hf`, the exact answer the range points to)
  gives both peaks within 0.1 % of the measured ones and inside the printed range (a trace outside either is
  ``off``);
  a draw with reentrant checkpointing (which the formula refuses: the trace answers it) is ``traced`` when the
  trace's peaks of both steps are within 0.1 % of the measured ones, and its phases hold the trace's bytes as the
  predicted side;
- ``refused``: :func:`memlab.predict.families.reader.from_hf` or the estimate raised a one-line
:class:`~memlab.errors.MemlabError`
  (a refused key must end here);
- ``off``: a number differs, or a refused key was estimated anyway: silently wrong, the case this exists to find
  (or the two measurements disagree: then the draw cannot vouch for anything);
- ``unbuildable``: transformers itself rejects the drawn config (not memlab's to judge).

The per-phase bytes (predicted and measured) are kept in each verdict (:attr:`HfVerdict.phases`) and the bench
prints their worst error, but only the peaks enter the verdict: a phase's own peak is not a number the estimator
promises to 0.1 %. ``benchmarks/hf_draws.py`` runs a large sample (joint by default); ``tests/studies/test_hf_draws.py``
and ``tests/studies/test_joint_keys.py`` seeded ones.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from memlab.compare.tolerances import TOLERANCE
from memlab.errors import MemlabError
from memlab.studies.joint_keys import draw_joint, variant

_LAYERS = ("num_hidden_layers", "n_layer")
_FF = ("intermediate_size", "n_inner", "ffn_dim", "moe_intermediate_size", "shared_expert_intermediate_size")
_DROPOUT_WORDS = ("dropout", "pdrop")
_MASKS = ("none", "ones", "padded")
_PAD_FRACTIONS = (0.1, 0.25, 0.5)

VERDICTS = ("exact", "traced", "named", "refused", "off", "unbuildable")
"""Every verdict a draw can end in (module docstring)."""
COMPONENTS = ("activations", "states", "peak", "steady states", "steady peak")
"""What each verdict compares: the byte-exact ones and the two peaks (:data:`TOLERANCE`)."""


@dataclass(frozen=True)
class HfDraw:
    """One drawn run: an HF config (a dict with ``model_type``) and how it is called."""

    family: str
    config: Mapping[str, Any]
    attention: str
    dtype: str
    autocast: bool
    checkpointing: bool
    batch: int
    seq: int
    refused_key: str | None = None
    """The refused key this draw set to a value its account does not accept (it must be refused)."""
    attention_mask: str = "none"
    """The call: ``none``, ``ones`` or ``padded`` (``Setup.attention_mask``)."""
    pad_fraction: float = 0.0
    """With ``padded``: the share of the batch's tokens that are padding."""
    padding_side: str = "right"
    """With ``padded``: where each row's padding sits (``Setup.padding_side``)."""
    loss_call: str = "labels"
    """``labels`` (the model's own loss) or ``manual`` (cross-entropy on the returned logits; ``Setup.loss_call``)."""
    reentrant: bool = False
    """With ``checkpointing``: torch's reentrant checkpoint (``Setup.checkpoint_reentrant``)."""

    def label(self) -> str:
        """A short description for tables: family, call, shape and what was changed."""
        how = "amp-bf16" if self.autocast else self.dtype
        ck = (" ckpt reentrant" if self.reentrant else " ckpt") if self.checkpointing else ""
        mask = {"none": "", "ones": " mask=ones"}.get(self.attention_mask,
                                                       f" padded={self.pad_fraction:g} {self.padding_side}")
        mask += " manual-loss" if self.loss_call == "manual" else ""
        extra = f" {self.refused_key}=*" if self.refused_key else ""
        width = next((self.config[k] for k in ("hidden_size", "n_embd") if self.config.get(k)), "?")
        return (f"{self.family} w{width} {variant(self.config)} {self.attention} {how}{ck}{mask} "
                f"b{self.batch}x{self.seq}{extra}")


@dataclass(frozen=True)
class HfVerdict:
    """The outcome of one :class:`HfDraw`: ``verdict`` (module docstring), the predicted and measured bytes per
    component (:data:`COMPONENTS`) where both exist, ``phases`` (``"step phase"`` -> (predicted, live, MemTracker)
    bytes) and ``reason`` (the refusal, the error, or which component is off)."""

    draw: HfDraw
    verdict: str
    predicted: Mapping[str, int] = field(default_factory=dict)
    measured: Mapping[str, int] = field(default_factory=dict)
    reason: str = ""
    phases: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)

    def error(self, component: str) -> float | None:
        """(predicted - measured) / measured for ``component``, or None without both."""
        p, m = self.predicted.get(component), self.measured.get(component)
        return None if p is None or not m else (p - m) / m


VOCABULARIES = (96, 128, 200, 512)
"""The vocabularies a draw picks from: small against the widths (64-160), where the HF families' own in-phase
transients are not hidden by the phase model's t x V logits terms (:data:`memlab.predict.coverage.HF_TRANSIENTS`)."""


def draw_hf(rng: random.Random, base: Mapping[str, Any], vocabularies: tuple[int, ...] = VOCABULARIES,
            joint: random.Random | None = None) -> HfDraw:
    """One seeded draw from ``base``, a small HF config dict with ``model_type`` (module docstring); the vocabulary
    is one of ``vocabularies``. ``joint``: a second generator that then draws every modelled key of the family at
    once (:func:`memlab.studies.joint_keys.draw_joint`: width, heads, KV heads, rotary, windows, experts, every
    boolean, dropout and activation key); ``rng`` draws what it drew without it, so each seed's earlier draws stay
    as they were."""
    from memlab.predict.families.keys import CONDITIONAL
    from memlab.predict.families.registry import account
    from memlab.run.hf import attention_implementations

    family = str(base.get("model_type"))
    acc = account(family)
    cfg = {k: v for k, v in base.items() if not k.startswith("_")}
    for key in _LAYERS:
        if key in cfg:
            cfg[key] = rng.randint(1, 3)
    cfg["vocab_size"] = rng.choice(vocabularies)
    for key in _FF:
        if cfg.get(key):
            cfg[key] = rng.choice((64, 96, 128, 160))
    for key in sorted(acc.modelled):
        if "." not in key and isinstance(cfg.get(key), bool) and rng.random() < 0.5:
            cfg[key] = not cfg[key]
        if any(w in key for w in _DROPOUT_WORDS) and key in cfg and rng.random() < 0.3:
            cfg[key] = 0.1
    refused = None
    candidates = [k for k in sorted(acc.refused) if "." not in k and k not in CONDITIONAL
                  and acc.accepted.get(k) and isinstance(acc.accepted[k][0], bool)]
    if candidates and rng.random() < 0.25:
        refused = rng.choice(candidates)
        cfg[refused] = not acc.accepted[refused][0]
    attention = rng.choice(attention_implementations(cfg))
    dtype, autocast = rng.choice((("fp32", False), ("bf16", False), ("fp32", True)))
    checkpointing, batch, seq = rng.random() < 0.3, rng.randint(1, 3), rng.randint(8, 40)
    mask = rng.choice(_MASKS)
    # the loss call and the padding side come from a generator seeded by what was drawn (str seeds hash with
    # SHA-512: the same on every run), so adding them left every earlier field of every seed's draws as it was
    call = random.Random(f"{family} {dtype} {autocast} {checkpointing} {batch} {seq} {mask}")
    if joint is not None:
        cfg = draw_joint(joint, cfg)
    return HfDraw(family=family, config=cfg, attention=attention, dtype=dtype, autocast=autocast,
                  checkpointing=checkpointing, batch=batch, seq=seq, refused_key=refused, attention_mask=mask,
                  pad_fraction=rng.choice(_PAD_FRACTIONS) if mask == "padded" else 0.0,
                  padding_side=call.choice(("right", "left")) if mask == "padded" else "right",
                  loss_call="manual" if call.random() < 0.25 else "labels",
                  reentrant=checkpointing and call.random() < 0.5)


@contextlib.contextmanager
def _mem_tracker(rows: list[Any], model: Any, optimizer: Any, inputs: list[Any], *,
                 reentrant: bool = False) -> Iterator[Any]:
    """torch's MemTracker over the steps (:data:`memlab.run.hf.Watch`): the model, the optimizer and the call's
    tensors tracked up front, one row per phase appended to ``rows``. Under the reentrant checkpoint its module
    hooks would keep each checkpoint's function (and the layers' keyword tensors) past the step, as in a trace: they
    are released when backward ends, as the real step without a tracker releases them
    (:func:`memlab.tracing.hf.release_reentrant_calls`)."""
    from memlab.tracing.hf import release_reentrant_calls
    from memlab.tracing.tracer import PhaseRecorder, fast_mem_tracker

    if reentrant:
        release_reentrant_calls(model)

    tracker = fast_mem_tracker()
    tracker.track_external(model, optimizer, *inputs)
    recorder = PhaseRecorder(tracker)
    with tracker:
        yield recorder
    rows.extend(recorder.rows)


def _step_peak(rows: Iterable[Any], step: str) -> int:
    """The most held in any phase of ``step`` (``PhaseRow.held_bytes``: zero_grad counts what it leaves)."""
    return max(r.held_bytes for r in rows if r.step == step)


def judge(draw: HfDraw, *, seed: int = 0) -> HfVerdict:
    """Build ``draw``'s model, train two steps, and compare with the estimate (or record the refusal)."""
    from memlab.device import device_type
    from memlab.predict.coverage import peak_range
    from memlab.predict.estimate import estimate
    from memlab.predict.families.reader import from_hf
    from memlab.run.hf import predict_hf, run_hf

    try:
        config = from_hf(dict(draw.config))
    except MemlabError as exc:
        return HfVerdict(draw, "refused", reason=str(exc))
    tracked: list[Any] = []
    try:
        _, m = run_hf(dict(draw.config), attn_implementation=draw.attention, dtype=draw.dtype, batch=draw.batch,
                      seq=draw.seq, autocast=draw.autocast, gradient_checkpointing=draw.checkpointing, seed=seed,
                      attention_mask=draw.attention_mask, pad_fraction=draw.pad_fraction, reentrant=draw.reentrant,
                      padding_side=draw.padding_side, loss_call=draw.loss_call, steps=2, phase_peaks=True,
                      watch=lambda *a: _mem_tracker(tracked, *a, reentrant=draw.reentrant))
    except MemlabError as exc:
        return HfVerdict(draw, "refused", reason=str(exc))
    except (ValueError, TypeError, RuntimeError, IndexError, AttributeError) as exc:  # transformers rejects it
        return HfVerdict(draw, "unbuildable", reason=f"{type(exc).__name__}: {str(exc)[:200]}")
    try:
        p = predict_hf(config, m)
        est = estimate(config, m.setup(config), device_type=device_type(m.device))
    except MemlabError as exc:
        return _refused_or_traced(draw, m.setup(config), m.phase_peaks, tracked, str(exc))
    states = p["params"] + p["grads"] + p["optimizer"]
    predicted = {"activations": p["activations"], "states": states, "peak": _step_peak(est.phases, "first"),
                 "steady states": states, "steady peak": _step_peak(est.phases, "steady")}
    measured = {"activations": m.saved_bytes, "states": m.step_states_bytes[0],
                "peak": _step_peak(m.phase_peaks, "first"), "steady states": m.step_states_bytes[1],
                "steady peak": _step_peak(m.phase_peaks, "steady")}
    want = {(r.step, r.phase): r.held_bytes for r in est.phases}
    phases = {f"{r.step} {r.phase}": (int(want.get((r.step, r.phase), -1)), r.held_bytes, t.held_bytes)
              for r, t in zip(m.phase_peaks, tracked, strict=True)}
    verdict = HfVerdict(draw, "exact", predicted, measured, phases=phases)
    if draw.refused_key is not None:
        return HfVerdict(draw, "off", predicted, measured, f"{draw.refused_key} is refused but was estimated", phases)
    split = [k for k, (_, live, tracker) in phases.items() if live != tracker]
    if split:
        return HfVerdict(draw, "off", predicted, measured, "live bytes and MemTracker disagree in "
                         + ", ".join(f"{k} ({phases[k][1] - phases[k][2]:+,} B)" for k in split), phases)
    named = list(est.named_terms)
    ranges = {k: peak_range(est, step=step)
              for k, step in (("peak", "first"), ("steady peak", "steady"))}
    peaks = {k: _peak_verdict(predicted[k], measured[k], r) for k, r in ranges.items()}
    off = [k for k in COMPONENTS if (peaks[k] == "off" if k in peaks else predicted[k] != measured[k])]
    loose = [k for k in peaks if peaks[k] == "named"]
    why = ", ".join(f"{k} {predicted[k] - measured[k]:+,} B ({verdict.error(k) or 0:+.3%})" for k in off or loose)
    if loose and not off and traceable(draw):
        traced = _traced_verdict(draw, m.setup(config), HfVerdict(draw, "traced", predicted, measured, why, phases),
                                 ranges)
        if traced is not None:
            return traced
    return HfVerdict(draw, "off" if off else "named" if loose else "exact", predicted, measured,
                     why + (" (named: " + "; ".join(n.name for n in named) + ")" if not off and loose else ""),
                     phases)


def _traced_verdict(draw: HfDraw, setup: Any, formula: HfVerdict, ranges: Mapping[str, Any]) -> HfVerdict | None:
    """The verdict of a draw whose printed peak is outside :data:`TOLERANCE` but inside the printed range
    (``formula``: its bytes and why), where the trace answers: ``traced`` when the trace's peaks of both steps are
    within :data:`TOLERANCE` of the measured ones and inside the printed range (``ranges``), else ``off``; None
    where the trace refuses the setup."""
    traced = _traced_peaks(draw, setup)
    if traced is None:
        return None
    measured, why = formula.measured, formula.reason
    wrong = [k for k in traced if abs(traced[k] - measured[k]) > TOLERANCE * measured[k]]
    wrong += [f"{k} outside the printed range {ranges[k].low:,}-{ranges[k].high:,} B" for k in traced
              if not _in_range(traced[k], ranges[k])]
    if wrong:  # the trace claims the exact bytes of this code: a trace that misses them is silently wrong
        return HfVerdict(draw, "off", formula.predicted, measured, "the trace's " + ", ".join(
            f"{k} {traced[k] - measured[k]:+,} B" if k in traced else k for k in wrong)
            + " (the formula's: " + why + ")", formula.phases)
    return HfVerdict(draw, "traced", formula.predicted, measured, why + "; the trace: "
                     + ", ".join(f"{k} {traced[k] - measured[k]:+,} B" for k in traced), formula.phases)


def _refused_or_traced(draw: HfDraw, setup: Any, live: list[Any], tracked: list[Any], refusal: str) -> HfVerdict:
    """The verdict of a draw the estimate refuses (``refusal``): ``refused``, unless the draw checkpoints reentrant
    (refused for that or another reason; the trace answers it: module docstring), where the trace of the same step is
    compared with the measured peaks: ``traced`` within :data:`TOLERANCE`, else ``off`` (as where the live bytes
    and MemTracker disagree). ``live`` and ``tracked``: the measured rows of each phase."""
    rows = _trace_rows(draw, setup) if draw.reentrant and traceable(draw) else None
    if rows is None:
        return HfVerdict(draw, "refused", reason=refusal)
    traced = {f"{r.step} {r.phase}": r.held_bytes for r in rows}
    phases = {f"{r.step} {r.phase}": (traced.get(f"{r.step} {r.phase}", -1), r.held_bytes, t.held_bytes)
              for r, t in zip(live, tracked, strict=True)}
    predicted = {"peak": _step_peak(rows, "first"), "steady peak": _step_peak(rows, "steady")}
    measured = {"peak": _step_peak(live, "first"), "steady peak": _step_peak(live, "steady")}
    split = [k for k, (_, held, tracker) in phases.items() if held != tracker]
    wrong = [k for k in predicted if abs(predicted[k] - measured[k]) > TOLERANCE * measured[k]]
    said = ", ".join(f"{k} {predicted[k] - measured[k]:+,} B" for k in predicted)
    if split or wrong:
        return HfVerdict(draw, "off", predicted, measured, f"the trace: {said}" + (
            f"; live bytes and MemTracker disagree in {', '.join(split)}" if split else ""), phases)
    return HfVerdict(draw, "traced", predicted, measured, f"the formula refuses it ({refusal}); the trace: {said}",
                     phases)


def traceable(draw: HfDraw) -> bool:
    """Whether :func:`memlab.tracing.hf.trace_hf` traces ``draw``'s call: every call a draw makes (no attention
    mask, an all-ones one or a padded batch, with either loss call: ``labels=`` or the hand-written cross-entropy,
    :class:`memlab.model.loss.LossOptions` ``call``), on CPU, where the draws run."""
    return draw.attention_mask in ("none", "ones", "padded")


def _traced_peaks(draw: HfDraw, setup: Any) -> dict[str, int] | None:
    """Both steps' peaks of the trace of ``draw``'s model under ``setup`` on fake CPU tensors (the answer ``memlab
    trace --hf`` gives): ``peak`` and ``steady peak``, bytes; None where the trace refuses the setup."""
    rows = _trace_rows(draw, setup)
    return None if rows is None else {"peak": _step_peak(rows, "first"), "steady peak": _step_peak(rows, "steady")}


def _trace_rows(draw: HfDraw, setup: Any) -> list[Any] | None:
    """The phase rows of the trace of ``draw``'s model under ``setup`` on fake CPU tensors; None where the trace
    refuses the setup (CPU flash with dropout: no exact answer to offer)."""
    from memlab.tracing.hf import trace_hf

    try:
        return list(trace_hf(dict(draw.config), setup, device_type="cpu").phases)
    except MemlabError:
        return None


def _in_range(peak: int, rng: Any) -> bool:
    """Whether ``peak`` (bytes: a trace's) is inside the printed range ``rng``
    (:func:`memlab.predict.coverage.peak_range`) widened by :data:`TOLERANCE` of it."""
    return rng.low - TOLERANCE * peak <= peak <= rng.high + TOLERANCE * peak


def _peak_verdict(predicted: int, measured: int, rng: Any) -> str:
    """``within`` (|predicted - measured| <= :data:`TOLERANCE` x measured), ``named`` (outside it, inside the
    range :func:`memlab.predict.coverage.peak_range` gives from the named terms, the range ``memlab estimate``
    prints, widened by the same tolerance) or ``off``."""
    slack = TOLERANCE * measured
    if abs(predicted - measured) <= slack:
        return "within"
    if rng.terms and rng.low - slack <= measured <= rng.high + slack:
        return "named"
    return "off"


def hf_agreement(bases: Mapping[str, Mapping[str, Any]], draws: int, *, seed: int = 0,
                 vocabularies: tuple[int, ...] = VOCABULARIES, joint: bool = False) -> list[HfVerdict]:
    """``draws`` seeded draws spread in turn over ``bases`` (name -> small HF config), each judged
    (:func:`judge`); ``vocabularies`` as :func:`draw_hf`. ``joint``: every modelled key drawn jointly too, from a
    generator of its own (``"{seed}-joint"``), so the fields drawn without it are those of the same seed's earlier
    draws."""
    return [judge(d, seed=seed) for d in hf_draws(bases, draws, seed=seed, vocabularies=vocabularies, joint=joint)]


def hf_draws(bases: Mapping[str, Mapping[str, Any]], draws: int, *, seed: int = 0,
             vocabularies: tuple[int, ...] = VOCABULARIES, joint: bool = False) -> list[HfDraw]:
    """The draws :func:`hf_agreement` judges, unjudged (the i-th from ``bases``' ``i mod len``-th name, sorted)."""
    names = sorted(bases)
    rng, extra = random.Random(seed), random.Random(f"{seed}-joint") if joint else None
    return [draw_hf(rng, bases[names[i % len(names)]], vocabularies, extra) for i in range(draws)]


def verdict_counts(verdicts: Iterable[HfVerdict]) -> dict[str, int]:
    """How many draws ended in each verdict (every verdict named, zero where none)."""
    out = dict.fromkeys(VERDICTS, 0)
    for v in verdicts:
        out[v.verdict] += 1
    return out

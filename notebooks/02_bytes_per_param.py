# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · Sixteen bytes per parameter, and when it is 8, 18 or 20
#
# **The common belief.** "Training with Adam costs 16 bytes per parameter, so 1B parameters need about 16 GB before
# activations." Seed article 000 ("視訊記憶體利用率", *memory utilization*) gives exactly this rule, with a table of
# 4 (fp32 master) + 2 (bf16 copy) + 2 (gradient) + 4 + 4 (Adam's two moments) bytes `[seed-000]`.
#
# The rule is right for one setup and quietly wrong for others. This chapter measures the model states
# (parameters, gradients, optimizer state) of the reference GPT under several precision policies and optimizers,
# byte for byte, and puts each measurement next to memlab's prediction:
#
# 1. the formula: bytes per parameter for each policy, and which framework uses which;
# 2. the experiment: the same GPT trained for real under each policy;
# 3. prediction vs measurement, component by component;
# 4. what AMP holds besides its 16 bytes: bf16 weight copies kept from forward to backward;
# 5. when the bytes appear: optimizer state is created at the first step, and `zero_grad(set_to_none=True)` frees
#    the gradients;
# 6. "1B parameters ≈ 16 GB", checked.

# %% tags=["parameters"]
scale = "auto"
device = "auto"
seed = 0
out_dir = "../reports/build/02_bytes_per_param"

# %%
import pandas as pd
from IPython.display import Markdown, display

from memlab import (
    PRECISION_POLICIES,
    Setup,
    chapter,
    check,
    estimate,
    measurement_of,
    predict_for,
    preset,
    read_rows,
    run_step,
    sweep,
)
from memlab.compare import compare, plots
from memlab.units import GiB, MiB, fmt_bytes

ch = chapter(scale, device, seed, out_dir)
# ci: AdamW under every policy, SGD under two, 8-bit Adam under one, a fresh sweep; full: every policy with every
# optimizer (others=None), resuming an interrupted sweep
SIZES = {"ci": dict(model="tiny-gpt", batch=1, seq=32, others={"sgd": ["fp32", "bf16"], "adam-8bit": ["mixed-bf16"]},
                    resume=False),
         "full": dict(model="gpt2", batch=4, seq=512, others=None, resume=True)}[ch.scale]
ch

# %% [markdown]
# ## 1. The formula
#
# A precision policy fixes how many bytes each parameter costs in weights, gradients, an fp32 master copy and an
# fp32 gradient buffer; the optimizer adds its moments. `memlab.predict.estimate` adds them up. For a bare parameter
# count
# it returns the model states only, so dividing by the count gives bytes per parameter.

# %%
N = 10**9
POLICIES = ["fp32", "amp-bf16", "mixed-bf16", "mixed-bf16-fp32-grads", "mixed-fp16-fp32-accum", "bf16"]
OPTIMIZERS = ["adamw", "sgd-momentum", "sgd", "adam-8bit"]


def bytes_per_param(policy: str, optimizer: str) -> float:
    """Model-state bytes per parameter predicted for a 1B-parameter model (step counters excluded)."""
    b = estimate(N, Setup(precision=policy, optimizer=optimizer))
    return b.model_state_bytes(step_counters=False) / N


table = pd.DataFrame({opt: [bytes_per_param(p, opt) for p in POLICIES] for opt in OPTIMIZERS}, index=POLICIES)
table.index.name = "bytes/param"
table["who uses it"] = [PRECISION_POLICIES[p].source for p in POLICIES]
ch.save_table(table.reset_index(), "bytes_per_param_predicted")
table

# %% [markdown]
# Reading the AdamW column, and who counts which:
#
# - **16**: the ZeRO paper's mixed precision, 2 + 2 + 4 master + 8 moments `[rajbhandari2019]`, and plain fp32
#   training (4 + 4 + 8). PyTorch AMP also *stores* 16 (fp32 weights, gradients and moments), but autocast holds
#   bf16 copies of the matmul weights from the forward pass to the backward: section 4 measures them.
# - **18**: Hugging Face's Transformers documentation counts its fp16/bf16 mode, which *is* `torch.autocast`, as 6
#   bytes of weights (fp32 and 16-bit), 4 of fp32 gradients and 8 of AdamW `[hf-transformers-anatomy]`: that is
#   this table's amp-bf16, 16 stored bytes, plus the 2-byte working copy autocast makes during the step (section 4
#   measures it), counted as a weight. Megatron-LM's distributed-optimizer table reaches the same 18 by another
#   layout: bf16 parameters, fp32 gradients and the fp32 master `[megatron-docs]`.
# - **20**: Megatron-LM's recipe with fp32 "main" gradients beside 16-bit ones `[megatron-docs]`. The Ultra-Scale
#   Playbook's formula counts mixed precision as 2 + 2 + 4 + 8 = **16**, and 20 only when gradients are also
#   accumulated in fp32 (its "w/ FP32 grad acc" column, as nanotron does) `[tazi2025]`; one sentence of its prose
#   says 12 bytes of fp32 copies, which its own formula does not.
#
# Pure bf16 training halves everything, moments included. The optimizer matters as much as the precision (the
# other columns).
#
# **Exercise 1 (predict before the next cells measure).** The sweep below trains the GPT model printed under this
# question, with the parameter count printed beside it, under each policy. How many MiB of model states
# (parameters, gradients and optimizer state; step counters left out) will the **amp-bf16 + AdamW** run hold?

# %%
print(f"the model: {preset(SIZES['model']).name}, {preset(SIZES['model']).param_count():,} parameters")

# %%
answer = ...
check("02.amp-run-mib", answer, model=preset(SIZES["model"]))

# %% [markdown]
# ## 2. The experiment: the same GPT under each policy
#
# `memlab.run.runner.run_step` builds the reference GPT in the policy's dtype, wires autocast, the GradScaler or fp32
# master weights, trains on synthetic tokens and counts every byte of parameters, gradients and optimizer state
# by storage, and every tensor saved for backward by category. `memlab.run.sweep.sweep` writes each result as one
# JSON line the moment it is measured. At `full` scale an interrupted sweep resumes where it stopped and runs
# every policy with every optimizer; at `ci` scale it starts over and runs AdamW under every policy, SGD under two
# and 8-bit Adam under one (it takes seconds: 16-bit matmuls are slow on CPUs without native bf16 instructions,
# `avx512_bf16` or AMX, chapter 00 section 2).

# %%
model = preset(SIZES["model"])
batch, seq = SIZES["batch"], SIZES["seq"]
others = SIZES["others"] or dict.fromkeys(("sgd", "adam-8bit"), POLICIES)
grid = [(model, Setup(batch=batch, seq=seq, precision=p, optimizer=o))
        for p in POLICIES for o in ("adamw", "sgd", "adam-8bit") if o == "adamw" or p in others[o]]
path = ch.out_dir / "states.jsonl"
if not SIZES["resume"]:
    path.unlink(missing_ok=True)
runs = sweep(grid, path, device=ch.device, steps=1, with_counted_flops=False, with_mfu=False,
             with_phase_peaks=False, progress=SIZES["resume"])
pairs = [measurement_of(r) for r in read_rows(path)]
print(f"{model.name}: {model.param_count():,} parameters, {len(pairs)} runs on {pairs[0][1].device_name}")

# %%
ch.cpu_note("prediction and measurement both count the stored bytes of the same tensors, so their agreement "
            "checks memlab's bookkeeping (which tensors exist, in which dtype, when), not a memory system. Only a "
            "GPU's caching allocator adds what neither counts: each block rounded up (to 512-byte multiples, carved "
            "from larger segments), freed blocks kept in its cache, fragmentation, and the transients inside a "
            "step; recorded GPU results, when the repo has them, are shown at the end.")

# %% [markdown]
# ## 3. Prediction vs measurement
#
# `memlab.compare.ledger.compare` puts each prediction next to its measurement; relative error is
# (predicted − measured) / measured.

# %% tags=["reveals-02.amp-run-mib"]
ledger = pd.concat([compare(predict_for(cfg, m), m) for cfg, m in pairs], ignore_index=True)
states = ledger[ledger["component"].isin(["params", "grads", "optimizer"])].copy()
ch.record_ledger(states)
worst = states["rel_error"].abs().max()
display(Markdown(f"predicted vs measured bytes of params, grads and optimizer state in {len(pairs)} runs "
                 f"({len(states)} rows): "
                 + ("every row agrees exactly" if worst == 0 else f"largest |relative error| {worst:.2%}")))
def reader_run(experiment: str) -> str:
    """'tiny-gpt mixed-bf16 adamw eager none b1x32' -> 'mixed-bf16 + adamw'."""
    words = experiment.split()
    return f"{words[1]} + {words[2]}" if len(words) > 2 else experiment


(states.assign(run=states["experiment"].map(reader_run))
 .pivot_table(index="run", columns="component", values="measured", sort=False) / 1024).round(2).rename(
    columns=lambda c: f"{c} (KiB), measured").rename_axis(index="precision + optimizer", columns=None)

# %%
adamw = states[states["experiment"].str.contains(" adamw ")].assign(
    experiment=lambda d: d["experiment"].map(reader_run).str.removesuffix(" + adamw"))
fig = plots.stacked_breakdown(adamw, title=f"Model states of {model.name} with AdamW: predicted vs measured",
                              source=f"measured on {pairs[0][1].device_name}, exact storage bytes")
ch.save_figure(fig, "states_adamw")

# %% [markdown]
# The measured bytes per parameter, next to the prediction for this model. The per-tensor `step` counters of Adam (4
# bytes per parameter *tensor*, not per parameter) are left out here: they are why an exact count is a hair above 16.
# On CUDA they stay on the host unless the optimizer is `fused=True` or `capturable=True` `[pytorch-optim]`. The two
# columns agree because memlab counts both: that is a bookkeeping check of the formula against the storages, and the
# learner-facing value is the shape across policies, not the agreement. The 8-bit Adam rows run memlab's own
# stand-in (`memlab.model.optimizers.Adam8bit`), not bitsandbytes: it reproduces the *state layout* of bitsandbytes'
# `AdamW8bit` (one byte per moment element, one fp32 absmax per 256-element block; a test checks its bytes against
# the real `bnb.optim.AdamW8bit` on a CPU), with a per-block power code where bitsandbytes uses a dynamic tree
# code: its bytes are bitsandbytes', its numerics are not. It comes out above the 1B-parameter column of section 1
# because, as in bitsandbytes, tensors under 4,096 elements (biases, norms) keep fp32 states `[dettmers2022]`; a small
# model has many of them.

# %%
rows = []
for cfg, m in pairs:
    p = predict_for(cfg, m)
    rows.append({"precision": m.setup["precision"], "optimizer": m.setup["optimizer"],
                 "measured bytes/param": m.model_state_bytes(step_counters=False) / cfg.param_count(),
                 "predicted bytes/param": p.model_state_bytes(step_counters=False) / cfg.param_count(),
                 "step counters (bytes)": m.optimizer_by_key.get("step", 0)})
measured = pd.DataFrame(rows)
ch.save_table(measured, "bytes_per_param_measured")
measured.pivot_table(index="precision", columns="optimizer", values=["measured bytes/param", "predicted bytes/param"],
                     sort=False).round(3)

# %% [markdown]
# ## 4. What AMP holds besides its 16 bytes
#
# Under autocast, each matmul casts its fp32 weight to bf16. The cast's output is saved for the backward pass, so
# the bf16 copies of all matmul weights live from the forward pass to the backward, through the activation peak:
# 2 bytes per matmul parameter on top of the 16 of model states `[pytorch-amp]`. The runner's saved-tensor
# recorder files them under "autocast weight copies"; the estimator predicts them among the activations.

# %%
amp_rows = []
for cfg, m in pairs:
    if m.setup["optimizer"] != "adamw":
        continue
    p = predict_for(cfg, m)
    copies = m.activations_by_category.get("autocast weight copies", 0)
    amp_rows.append({"precision": m.setup["precision"],
                     "model states (B/param)": m.model_state_bytes(step_counters=False) / cfg.param_count(),
                     "autocast weight copies, measured (B/param)": copies / cfg.param_count(),
                     "predicted (B/param)": p.activation_detail.get("autocast weight copies", 0) / cfg.param_count(),
                     "all saved activations (B/param)": m.activations_bytes / cfg.param_count()})
amp = pd.DataFrame(amp_rows)
ch.save_table(amp, "autocast_copies")
amp_ledger = pd.DataFrame({"experiment": f"{model.name} " + amp["precision"] + " adamw, saved for backward",
                           "component": "autocast weight copies",
                           "unit": "B/param", "predicted": amp["predicted (B/param)"],
                           "measured": amp["autocast weight copies, measured (B/param)"]})
ch.record_ledger(amp_ledger[amp_ledger["measured"] > 0])
amp.round(3)

# %%
amp_copies = amp.set_index("precision").loc["amp-bf16", "autocast weight copies, measured (B/param)"]
display(Markdown(f"amp-bf16 holds {amp_copies:.2f} B/param of bf16 weight copies from forward to backward, on top of "
                 f"{amp.set_index('precision').loc['amp-bf16', 'model states (B/param)']:.2f} B/param of "
                 f"model states; 2 bytes for each of the {model.matmul_param_count():,} matmul weights of the "
                 f"{model.param_count():,} parameters "
                 f"({2 * model.matmul_param_count() / model.param_count():.2f} B/param)"))
HF_AMP_BYTES_PER_PARAM = 6 + 4 + 8  # [hf-transformers-anatomy]: weights fp32 + 16-bit, fp32 grads, AdamW
amp_states = amp.set_index("precision").loc["amp-bf16", "model states (B/param)"]
display(Markdown(f"Hugging Face's documentation counts AMP with AdamW as 6 + 4 + 8 = {HF_AMP_BYTES_PER_PARAM} B/param; "
                 f"measured here: {amp_states:.2f} stored + {amp_copies:.2f} of autocast copies = "
                 f"{amp_states + amp_copies:.2f} "
                 f"B/param ({amp_states + amp_copies - HF_AMP_BYTES_PER_PARAM:+.2f}: HF counts a 16-bit copy of every "
                 f"parameter, autocast copies only the {model.matmul_param_count() / model.param_count():.1%} "
                 f"that feed a "
                 "matmul)"))

# %% [markdown]
# ## 5. When the bytes appear
#
# The runner records exact bytes at each phase boundary of the first training step. The fp32 master copy exists
# from the start (it is made when the optimizer is wrapped), but Adam's moments do not exist until the first
# `optimizer.step()` creates them, so memory *jumps* at the first step: a job that survives its first forward and
# backward can still die at step one. `zero_grad(set_to_none=True)` (PyTorch's default since
# 2.0) then frees the gradients instead of filling them with zeros.

# %%
first = next(m for _, m in pairs if m.setup["precision"] == "mixed-bf16" and m.setup["optimizer"] == "adamw")
phases = pd.DataFrame(first.phases)
fig = plots.phase_timeline(phases, title=f"{model.name}, mixed-bf16 + AdamW: bytes held through the first step",
                           source="exact storage bytes at each phase boundary of the run")
ch.save_figure(fig, "first_step_timeline")
phases.assign(**{c: phases[c].map(fmt_bytes) for c in ("params", "grads", "optimizer", "activations")})

# %% [markdown]
# **What the boundaries miss.** These are bytes held *between* phases. Inside `optimizer.step()` an optimizer
# allocates temporaries and frees them before it returns, so no boundary sees them: the multi-tensor
# ("foreach") implementations, PyTorch's default on CUDA, build intermediates for every parameter at once, a loop
# over parameters (memlab's runner passes `foreach=False`) for one tensor at a time, and the fused kernels keep
# almost none. A GPU's allocator peak includes them; on a CPU only a measurement inside the step can (the "temp"
# of seed 004's budget, P + G + O + A + temp, `[seed-004]`).

# %%
step_rows = pd.DataFrame(first.phases).set_index("phase")
pd.Series({
    "optimizer state created by the first step": fmt_bytes(step_rows.loc["optimizer step", "optimizer"]
                                                           - step_rows.loc["backward", "optimizer"]),
    "held after the step (params + grads + optimizer)": fmt_bytes(
        step_rows.loc["optimizer step", ["params", "grads", "optimizer"]].sum()),
    "transient inside the step": "not seen at phase boundaries",
}, name="first optimizer step, mixed-bf16 + AdamW").to_frame()

# %% [markdown]
# The boundaries hide what happens *inside* a phase. The runner also counts live tensor bytes through the step
# (`memlab.measure.live_bytes` on a CPU; `max_memory_allocated`, reset per phase, on CUDA): inside backward the
# logits' fp32 gradient sits next to every activation, inside the optimizer step its temporaries sit next to all
# states. "Will it fit?" is a question about that peak, which `estimate(...).phases` predicts phase by phase (for
# `zero_grad`, the bytes it leaves: the table compares those).

# %%
spiked = run_step(model, Setup(**first.setup), ch.device, steps=1, seed=seed, with_counted_flops=False,
                  with_mfu=False)
pred = predict_for(model, spiked)
inside = pd.DataFrame([r.to_dict() for r in spiked.phase_peaks])[["step", "phase", "peak_bytes", "end_bytes"]]
inside["predicted"] = [pred.phase_bytes(ph, st) for st, ph in zip(inside["step"], inside["phase"], strict=True)]
starts = [0, *inside["end_bytes"].iloc[:-1]]  # each phase starts where the one before it ended
# a spike is what the phase holds above both its start and its end (zero_grad's peak is its start: no spike)
inside["spike above the phase's start and end"] = [p - max(s0, e) for p, s0, e in
                                                    zip(inside["peak_bytes"], starts, inside["end_bytes"], strict=True)]
ch.save_table(inside, "in_step_peaks")
# the estimator predicts each phase's peak, and for zero_grad the bytes held after it: compare like with like
compared = inside["peak_bytes"].where(inside["phase"] != "zero_grad", inside["end_bytes"])
inside[["step", "phase"]].assign(**{
    "measured (MiB)": compared / MiB, "predicted (MiB)": inside["predicted"] / MiB,
    "spike above the phase's start and end (MiB)": inside["spike above the phase's start and end"] / MiB}).round(3)

# %% [markdown]
# What `zero_grad(set_to_none=False)` (`Setup(zero_grad_to_none=False)`) would keep: the gradients stay
# allocated, zero-filled, through the next forward, when activations are at their largest. The cell measures both
# with `memlab.measure.accounting.model_states`.

# %%
kept = {}
for set_to_none in (True, False):
    m = run_step(model, Setup(batch=batch, seq=seq, precision="fp32", optimizer="adamw",
                              zero_grad_to_none=set_to_none), ch.device, steps=1,
                 seed=seed, with_counted_flops=False, with_mfu=False)
    kept[f"set_to_none={set_to_none}"] = fmt_bytes(next(p for p in m.phases if p["phase"] == "zero_grad")["grads"])
pd.Series(kept, name="gradient bytes held into the next forward").to_frame()

# %% [markdown]
# ## 6. "1B parameters is about 16 GB before activations", checked
#
# The measured bytes per parameter of the mixed-bf16 + AdamW run, scaled to 10⁹ parameters, against the rule and
# the estimator. GB are 10⁹ bytes; GiB 2³⁰.

# %%
m_bpp = measured.query("precision == 'mixed-bf16' and optimizer == 'adamw'")["measured bytes/param"].item()
rule = pd.DataFrame({
    "source": ["seed 000's rule (16 B/param)", "memlab estimate"],
    "bytes for 10⁹ params": [16 * N, table.loc["mixed-bf16", "adamw"] * N],
})
display(Markdown(f"measured on {model.name}: {m_bpp:.3f} B/param for mixed-bf16 + AdamW (section 3), the estimate's "
                 f"{table.loc['mixed-bf16', 'adamw']:.3f}"))
rule["GB"] = (rule["bytes for 10⁹ params"] / 1e9).round(2)
rule["GiB"] = (rule["bytes for 10⁹ params"] / GiB).round(2)
rule

# %% [markdown]
# The rule holds for mixed-bf16 AdamW, exactly, as long as "GB" means 10⁹ bytes: in the GiB the allocator's messages
# print, it is 14.9. It is not a rule for "training": the same model needs 8 B/param with SGD
# and fp32 master weights, 4 with pure bf16 SGD, and 20 with fp32 copies of weights and gradients (the Ultra-Scale
# Playbook's count). AMP adds its bf16 weight copies during the step (section 4). Activations come on top (chapter
# 04); the allocator's cache and the CUDA context too (chapter 01).
#
# **Three layouts this table does not run.** Fine-tuning with LoRA or QLoRA freezes the base weights: they carry
# no gradient and no optimizer state, only the small adapters do (chapter 12 counts it, measured). `fused=True`
# AdamW keeps the same 16 bytes of states but updates the parameters in a few fused multi-tensor kernels (over
# chunks of tensors per device and dtype), with no parameter-sized scratch, unlike the foreach implementation's
# lists (section 5 measures that transient). FSDP2's `MixedPrecisionPolicy(param_dtype=
# bf16, reduce_dtype=fp32)` keeps the *sharded fp32 parameters as the master*: there is no separate master copy,
# the bf16 weights exist only while a unit is gathered, and gradients are reduce-scattered into fp32 shards
# `[pytorch-fsdp2]` (chapter 05).

# %%
recorded = ch.recorded("02_bytes_per_param_gpu")
recorded  # the GPU run recorded by scripts/gpu_session.sh, where the repo has one (nothing shows otherwise)

# %%
ch.published("02")

# %% [markdown]
# ## Exercises
#
# Write your answer in place of `...` and run the cell: a wrong answer gets a hint, a right one the exact value and
# why, and each check ends with a collapsed solution. Answers may carry units, e.g. `"112 GiB"`. (Exercise 1 is in
# section 1, before the measurement.)
#
# **Exercise 2.** Mistral-7B (preset `mistral-7b`) trained with mixed-bf16 and AdamW on one GPU: how many GiB of
# model states (parameters, gradients and optimizer state), before any activation?

# %%
answer = ...
check("02.mistral7b-states", answer)

# %% [markdown]
# **Exercise 3.** Lion `[chen2023]` keeps a single momentum buffer per parameter where AdamW keeps two moments.
# Trained with mixed-bf16 (bf16 weights and gradients, an fp32 master copy, the optimizer's state in fp32), how
# many bytes per parameter do the model states of a Lion run cost?

# %%
answer = ...
check("02.lion-bytes", answer)

# %% [markdown]
# **Exercise 4.** A card has 80 GiB for model states alone. With pure bf16 weights and gradients and plain SGD (no
# momentum), how many billion parameters fit at most?

# %%
answer = ...
check("02.bf16-sgd-fit", answer, capacity_gib=80)

# %% [markdown]
# ## Summary
#
# - Model states cost (weight + gradient + master + fp32 gradient buffer + optimizer moments) bytes per parameter;
#   the policy and the optimizer each choose their terms. 16 is ZeRO's mixed precision, fp32 with Adam, AMP's
#   stored bytes and the Ultra-Scale Playbook's formula; 18 is Hugging Face's count of AMP (the 16 plus autocast's
#   working copy) and Megatron-LM's bf16 weights with fp32 gradients; 20 adds fp32 gradient accumulation beside
#   16-bit gradients; pure bf16 with SGD is 4.
# - AMP stores 16 but holds bf16 copies of its matmul weights from forward to backward: close to 2 B/param more
#   through the activation peak.
# - memlab's prediction and the exact storage count of a real training step agree to the byte here, including
#   Adam's per-tensor step counters: on a CPU that checks the bookkeeping; a GPU's allocator adds rounding, its
#   cache and the transients inside the optimizer step, which phase boundaries do not see.
# - Optimizer state appears at the first `optimizer.step()`: the first step is a memory event of its own.
#   `zero_grad(set_to_none=True)` returns the gradients' bytes before the next forward.
# - "1B parameters ≈ 16 GB" is 16 × 10⁹ bytes = 14.9 GiB, for mixed-bf16 + AdamW, before activations.

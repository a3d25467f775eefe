# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
#   memlab:
#     runs_alone: it times a step under each precision policy
# ---

# %% [markdown]
# # 03 · Mixed precision: what autocast halves, and what it adds
#
# **The common belief.** Seed article 004 `[seed-004]` introduces AMP with `from torch.cuda.amp import autocast,
# GradScaler` and promises "效果通常可减少约50%的模型参数、梯度和激活内存" (*it usually cuts parameter, gradient
# and activation memory by about 50 %*). Seed 000 `[seed-000]` says the same of parameters and gradients.
#
# Under PyTorch's autocast `[pytorch-amp]` the weights and gradients stay fp32; autocast makes 16-bit *copies* of
# the matmul weights for each forward and keeps them until backward; activations shrink only where an op runs in
# 16 bits. This chapter measures each policy byte by byte:
#
# 1. the formula: bytes per component and policy (`memlab.estimate`);
# 2. the experiment: fp32, `amp-bf16`, `amp-fp16` + GradScaler, `mixed-bf16` (16-bit weights, fp32 master) and
#    pure `bf16` trained for real, predicted beside measured, with the peak and tokens/s;
# 3. loss scaling: fp16 gradients underflowing on real tensors, the scaler's scale over steps, why bf16 needs none;
# 4. the deprecated `torch.cuda.amp` spelling and its replacement; 5. tensor-core shapes (CUDA).
#
# One thing first: AMP's main benefit is *throughput*, not memory. Tensor cores run 16-bit matmuls at many times
# fp32's rate (section 5's table of published peaks; not measured on this page). The Ultra-Scale Playbook makes the
# memory point in two halves `[tazi2025]`: for the model states, mixed precision "doesn't save overall memory as it
# just distributes the memory differently across the three components", while it "reduces the activation memory
# requirements". This chapter measures both halves, and shows where the second one fails on CUDA.

# %% tags=["parameters"]
scale = "auto"
device = "auto"
seed = 0
out_dir = "../reports/build/03_mixed_precision"

# %%
import matplotlib.pyplot as plt
import pandas as pd
import torch
from IPython.display import Markdown, display

from memlab import (
    Setup,
    chapter,
    check,
    estimate,
    gpu,
    live_training_steps,
    matmul_flops_per_s,
    predict_for,
    preset,
    run_step,
)
from memlab.compare import compare
from memlab.course.chapter import as_percent
from memlab.labs import precision
from memlab.units import MiB

ch = chapter(scale, device, seed, out_dir, ci_threads=1)  # tiny models: more threads only add contention
SIZES = {"ci": dict(model="small-gpt", batch=2, seq=64, scaler_steps=8),
         "full": dict(model="gpt2", batch=8, seq=1024, scaler_steps=50)}[ch.scale]
ch

# %% [markdown]
# ## 1. The formula
#
# `memlab.estimate` counts each component for a precision policy. For a model config it adds the activations,
# term by term, including the autocast weight copies (category `autocast weight copies`).

# %%
model = preset(SIZES["model"])
batch, seq = SIZES["batch"], SIZES["seq"]
POLICIES = ["fp32", "amp-bf16", "amp-fp16", "mixed-bf16", "bf16"]
pred = {}
for p in POLICIES:
    b = estimate(model, Setup(batch=batch, seq=seq, precision=p), device_type=ch.device_type)
    copies = b.activation_detail.get("autocast weight copies", 0)
    pred[p] = {"params": b.params_bytes, "grads": b.grads_bytes, "optimizer": b.optimizer_bytes,
               "activations (tensors)": b.activations_bytes - copies, "autocast weight copies": copies}
pred = pd.DataFrame(pred).T
ratios = (pred.drop(columns="autocast weight copies") / pred.loc["fp32"].drop("autocast weight copies")).rename(
    columns=lambda c: f"{c} / fp32")
ratios["weight copies (B/param)"] = pred["autocast weight copies"] / model.param_count()
ch.save_table(ratios.reset_index(names="policy"), "policies_predicted_ratios")
ratios.round(2)

# %% [markdown]
# Read the ratios: no policy halves everything. `amp-*` keeps parameters, gradients and optimizer state at fp32's
# size (1.00) and *adds* weight copies (last column); `mixed-bf16` halves the weights and gradients but adds a
# 4-byte master copy, so the optimizer column grows; only pure `bf16` halves all three.

# %% [markdown]
# **Exercise 1 (predict first).** Autocast keeps a bf16 copy of every matmul weight from the forward to the
# backward. How many GiB do those copies cost for Llama-2-7B (preset `llama-2-7b`) under `amp-bf16` on a GPU?
# (Unlike this chapter's model, Llama does not tie its input embedding to its LM head.)

# %%
answer = ...
check("03.llama-copies", answer)

# %% [markdown]
# ## 2. The experiment: the same model trained under each policy
#
# `run_step` builds the reference GPT in the policy's dtype, wires autocast, the `torch.amp.GradScaler` (fp16) or
# the fp32 master weights, and counts every byte by storage; `live_training_steps` counts live tensor bytes at
# every op of two steps, whose maximum is the peak.

# %%
runs, peaks = {}, {}
for p in POLICIES:
    setup = Setup(batch=batch, seq=seq, precision=p)
    runs[p] = run_step(model, setup, ch.device, steps=2, seed=seed, with_counted_flops=False, with_mfu=False)
    peaks[p] = live_training_steps(model, setup, ch.device, steps=2, seed=seed).peak_bytes
ledger = pd.concat([compare(predict_for(model, m), m) for m in runs.values()], ignore_index=True)
ch.record_ledger(ledger)
print(f"largest |relative error| over {len(ledger)} ledger rows: {ledger['rel_error'].abs().max():.2%}")

# %%
rows = []
for p, m in runs.items():
    copies = m.activations_by_category.get("autocast weight copies", 0)
    rows.append({"policy": p, "params": m.params_bytes, "grads": m.grads_bytes, "optimizer": m.optimizer_bytes,
                 "activations (tensors)": m.activations_bytes - copies, "autocast weight copies": copies,
                 "peak of live bytes": peaks[p], "cuda peak allocated": m.cuda_peak_allocated_bytes,
                 "step time (s)": m.step_time_s, "tokens/s": m.tokens_per_s})
measured = pd.DataFrame(rows).set_index("policy")
ch.save_table(measured.reset_index(), "policies_measured")
byte_cols = [c for c in measured.columns if c not in ("step time (s)", "tokens/s")
             and measured[c].notna().any()]  # the allocator's peak exists on CUDA only
SHORT = {"activations (tensors)": "activations", "autocast weight copies": "weight copies",
         "peak of live bytes": "peak", "cuda peak allocated": "CUDA allocator peak"}
(measured[byte_cols] / MiB).rename(columns=lambda c: f"{SHORT.get(c, c)} (MiB)").assign(
    **{"step time (s)": measured["step time (s)"], "tokens/s": measured["tokens/s"]}).round(3)

# %%
comp = ["params", "grads", "optimizer", "activations (tensors)", "autocast weight copies"]
fig, ax = plt.subplots(figsize=(9, 4.5), layout="constrained")
bottom = pd.Series(0.0, index=measured.index)
for c in comp:
    ax.bar(measured.index, measured[c] / MiB, bottom=bottom / MiB, label=c, edgecolor="white")
    bottom += measured[c]
ax.plot(measured.index, measured["peak of live bytes"] / MiB, "k_", ms=30, mew=2, label="peak of two steps")
ax.set(ylabel="bytes (MiB)", xlabel="precision policy",
       title=f"{model.name}, AdamW, b={batch}, s={seq}: measured bytes per component and the step's peak\n"
             f"exact storage bytes and live tensor bytes, measured on the {ch.device_type.upper()}")
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
ch.save_figure(fig, "policies_components")
over = measured["peak of live bytes"] - measured[comp].sum(axis=1)
display(Markdown("peak minus the sum of the components (MiB): "
                 + ", ".join(f"{p} {v / MiB:+.2f}" for p, v in over.items())))

# %% [markdown]
# A peak below the sum means the components are never all alive at once (the activations are gone before the
# optimizer touches its state). A peak above it is a transient no component names; the next cell says which
# policies have one here and why.

# %%
above = [p for p, v in over.items() if v > 0]
Markdown(("Peaks above the sum of components here: " + ", ".join(f"`{p}` ({over[p] / MiB:+.2f} MiB)" for p in above)
          + ". For `mixed-bf16` that is **memlab's runner**, not the policy: its master-weight step makes fp32 "
          "copies of the 16-bit gradients for the update and frees them after. Frameworks avoid or bound that copy: "
          "Megatron-LM keeps a persistent fp32 `main_grad` instead (the 18 and 20 B/param rows of chapter 02), "
          "DeepSpeed's bf16 and ZeRO-1/2 optimizers keep persistent fp32 gradient partitions (under ZeRO-3 it bounds "
          "the step's fp32 working set by `sub_group_size`), and FSDP2's `MixedPrecisionPolicy(reduce_dtype=fp32)` "
          "reduce-scatters straight into fp32 gradient shards, so \"master weights peak above fp32\" is not a rule.")
         if above else "No policy's peak lies above the sum of its components in this run.")

# %% [markdown]
# ### The weight copies, and which activations shrink
#
# Measured bytes per parameter of the autocast copies, and each activation category under `amp-bf16` as a
# fraction of fp32's. Autocast decides per op by three **op lists** `[pytorch-amp]`: ops that run in 16 bits
# (matmul, linear, conv, SDPA), ops autocast runs in fp32 (on CUDA softmax, log_softmax, layer_norm and the losses),
# and "promote" ops that cast their inputs to the widest dtype among them (on CUDA addcmul, addcdiv, dot,
# index_put, scatter_add and a few more; on a CPU also cat and stack). Ops on no list, such as add and mul, are left
# alone and follow ordinary type promotion. The lists differ by device: on a CPU softmax and layer norm stay in the
# input dtype. The estimator models both (`memlab.predict.memory.activations`), so the CPU
# measurement below is checked against the CPU lists, and section 2's verdict gives the CUDA estimate beside it.
#
# *Who keeps the copies alive.* Autocast's **cast cache** (`cache_enabled=True`, the default) keeps each weight's
# 16-bit copy from its first use until the outermost autocast context exits, so a weight used twice is cast once;
# the matmul's autograd node also *saves* that copy for backward. The cache alone ends with the forward; the saved
# tensor lasts until the backward has used it. `cache_enabled=False` drops the first (one cast per use), and
# checkpointing drops the second (chapter 04). FSDP2 with `param_dtype=bf16` casts each fp32 shard to bf16 for
# the all-gather, and that gathered bf16 parameter *is* the working copy: autocast does not cache another, and with
# `reshard_after_forward=True` it is freed after the forward and gathered again for the backward, so no copy is held
# from forward to backward.

# %%
copies_bpp = measured.loc["amp-bf16", "autocast weight copies"] / model.param_count()
display(Markdown(f"autocast weight copies: {copies_bpp:.3f} bytes per parameter "
                 f"(2 x {model.matmul_param_count() / model.param_count():.3f} of the parameters feed a matmul)"))
cats = pd.DataFrame({p: runs[p].activations_by_category for p in ("fp32", "amp-bf16", "bf16")}).fillna(0)
cats["amp-bf16 / fp32"] = cats["amp-bf16"] / cats["fp32"].where(cats["fp32"] > 0)
ch.save_table(cats.reset_index(names="category"), "activations_by_category")
cats.round(3)

# %% [markdown]
# The matmul inputs and outputs (attention, MLP) halve; the residual stream and the fp32 loss do not. On CUDA the
# attention scores go the other way: autocast runs softmax in fp32 and saves its fp32 output, and the P·V matmul
# then saves a bf16 *copy* of it, 6 bytes per score instead of fp32's 4. The weight copies come on top. Which term
# wins depends on the size: the copies grow with the matmul parameters, the activations with the tokens (b·s), the
# scores with b·s². The verdict table below is this page's small run; the cell after it sets the chapter's
# full-scale setup beside it.

# %%
verdict = pd.DataFrame({
    "component (amp-bf16 vs fp32)": ["params", "grads", "activations (tensors)", "activations + weight copies"],
    "seed 004 claims": ["-50%"] * 4,
    "measured": [measured.loc["amp-bf16", "params"] / measured.loc["fp32", "params"] - 1,
                 measured.loc["amp-bf16", "grads"] / measured.loc["fp32", "grads"] - 1,
                 measured.loc["amp-bf16", "activations (tensors)"] / measured.loc["fp32", "activations (tensors)"] - 1,
                 (measured.loc["amp-bf16", ["activations (tensors)", "autocast weight copies"]].sum()
                  / measured.loc["fp32", "activations (tensors)"] - 1)],
})
cuda = {p: estimate(model, Setup(batch=batch, seq=seq, precision=p), device_type="cuda") for p in ("fp32", "amp-bf16")}
cuda_copies = cuda["amp-bf16"].activation_detail.get("autocast weight copies", 0)
cuda_acts = {p: b.activations_bytes - (cuda_copies if p == "amp-bf16" else 0) for p, b in cuda.items()}
verdict["CUDA op lists (estimator)"] = [
    cuda["amp-bf16"].params_bytes / cuda["fp32"].params_bytes - 1,
    cuda["amp-bf16"].grads_bytes / cuda["fp32"].grads_bytes - 1,
    cuda_acts["amp-bf16"] / cuda_acts["fp32"] - 1,
    (cuda_acts["amp-bf16"] + cuda_copies) / cuda_acts["fp32"] - 1]
verdict = verdict.rename(columns={"measured": f"measured ({ch.device_type} op lists)"})
for c in verdict.columns[2:]:
    verdict[c] = verdict[c].map(lambda v: f"{v:+.0%}")
ch.save_table(verdict, "seed_verdict_amp")
verdict

# %%
FULL = dict(model_key="gpt2", batch=8, seq=1024)  # the chapter's full scale (SIZES["full"]), estimated for CUDA


def amp_change(model_key: str, batch: int, seq: int, attention: str = "eager") -> dict:
    """CUDA estimate of amp-bf16 against fp32 for one setup: activations, scores, copies (MiB) and the change."""
    fp32_attention = "efficient" if attention == "flash" else attention  # flash runs 16-bit inputs only
    b = {p: estimate(preset(model_key), Setup(batch=batch, seq=seq, precision=p,
                                              attention=fp32_attention if p == "fp32" else attention),
                     device_type="cuda") for p in ("fp32", "amp-bf16")}
    w = b["amp-bf16"].activation_detail.get("autocast weight copies", 0)
    acts = {p: x.activations_bytes - (w if p == "amp-bf16" else 0) for p, x in b.items()}
    return {"setup": f"{model_key}, b={batch}, s={seq}, {attention} attention"
                     + (f" (fp32: {fp32_attention})" if fp32_attention != attention else ""),
            "fp32 activations (MiB)": acts["fp32"] / MiB, "amp-bf16 activations (MiB)": acts["amp-bf16"] / MiB,
            "fp32 attention scores (MiB)": b["fp32"].activation_detail.get("attention scores", 0) / MiB,
            "amp-bf16 attention scores (MiB)": b["amp-bf16"].activation_detail.get("attention scores", 0) / MiB,
            "weight copies (MiB)": w / MiB,
            "activations, amp vs fp32 (%)": 100 * (acts["amp-bf16"] / acts["fp32"] - 1),
            "with the weight copies (%)": 100 * ((acts["amp-bf16"] + w) / acts["fp32"] - 1)}


scaling_rows = [amp_change(SIZES["model"], batch, seq), amp_change("gpt2", 1, 128), amp_change(**FULL),
                amp_change(**FULL, attention="flash")]
scaling = pd.DataFrame(scaling_rows).drop_duplicates("setup").set_index("setup")  # at full scale row 1 = row 3
ch.save_table(scaling.reset_index(), "amp_change_by_size_cuda_estimate")
full_eager, full_flash = scaling.loc[scaling_rows[2]["setup"]], scaling.loc[scaling_rows[3]["setup"]]
display(scaling.round(1))
Markdown(
    f"At the chapter's full-scale setup ({full_eager.name}), memlab's CUDA estimate puts the attention scores at "
    f"{full_eager['fp32 attention scores (MiB)']:,.0f} MiB in fp32 and "
    f"{full_eager['amp-bf16 attention scores (MiB)']:,.0f} MiB under autocast, so AMP "
    + ("*raises*" if full_eager["activations, amp vs fp32 (%)"] > 0 else "lowers")
    + f" the activations by {full_eager['activations, amp vs fp32 (%)']:+.1f} % "
    f"({full_eager['with the weight copies (%)']:+.1f} % with the weight copies). With a fused attention kernel "
    f"(last row) no s×s term is stored and AMP changes them by {full_flash['activations, amp vs fp32 (%)']:+.1f} "
    "%. So seed 004's \"−50 % for parameters, gradients and activations\" does not hold for `torch.autocast`: "
    "parameters and gradients change by 0 %, and activations shrink only where the ops run in 16 bits and no fp32 "
    "output is saved beside a 16-bit copy. Halving needs 16-bit weights (`mixed-*`, `bf16`), and then an fp32 "
    "master copy takes the saving back unless the optimizer state is in bf16 too.")

# %%
ch.cpu_note("step times and tokens/s on a CPU say nothing about tensor cores: whether bf16 beats fp32 here depends "
            "on the CPU's native bf16 instructions (avx512_bf16, AMX; chapter 00 section 2 reads them), not on "
            "bf16; the allocator peak column is empty without CUDA. The byte counts are exact.")

# %% [markdown]
# ## 3. Loss scaling: why fp16 needs a GradScaler and bf16 does not
#
# fp16 has 5 exponent bits: the smallest normal number is 2⁻¹⁴ ≈ 6.1 × 10⁻⁵, the smallest subnormal 2⁻²⁴ ≈ 6.0 × 10⁻⁸,
# the largest 65504. bf16 keeps fp32's 8 exponent bits (smallest normal ≈ 1.2 × 10⁻³⁸) with fewer mantissa bits
# `[kalamkar2019]`. The cell takes the fp32 parameter gradients of one fp32 step of the model at initialisation,
# multiplies them by a scale and casts them. That is a **proxy**: under AMP fp16 the `.grad` tensors are fp32 and
# never cast; what underflows is the fp16 *activation* gradients flowing through backward (Micikevicius et al.'s
# Fig. 3 is a histogram of those) and the fp16 outputs of the weight-gradient matmuls `[micikevicius2018]`, and
# gradients shrink as training proceeds; after the figure the proxy is set beside the real quantity. A scale
# below 1 is what dividing the loss by k accumulation micro-batches does to every gradient (a factor 1/k).

# %%
finfo = pd.DataFrame({n: {"exponent bits": {torch.float16: 5, torch.bfloat16: 8, torch.float32: 8}[d],
                          "smallest normal": torch.finfo(d).smallest_normal, "smallest subnormal":
                          torch.finfo(d).smallest_normal * torch.finfo(d).eps, "largest": torch.finfo(d).max}
                      for n, d in (("fp16", torch.float16), ("bf16", torch.bfloat16), ("fp32", torch.float32))})
both_grads = precision.step_gradients(model, batch=batch, seq=seq, seed=seed)  # one fp32 step, two kinds
grads = both_grads["parameters"]
survival = precision.cast_survival(grads, [2.0**-10, 1.0, 2.0**8, 2.0**16, 2.0**24])
ch.save_table(survival, "fp16_underflow")
display(finfo)
as_percent(survival, ["flushed to zero", "subnormal", "overflow to inf", "normal"], digits=3)

# %%
fig, ax = plt.subplots(figsize=(8, 4), layout="constrained")
for name, style in (("fp16", "-o"), ("bf16", "--s")):
    s = survival[survival["dtype"] == name]
    ax.plot(s["scale"], s["flushed to zero"] * 100, style, label=f"{name}: flushed to zero")
    ax.plot(s["scale"], s["overflow to inf"] * 100, style, alpha=0.5, label=f"{name}: overflow to inf")
f16 = survival[survival["dtype"] == "fp16"]
ax.plot(f16["scale"], f16["subnormal"] * 100, ":", label="fp16: subnormal (precision lost)")
ax.set_xscale("log", base=2)
ax.set(xlabel="scale applied to the gradients (loss scale)", ylabel="% of nonzero fp32 gradient values",
       title=f"Real gradients of {model.name} cast to 16 bits: what a scale saves and what it breaks\n"
             f"{grads.numel():,} gradient values, measured on {ch.device}")
ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
ch.save_figure(fig, "fp16_underflow")

# %% [markdown]
#
# %%
at = survival.set_index(["dtype", "scale"])
u = {n: torch.finfo(d).eps / 2 for n, d in (("fp16", torch.float16), ("bf16", torch.bfloat16))}
bf16_rows = survival[survival["dtype"] == "bf16"]
Markdown(
    f"Unscaled, fp16 flushes {at.loc[('fp16', 1.0), 'flushed to zero']:.3%} of these gradients to zero and makes "
    f"{at.loc[('fp16', 1.0), 'subnormal']:.2%} subnormal; at 2¹⁶, {at.loc[('fp16', 2.0**16), 'normal']:.2%} are "
    f"normal; at 2²⁴, {at.loc[('fp16', 2.0**24), 'overflow to inf']:.2%} overflow. bf16 flushes at most "
    f"{bf16_rows['flushed to zero'].max():.3%} and overflows at most "
    f"{bf16_rows['overflow to inf'].max():.3%} at any scale here, but it rounds every "
    f"value to 8 significant bits: a relative error up to {u['bf16']:.2%} per cast, against fp16's "
    f"{u['fp16']:.3%} in its normal range (half the gap between 1 and the next number, torch.finfo(...).eps / 2).")

# %% [markdown]
# The quantity AMP really keeps in fp16, the gradients flowing between ops in backward
# (`memlab.labs.precision.activation_gradients`: every Attention, MLP and Block output's gradient of the same step),
# cast the same way at scale 1, beside the proxy:

# %%
act_grads = both_grads["activations"]
both = pd.concat([precision.cast_survival(grads, [1.0], ("fp16",)).assign(tensors="parameter .grad (the proxy)"),
                  precision.cast_survival(act_grads, [1.0], ("fp16",)).assign(tensors="activation gradients")])
ch.save_table(both, "fp16_underflow_activation_grads")
lost = both.set_index("tensors")[["flushed to zero", "subnormal"]].sum(axis=1)
display(as_percent(both[["tensors", "flushed to zero", "subnormal", "normal"]],
                   ["flushed to zero", "subnormal", "normal"], digits=3))
Markdown(f"At initialisation the activation gradients lose {lost['activation gradients']:.2%} to zero or subnormal "
         f"in fp16, the parameter gradients {lost['parameter .grad (the proxy)']:.2%}: "
         + ("the proxy overstates" if lost["activation gradients"] < lost["parameter .grad (the proxy)"] else
            "the proxy understates")
         + " what this untrained model's backward loses. Both shrink as training proceeds (Micikevicius et al.'s "
           "Fig. 3 is from a trained network), which is why the scaler keeps searching.")

# %% [markdown]
# `GradScaler` looks for that window at run time: it starts high, halves the scale and *skips the step* whenever a
# gradient is inf/NaN, and doubles it after `growth_interval` clean steps. Here with a deliberately high start and a
# short interval:

# %%
traj = precision.scaler_trajectory(model, steps=SIZES["scaler_steps"], init_scale=2.0**24, growth_interval=3,
                         batch=batch, seq=seq, seed=seed, device=ch.device)
ch.save_table(traj, "grad_scaler_trajectory")
print(f"{int(traj['skipped'].sum())} of {len(traj)} steps skipped; scale {traj['scale used'].iloc[0]:.0f} -> "
      f"{traj['scale after update'].iloc[-1]:.0f}")
traj

# %% [markdown]
# Skipped steps leave the *parameters* unchanged (the loss is flat here only because the same batch is replayed). Two
# rules the scaler does not enforce. Clip gradients only after `scaler.unscale_(optimizer)`: before it, the gradients
# are still multiplied by the scale, so `clip_grad_norm_(..., 1.0)` clips at 1 × scale, and `scaler.step` knows not to
# unscale twice. And the scaler scales the *loss*, so it protects the backward only: an fp16 *forward* overflow
# (attention logits or activations beyond 65504, common in large models) is inf before any scale applies, which is why
# bf16, with fp32's range, became the default for training. Seed 004's AMP-NaN row advises tuning `growth_interval`
# and `backoff_factor`; they only change how fast this search runs. With bf16 there is nothing to search: use
# `torch.autocast(device, dtype=torch.bfloat16)` without a scaler. Its "force fp32 for LayerNorm with `custom_fwd`" is
# what autocast's op lists already do on CUDA (layer_norm is in the fp32 list).

# %% [markdown]
# ### Why master weights exist: update precision, not range
#
# bf16 has fp32's range, so range is not why `mixed-bf16` keeps an fp32 master copy. Precision is: the update
# w + η·g is rounded back to 16 bits, and when |η·g| is below half a unit in the last place of w it is lost, every
# step. `memlab.labs.precision.update_swamping` adds the same small update to a weight of 1.0, step after step:

# %%
SWAMP_UPDATE, SWAMP_STEPS = 2.0**-12, 500
swamp = precision.update_swamping(weight=1.0, update=SWAMP_UPDATE, steps=SWAMP_STEPS)
ch.save_table(swamp, "update_swamping")
fig, ax = plt.subplots(figsize=(7.5, 3.8), layout="constrained")
for col, style in zip([c for c in swamp.columns if c != "step"], ("-", "--", ":"), strict=True):
    ax.plot(swamp["step"], swamp[col], style, lw=2, label=col)
ax.set(xlabel="optimizer step", ylabel="weight value",
       title=f"{SWAMP_STEPS:,} updates of +2⁻¹² to a weight of 1.0: kept in fp32, or rounded to 16 bits each step\n"
             "(torch's round-to-nearest casts, the same on any device)")
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
ch.save_figure(fig, "update_swamping")
last = swamp.iloc[-1]
Markdown(f"After {SWAMP_STEPS:,} steps the fp32 master holds {last['fp32 master']:.4f}; the bf16 weight holds "
         f"{last['bf16 weight']:.4f} and the fp16 weight {last['fp16 weight']:.4f}: every update was below half "
         "their last place at 1.0 and was rounded away. Pure 16-bit training needs a fix for this: an fp32 master "
         "copy (4 B/param), Kahan-compensated summation or stochastic rounding.")

# %% [markdown]
# ## 4. The seed's code, on torch 2.13
#
# `torch.cuda.amp.autocast()` and `torch.cuda.amp.GradScaler()` still run, with a `FutureWarning` each (and, on a
# machine without CUDA, a second warning that they disable themselves):

# %%
warn = precision.deprecated_amp_calls()
ch.save_table(warn, "deprecated_amp_warnings")
warn.drop(columns="torch.amp form")  # the replacement is spelled out below

# %% [markdown]
# The seed's loop in the `torch.amp` form (device-generic; drop the scaler for bf16):
#
# ```python
# scaler = torch.amp.GradScaler("cuda")
# with torch.autocast("cuda", dtype=torch.float16):
#     loss = loss_fn(model(data), target)
# scaler.scale(loss).backward()
# scaler.step(optimizer)
# scaler.update()
# ```

# %% [markdown]
# ## 5. Tensor-core shapes (CUDA)
#
# **Tensor cores** are the GPU units that multiply small 16-bit (and tf32, fp8) tiles per instruction. Since cuBLAS
# 11 they are used for any shape; dimensions that are multiples of 8 elements (16 bytes) run most efficiently, and
# on A100/H100 NVIDIA's *Matrix Multiplication Background* guide recommends multiples of 64 (128 B); other shapes
# still use tensor cores, less efficiently (alignment of vector loads, tile and wave quantisation)
# `[nvidia-matmul-guide]`. **FP8** (Ada, such as the L40S and L4, Hopper and later: e4m3/e5m2, with per-tensor
# scales, as in NVIDIA's Transformer Engine; block-scaled MXFP8 on Blackwell) doubles the tensor-core rate again
# over bf16 (the table below). On a GPU the cell times `n x n` bf16 matmuls for `n` a multiple of 8 and one off it.

# %%
if not ch.on_cpu:
    sizes = [4096, 4095, 4104, 8192, 8191]
    tc = matmul_flops_per_s([(n, n, n) for n in sizes], dtypes=("bf16", "fp16"), device=ch.device, scale=ch.scale)
    tc["multiple of 8"] = tc["m"] % 8 == 0
    ch.save_table(tc, "tensor_core_shapes")
    display(tc[["dtype", "m", "multiple of 8", "flops_per_s"]])
else:
    display(ch.cpu_note("tensor cores are a GPU unit: the multiple-of-8 effect (and fp8's 2x) can only be "
                        "measured on CUDA, which this cell does when the chapter runs there. Below instead: the "
                        "vendors' published dense peaks (memlab's hardware table, each row's source beside it)."))
    rows = []
    for key in ("a100-80gb-sxm", "h100-sxm", "mi300x"):
        g = gpu(key)
        row = {"card": g.name, "fp32, no tensor cores (TFLOP/s)": g.peak("fp32") / 1e12,
               "bf16 tensor cores (TFLOP/s)": g.peak("bf16") / 1e12,
               "bf16 / fp32": g.peak("bf16") / g.peak("fp32"),
               "fp8 / bf16": round(g.peak("fp8") / g.peak("bf16"), 1) if g.peak("fp8") else "no fp8 units",
               "source": g.source}
        rows.append(row)
    published = pd.DataFrame(rows)
    ch.save_table(published, "tensor_core_peaks_published")
    display(published.drop(columns="source").round(1))
    display(Markdown("Sources: " + "; ".join(f"{c}: {src}" for c, src in zip(published["card"], published["source"],
                                                                           strict=True)) + "."))
    fp8 = published["fp8 / bf16"][published["fp8 / bf16"].map(lambda v: isinstance(v, float))]
    display(Markdown(f"Published, not measured: 16-bit tensor cores run {published['bf16 / fp32'].min():.0f}x to "
                     f"{published['bf16 / fp32'].max():.0f}x the fp32 rate on these cards, and fp8 "
                     f"{fp8.min():.1f}x the bf16 rate where the card has it."))

# %% [markdown]
# ## Seed claims, answered

# %%
flush = survival.query("scale == 1.0").set_index("dtype")["flushed to zero"]
amp_params = measured.loc["amp-bf16", "params"] / measured.loc["fp32", "params"] - 1
mixed_states = runs["mixed-bf16"].model_state_bytes() / runs["fp32"].model_state_bytes() - 1
ch.seed_claims([
    {"#": 7, "claim": "mixed precision halves parameter and gradient memory [seed-000]",
     "verdict": "does not hold for AMP; holds for 16-bit weights, whose master copy takes it back",
     "number": f"amp-bf16 params {amp_params:+.0%}; mixed-bf16 model states {mixed_states:+.0%}"},
    {"#": 37, "claim": "torch.cuda.amp code; AMP −50 % params/grads/activations [seed-004]",
     "verdict": "does not hold; the API is deprecated",
     "number": f"params and grads {verdict.loc[0, verdict.columns[2]]} / {verdict.loc[1, verdict.columns[2]]}; "
               f"activations + weight copies: {verdict.loc[3, verdict.columns[2]]} on this page's "
               f"{batch * seq}-token run ({ch.device_type} op lists), "
               f"{full_eager['with the weight copies (%)']:+.1f} % at {full_eager.name} (CUDA estimate: fp32 "
               "softmax output + bf16 copy), "
               f"{full_flash['with the weight copies (%)']:+.1f} % there with flash attention"
               f"; {int((warn['warning'] == 'FutureWarning').sum())} FutureWarnings"},
    {"#": 46, "claim": "AMP NaN: tune GradScaler, force fp32 with custom_fwd [seed-004]",
     "verdict": "holds for fp16; bf16 needs no scaler",
     "number": f"at scale 1 fp16 flushes {flush['fp16']:.2%} of gradients to zero, bf16 {flush['bf16']:.2%}"},
    {"#": 28, "claim": "FP8 ≈ 2x [seed-001]", "verdict": "not measured here (needs tensor cores)",
     "number": "section 5 runs on CUDA only"},
])

# %%
recorded = ch.recorded("03_mixed_precision_gpu")
recorded  # the GPU run recorded by scripts/gpu_session.sh, where the repo has one (nothing shows otherwise)

# %%
ch.published("03")

# %% [markdown]
# ## Exercises
#
# **Exercise 2.** torch's `GradScaler` with its default settings runs 6,000 steps without an inf/NaN gradient,
# then one step with one. What is its scale after that?

# %%
answer = ...
check("03.scaler-scale", answer, clean_steps=6000, overflows=1)

# %% [markdown]
# **Exercise 3.** A gradient value of 2⁻³⁰ (about 9.3 × 10⁻¹⁰) is cast to fp16 after multiplying the loss by a scale
# 2ᵏ. What is the smallest whole k that makes it a *normal* fp16 number (not subnormal, not zero)?

# %%
answer = ...
check("03.scale-exponent", answer, gradient_exponent=-30)

# %% [markdown]
# **Exercise 4.** In pure `bf16` training (no fp32 master copy), a weight equal to 1.0 gets an update of
# 2⁻⁹ (about 0.00195). What is the weight after the update, stored in bf16?

# %%
answer = ...
check("03.bf16-update", answer, update_exponent=-9)

# %% [markdown]
# ## Summary
#
# - `torch.autocast` keeps fp32 weights and gradients: 16 B/param with AdamW, like fp32, plus 2 bytes per matmul
#   parameter of bf16 weight copies held from forward to backward.
# - Activations shrink only for ops autocast runs in 16 bits; the residual stream and the loss stay fp32.
# - Halving weights and gradients needs 16-bit weights; an fp32 master copy and fp32 moments keep the total at 16.
# - fp16 flushes small gradients to zero: a loss scale (GradScaler) moves them into range and backs off on
#   overflow; bf16 has fp32's range and needs none, but rounds every value to 8 significant bits.
# - Master weights exist for update precision: an update below half a unit in the last place of a 16-bit weight
#   is lost every step; an fp32 copy keeps it. Clip only after `scaler.unscale_`.
# - `torch.cuda.amp.*` is deprecated (FutureWarning); write `torch.amp.autocast("cuda", ...)` and
#   `torch.amp.GradScaler("cuda")`.

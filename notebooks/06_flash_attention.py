# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 · FlashAttention: the s² term that disappears, and the work that does not
#
# **The common belief.** "Flash Attention avoids storing the full attention matrix: activation memory goes from
# O(N²) to O(N)" (seed 000, `[seed-000]`), and "for a 2048-token sequence the attention matrix needs about
# 2048 × 2048 × dtype size" (seed 004, `[seed-004]`).
#
# Both are about the *score matrix*. This chapter measures what the reference GPT keeps for backward with each
# attention kernel, against sequence length, and puts it next to the prediction:
#
# 1. the formula: the b × a × s² probabilities eager attention keeps, and what a fused kernel keeps instead;
# 2. the experiment: eager (softmax(QKᵀ) written out) vs the SDPA backends this machine runs, against seq;
# 3. the log-log slope, from the measurements: 2 for eager, 1 for flash;
# 4. FLOPs: the same forward, and a backward that recomputes QKᵀ [dao2022];
# 5. seed 004's 2048² × dtype, for a real model; the longest sequence that fits.

# %% tags=["parameters"]
scale = "auto"
device = "auto"
seed = 0
out_dir = "../reports/build/06_flash_attention"

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from memlab import (
    Setup,
    attention_hbm_bytes,
    available_attention,
    chapter,
    check,
    estimate,
    ledger,
    matmul_flops,
    max_seq,
    megatron_iteration_flops,
    preset,
    run_step,
    trace_gpt,
)
from memlab.course.chapter import as_percent
from memlab.units import GiB, MiB

ch = chapter(scale, device, seed, out_dir)
SIZES = {  # what the scale changes: the one-layer model, the sequence lengths, the kernels traced in section 5
    "ci": dict(model="tiny-gpt", seqs=[128, 256, 512, 1024], traced=("eager",)),
    "full": dict(model="gpt2", seqs=[1024, 2048, 4096, 8192], traced=("eager", "flash")),
}[ch.scale]
ON_DEVICE = {  # what the device changes: the precision (and the dtype the kernels are probed in), steps per run
    "cpu": dict(precision="fp32", dtype=torch.float32, steps=1),
    "cuda": dict(precision="amp-bf16", dtype=torch.bfloat16, steps=3),
}[ch.device_type]
ch

# %% [markdown]
# ## 1. The formula
#
# Eager attention keeps the softmax probabilities for backward: b × a × s² numbers per layer (a = query heads).
# A fused kernel (FlashAttention, memory-efficient, cuDNN) keeps q, k, v, its output and one fp32 log-sum-exp per
# row, b × a × s numbers: the s² tensor is never written to memory, and backward rebuilds it block by block
# [dao2022]. `memlab.predict.activations` counts both, term by term.

# %%
cuda = ch.device_type == "cuda"
layer = preset(SIZES["model"]).with_(n_layers=1, max_seq=8192)
precision, seqs = ON_DEVICE["precision"], SIZES["seqs"]
backends = available_attention(ch.device, dtype=ON_DEVICE["dtype"])


def predicted_attention(attention: str, s: int) -> dict[str, float]:
    """The estimate's attention categories (bytes kept for backward) for one layer at ``s`` tokens, batch 1."""
    b = estimate(layer, Setup(batch=1, seq=s, precision=precision, attention=attention), device_type=ch.device_type)
    return {k: v for k, v in b.activation_detail.items() if k.startswith("attention")}


formula = pd.DataFrame([{"kernel": a, "seq": s, **{f"{k} (B)": v for k, v in predicted_attention(a, s).items()}}
                        for a in backends for s in (seqs[0], seqs[-1])]).fillna(0)
print(f"{layer.name} with one layer: h={layer.d_model}, a={layer.n_heads}; attention kernels here: {backends}")
formula

# %% [markdown]
# **Exercise 1 (predict before you measure).** Doubling the sequence from 512 to 1024 tokens, by what factor
# grows what *eager* attention keeps in the `attention scores` category? Answer before the next cell runs.

# %%
def predicted_scores(s: int) -> float:
    """Eager attention's predicted ``attention scores`` bytes at ``s`` tokens (the measurement below checks it)."""
    return predicted_attention("eager", s)["attention scores"]


# %%
answer = ...
check("06.eager-growth", answer, scores=predicted_scores)

# %% [markdown]
# ## 2. The experiment
#
# `memlab.run.runner.run_step` trains the one-layer GPT for a step with each kernel and records every tensor
# autograd saves (storage by storage, `memlab.measure.accounting.SavedTensorRecorder`), by category.

# %%
measurements = {}
for a in backends:
    for s in seqs:
        counted = s == seqs[-2]
        measurements[(a, s)] = run_step(layer, Setup(batch=1, seq=s, precision=precision, attention=a), ch.device,
                                        steps=ON_DEVICE["steps"], with_counted_flops=counted, with_mfu=cuda)
runs = pd.DataFrame([{"attention": a, "seq": s,
                      "attention scores": m.activations_by_category.get("attention scores", 0),
                      "attention core + projections": m.activations_by_category.get("attention", 0),
                      "all saved": m.activations_bytes, "cuda peak": m.cuda_peak_allocated_bytes,
                      "step s": m.step_time_s} for (a, s), m in measurements.items()])
runs["attention total"] = runs["attention scores"] + runs["attention core + projections"]
ch.save_table(runs, "saved_vs_seq")
runs.pivot_table(index="seq", columns="attention", values="attention total")

# %%
ch.cpu_note("these are exact saved-tensor bytes; a CPU has no allocator peak, no HBM traffic and no kernel timing "
            "worth comparing, so the peak, step time and HFU rows come from a CUDA run (recorded data below).")

# %% [markdown]
# ## 3. Prediction vs measurement, and the slope
#
# The ledger compares every category of every run with the estimate of its setup; the slope is fitted to the
# measured attention bytes over the longest sequences, on log-log axes.

# %%
rows = ledger([(layer, m) for m in measurements.values()], activations_detail=True)
acts = rows[rows["component"].str.startswith("activations")]
ch.record_ledger(acts)
print(f"{len(acts)} activation rows, largest |relative error| {acts['rel_error'].abs().max():.2%}")


def slope(attention: str, column: str = "attention total", last: int = 3) -> float:
    """Least-squares slope of log(bytes) against log(seq) over the ``last`` longest sequences (measured)."""
    part = runs[runs["attention"] == attention].sort_values("seq").tail(last)
    return float(np.polyfit(np.log(part["seq"]), np.log(part[column]), 1)[0])


slopes = pd.DataFrame({"attention": backends, "log-log slope (measured)": [slope(a) for a in backends],
                       "slope of the score tensors alone": [
                           slope(a, "attention scores") if runs.loc[runs["attention"] == a, "attention scores"].all()
                           else float("nan") for a in backends]})
ch.save_table(slopes, "slopes")
slopes.round(2)

# %%
fig, ax = plt.subplots(figsize=(6.5, 4))
for i, a in enumerate(backends):
    part = runs[runs["attention"] == a]
    pred = [sum(predicted_attention(a, s).values()) for s in part["seq"]]
    ax.plot(part["seq"], pred, color=f"C{i}", alpha=0.5, label=f"{a}: predicted")
    ax.scatter(part["seq"], part["attention total"], color=f"C{i}", marker="ox+sd"[i % 5],
               label=f"{a}: measured (slope {slope(a):.2f})")
ax.set_xscale("log", base=2)
ax.set_yscale("log", base=2)
ax.set_xlabel("sequence length s (tokens)")
ax.set_ylabel("bytes kept for backward by attention (1 layer)")
ax.set_title(f"{layer.name}, 1 layer, batch 1, {precision}: attention memory vs s")
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
ch.save_figure(fig, "attention_vs_seq")

# %% [markdown]
# Eager and SDPA's math backend keep the same bytes here (fp32 on a CPU: the math backend's upcast is a no-op),
# so their points coincide. The total's slope is below 2 at these lengths because q, k, v and the output grow
# linearly; the score tensors alone grow with slope 2.
#
# **The misreading.** "O(N²) → O(N)" is right for the score matrix and for what attention keeps, not for the
# whole model: the MLP, norms and projections' inputs were linear in s already, and the fused kernel still keeps
# q, k, v and its output. The s² share of everything saved grows with s / h (Korthikanti et al.'s 5as/h term
# [korthikanti2022]); the table gives it for this layer, per kernel.

# %%
share = runs.assign(share=runs["attention scores"] / runs["all saved"]).pivot_table(
    index="seq", columns="attention", values="share")
as_percent(share).rename_axis(columns="attention scores' share of all saved bytes, per kernel")

# %% [markdown]
# ## 4. FLOPs: equal forward, more backward
#
# `torch.utils.flop_counter.FlopCounterMode` counts one step at the second-longest sequence. The model FLOPs (the MFU
# numerator, `memlab.predict.flops`) are the same for every kernel; the flash backward recomputes QKᵀ, so its
# hardware FLOPs (HFU) are higher.

# %%
s2 = seqs[-2]
model_flops = megatron_iteration_flops(layer, 1, s2, "none")
fl = pd.DataFrame([{"attention": a, "counted FLOPs (fwd+bwd)": measurements[(a, s2)].counted_flops_per_step,
                    "model FLOPs": model_flops,
                    "QK^T of one forward": matmul_flops(s2, s2, layer.d_model)}
                   for a in backends])
fl["counted - model"] = fl["counted FLOPs (fwd+bwd)"] - fl["model FLOPs"]
fl["extra / QK^T"] = fl["counted - model"] / fl["QK^T of one forward"]
if cuda:
    fl["step s"] = [measurements[(a, s2)].step_time_s for a in backends]
    fl["HFU"] = [measurements[(a, s2)].hfu for a in backends]
ch.save_table(fl, "flops")
fl

# %% [markdown]
# The extra work of the fused kernels' backward is one QKᵀ per layer (`extra / QK^T` = 1): the price of never
# storing the probabilities. On a GPU it is cheaper than reading them back from HBM; the time and HFU columns of a
# CUDA run show by how much. Seed 001's "FA-2/3 lift attention utilisation from under 20 % to over 50 %" is a
# GPU-kernel claim: this chapter measures it only on CUDA.

# %% [markdown]
# What the recompute buys is HBM traffic. The FlashAttention paper's IO count (`memlab.predict.attention_io`,
# [dao2022] Theorem 2: Θ(N²d²/M) against Θ(N² + Nd)) for one layer in bf16 at batch 1, with the A100's 192 KB of
# SRAM per SM as M: GPT-2 medium's heads of 64 (the paper's Fig. 2 model) and Llama-2-7B's heads of 128. The
# saving shrinks as d² approaches M; the memory saving of section 3 does not depend on it. Predicted only:
# torch's profiler does not report bytes per kernel (Nsight Compute does).

# %%
llama = preset("llama-2-7b")
io = pd.DataFrame([{"model": cfg.name, "seq": n, **{
    f"{k} (MiB)": attention_hbm_bytes(1, cfg.n_heads, n, cfg.head_dim, kernel=k) / MiB
    for k in ("standard", "flash")}} for cfg in (preset("gpt2-medium"), llama) for n in (1024, 4096)])
io["standard / flash"] = io["standard (MiB)"] / io["flash (MiB)"]
ch.save_table(io, "hbm_traffic_predicted")
io.round(1)

# %% [markdown]
# ## 5. Seed 004's 2048² × dtype, for a real model
#
# For Llama-2-7B at batch 1 and 2048 tokens with bf16 weights (mixed-bf16), the seed's figure against what eager
# attention keeps in all layers:

# %%
seed_fig = 2048 * 2048 * 2
real = estimate(llama, Setup(batch=1, seq=2048, precision="mixed-bf16")).activation_detail["attention scores"]
pd.DataFrame({"bytes": [seed_fig, real], "MiB": [seed_fig / MiB, real / MiB]},
             index=["seed 004: 2048² × 2 B", f"eager, {llama.n_heads} heads × {llama.n_layers} layers, batch 1"])

# %% [markdown]
# **Exercise 2.** By what factor does the seed's 2048² × 2 B undercount what eager attention keeps in the
# `attention scores` category for Llama-2-7B (mixed-bf16) at batch 4 and 4096 tokens?

# %%
answer = ...
check("06.seed-undercount-b4", answer)

# %% [markdown]
# **Exercise 3 (predict, then search).** Llama-2-7B, mixed-bf16 AdamW, ZeRO-3 over 8 H100-SXM (memlab's table
# capacity), batch 1, no recompute: what is the longest sequence that the estimator's fit search (`max_seq`) says
# fits with *eager* attention? Guess first; the cell after runs the search, and the trace after it checks it.

# %%
fit_setup = Setup(batch=1, precision="mixed-bf16", attention="eager", zero_stage=3, world_size=8)

# %%
answer = ...
check("06.eager-max-seq", answer, setup=fit_setup, card="h100-sxm")

# %%
fit = pd.DataFrame([{"attention": a, **max_seq(llama, fit_setup.with_(attention=a), "h100-sxm",
                                               limit=1 << 17).to_dict()} for a in ("eager", "flash")])
fit[["attention", "value", "reason"]]

# %% [markdown]
# The fit search adds the estimator's terms. `memlab.tracing` runs the reference GPT's real step at the answer, at
# full size, on fake tensors: FSDP2 over a fake 8-rank process group (`memlab.tracing.fake_dist`), rank 0's bytes,
# nothing allocated. At ci scale it traces the eager answer (about 5 s); at full scale both.

# %%
confirm = []
for a in SIZES["traced"]:
    row = fit.set_index("attention").loc[a]
    s6 = fit_setup.with_(attention=a, seq=int(row["value"]))
    t = trace_gpt(llama.with_(max_seq=s6.seq), s6)  # rotary positions: max_seq is only the preset's bound
    confirm.append({"attention": a, "seq": s6.seq, "predicted peak GiB": estimate(llama, s6).peak_bytes / GiB,
                    "traced peak GiB": t.peak_bytes / GiB, "traced peak in": f"{t.peak_step} {t.peak_phase}",
                    "card GiB": row["capacity_bytes"] / GiB, "fits (traced)": t.peak_bytes <= row["capacity_bytes"]})
confirm = pd.DataFrame(confirm)
confirm["traced vs predicted"] = confirm["traced peak GiB"] / confirm["predicted peak GiB"] - 1
ch.save_table(confirm, "fit_search_traced")
print("the estimator's own caveat: " + next((n for n in estimate(llama, s6).assumptions if "gathered" in n), "none"))
confirm.round(3)

# %% [markdown]
# Where the traced peak is above the card, the fit search's answer is optimistic: FSDP2 holds the parameters it
# gathers (the root module's, the running block's) and its all-gather buffers next to the step's own bytes, which
# the estimate counts only when told how many blocks are gathered (`Overheads(gathered_layers=...)`, chapter 05).
# The trace needs no such assumption: search with it when the answer is within a few per cent of the card.

# %%
recorded = ch.recorded("06_flash_attention_gpu")
recorded if recorded is not None else "No GPU measurements for this chapter are recorded in data/recorded/ yet."

# %% [markdown]
# **Exercise 4.** From 1024 to 8192 tokens, by what factor grows *everything* eager attention keeps for this
# chapter's one-layer model (all its `attention` categories, as `predicted_attention` counts them), not only the
# scores?

# %%
answer = ...
check("06.attention-growth", answer, attention=predicted_attention)

# %% [markdown]
# ## Summary
#
# - Measured, eager attention and SDPA's math backend keep the b × a × s² probabilities (slope → 2); the flash
#   kernel keeps q, k, v, its output and one fp32 number per row (slope 1). The prediction matches byte for byte.
# - Seed 000's "O(N²) → O(N)" holds for the attention score matrix and for what attention keeps; the rest of the
#   model's activations were linear in s already.
# - The fused backward recomputes QKᵀ: equal model FLOPs, one more QKᵀ per layer of hardware FLOPs.
# - Seed 004's 2048² × dtype is one head of one layer: Llama-2-7B keeps heads × layers times more at batch 1
#   (section 5's table), and batch times that; under CUDA autocast the fp32 probabilities triple it again.

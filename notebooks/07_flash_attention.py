# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 · FlashAttention: the s² term that disappears, and the work that does not
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
# 4. FLOPs: the same forward, and a backward that recomputes QKᵀ [dao2022]; the paper's measured GPU figures;
# 5. HBM traffic: the paper's IO model for the forward, beside its measured forward + backward;
# 6. which kernel SDPA picks, and how an explicit mask brings the s² term back on a GPU;
# 7. seed 004's 2048² × dtype, for a real model; the longest sequence that fits.

# %% tags=["parameters"]
scale = "auto"
device = "auto"
seed = 0
out_dir = "../reports/build/07_flash_attention"

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from IPython.display import Markdown

from memlab import (
    Setup,
    attention_hbm_bytes,
    available_attention,
    chapter,
    check,
    estimate,
    gpu,
    ledger,
    matmul_flops,
    max_seq,
    megatron_iteration_flops,
    preset,
    run_step,
    trace_gpt,
)
from memlab.course.chapter import as_percent
from memlab.predict.fit import ALLOCATED_ONLY
from memlab.units import GB, GiB, MiB

ch = chapter(scale, device, seed, out_dir, ci_threads=1)  # tiny models on a shared machine: 1 thread
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
# A fused kernel keeps q, k, v, its output and one fp32 *log-sum-exp* per row, b × a × s numbers: the s² tensor is
# never written to memory, and backward rebuilds it block by block [dao2022]. One number per row suffices because
# a softmax row is exp(sᵢⱼ − LSEᵢ) with LSEᵢ = log Σⱼ exp(sᵢⱼ): from q, k and LSEᵢ the backward recomputes every
# probability exactly, without the row's maximum or sum. `memlab.predict.memory.activations` counts both, term by term.
# That is what this CPU's kernels keep (measured below, and "fused" here is torch's
# `_scaled_dot_product_flash_attention_for_cpu`, not Dao's CUDA kernel). CUDA kernels keep a little more: the
# memory-efficient kernel pads its log-sum-exp to a multiple of 32 rows, the flash kernel also saves a random
# seed and offset for dropout, cuDNN its own statistics.

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
check("07.eager-growth", answer, scores=predicted_scores)

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
ch.cpu_note("these are exact saved-tensor bytes of this CPU's kernels; a CPU has no allocator peak, no HBM traffic "
            "and no kernel timing worth comparing, and no CUDA run of this chapter is recorded: the GPU evidence "
            "on this page is the FlashAttention papers' published figures (section 4).")

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
# q, k, v and its output. The s² share of everything saved grows with a·s/h = s / d_head (d_head = h / a, the
# width of one head): Korthikanti et al. count it as 5as/h bytes per token per h [korthikanti2022], the 2-byte
# probabilities plus dropout's 1-byte mask and 2-byte output; the reference GPT has no dropout, so its term is
# 2as/h in 16 bits (4as/h in fp32, as here). The table gives the share for this layer, per kernel.

# %%
share = runs.assign(share=runs["attention scores"] / runs["all saved"]).pivot_table(
    index="seq", columns="attention", values="share")
as_percent(share).rename_axis(columns="attention scores' share of all saved bytes, per kernel")

# %% [markdown]
# ## 4. FLOPs: equal forward, more backward
#
# `torch.utils.flop_counter.FlopCounterMode` counts one step at the second-longest sequence. Plain FlopCounterMode
# has no formula for the CPU's fused attention kernels and counts them as 0 (the cell prints it); memlab gives the
# counter torch's own SDPA formulas for them (`sdpa_flop_count`, and `sdpa_backward_flop_count`, whose first step
# recomputes the scores; `memlab.run.runner`), so for the fused kernels the count below is that formula applied to
# the shapes that ran, not an observation of the kernel. The *model FLOPs* (the
# arithmetic the model needs, the numerator of MFU, model FLOPs utilisation, chapter 08; `memlab.predict.compute.flops`)
# are the same for every kernel. The flash backward recomputes QKᵀ, so its *hardware FLOPs* (what the device
# executes), and so its HFU (hardware FLOPs utilisation), are higher.

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
q_ = torch.randn(1, 4, 64, 16, requires_grad=True)
with torch.utils.flop_counter.FlopCounterMode(display=False) as plain_counter:
    torch.nn.functional.scaled_dot_product_attention(q_, q_, q_, is_causal=True).sum().backward()
print(f"plain FlopCounterMode on one CPU SDPA call, forward + backward: {plain_counter.get_total_flops():,} FLOPs")
fl

# %%
extra = fl.set_index("attention")["extra / QK^T"]
Markdown(f"**Reading it (computed).** By torch's SDPA backward formula, which memlab assigns to the CPU kernel, the "
         f"fused kernels' backward does {extra.max():.2f} extra QKᵀ per layer (`extra / QK^T`), the unfused ones "
         f"{extra.min():.2f}: the price of never storing the probabilities. The CPU kernel's source does recompute "
         "the scores in its backward, but this count is a formula, not an observation. Whether that buys time is a "
         "GPU question, answered below by the papers' measurements, not by this CPU.")

# %% [markdown]
# **The GPU evidence: the papers' measurements** (outside memlab; none of it is reproduced on this CPU). Seed 001
# says FA-2/3 lift attention's utilisation "from under 20 % to over 50 %" [seed-001]; the papers' own figures:

# %%
FA_PAPERS = pd.DataFrame([  # each row as its paper states it
    ("FlashAttention [dao2022] Fig. 2", "GPT-2 medium attention, s 1024, A100, fwd + bwd",
     "standard 41.7 ms, 66.6 GFLOP, 40.3 GB HBM R/W; FlashAttention 7.3 ms, 75.2 GFLOP, 4.4 GB"),
    ("FlashAttention-2 [dao2023]", "forward + backward kernels, A100", "FlashAttention-1 reaches 25-40 % of peak "
     "FLOP/s; FlashAttention-2 50-73 %"),
    ("FlashAttention-3 [shah2024]", "FP16 forward, H100 SXM5", "up to 740 TFLOP/s, 75 % of the peak"),
], columns=["source", "what was measured", "figure"])
FA_PAPERS

# %%
fig2 = {"standard": {"GFLOP": 66.6, "HBM GB": 40.3, "ms": 41.7}, "flash": {"GFLOP": 75.2, "HBM GB": 4.4, "ms": 7.3}}
UTIL = {"FlashAttention-1": (0.25, 0.40), "FlashAttention-2": (0.50, 0.73), "FlashAttention-3": (0.75, 0.75)}  # papers
later_over_50 = all(lo >= 0.5 for name, (lo, _) in UTIL.items() if name != "FlashAttention-1")
# standard attention's utilisation from Fig. 2's own runtime at its stated shape (batch 64, 16 heads, s 1024, d 64):
# forward QK^T and PV, 2 x 2·b·h·s²·d FLOPs, backward twice that (model FLOPs, no recompute), over the A100's peak
FIG2_SHAPE = dict(b=64, h=16, s=1024, d=64)
fig2_flops = 3 * 2 * 2 * FIG2_SHAPE["b"] * FIG2_SHAPE["h"] * FIG2_SHAPE["s"] ** 2 * FIG2_SHAPE["d"]
a100_peak = gpu("a100-80gb-sxm").peak("bf16")
util_fig2 = {k: fig2_flops / (v["ms"] / 1e3) / a100_peak for k, v in fig2.items()}
earlier_under_20 = util_fig2["standard"] < 0.2
Markdown(f"In the paper's Fig. 2 the fused kernel executes {fig2['flash']['GFLOP'] / fig2['standard']['GFLOP']:.2f}× "
         f"the FLOPs of standard attention (the recomputed QKᵀ, as counted above), moves "
         f"{fig2['standard']['HBM GB'] / fig2['flash']['HBM GB']:.1f}× fewer HBM bytes and runs "
         f"{fig2['standard']['ms'] / fig2['flash']['ms']:.1f}× faster: more FLOPs, fewer bytes, less time. Seed "
         f"001's \"over 50 %\" {'holds' if later_over_50 else 'does not hold'} for FlashAttention-2 and -3 by these "
         f"figures. Its \"previously under 20 %\" {'holds' if earlier_under_20 else 'does not hold'} against "
         f"standard attention: at Fig. 2's stated shape the fwd + bwd is {fig2_flops / 1e9:,.0f} GFLOP, which in "
         f"{fig2['standard']['ms']} ms is {util_fig2['standard']:.0%} of the A100's "
         f"{a100_peak / 1e12:.0f} TFLOP/s. The same arithmetic gives FlashAttention-1 {util_fig2['flash']:.0%} in "
         f"{fig2['flash']['ms']} ms, inside FlashAttention-2's paper's {UTIL['FlashAttention-1'][0]:.0%}-"
         f"{UTIL['FlashAttention-1'][1]:.0%} for it: a cross-check of the arithmetic. (Fig. 2's GFLOP column, used "
         "above only as a ratio, is not this count.)")

# %% [markdown]
# ## 5. HBM traffic: the forward's IO model, and the paper's forward + backward
#
# The FlashAttention paper's IO count (`memlab.predict.compute.attention_io`, [dao2022] Theorem 2: Θ(N²d²/M) against
# Θ(N² + Nd) for the **forward pass**, Algorithms 0 and 1) for one layer in bf16, with M the on-chip memory per
# SM. M = 192 KB is the A100's combined L1 and shared memory per SM, of which at most 164 KB can be shared memory,
# and a real kernel uses less: an upper bound. The model also ignores the 40 MB L2 cache, which catches many of
# the flash kernel's K and V re-reads, so Nsight Compute's `dram__bytes` counters read below it. GPT-2 medium's
# heads of 64 (the paper's Fig. 2 shape) and Llama-2-7B's heads of 128; the backward (Theorem 5: the same orders)
# is not modelled, so the paper's *measured* forward + backward sits beside the prediction.

# %%
llama, gpt2m = preset("llama-2-7b"), preset("gpt2-medium")
io = pd.DataFrame([{"model": cfg.name, "seq": n, **{
    f"{k} (MiB)": attention_hbm_bytes(1, cfg.n_heads, n, cfg.head_dim, kernel=k) / MiB
    for k in ("standard", "flash")}} for cfg in (gpt2m, llama) for n in (1024, 4096)])
io["standard / flash"] = io["standard (MiB)"] / io["flash (MiB)"]
ch.save_table(io, "hbm_traffic_predicted")
FIG2_BATCH = 64  # the paper's Fig. 2: GPT-2 medium, batch 64, 16 heads, s 1024, d 64
fig2_pred = {k: attention_hbm_bytes(FIG2_BATCH, gpt2m.n_heads, 1024, gpt2m.head_dim, kernel=k) / GB
             for k in ("standard", "flash")}
fig2_cmp = pd.DataFrame({"forward, predicted (GB)": fig2_pred,
                         "forward + backward, measured [dao2022] (GB)": {k: v["HBM GB"] for k, v in fig2.items()}})
fig2_cmp.loc["standard / flash"] = fig2_cmp.loc["standard"] / fig2_cmp.loc["flash"]
io.round(1)

# %%
fig2_cmp.round(2)

# %%
fig, ax = plt.subplots(figsize=(9, 4), layout="constrained")
seq_axis = np.array([512, 1024, 2048, 4096, 8192, 16384])
for cfg, colour in ((gpt2m, "C0"), (llama, "C1")):
    for k, style in (("standard", "-"), ("flash", "--")):
        ax.plot(seq_axis, [attention_hbm_bytes(1, cfg.n_heads, int(n), cfg.head_dim, kernel=k) / GB for n in seq_axis],
                colour + style, marker="o", label=f"{cfg.name} (d_head {cfg.head_dim}), {k}: fwd, predicted")
for k, marker in (("standard", "s"), ("flash", "D")):
    ax.scatter([1024], [fig2[k]["HBM GB"] / FIG2_BATCH], color="k", marker=marker, zorder=3,
               label=f"paper's Fig. 2, {k}: fwd + bwd, measured")
ax.set(xscale="log", yscale="log", xlabel="sequence length s (tokens)", ylabel="HBM bytes per layer, batch 1 (GB)",
       title="Attention HBM traffic: the IO model's forward vs the paper's measurement")
ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
ch.save_figure(fig, "attention_hbm_traffic")

# %%
SRAM_ELEMS = 192 * 1024 // 2  # M: the 192 KB per SM the IO model assumes, in 2-byte elements


def block_cols(d: int) -> int:
    """The IO model's column-block size B_c = ceil(M / 4d) [dao2022] (memlab.predict.compute.attention_io)."""
    return -(-SRAM_ELEMS // (4 * d))


Markdown(f"**Reading it (computed).** For the paper's shape the model predicts a forward ratio of "
         f"{fig2_cmp.loc['standard / flash', 'forward, predicted (GB)']:.1f}×; the paper measured "
         f"{fig2_cmp.loc['standard / flash', 'forward + backward, measured [dao2022] (GB)']:.1f}× for forward + "
         "backward, where the standard backward reads the stored s × s probabilities again. With heads of 128 the "
         f"forward saving falls to {io.loc[io['model'] == llama.name, 'standard / flash'].min():.1f}× because the "
         f"paper's block rule B_c = ⌈M / 4d⌉ (M = {SRAM_ELEMS:,} bf16 elements) gives {block_cols(gpt2m.head_dim)} "
         f"columns at d = {gpt2m.head_dim} and {block_cols(llama.head_dim)} at d = {llama.head_dim}, doubling the "
         "re-reads of Q and O (the model is FlashAttention-1's loop order, outer loop over K and V; PyTorch's flash "
         "backend is FlashAttention-2, outer loop over Q, and the L2 cache changes the constant too); "
         "the memory saving of section 3 does not depend on it. Two further kernels follow the same idea: "
         "FlashDecoding splits a decode step's attention over the KV sequence so one query token uses many SMs "
         "[flash-decoding], and context parallelism splits one long sequence's tokens over devices: Ring Attention "
         "passes K/V blocks around a ring of devices [liu2023] (chapter 06 counts its bytes per rank); "
         "DeepSpeed Ulysses re-shards Q, K, V (and the output back) between sequence and heads with all-to-all "
         "[jacobs2023].")

# %% [markdown]
# ## 6. Which kernel SDPA picks, and the mask that brings s² back
#
# `torch.nn.functional.scaled_dot_product_attention` (SDPA) chooses a backend per call from its inputs. Measured
# here with `torch.profiler`: the aten kernel this machine dispatches with no mask, `is_causal=True`, an explicit
# boolean mask and an explicit additive float mask:

# %%
def sdpa_kernel(**kwargs) -> str:
    """The aten attention kernel SDPA dispatches on this device for one call (torch.profiler's op names)."""
    q = torch.randn(1, 4, 128, 32, device=ch.device, dtype=ON_DEVICE["dtype"])
    with torch.profiler.profile() as prof:
        torch.nn.functional.scaled_dot_product_attention(q, q, q, **kwargs)
    names = [e.key for e in prof.key_averages() if e.key.startswith("aten::_") and "attention" in e.key]
    return names[0].removeprefix("aten::") if names else "math (softmax(QKᵀ)V in separate ops)"


causal = torch.ones(128, 128, dtype=torch.bool, device=ch.device).tril()
additive = torch.zeros(128, 128, device=ch.device, dtype=ON_DEVICE["dtype"]).masked_fill(~causal, float("-inf"))
picked = pd.DataFrame([{"call": c, "kernel dispatched here": sdpa_kernel(**kw)} for c, kw in (
    ("no mask", {}), ("is_causal=True", {"is_causal": True}), ("explicit bool mask", {"attn_mask": causal}),
    ("explicit float mask", {"attn_mask": additive}))])
picked

# %%
kernels = set(picked["kernel dispatched here"])
Markdown(f"**Reading it (computed).** On {ch.device}, "
         + (f"every call runs `{kernels.pop()}`: this device's fused kernel accepts a mask. " if len(kernels) == 1
            else f"the calls run {len(kernels)} different kernels: an explicit mask changes the choice. ")
         + "On CUDA the rule differs [pytorch-sdpa]: the flash backend takes no `attn_mask`, so an explicit mask "
           "sends the call to the memory-efficient kernel, which keeps the mask itself for backward: a "
           "(b, 1, s, s) tensor per layer, an s² term a-fold smaller than eager's b × a × s² probabilities "
           "(memlab counts it for such calls). Only the math fallback stores the probabilities again. Passing "
           "`is_causal=True` instead of a causal mask keeps the flash kernel. Hugging Face models build an explicit "
           "4-D mask when a batch is padded, the most common way an s² term silently returns; packing sequences "
           "without padding (varlen kernels) avoids it.")

# %% [markdown]
# ## 7. Seed 004's 2048² × dtype, for a real model
#
# For Llama-2-7B at batch 1 and 2048 tokens with bf16 weights (mixed-bf16), the seed's figure against what eager
# attention keeps in all layers:

# %%
seed_fig = 2048 * 2048 * 2  # seed 004's figure: one 2048 x 2048 matrix of 2-byte numbers
real = estimate(llama, Setup(batch=1, seq=2048, precision="mixed-bf16")).activation_detail["attention scores"]
pd.DataFrame({"kept for backward (MiB)": [seed_fig / MiB, real / MiB]},
             index=["seed 004: 2048² × 2 B", f"eager, {llama.n_heads} heads × {llama.n_layers} layers, batch 1"])

# %% [markdown]
# **Exercise 2.** By what factor does the seed's 2048² × 2 B undercount what eager attention keeps in the
# `attention scores` category for Llama-2-7B (mixed-bf16) at batch 4 and 4096 tokens?

# %%
answer = ...
check("07.seed-undercount-b4", answer)

# %% [markdown]
# **Exercise 3 (predict, then search).** Llama-2-7B, mixed-bf16 AdamW, ZeRO-3 over 8 H100-SXM (memlab's table
# capacity), batch 1, no recompute: what is the longest sequence whose *tensors* fit with *eager* attention, by the
# estimator's fit search (`max_seq(..., device=ALLOCATED_ONLY)`: the step's peak against the card, nothing else)?
# Guess first; the cell after runs the search, and the trace after it checks it.

# %%
fit_setup = Setup(batch=1, precision="mixed-bf16", attention="eager", zero_stage=3, world_size=8)

# %%
answer = ...
check("07.eager-max-seq", answer, setup=fit_setup, card="h100-sxm")

# %%
fit = pd.DataFrame([{"attention": a, **max_seq(llama, fit_setup.with_(attention=a), "h100-sxm", limit=1 << 17,
                                               device=ALLOCATED_ONLY).to_dict()} for a in ("eager", "flash")])
on_device = {a: max_seq(llama, fit_setup.with_(attention=a), "h100-sxm", limit=1 << 17) for a in ("eager", "flash")}
fit["device-used: fits for certain"] = [on_device[a].value for a in fit["attention"]]
fit["device-used: may fit up to"] = [on_device[a].up_to for a in fit["attention"]]
fit[["attention", "value", "device-used: fits for certain", "device-used: may fit up to"]].rename(
    columns={"value": "tensors fit up to"})

# %% [markdown]
# The first column is the exercise's: the tensors alone. On a GPU the CUDA context, cuBLAS workspaces, NCCL's
# buffers and the caching allocator's reserve come on top, so `max_seq` without `device=ALLOCATED_ONLY` answers from
# both ends of device-used: the sequence that fits for certain (the reserve at its bound) and the one above which
# nothing fits (no reserve); `memlab trace --gpu h100-sxm --longest-seq` settles between them by replaying the
# allocator. The fit search adds the estimator's terms. `memlab.tracing` runs the reference GPT's real step at the
# answer, at full size, on fake tensors: FSDP2 over a fake 8-rank process group (`memlab.tracing.fake_dist`), rank
# 0's bytes, nothing allocated. At ci scale it traces the eager answer; at full scale both.

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
named = estimate(llama, fit_setup.with_(attention="eager", seq=int(fit.set_index("attention").loc["eager", "value"]))
                 ).named_terms
for term in named:
    print(f"the estimate names as left out: {'+' if term.sign > 0 else '-'}{term.bytes / GiB:.2f} GiB at most in "
          f"{', '.join(term.phases)}: {term.name}")
confirm.round(3)

# %%
eager_row = confirm.set_index("attention").loc["eager"]
over = eager_row["traced peak GiB"] - eager_row["card GiB"]
gap = eager_row["traced peak GiB"] - eager_row["predicted peak GiB"]
peak_phase = eager_row["traced peak in"].split(" ", 1)[1]  # "steady backward" -> "backward"
named_gib = sum(t.bytes for t in named if t.sign > 0 and t.applies(peak_phase)) / GiB
Markdown(f"**Reading it (computed).** Exercise 3 asks for the *estimator's* answer, {int(eager_row['seq']):,} "
         f"tokens. The trace of that step peaks at {eager_row['traced peak GiB']:.2f} GiB in the "
         f"{eager_row['traced peak in']}, "
         + (f"{over:.2f} GiB above the card: the estimator's answer does not fit by the trace. "
            if over > 0 else f"{-over:.2f} GiB below the card: it fits by the trace too. ")
         + f"The trace is {gap:+.2f} GiB from the estimate; the terms the estimate names as left out (printed "
           f"above) that apply to the {peak_phase} may add up to {named_gib:.2f} GiB, and only what they name is "
           "attributed: "
           f"{max(0.0, gap - named_gib):.2f} GiB of the difference is left unexplained here. And the card is "
           "memlab's nominal capacity: the driver reports slightly less, and the CUDA context and NCCL's buffers "
           "take their share, so on a real GPU search below the nominal figure.")

# %%
recorded = ch.recorded("07_flash_attention_gpu")
recorded if recorded is not None else Markdown(
    "**GPU evidence.** No GPU run of this chapter is recorded in `data/recorded/`: section 4's table of the "
    "papers' measurements and the published measurements below are this page's GPU evidence.")

# %%
ch.published("07")

# %% [markdown]
# **Exercise 4.** From 1024 to 8192 tokens, by what factor grows *everything* eager attention keeps for this
# chapter's one-layer model (all its `attention` categories, as `predicted_attention` counts them), not only the
# scores?

# %%
answer = ...
check("07.attention-growth", answer, attention=predicted_attention)

# %% [markdown]
# ## Summary
#
# - Measured, eager attention and SDPA's math backend keep the b × a × s² probabilities (slope → 2); the flash
#   kernel keeps q, k, v, its output and one fp32 log-sum-exp per row (slope 1). The prediction matches byte for
#   byte for the CPU kernels measured here; CUDA's kernels keep a few more small tensors.
# - Seed 000's "O(N²) → O(N)" holds for the attention score matrix and for what attention keeps; the rest of the
#   model's activations were linear in s already.
# - The fused backward recomputes QKᵀ: equal model FLOPs, one more QKᵀ per layer of hardware FLOPs. On a GPU that
#   buys HBM traffic and time (the FlashAttention paper's Fig. 2, section 4).
# - An explicit `attn_mask` takes CUDA's SDPA off the flash kernel; `is_causal=True` keeps it.
# - Seed 004's 2048² × dtype is one head of one layer: Llama-2-7B keeps heads × layers times more at batch 1
#   (section 7's table), and batch times that; under CUDA autocast the fp32 probabilities triple it again.

# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
#   memlab:
#     runs_alone: it measures this machine's matmul peaks and a step's time
# ---

# %% [markdown]
# # 08 · The roofline and MFU: which peak, which ops, which step time
#
# **The common belief.** Seed article 001 ("利用率", *utilization*) [seed-001] says that top large-model training
# reaches only about 50 % MFU, that a "312 TFLOPS" GPU gives about 160 TFLOP/s of useful work, that the rest is
# eaten by memory traffic, communication and scheduling, and that MFU's step time must exclude the optimizer
# step, gradient clipping and logging (section 3: not PaLM's definition). Seed 004 [seed-004] lists the fixes for low
# utilisation: more
# `num_workers`, `pin_memory`, fewer `.item()` syncs.
#
# This chapter measures each of those on the machine it runs on:
#
# 1. this device's roofline: matmul FLOP/s over shapes and dtypes, the best one as the achievable ceiling, and
#    bandwidth with arrays larger than every cache;
# 2. one real training step of the reference GPT, op by op, placed on that roofline and predicted by it;
# 3. MFU three ways, HFU with recomputation, and the step time split into its phases;
# 4. MFU divided by the wrong peak;
# 5. a starved input pipeline and host syncs, measured as MFU lost;
# 6. from one device to many: the pipeline bubble and scaling efficiency.

# %% tags=["parameters"]
scale = "auto"
device = "auto"
seed = 0
out_dir = "../reports/build/08_roofline_mfu"

# %%
import matplotlib.pyplot as plt
import pandas as pd
import torch
from IPython.display import Markdown, display

from memlab import (
    Setup,
    chapter,
    check,
    cluster_utilisation,
    detect,
    exposed_comm_for,
    flops_per_token,
    forward_flops,
    gpu,
    megatron_closed_form,
    mfu,
    pipeline_bubble_fraction,
    preset,
    roofline_bound,
    run_step,
    training_loop,
)
from memlab.compare import plots
from memlab.course.chapter import as_percent
from memlab.measure import roofline
from memlab.predict.hardware.gpus import tile_waves
from memlab.run import op_profile
from memlab.units import MiB

ch = chapter(scale, device, seed, out_dir, ci_threads=1)  # repeatable: detect() measures 1 thread's peak
info = detect(device=ch.device)
CUDA = ch.device_type == "cuda"
ON_DEVICE = {  # what the device changes (each scale keeps these; roofline's shapes and repeats follow the scale)
    "cpu": dict(model="small-gpt", setup=Setup(batch=4, seq=128, precision="fp32", attention="eager"),
                dtype="fp32", dtypes=("fp32", "bf16"), extra_shapes=[(384, 384, 384), (512, 512, 512)], loop_steps=3),
    "cuda": dict(model="gpt2", setup=Setup(batch=8, seq=1024, precision="amp-bf16", attention="flash"),
                 dtype="bf16", dtypes=("fp32", "tf32", "bf16"), extra_shapes=[], loop_steps=20),
}[ch.device_type]
CFG, SETUP = preset(ON_DEVICE["model"]), ON_DEVICE["setup"]
DTYPE = ON_DEVICE["dtype"]  # the dtype the step's matmuls run in
(f"Running at scale **{ch.scale}** on **{ch.device}**: {CFG.name}, batch {SETUP.batch}, sequence {SETUP.seq}, "
 f"{SETUP.precision}.")

# %% [markdown]
# ## 1. This device's roofline, measured
#
# The compute roof is what a matmul actually reaches. Like Bekman's MAMF finder (MAMF: "maximum achievable
# matmul FLOPS", the best FLOP/s over a sweep of matmul shapes [bekman-mamf]) we time several shapes and keep the
# best as the *achievable* ceiling, beside the peak `detect()` reports. On a GPU that peak is the datasheet's
# (at the boost clock, which a loaded card may not hold), and achievable / peak is a real fraction. On a CPU
# `detect()`'s peak is itself a short benchmark of one shape, so the two are measurements of the same thing and
# their ratio is noise around 1, not an efficiency: the table shows it only on a GPU. The memory roof is STREAM's copy
# and triad [mccalpin-stream] with every array 4x the last-level cache, read from sysfs below, so the figure is
# DRAM's, not a cache's.

# %%
caches = roofline.cache_bytes("cpu")
array_bytes = roofline.beyond_cache_bytes(ch.device)
pd.Series({**{f"{k} (MiB)": v / MiB for k, v in caches.items()}, "bandwidth array (MiB)": array_bytes / MiB},
          name="this machine").to_frame()

# %%
shapes = roofline.default_shapes(ch.device, ch.scale) + ON_DEVICE["extra_shapes"]
matmul = roofline.matmul_flops_per_s(shapes, ON_DEVICE["dtypes"], device=ch.device, scale=ch.scale, repeats=3,
                                     warmup=1)
matmul = matmul[matmul["status"] == "ok"].copy()
bandwidth = roofline.bandwidth_bytes_per_s([array_bytes], device=ch.device, scale=ch.scale, repeats=3, warmup=1)
ch.save_table(matmul, "matmul")
ch.save_table(bandwidth, "bandwidth")

achievable = matmul.groupby("dtype")["flops_per_s"].max()
BW = float(bandwidth["bytes_per_s"].max())
PEAK = float(achievable[DTYPE])
ceilings = pd.DataFrame({
    "achievable (best shape), TFLOP/s": achievable / 1e12,
    ("datasheet peak (boost clock), TFLOP/s" if CUDA else "detect() benchmark, TFLOP/s"):
        [(info.peak_flops.get(d) or float("nan")) / 1e12 for d in achievable.index],
})
if CUDA:
    ceilings["achievable / datasheet peak"] = ceilings.iloc[:, 0] / ceilings.iloc[:, 1]
ceilings.round(3)

# %%
if CUDA:
    cpu_reading = Markdown(f"The best {DTYPE} shape reaches "
                           f"{ceilings.loc[DTYPE, 'achievable / datasheet peak']:.0%} of the datasheet peak.")
else:
    above = [d for d in achievable.index if achievable[d] > (info.peak_flops.get(d) or float("inf"))]
    slower = "bf16" in achievable.index and achievable["bf16"] < achievable["fp32"]
    cpu_reading = Markdown(
        "**Reading it (computed), on this CPU.** "
        + (f"The sweep's best is above `detect()`'s benchmark for {', '.join(above)}: both are short measurements "
           "on a shared machine, and a sweep over more shapes finds a better one. " if above else
           "The sweep's best is within the `detect()` benchmark for every dtype: both are short measurements of "
           "the same library on a shared machine. ")
        + ("bf16 runs *slower* than fp32 here: this CPU's matmul library has no native bf16 path at these shapes "
           "and converts. " if slower else "bf16 runs faster than fp32 here (the CPU has a native bf16 matmul path). ")
        + "None of this is GPU evidence: on a GPU the roof is the tensor cores' datasheet figure, and the best shape "
          "reaches a fraction of it (the MAMF finder's point [bekman-mamf]).")
cpu_reading

# %%
fig = plots.roofline(matmul, peaks=achievable.to_dict(), bandwidth_bytes_per_s=BW,
                     bandwidth_label=f"triad {array_bytes // MiB} MiB",
                     title=f"Matmuls on the measured roofline: {info.name}",
                     source="roof = best measured shape per dtype (achievable ceiling)")
ch.save_figure(fig, "matmul_roofline")

# %% [markdown]
# Seed 001 claims that cuBLAS keeps tensor cores more than 80 % busy [seed-001]. That is a statement about
# tensor-pipe busy cycles, which only a GPU profiler reads (DCGM's `PIPE_TENSOR_ACTIVE`, chapter 09). The nearest
# measurable figure is the best matmul's fraction of the datasheet peak, on a GPU only.

# %%
ch.cpu_note("tensor cores, SMs and occupancy exist only on a GPU: on a CUDA run the table above has tf32 next to "
            "fp32, the same matmul on tensor cores or not, and the tile table below uses the card's SM count; a "
            "CPU has neither, so the tile and wave figures below are computed for an H100's 132 SMs, not measured.")

# %% [markdown]
# **Tile and wave quantisation (SM coverage), and occupancy.** cuBLAS cuts a GEMM's m × n output into tiles
# (128 × 128 is typical; it also picks 128 × 256, 256 × 128 and others) and runs one tile per SM at a time, in
# *waves* of as many tiles as there are SMs [nvidia-gemm-perf]. Two losses follow from the shape alone. *Tile
# quantisation*: a dimension that is not a multiple of the tile leaves the last tiles partly empty. (GPT-2's
# vocabulary of 50,257 is padded to 50,304 by nanoGPT, "up to nearest multiple of 64 for efficiency" [nanogpt]:
# that is alignment, which lets cuBLAS pick vectorised, tensor-core-friendly kernels for the leading dimension,
# not tile count; the first two rows of the table below show the tile count does not move.) *Wave quantisation*: a
# tile count
# just above a multiple of the SM count leaves most SMs idle in the last wave. Neither is *occupancy*, which is
# the number of warps resident on an SM over the most it can hold, set by each kernel's registers, shared memory
# and block size, and read only with a kernel profiler (Nsight Compute's `sm__warps_active`). Computed for an
# H100 SXM (132 SMs), 128 × 128 tiles: 8,192 tokens × an LM head's n, then a GEMM whose 12 × 11 = 132 tiles fill
# one wave exactly, against 12 × 12 = 144 tiles:

# %%
H100_SMS = 132  # H100 SXM5: 132 SMs (NVIDIA Hopper whitepaper)
waves = pd.DataFrame([tile_waves(8192, n, H100_SMS) for n in (50257, 50304, 50432)]  # an LM head: tile quantisation
                     + [tile_waves(1536, n, H100_SMS) for n in (1408, 1420)])  # 132 tiles vs 144: wave quantisation
if CUDA:
    sms = torch.cuda.get_device_properties(torch.device(ch.device)).multi_processor_count
    occ = matmul[["dtype", "m", "n", "k", "flops_per_s"]].copy()
    occ["tiles / SMs (this card)"] = [tile_waves(m, n, sms)["tiles"] / sms for m, n in zip(occ["m"], occ["n"],
                                                                                            strict=True)]
    occ["fraction of best"] = occ["flops_per_s"] / occ["dtype"].map(achievable)
    display(occ.round(3))
    tensor_cores = achievable.reindex(["fp32", "tf32", "bf16"]) / achievable["fp32"]
    display(tensor_cores.rename("speed-up over IEEE fp32").to_frame().round(2))
gpt2_vocab, padded = waves.iloc[0], waves.iloc[1]  # n = 50,257 and nanoGPT's 50,304
print(f"LM head n = 50,257 vs 50,304: {gpt2_vocab['tiles']:,.0f} vs {padded['tiles']:,.0f} tiles, "
      f"{gpt2_vocab['waves']:.0f} vs {padded['waves']:.0f} waves, tile fill {gpt2_vocab['tile fill (%)']:.1f} % vs "
      f"{padded['tile fill (%)']:.1f} %: padding to a multiple of 64 "
      + ("leaves the tile count unchanged (its gain is alignment)" if gpt2_vocab["tiles"] == padded["tiles"]
         else "changes the tile count"))
waves.round(1)

# %% [markdown]
# **Which peak an "fp32" run divides by.** On Ampere and later, an fp32 matmul can run on tensor cores as TF32
# (fp32 range, 10 bits of mantissa). PyTorch's default keeps fp32 matmuls in IEEE fp32
# (`torch.backends.cuda.matmul.allow_tf32` is False since 1.12; `torch.set_float32_matmul_precision("high")`
# turns TF32 on [pytorch-tf32]). The MFU of an fp32 run divides by the fp32 column under the default and by the
# TF32 column once TF32 is on: the same run's MFU differs by the ratio below. This process's setting:

# %%
tf32 = pd.DataFrame([{"card": g.name, "IEEE fp32 (TFLOP/s)": g.peak("fp32") / 1e12,
                      "TF32 dense (TFLOP/s)": g.peak("tf32") / 1e12, "TF32 / fp32": g.peak("tf32") / g.peak("fp32")}
                     for g in (gpu("a100-80gb-sxm"), gpu("h100-sxm"))])
ieee = torch.get_float32_matmul_precision() == "highest"
print(f"torch.get_float32_matmul_precision() here: {torch.get_float32_matmul_precision()!r} "
      f"({'IEEE fp32: divide by the fp32 column' if ieee else 'TF32 allowed: divide by the TF32 column'})")
tf32.round(2)

# %% [markdown]
# ## 2. One training step, op by op
#
# `memlab.run.op_profile.profile_step` runs `torch.profiler` with `record_shapes=True` over one step of the reference
# GPT (after a warm-up step) and gives each op FLOPs and bytes from its recorded shapes and dtypes. Matmuls count
# 2·m·n·k [narayanan2021]; softmax, norms, GELU, residual adds, the loss and the optimizer's element-wise updates
# count a few FLOPs per element (memlab's convention, `op_profile.ELEMENTWISE_FLOPS`): seed 001 says to drop them from
# MFU [seed-001], and the profile shows what they cost in time instead.
#
# **Exercise 1 (predict first).** Before running the next cell: at this model's shapes, which op does the fewest
# FLOPs per byte moved, i.e. sits furthest *under* the memory roof's ridge point: `"matmul"` (the MLP's
# up-projection), `"norm"` (LayerNorm) or `"add"` (the residual add)?

# %%
answer = ...
check("08.most-memory-bound", answer, model=CFG, setup=SETUP)

# %%
prof = {att: op_profile.profile_step(CFG, Setup(**{**SETUP.to_dict(), "attention": att}), ch.device, seed=seed)
        for att in ("eager", "flash")}
ops = prof[SETUP.attention].by_op()
pred = op_profile.predict_ops(ops, PEAK, BW, min_time_s=5e-6)
ch.save_table(pred, "ops")
fig = plots.op_roofline(pred, peak_flops_per_s=PEAK, bandwidth_bytes_per_s=BW, peak_label=f"best {DTYPE} matmul",
                        bandwidth_label="triad",
                        title=f"One training step of {CFG.name}, op by op ({SETUP.attention} attention)",
                        source="torch.profiler self times, FLOPs and bytes from shapes; area = share of time")
ch.save_figure(fig, "step_ops_roofline")

# %%
kinds = op_profile.time_by_kind(ops)
kinds["memory_bound"] = kinds["kind"].map(pred.groupby("kind")["memory_bound"].mean().gt(0.5))
kinds["intensity (FLOP/B)"] = kinds["flops"] / kinds["bytes"]
kinds.round(4)

# %% [markdown]
# The prediction: each op at its roof, time = max(FLOPs / peak, bytes / bandwidth) [williams2009]. The ratio
# measured / predicted is 1 on the roof; per op kind, summed:

# %%
err = pred.groupby("kind", as_index=False)[["predicted_s", "self_s"]].sum()
err["measured / predicted"] = err["self_s"] / err["predicted_s"]
ch.record_ledger(pd.DataFrame({"experiment": "roofline time per op kind", "component": err["kind"], "unit": "s",
                               "predicted": err["predicted_s"], "measured": err["self_s"]}))
err.round(6)

# %% [markdown]
# **Reading it.** The big matmuls sit near the compute roof. The element-wise ops scatter on both sides of the memory
# roof: those above it read operands the previous op left in cache (the roof is DRAM's bandwidth, measured with
# arrays no cache holds), those far below it are dominated by each call's fixed cost (dispatch, a kernel launch on
# a GPU). The roofline bounds an op; it predicts small ops poorly. Eager vs flash attention: the fused kernel
# replaces the s×s score matrix's softmax and its two matmuls by one op whose bytes are only Q, K, V and O [dao2022]:

# %%
both = pd.concat([op_profile.time_by_kind(p.by_op()).assign(attention=a) for a, p in prof.items()])
both.pivot_table(index="kind", columns="attention", values="self_s", aggfunc="sum").round(5)

# %% [markdown]
# The fused backward does not read a stored score matrix: it recomputes it, trading FLOPs for bytes [dao2022].
# Counted from the shapes (torch's SDPA formulas), the flash backward executes more than twice its forward:

# %%
flash_att = prof["flash"].by_op().query("kind == 'attention'").groupby("phase")["flops"].sum()
pd.Series({"flash backward / forward FLOPs": flash_att["backward"] / flash_att["forward"],
           "a plain matmul's backward / forward": 2.0}, name="attention").to_frame()

# %% [markdown]
# ## 3. MFU three ways, HFU, and the step split
#
# The same measured step time divided three ways: PaLM's 6N + 12·L·H·Q·T per token [chowdhery2022], Megatron's
# closed form 72·B·s·l·h²(1 + s/6h + V/12lh) [korthikanti2022], and torch's `FlopCounterMode` counting the matmuls
# actually dispatched. HFU adds the recomputed forward under full activation checkpointing [korthikanti2022]. The
# last column is a utilisation: MFU for the first three rows, HFU for the fourth.

# %%
meas = run_step(CFG, SETUP, ch.device, steps=3, seed=seed)
meas_rc = run_step(CFG, Setup(**{**SETUP.to_dict(), "recompute": "full"}), ch.device, steps=3, seed=seed)
peak = info.peak_flops.get(DTYPE)
tokens = SETUP.batch * SETUP.seq
three = pd.DataFrame({
    "formula": ["PaLM 6N + 12LHQT", "Megatron closed form", "FlopCounterMode (counted)"],
    "flops_per_step": [flops_per_token(CFG, SETUP.seq) * tokens,
                       megatron_closed_form(SETUP.batch, SETUP.seq, CFG.n_layers, CFG.d_model, CFG.vocab_size),
                       meas.counted_flops_per_step],
})
three["utilisation"] = three["flops_per_step"] / meas.step_time_s / peak
three.loc[len(three)] = ["HFU, full recompute (executed)", meas_rc.hardware_flops_per_step,
                         meas_rc.hardware_flops_per_step / meas_rc.step_time_s / peak]
ch.save_table(three, "mfu_three_ways")
ch.record_ledger(pd.DataFrame({"experiment": "FLOPs per step: formula vs FlopCounterMode",
                               "component": three["formula"].iloc[:2], "unit": "FLOP",
                               "predicted": three["flops_per_step"].iloc[:2],
                               "measured": meas.counted_flops_per_step}))
as_percent(three, ["utilisation"]).round(4)

# %% [markdown]
# The three model-FLOP counts agree to the FLOP here *by construction*: N is the matmul parameter count and
# small-gpt has the layout Megatron's closed form assumes (d_ff = 4h, one KV head per query head, the full s × s
# scores). For a Llama layout they part: SwiGLU's three d_ff matrices and GQA's narrow K and V break the closed
# form's 4h and multi-head assumptions, N = all parameters counts the untied embedding table, and counting
# causal attention at half (its masked upper triangle skipped, as FlashAttention does) lowers the attention term.
# Per token, for Llama-3-8B at 8,192 tokens (computed, no run):

# %%
llama3, s8k = preset("llama-3-8b"), 8192
conv = pd.DataFrame({"training FLOPs / token (G)": {
    "PaLM 6N + 12LHQT, N = matmul weights": flops_per_token(llama3, s8k) / 1e9,
    "PaLM, N = all parameters": flops_per_token(llama3, s8k, exclude_embeddings=False) / 1e9,
    "3 × forward, counted by shapes (non-causal)": 3 * forward_flops(llama3, 1, s8k) / s8k / 1e9,
    "3 × forward, causal attention at half": 3 * forward_flops(llama3, 1, s8k, causal=True) / s8k / 1e9,
    "Megatron closed form (assumes 4h MLP, MHA)": megatron_closed_form(1, s8k, llama3.n_layers, llama3.d_model,
                                                                       llama3.vocab_size) / s8k / 1e9}})
conv["vs the counted"] = conv.iloc[:, 0] / conv.iloc[2, 0] - 1
as_percent(conv, ["vs the counted"], 1).round(2)

# %%
recompute = pd.Series({
    "executed FLOPs, full / none": meas_rc.hardware_flops_per_step / meas.flops_per_step,
    "step time, full / none (measured)": meas_rc.step_time_s / meas.step_time_s,
    "MFU with recompute (run_step)": meas_rc.mfu, "HFU with recompute (run_step)": meas_rc.hfu,
}, name="activation recompute").round(3)
recompute.to_frame()

# %% [markdown]
# Seed 001 says recomputation costs "about 1.3x" the FLOPs [seed-001]: one more forward of the blocks is 4/3 of
# forward + backward, less the LM head, which is not recomputed. MFU keeps counting the model's FLOPs only, so
# recomputation lowers MFU while HFU counts the extra work.
#
# **The step split.** `memlab.labs.step_time.training_loop` times data, forward, backward, optimizer, host work
# (`.item()`, logging) and checkpointing, step by step (with a synchronize at each boundary on a GPU). PaLM defines
# MFU as "the ratio of the observed throughput (tokens-per-second) relative to the theoretical maximum
# throughput" [chowdhery2022]: the whole training throughput, nothing excluded. Seed 001 says to leave the
# optimizer step, gradient clipping and logging out of the step time [seed-001]; leaving out the optimizer step or
# clipping inflates MFU (they are part of every training step), so memlab's model time keeps them (`model_step_s`
# = data + forward + backward + optimizer) and leaves out only host logging and one-off checkpoint saves, a
# reporting convention rather than PaLM's definition. Both columns are shown:

# %%
loop_cfg = dict(steps=ON_DEVICE["loop_steps"], seed=seed)
plain = training_loop(CFG, SETUP, ch.device, label="plain", **loop_cfg)
logged = training_loop(CFG, SETUP, ch.device, label="log every step, checkpoint every 2",
                       log_every=1, checkpoint_every=2, **loop_cfg)
split = pd.DataFrame([plain.to_row(), logged.to_row()]).set_index("label")
phase_cols = [f"{p}_s" for p in plain.phase_s]  # data, forward, ..., checkpoint
fig, ax = plt.subplots(figsize=(7.5, 3.6), layout="constrained")
(split[phase_cols] * 1e3).rename(columns=lambda c: c[:-2]).plot.barh(stacked=True, ax=ax)
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
ax.set(xlabel="mean time per step (ms)", ylabel="", title=f"Where a step's time goes ({CFG.name}, {ch.device})")
ch.save_figure(fig, "step_split")
as_percent(split[["step_s", "model_step_s", "mfu", "mfu_model_time"]], ["mfu", "mfu_model_time"]).round(5)

# %% [markdown]
# ## 4. The wrong peak
#
# An MFU is only as right as its denominator. The same measured work divided by a sparse figure (2:4 sparsity,
# twice the dense peak), by another dtype's column, or by an A100's bf16 peak that a tool assumes for every device
# (nanoGPT's `estimate_mfu` divides by a constant 312 TFLOP/s [nanogpt], so an H100 bf16 run reads too high by the
# ratio printed below):

# %%
achieved = meas.flops_per_step / meas.step_time_s
a100, h100 = gpu("a100-80gb-sxm"), gpu("h100-sxm")
other = "bf16" if DTYPE == "fp32" else "fp32"
wrong = pd.DataFrame([
    {"denominator": f"dense {DTYPE} peak of this device (right)", "peak_tflop_s": peak / 1e12},
    {"denominator": "2:4 sparse figure (2x dense)", "peak_tflop_s": 2 * peak / 1e12},
    {"denominator": f"the {other} column", "peak_tflop_s": (info.peak_flops.get(other) or float("nan")) / 1e12},
    {"denominator": "A100 bf16 (a tool's fallback)", "peak_tflop_s": a100.peak("bf16") / 1e12},
])
wrong["mfu"] = achieved / (wrong["peak_tflop_s"] * 1e12)
unknown = mfu(CFG, meas.tokens_per_s, accelerator=None, seq=SETUP.seq)
print(f"nanoGPT's constant on an H100: its bf16 peak is {h100.peak('bf16') / a100.peak('bf16'):.1f}x the A100's "
      "312 TFLOP/s, so the MFU reads that many times too high")
print("memlab on an unknown device:", unknown.mfu, "-", unknown.reason)
as_percent(wrong, ["mfu"]).round(3)

# %% [markdown]
# Seed 001's example placed on the A100's roofline (memlab's table: peak and bandwidth), and the ridge points of
# each compute unit. A single compute roof is the tensor cores'; non-matmul ops (softmax, norms, GELU) run on the
# SMs' ordinary fp32 units, whose roof is far lower, and exponentials on special-function units lower still (an
# H100 has about 3.9 TFLOP/s of them against 989 of bf16 matmul, FlashAttention-3's motivation [shah2024]).
# These per-unit roofs are Williams et al.'s "ceilings" [williams2009]:

# %%
SEED_001_USEFUL = 160e12  # seed 001: a "312 TFLOPS" GPU gives about 160 TFLOP/s of useful work
a100_ridge = a100.peak("bf16") / a100.bandwidth_bytes_per_s
pd.Series({
    "fraction of A100 dense bf16 peak": SEED_001_USEFUL / a100.peak("bf16"),
    "ridge point (FLOP/B)": a100_ridge,
    "intensity needed for 160 TFLOP/s (FLOP/B)": SEED_001_USEFUL / a100.bandwidth_bytes_per_s,
    "roofline bound at 1 FLOP/B, TFLOP/s (a LayerNorm)": roofline_bound(1.0, a100.peak("bf16"),
                                                                       a100.bandwidth_bytes_per_s) / 1e12,
}, name="A100 80GB SXM (memlab table)").round(3).to_frame()

# %%
ridges = pd.DataFrame([{"card": g.name, **{f"ridge, {unit} (FLOP/B)": g.peak(d) / g.bandwidth_bytes_per_s
                                           for unit, d in (("bf16 tensor", "bf16"), ("TF32 tensor", "tf32"),
                                                           ("fp32 non-tensor", "fp32"))}}
                       for g in (a100, h100)])
ridges.round(0)

# %% [markdown]
# **Exercise 2.** The same 160 TFLOP/s measured on an H100 SXM: what MFU in % is right (memlab's table, dense
# bf16)?

# %%
answer = ...
check("08.h100-mfu", answer, useful_flop_s=SEED_001_USEFUL)

# %% [markdown]
# ## 5. A starved input pipeline and host syncs, as MFU lost
#
# Seed 004's low-utilisation row [seed-004]: a slow loader, `num_workers`, `pin_memory`, and `.item()` syncs. The
# loader below takes as long to produce one batch as the plain step takes to compute it (a sleep, like I/O).

# %%
delay = plain.model_step_s / SETUP.batch  # seconds per sequence: one batch = one step of compute
variants = {
    "fast loader": {},
    "fast loader, again (the noise floor)": {},
    "slow loader, 0 workers": {"delay_s": delay},
    "slow loader, 2 workers, prefetch 4": {"delay_s": delay, "num_workers": 2, "prefetch_factor": 4},
    "slow loader, 2 workers, pin_memory": {"delay_s": delay, "num_workers": 2, "pin_memory": True},
    ".item() every step": {"item_every": 1},
}
loops = pd.DataFrame([training_loop(CFG, SETUP, ch.device, label=k, **loop_cfg, **v).to_row()
                      for k, v in variants.items()]).set_index("label")
loops["mfu lost vs fast loader"] = loops.loc["fast loader", "mfu"] - loops["mfu"]
ch.save_table(loops.reset_index(), "input_pipeline")
as_percent(loops[["data_s", "step_s", "tokens_per_s", "mfu", "mfu lost vs fast loader"]],
           ["mfu", "mfu lost vs fast loader"]).round(5)

# %% [markdown]
# Workers overlap the loader with compute. This loader *sleeps* (like waiting for I/O), so it uses no core and
# the workers hide it almost entirely; a CPU-bound loader (decoding, tokenising, augmenting) would compete with
# the step for this machine's cores, which this experiment does not show. `pin_memory` only changes host-to-GPU
# copies, so on a CPU it is a no-op. On a CPU every op is synchronous, so `.item()` costs nearly nothing; on a GPU
# it makes the host wait for the queue to drain each step.

# %%
ch.cpu_note("the .item() stall and pin_memory's faster copies are GPU effects (an asynchronous launch queue, "
            "pageable vs pinned host memory); here both rows measure their CPU cost, which is within the run-to-run "
            "noise that the repeated fast-loader row shows.")

# %% [markdown]
# ## 6. From one device to many
#
# With p pipeline stages and m micro-batches, each device idles for (p − 1)/(m + p − 1) of the iteration, under
# GPipe (all forwards, then all backwards) and under 1F1B ("one forward, one backward": each stage alternates
# them once the pipeline is full) alike; 1F1B's gain is elsewhere (Exercise 4). Splitting each stage's layers into v
# interleaved chunks
# divides the bubble by v, at the price of more communication [narayanan2021]. Seed 001 says scheduling brings
# bubbles from 30-50 % to under 5 % [seed-001]:

# %%
configs = [(4, 4, 1), (8, 8, 1), (8, 32, 1), (8, 128, 1), (8, 128, 2), (16, 64, 1), (16, 64, 2)]
bubbles = pd.DataFrame([{"stages p": p, "micro-batches m": m, "interleave v": v,
                         "bubble": pipeline_bubble_fraction(p, m, v)} for p, m, v in configs])
bubbles.round(3)

# %% [markdown]
# Seed 001's "55 % MFU per GPU becomes about 40 % at 1000 GPUs" [seed-001] as a worked example. Assumptions
# (stated, not measured): 8 pipeline stages with 64 micro-batches, and the rest lost to communication that overlap
# does not hide. The example fixes how much that must be:

# %%
bubble = pipeline_bubble_fraction(8, 64)
comm = exposed_comm_for(0.55, 0.40, bubble)
worked = cluster_utilisation(0.55, bubble_fraction=bubble, exposed_comm_fraction=comm)
pd.Series(worked.to_dict(), name="55 % -> 40 %").round(4).to_frame()

# %% [markdown]
# **Published MFU at scale** (evidence from outside memlab, each from its paper; bf16 dense peaks):

# %%
PUBLISHED_MFU = pd.DataFrame([  # (system, model, devices, MFU, HFU or None, source key): the papers' own figures
    ("PaLM", "540B", "6,144 TPU v4", 0.462, 0.578, "chowdhery2022"),
    ("Megatron-LM (PTD-P)", "1T", "3,072 A100", 0.52, None, "narayanan2021"),
    ("MegaScale", "175B", "12,288 Ampere GPUs", 0.552, None, "jiang2024megascale"),
    ("Llama 3", "405B", "8,192 H100", 0.43, None, "dubey2024"),  # Table 4: 430 TFLOP/s per GPU
    ("Llama 3", "405B", "16,384 H100", 0.41, None, "dubey2024"),  # Table 4: 400 TFLOP/s per GPU
    ("Llama 3, long context (131k tokens)", "405B", "16,384 H100", 0.38, None, "dubey2024"),
], columns=["system", "model", "devices", "MFU", "HFU", "source"])
PUBLISHED_MFU["source"] = "[" + PUBLISHED_MFU["source"] + "]"
as_percent(PUBLISHED_MFU, ["MFU", "HFU"], 1)

# %% [markdown]
# Megatron-LM's figure is its per-GPU throughput over the A100's peak (163 of 312 TFLOP/s), with recomputation
# counted, so closer to an HFU. None of these is comparable with a CPU step's MFU: one device, no communication,
# no pipeline, and a denominator that is itself a measurement.

# %% [markdown]
# **Exercise 3.** 16 stages and 48 micro-batches, no interleaving: what fraction of the iteration, in %, is
# bubble?

# %%
answer = ...
check("08.bubble", answer, stages=16, micro_batches=48)

# %% [markdown]
# **Exercise 4.** 1F1B has the same bubble as GPipe; what it changes is memory. With p = 8 stages and m = 64
# micro-batches, how many micro-batches' activations does the *first* stage hold at once, at most, under 1F1B?

# %%
answer = ...
check("08.in-flight-1f1b", answer, stages=8, micro_batches=64)

# %% [markdown]
# 1F1B's gain is memory: once the pipeline is full each stage alternates one forward with one backward, so the
# first stage holds the activations of at most p micro-batches in flight instead of all m under GPipe
# [narayanan2021]; chapter 06 counts those bytes rank by rank and traces torch's own schedules.

# %% [markdown]
# ## The seed's claims, answered

# %%
matmul_frac = float(kinds.loc[kinds["kind"] == "matmul", "time_share"].sum())
pub_lo, pub_hi = PUBLISHED_MFU["MFU"].min(), PUBLISHED_MFU["MFU"].max()
top_verdict = ("holds" if pub_lo >= 0.45 and pub_hi <= 0.55 else
               "holds with a qualification" if pub_lo >= 0.3 and pub_hi <= 0.6 else "does not hold")
rc_ratio = meas_rc.hardware_flops_per_step / meas.flops_per_step
bubble_lo, bubble_hi = pipeline_bubble_fraction(8, 8), pipeline_bubble_fraction(8, 128)
bubble_v2 = pipeline_bubble_fraction(8, 128, 2)
m_under_5 = next(m for m in range(1, 10_000) if pipeline_bubble_fraction(8, m) < 0.05)
workers_share = loops.loc["slow loader, 2 workers, prefetch 4", "mfu"] / loops.loc["fast loader", "mfu"]
ch.seed_claims([
    ("001", "top training MFU ≈ 50 %", top_verdict,
     f"published at scale: {pub_lo:.0%}-{pub_hi:.1%} MFU (table above); a CPU step is not evidence either way"),
    ("000", "MFU 30-60 % is a good level", "unsourced range",
     "depends on the peak used: section 4 moves the same run by 2x (sparse) or more (wrong dtype / device)"),
    ("001", "roofline, arithmetic intensity, machine balance", "holds",
     f"ridge {PEAK / BW:.0f} FLOP/B here; {int(pred['memory_bound'].sum())} of {len(pred)} op shapes below it"),
    ("001", "matmul = 2mnk; drop norms and residuals",
     "holds (as a FLOP count)" if abs(three["flops_per_step"].iloc[2] / meas.flops_per_step - 1) < 0.01
     else "does not hold",
     f"matmuls are {three['flops_per_step'].iloc[2] / meas.flops_per_step:.3f}x the analytic count (CPU only, "
     f"not GPU evidence: non-matmul ops take {1 - matmul_frac:.0%} of this CPU step's op time)"),
    ("001", "cuBLAS keeps tensor cores > 80 % busy",
     ("holds" if ceilings.loc[DTYPE, "achievable / datasheet peak"] > 0.8 else "does not hold") if CUDA
     else "not measured on this device",
     f"best {DTYPE} matmul: {ceilings.loc[DTYPE, 'achievable / datasheet peak']:.0%} of the datasheet peak "
     "(busy cycles need DCGM's PIPE_TENSOR_ACTIVE)" if CUDA else "a CPU has no tensor cores"),
    ("001", "occupancy = active warps / max warps", "holds (a definition)",
     "read with Nsight Compute; tiles per SM are SM coverage and wave quantisation, not occupancy"),
    ("001", "MFU excludes recompute; HFU counts it",
     "holds (a definition)" if meas_rc.hfu > meas_rc.mfu else "does not hold",
     f"MFU {meas_rc.mfu:.2%} vs HFU {meas_rc.hfu:.2%} with full recompute"),
    ("001", "recompute ≈ 1.3x FLOPs", "holds" if 1.2 <= rc_ratio <= 1.4 else "does not hold",
     f"{rc_ratio:.3f}x executed FLOPs (CPU only, not GPU evidence: {meas_rc.step_time_s / meas.step_time_s:.2f}x "
     "this CPU step's time)"),
    ("001", "bubbles 30-50 % -> < 5 %; 55 % -> 40 % at 1k GPUs",
     "holds only with interleaving or many micro-batches" if bubble_lo >= 0.3 and bubble_v2 < 0.05 else
     "does not hold",
     f"p=8: m=8 gives {bubble_lo:.0%}, m=128 {bubble_hi:.1%} (not under 5 %), m=128 interleaved v=2 "
     f"{bubble_v2:.1%}; without interleaving m >= {m_under_5}; 55->40 needs {comm:.0%} exposed comm after a "
     f"{bubble:.0%} bubble"),
    ("004", "torch.profiler with shapes shows the ops",
     "holds" if prof[SETUP.attention].coverage() > 0.5 else "holds with a qualification",
     f"{len(ops)} op shapes costed, {prof[SETUP.attention].coverage():.0%} of profiled op time"),
    ("004", "num_workers, pin_memory, .item() fix low utilisation",
     "not measured on a GPU",
     f"CPU only, not GPU evidence: workers recovered {workers_share:.0%} of the fast loader's MFU here (a "
     "sleeping loader); .item() and pin_memory are GPU effects"),
], columns=["seed", "claim", "verdict", "number (this run)"])

# %%
ch.published("08")

# %% [markdown]
# ## Summary
#
# - The compute roof is what the best matmul shape reaches (achievable), the memory roof is bandwidth with arrays
#   beyond every cache. On a GPU the datasheet peak is above what the best shape reaches; tile and wave
#   quantisation cost more (occupancy is another thing, read with a profiler). Element-wise ops land on both sides
#   of the memory roof: cache above it, fixed per-call costs far below it; the roofline bounds them but predicts
#   them poorly, and their own roof (non-tensor units) is lower than the tensor cores'.
# - Per op, FLOPs and bytes come from the profiler's shapes; matmuls carry nearly all FLOPs, the other ops a
#   visible share of the time. Fused attention removes the score matrix's softmax and traffic.
# - MFU: model FLOPs (PaLM, Megatron and counted agree for a GPT layout, by construction, and part for a Llama
#   layout) over the training step time over the dense peak of the dtype the matmuls run in (TF32's when TF32 is
#   on). HFU adds recomputation (≈ 4/3). Published runs at scale reach about 38-55 %.
# - A sparse figure halves MFU, a wrong dtype or a borrowed A100 peak makes it meaningless; memlab refuses an
#   unknown device instead.
# - Data starvation costs MFU in proportion to the time the step waits; workers hide a loader that waits (I/O);
#   one that computes competes for the cores.
# - Across devices, the bubble (p − 1)/(m + p − 1), the same for GPipe and 1F1B, and exposed communication
#   multiply into the per-device MFU; 1F1B saves memory, not bubble.

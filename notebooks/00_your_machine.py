# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 00 · Your machine: its peaks, its bandwidth, and the units they are printed in
#
# **The common belief.** "My card does *N* TFLOP/s and has 80 GB": the two numbers on the datasheet are taken as
# what a training job gets. Every later chapter divides by a peak (MFU) or compares against a capacity (does it
# fit?), so this chapter pins down which peak and which capacity, on the machine the course runs on:
#
# 1. what the device is, and where its peak figures come from (a sourced table row, or a measurement);
# 2. what a matmul and a memory copy actually achieve here, against those peaks;
# 3. dense vs sparse peaks: the datasheet's biggest number is usually not the one to divide by;
# 4. GB vs GiB: "80 GB" is not 80 × 10⁹ bytes.
#
# Later chapters reuse what this one writes to its output folder (`device_peaks.csv`, `matmul.csv`,
# `bandwidth.csv`).

# %% tags=["parameters"]
scale = "auto"
device = "auto"
seed = 0
out_dir = "../reports/build/00_your_machine"

# %%
import matplotlib.pyplot as plt
import pandas as pd

pd.set_option("display.max_colwidth", None)

from memlab import chapter, detect
from memlab.compare import plots
from memlab.course import exercises
from memlab.device import describe
from memlab.predict import hardware
from memlab.run import roofline

ch = chapter(scale, device, seed, out_dir)
info = detect(device=ch.device)
ch.to_dict()

# %% [markdown]
# ## 1. The formula: what is this device, and what are its peaks?
#
# `memlab.device.detect()` resolves a GPU's name and memory to one row of memlab's accelerator table (dense
# peaks per dtype, memory, bandwidth, and the datasheet each comes from). A GPU missing from the table gets *no*
# peak, with the reason, never a neighbour's. A CPU has no datasheet row: its matmul peak is measured by a short
# benchmark, cached, and marked as measured.

# %%
peaks = pd.DataFrame({
    "dtype": list(info.peak_flops),
    "dense_peak_tflop_per_s": [None if v is None else v / 1e12 for v in info.peak_flops.values()],
}).dropna()
ch.save_table(peaks, "device_peaks")
pd.Series(describe(ch.device), name="this device").to_frame()

# %% [markdown]
# Dense peaks this chapter compares against (dtypes without a peak for this device are left out):

# %%
peaks

# %%
ch.cpu_note("a CPU has no datasheet peak in memlab's table, so its peak is itself a matmul measurement and "
            "achieved/peak below compares two measurements; the GPU-only points (HBM bandwidth, tensor-core "
            "dtypes such as tf32 and fp8) cannot be shown here.")

# %% [markdown]
# ## 2. The experiment: a matmul and a memory copy, against those peaks
#
# `memlab.run.roofline.matmul_flops_per_s` times `C = A @ B` for a few shapes and dtypes (FLOPs = 2·m·n·k);
# `memlab.run.roofline.bandwidth_bytes_per_s` times STREAM's copy and triad kernels (bytes moved as STREAM counts them).
# One bandwidth array size (64 MiB) is larger than a server CPU's last-level cache, so at least one point
# measures DRAM rather than cache.
#
# Seed article 001 ("利用率", *utilization*) claims that top large-model training reaches only about 50 % MFU,
# and that a "312 TFLOPS" GPU delivers about 160 TFLOPS of useful work. Achieved/peak for single matmuls below is
# the ceiling any MFU inherits: no training step beats its own matmuls.

# %%
matmul = roofline.matmul_flops_per_s(device=ch.device, scale=ch.scale)
matmul = matmul[matmul["status"] == "ok"].copy()
matmul["peak_flops_per_s"] = matmul["dtype"].map(dict(info.peak_flops))
matmul["achieved_over_peak"] = matmul["flops_per_s"] / matmul["peak_flops_per_s"]
ch.save_table(matmul, "matmul")

sizes = sorted(set(roofline.default_sizes(ch.device, ch.scale)) | {64 * 2**20})
bandwidth = roofline.bandwidth_bytes_per_s(sizes, device=ch.device, scale=ch.scale)
bandwidth = bandwidth[bandwidth["status"] == "ok"].copy()
ch.save_table(bandwidth, "bandwidth")

matmul[["dtype", "m", "n", "k", "arithmetic_intensity", "flops_per_s", "peak_flops_per_s", "achieved_over_peak"]]

# %% [markdown]
# ## 3. Prediction vs measurement: the roofline
#
# The "prediction" a datasheet invites is: every matmul runs at peak. The roofline (Williams, Waterman and
# Patterson, CACM 2009) refines it: a kernel doing *I* FLOPs per byte of memory traffic can reach at most
# min(peak, I × bandwidth). Points far below the flat roof at high intensity are overheads; points on the slope
# are limited by memory, not by compute. On a GPU the roof uses the table's peak bandwidth (the benchmark flushes
# the L2 cache between repeats); on a CPU there is no table figure and small operands stay in cache, so the roof
# uses the best bandwidth measured above.

# %%
roof_bandwidth, roof_label = (
    (info.accelerator.bandwidth_bytes_per_s, "table")
    if info.accelerator and info.accelerator.bandwidth_bytes_per_s
    else (bandwidth["bytes_per_s"].max(), "best measured")
)
peaks = {dtype: peak for dtype, peak in info.peak_flops.items() if peak}
fig = plots.roofline(matmul, peaks=peaks, bandwidth_bytes_per_s=roof_bandwidth, bandwidth_label=roof_label,
                     title=f"Matmul throughput against the roofline: {info.name}")
roofline_png = ch.save_figure(fig, "roofline")

# %%
best = matmul.loc[matmul.groupby("dtype")["flops"].idxmax()]  # the largest shape per dtype
ledger = pd.DataFrame({
    "experiment": "largest matmul vs dense peak",
    "component": best["dtype"] + " " + best[["m", "n", "k"]].astype(str).agg("x".join, axis=1),
    "unit": "FLOP/s",
    "predicted": best["peak_flops_per_s"],
    "measured": best["flops_per_s"],
}).dropna(subset=["predicted"])
ch.record_ledger(ledger)
ledger

# %% [markdown]
# ### Host memory vs HBM
#
# Seed article 004 (on AI's growing memory demand, HBM vs DRAM) claims that mainstream DDR5 delivers about
# 50-100 GB/s while HBM3 reaches 3.2 TB/s and more, "dozens of times" DDR5. The figure puts the bandwidth measured
# here next to the HBM figures of memlab's table and the article's DDR5 range.

# %%
SEED_004_DDR5_GB_S = (50, 100)  # seed article 004's claim for mainstream DDR5, GB/s
hbm = hardware.to_frame([hardware.gpu(k) for k in ("a100-80gb-sxm", "h100-sxm", "h200-sxm", "mi300x")])
measured = bandwidth.assign(label=lambda d: d["kind"] + " " + (d["array_bytes"] // 2**20).astype(str) + " MiB")
fig, ax = plt.subplots(figsize=(7.5, 4.5))
ax.bar(measured["label"], measured["bytes_per_s"] / 1e9, color="tab:blue", label=f"measured on {info.name}")
ax.bar(hbm["key"], hbm["bandwidth_bytes_per_s"] / 1e9, color="tab:orange", label="memlab table (datasheets)")
ax.axhspan(*SEED_004_DDR5_GB_S, color="tab:green", alpha=0.25, label="seed 004's DDR5 claim")
ax.set(yscale="log", ylabel="bandwidth (GB/s)", title="Memory bandwidth: measured here vs datasheet HBM")
ax.tick_params(axis="x", rotation=45)
ax.legend(fontsize=8)
bandwidth_png = ch.save_figure(fig, "bandwidth")

# %%
dram = bandwidth.loc[bandwidth["array_bytes"].idxmax()]
h100 = hardware.gpu("h100-sxm")
pd.Series({
    "measured, largest array (GB/s)": round(dram["bytes_per_s"] / 1e9, 1),
    "H100 SXM HBM3, table (GB/s)": h100.bandwidth_bytes_per_s / 1e9,
    "ratio HBM / measured": round(h100.bandwidth_bytes_per_s / dram["bytes_per_s"], 1),
}, name="bandwidth").to_frame()

# %% [markdown]
# **Reading it.** A bandwidth figure belongs to a whole memory system: all channels of a socket (DDR5) or all
# stacks of a GPU (HBM). A process with a few cores sees a slice of it, and small arrays that fit in cache show
# cache bandwidth, well above DRAM's. The article's ratio holds in kind (HBM is one to two orders of magnitude
# above what a CPU process reads from DRAM), but the measured number depends on the array size and core count.

# %%
recorded = ch.recorded("00_your_machine_gpu")
recorded if recorded is not None else "No GPU measurements for this chapter are recorded in data/recorded/ yet."

# %% [markdown]
# ## 4. The misreading, part 1: dense vs sparse peaks
#
# Since Ampere, NVIDIA datasheets print tensor-core figures "with sparsity": 2:4 structured sparsity (two of
# every four weights zero, in a pattern the hardware skips) doubles the rate. Dense training never runs at that
# figure. memlab's table stores the dense peak and says so in each row's notes; the sparse figure is twice it.
# An MFU computed against the sparse figure comes out at half its true value.

# %%
rows = [hardware.gpu(k) for k in ("a100-80gb-sxm", "h100-sxm", "h200-sxm", "l40s", "b200", "mi300x")]
pd.DataFrame({
    "gpu": [r.name for r in rows],
    "dense bf16 (TFLOP/s)": [r.peak("bf16") / 1e12 for r in rows],
    "with 2:4 sparsity (TFLOP/s)": [2 * r.peak("bf16") / 1e12 for r in rows],
    "table notes": [r.notes for r in rows],
})

# %% [markdown]
# Seed article 001's "312 TFLOPS" GPU is the A100's *dense* bf16 peak (first row): the article divided by the
# right number. The same card's sparse figure is twice that.
#
# ## 5. The misreading, part 2: GB vs GiB
#
# Memory is counted in powers of two (GiB = 2³⁰ bytes; nvidia-smi prints MiB) and marketed in "GB". HBM is
# built from power-of-two dies, so an "80 GB" HBM card holds 80 GiB, of which the driver reserves a little; read
# as decimal gigabytes, the same "80 GB" would be 7 % less. Seed article 000 ("視訊記憶體利用率", *memory
# utilization*) defines memory utilization as memory in use over the physically available total: that ratio is
# only as good as the unit of its denominator.

# %%
units = pd.DataFrame({
    "what": ["this device (reported)", "H100 SXM (memlab table)", "'80 GB' read as decimal"],
    "bytes": [info.total_memory_bytes, h100.memory_bytes, 80 * 10**9],
})
units["GB (10^9 B)"] = units["bytes"] / 1e9
units["GiB (2^30 B)"] = units["bytes"] / 2**30
units

# %% [markdown]
# ## Exercises
#
# Write your answer in place of `...` and run the cell: the check says whether it is right, or how far off and a
# hint. Answers may carry units, e.g. `"74.5 GiB"`.
#
# **Exercise 1.** How many GiB of memory does this device report (the `bytes` of the first row above)?

# %%
ex_gib = exercises.Numeric(
    "device-gib", "This device's memory in GiB", reference=lambda: info.total_memory_bytes / 2**30,
    hint="1 GiB = 2**30 bytes = 1.074 GB", unit="GiB", rtol=0.01)
answer = ...
ex_gib.check(answer)

# %% [markdown]
# **Exercise 2.** Take seed article 001's example: an A100 doing about 160 TFLOP/s of useful bf16 work. Someone
# divides it by the A100's bf16 figure printed *with sparsity*. What MFU, in %, do they report?

# %%
SEED_001_USEFUL_FLOP_S = 160e12  # seed article 001's "about 160 TFLOPS" of useful work on a 312 TFLOPS GPU
ex_sparse = exercises.Numeric(
    "a100-sparse-mfu", "MFU against the sparse figure",
    reference=lambda: 100 * SEED_001_USEFUL_FLOP_S / (2 * hardware.gpu("a100-80gb-sxm").peak("bf16")),
    hint="the sparse figure is twice the dense peak in the table above", unit="%", rtol=0.02)
answer = ...
ex_sparse.check(answer)

# %% [markdown]
# **Exercise 3.** At its peak bandwidth (memlab's table), how many milliseconds does an H200 SXM need to read
# all of its memory once? (That is the floor for one decoding step of a model that fills the card.)

# %%
h200 = hardware.gpu("h200-sxm")
ex_sweep = exercises.Numeric(
    "h200-read-all", "Time to read all H200 SXM memory once",
    reference=lambda: 1e3 * h200.memory_bytes / h200.bandwidth_bytes_per_s,
    hint="time = bytes / (bytes per second); the table's memory is in GiB, its bandwidth in decimal TB/s",
    unit="ms", rtol=0.03)
answer = ...
ex_sweep.check(answer)

# %% [markdown]
# ## Summary
#
# - Peaks come from a sourced table row (GPU) or a measurement (CPU); an unknown GPU gets no peak rather than a
#   borrowed one. Every MFU in this course divides by the **dense** peak of the dtype the matmuls run in.
# - Single matmuls reach their peak only when large: small and skinny shapes sit under the memory roof. No
#   training step exceeds its matmuls' achieved/peak.
# - Bandwidth depends on where the data lives (cache, DRAM, HBM) and how much of the memory system a process
#   drives; datasheet HBM figures sit one to two orders of magnitude above what a CPU process reads from DRAM.
# - "GB" on a GPU datasheet means GiB-sized dies; convert with 2³⁰, not 10⁹, before deciding whether a model fits.

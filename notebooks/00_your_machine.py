# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
#   memlab:
#     runs_alone: it measures this machine's matmul peak and memory bandwidth
# ---

# %% [markdown]
# # 00 · Your machine: its peaks, its bandwidth, and the units they are printed in
#
# **The common belief.** "My card does *N* TFLOP/s and has 80 GB": the two numbers on the datasheet are taken as
# what a training job gets. Every later chapter divides by a peak or compares against a capacity (does it fit?).
# The division by a peak is **MFU**, *model FLOPs utilisation*: the FLOP/s a model's own arithmetic achieves over
# the device's peak FLOP/s (PaLM, Appendix B, `[chowdhery2022]`). So this chapter pins down which peak and which
# capacity, on the machine the course runs on:
#
# 1. what the device is, and where its peak figures come from (a sourced table row, or a measurement);
# 2. what a matmul and a memory copy actually achieve here, against those peaks;
# 3. dense vs sparse peaks: the datasheet's biggest number is usually not the one to divide by;
# 4. GB vs GiB: "80 GB" and the unit a memory ratio is taken in.
#
# Later chapters reuse what this one writes to its output folder (`device_peaks.csv`, `matmul.csv`,
# `bandwidth.csv`).

# %% tags=["parameters"]
scale = "auto"
device = "auto"
seed = 0
out_dir = "../reports/build/00_your_machine"

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import psutil
import torch
from IPython.display import Markdown, display

from memlab import chapter, check, describe, detect, gpu, roofline_bound
from memlab.compare import plots
from memlab.measure import roofline
from memlab.predict.hardware import gpus as hardware
from memlab.units import GB, GiB, MiB, fmt_bytes, fmt_rate

ch = chapter(scale, device, seed, out_dir)
info = detect(device=ch.device)
ch

# %% [markdown]
# ## 1. The formula: what is this device, and what are its peaks?
#
# `memlab.measure.machine.detect()` resolves a GPU's name and memory to one row of memlab's accelerator table (dense
# peaks per dtype, memory, bandwidth, and the datasheet each comes from). A GPU missing from the table gets *no*
# peak, with the reason, never a neighbour's. A CPU has no datasheet row: its matmul peak is measured by a short
# benchmark, cached, and marked as measured.

# %%
peaks = pd.DataFrame({
    "dtype": list(info.peak_flops),
    "dense_peak_tflop_per_s": [None if v is None else v / 1e12 for v in info.peak_flops.values()],
}).dropna()
ch.save_table(peaks, "device_peaks")
about = describe(ch.device)
about.update({k: fmt_rate(v) for k, v in about.items() if k.startswith("peak_") and isinstance(v, float)})
about["total_memory_bytes"] = f"{about['total_memory_bytes']:,} B ({fmt_bytes(about['total_memory_bytes'])})"
ABOUT_WORDS = {"device": "device", "device_kind": "kind", "accelerator": "memlab table row",
               "peak_source": "where the peaks come from", "peak_reason": "why no peak",
               "peak_fp32_flops": "fp32 peak", "peak_bf16_flops": "bf16 peak", "total_memory_bytes": "memory",
               "torch_version": "torch", "cuda_version": "CUDA", "driver_version": "driver", "cpu_count": "CPU cores"}
pd.Series({ABOUT_WORDS.get(k, k.replace("_", " ")): v for k, v in about.items() if v is not None},
          name="this device").to_frame()

# %% [markdown]
# The dense peaks `detect()` gives (dtypes without a peak for this device are left out). On a CPU this is
# detect()'s own short benchmark; section 2 divides by the higher of it and the best matmul this run measures, and
# shows that one ceiling beside each point:

# %%
peaks

# %%
ch.cpu_note("a CPU has no datasheet peak in memlab's table, so its ceiling is itself a measurement (the best "
            "matmul measured, by detect() or in this chapter) and achieved/ceiling compares two measurements; the "
            "GPU-only points (HBM bandwidth, tensor-core dtypes such as tf32 and fp8) cannot be shown here.")

# %% [markdown]
# ## 2. The experiment: a matmul and a memory copy, against those peaks
#
# `memlab.measure.roofline.matmul_flops_per_s` times `C = A @ B` for a few shapes and dtypes (FLOPs = 2·m·n·k). One
# shape has m = 1: a **GEMV**, a *general matrix-vector product* (one vector times a matrix, as in one decoding
# step), which does little arithmetic per byte it reads. `memlab.measure.roofline.bandwidth_bytes_per_s` times two
# kernels of McCalpin's **STREAM** benchmark `[mccalpin1995]`: *copy* (`a = b`) and *triad*
# (`a = b + s·c`, two reads and one write per element), counting bytes as STREAM does.
#
# Where an array lives decides what is measured: one that fits in a cache measures the cache, one larger than
# every cache measures DRAM (or a GPU's **HBM**, *high-bandwidth memory*, section 3).
# `memlab.measure.roofline.cache_bytes` reads this machine's cache sizes (Linux sysfs or `lscpu`; a GPU's L2 from
# its device properties) and `default_sizes` picks one array inside the L2 and one at least twice the whole
# last-level cache:

# %%
caches = roofline.cache_bytes(ch.device)
sizes = roofline.default_sizes(ch.device, ch.scale, caches=caches)
llc_total = caches.get("last_level_total")
CACHE_WORDS = {"last_level": "last-level cache", "last_level_total": "last-level cache, all instances"}
pd.DataFrame({
    "what": [*(CACHE_WORDS.get(k, f"{k} cache") for k in caches),
             *(f"array {i + 1} of the benchmark" for i in range(len(sizes)))],
    "size": [fmt_bytes(v) for v in [*caches.values(), *sizes]],
    "note": [{"last_level": "one instance of the last level", "last_level_total": "all instances on this machine"}
             .get(k, "per instance") for k in caches]
            + ["beyond the whole last-level cache: DRAM" if llc_total and s >= 2 * llc_total else "fits in a cache"
               for s in sizes],
})

# %% [markdown]
# **Exercise 1 (predict before the next cell measures).** The GEMV-like shape below multiplies a 1 × k vector by
# a k × n fp32 matrix. Its *arithmetic intensity* is FLOPs per byte moved: 2·m·n·k FLOPs over the bytes of the
# two operands and the result, each read or written once. How many FLOP per byte?

# %%
gemv = next(shape for shape in roofline.default_shapes(ch.device, ch.scale) if shape[0] == 1)
print(f"GEMV-like shape (m, n, k) = {gemv}")

# %%
answer = ...
check("00.gemv-intensity", answer, shape=gemv)

# %% [markdown]
# Seed article 001 ("利用率", *utilization*) claims that top large-model training reaches only about 50 % MFU,
# and that a "312 TFLOPS" GPU delivers about 160 TFLOPS of useful work `[seed-001]`. A step's MFU cannot exceed the
# achieved/peak of the matmuls *it* runs, at their shapes and dtype. The shapes below are this page's small ones
# (on a CPU their ceiling is, by construction, the best of them): they show the method, not a training step's
# ceiling. For that, time the step's own GEMM shapes (e.g. 4096 × 11008 for a 7B MLP); the best rate a GPU reaches
# over a sweep of large shapes is its *maximum achievable matmul FLOPs* (MAMF, `[bekman-mamf]`), the number an MFU
# is read against (chapter 08).

# %% tags=["reveals-00.gemv-intensity"]
matmul = roofline.matmul_flops_per_s(device=ch.device, scale=ch.scale)
matmul = matmul[matmul["status"] == "ok"].copy()
bandwidth = roofline.bandwidth_bytes_per_s(sizes, device=ch.device, scale=ch.scale)
bandwidth = bandwidth[bandwidth["status"] == "ok"].copy()
ch.save_table(bandwidth, "bandwidth")

# The ceiling each point is compared with. A GPU: the datasheet's dense peak. A CPU: the best matmul measured,
# by detect()'s benchmark or in this run, whichever is higher, so no point can sit above its own ceiling.
best_here = matmul.groupby("dtype")["flops_per_s"].max()
if ch.on_cpu:
    ceiling = {d: max(p, float(best_here.get(d, 0.0))) for d, p in info.peak_flops.items() if p}
    ceiling_label = "best measured (detect() or this run)"
else:
    ceiling = {d: p for d, p in info.peak_flops.items() if p}
    ceiling_label = "datasheet dense peak"
matmul["ceiling_flops_per_s"] = matmul["dtype"].map(ceiling)
matmul["achieved_over_ceiling"] = matmul["flops_per_s"] / matmul["ceiling_flops_per_s"]
ch.save_table(matmul, "matmul")
pd.DataFrame({
    "dtype": matmul["dtype"], "shape m x n x k": matmul[["m", "n", "k"]].astype(str).agg(" x ".join, axis=1),
    "FLOP/byte": matmul["arithmetic_intensity"].round(2),
    "achieved": matmul["flops_per_s"].map(fmt_rate), "ceiling": matmul["ceiling_flops_per_s"].map(fmt_rate),
    f"achieved / ceiling ({ceiling_label})": matmul["achieved_over_ceiling"].map("{:.1%}".format),
})

# %%
tc_ratio = {gpu(k).name: gpu(k).peak("bf16") / gpu(k).peak("fp32") for k in ("a100-80gb-sxm", "h100-sxm")}
if ch.on_cpu and {"fp32", "bf16"} <= set(best_here.index):
    cpuinfo = Path("/proc/cpuinfo")
    flags = set(cpuinfo.read_text().split()) if cpuinfo.exists() else set()
    native = sorted(flags & {"avx512_bf16", "amx_bf16"})
    ratio = float(best_here["bf16"] / best_here["fp32"])
    display(Markdown(
        f"The best bf16 matmul measured here runs at {ratio:,.2f}x the best fp32 one. This CPU "
        + (f"has native bf16 instructions ({', '.join(native)} in /proc/cpuinfo), so torch's oneDNN can run bf16 "
           "GEMMs on them." if native else
           "shows no native bf16 instruction (no avx512_bf16 or amx_bf16 in /proc/cpuinfo"
           + ("" if flags else ": not a Linux machine, so unknown") + "): torch converts bf16 to fp32 in software "
           "around each multiply, a property of this CPU's path, not of bf16.")
        + f" A GPU's tensor cores run bf16 at {min(tc_ratio.values()):.0f}-{max(tc_ratio.values()):.0f}x the "
          "non-tensor-core fp32 rate (dense datasheet peaks in memlab's table: "
          + ", ".join(f"{k} {v:.1f}x" for k, v in tc_ratio.items())
          + "; chapter 03 section 5); on a CPU shared with other jobs, single timings also carry their noise."))

# %% [markdown]
# ## 3. Prediction vs measurement: the roofline
#
# The "prediction" a datasheet invites is: every matmul runs at peak. The roofline (Williams, Waterman and
# Patterson, CACM 2009, `[williams2009]`) refines it: a kernel doing *I* FLOPs per byte of memory traffic can
# reach at most min(peak, I × bandwidth) (`memlab.roofline_bound`). Points far below the flat roof at high
# intensity are overheads; points on the slope are limited by memory, not by compute. On a GPU the roof uses the
# table's peak HBM bandwidth (the benchmark flushes the L2 cache between repeats). On a CPU there is no table
# figure and the benchmark's small operands stay in cache, so the dashed slope is the best bandwidth measured above
# (a *cache* roof when a cache-sized array measured best), and a dotted slope then draws the bandwidth of the
# largest array (DRAM). A GEMV in a real decoding step streams weights far larger than any cache: the DRAM slope
# is its roof.

# %%
best_row = bandwidth.loc[bandwidth["bytes_per_s"].idxmax()]
largest = bandwidth[bandwidth["array_bytes"] == bandwidth["array_bytes"].max()]
same_kernel = largest[largest["kind"] == best_row["kind"]]  # compare one kernel in cache and in DRAM
dram_row = (same_kernel if len(same_kernel) else largest).iloc[0]
best_in_cache = not (llc_total and best_row["array_bytes"] >= 2 * llc_total)
if info.accelerator and info.accelerator.bandwidth_bytes_per_s:
    roof_bandwidth, roof_label, extra_roofs = info.accelerator.bandwidth_bytes_per_s, "HBM, table", {}
else:
    roof_bandwidth = float(best_row["bytes_per_s"])
    where = "cache" if best_in_cache else "DRAM"
    roof_label = f"{where}: best measured, {best_row['kind']} {fmt_bytes(int(best_row['array_bytes']))}"
    extra_roofs = ({f"DRAM: {dram_row['kind']} {fmt_bytes(int(dram_row['array_bytes']))}":
                    float(dram_row["bytes_per_s"])} if best_in_cache else {})
fig = plots.roofline(matmul, peaks=ceiling, bandwidth_bytes_per_s=roof_bandwidth, bandwidth_label=roof_label,
                     title=f"Matmul throughput against the roofline: {info.name}",
                     source=f"compute roof: {ceiling_label}", extra_bandwidths=extra_roofs)
roofline_png = ch.save_figure(fig, "roofline")
if ch.on_cpu:
    display(Markdown(
        f"The cache roof's slope ({best_row['kind']}, {fmt_rate(roof_bandwidth, 'B/s')}) is "
        f"{roof_bandwidth / float(dram_row['bytes_per_s']):.1f}x the DRAM one (the same kernel, "
        f"{fmt_rate(float(dram_row['bytes_per_s']), 'B/s')}): a point judged against the cache roof alone would "
        "look farther from its memory limit than a DRAM-bound kernel is." if extra_roofs else
        "In this run the largest array (DRAM) measured the best bandwidth, "
        f"{fmt_rate(roof_bandwidth, 'B/s')}: the cache-sized array came out slower (timings on a shared machine "
        "carry its noise), so the one memory roof drawn is DRAM's."))

# %%
matmul["roofline_bound"] = [roofline_bound(i, ceiling[d], roof_bandwidth)
                            for i, d in zip(matmul["arithmetic_intensity"], matmul["dtype"], strict=True)]
ledger = pd.DataFrame({
    "experiment": "matmul vs roofline bound",
    "component": matmul["dtype"] + " " + matmul[["m", "n", "k"]].astype(str).agg("x".join, axis=1),
    "unit": "FLOP/s",
    "predicted": matmul["roofline_bound"],
    "measured": matmul["flops_per_s"],
    "kind": "bound",  # the roofline is an upper bound: the report shows the share of it reached, not an "error"
})
ch.record_ledger(ledger)
ledger.assign(predicted=ledger["predicted"].map(fmt_rate), measured=ledger["measured"].map(fmt_rate),
              **{"measured / bound": (ledger["measured"] / ledger["predicted"]).map("{:.1%}".format)})

# %% [markdown]
# The ledger (and the report's index) records each matmul against its roofline bound, min(ceiling, I × bandwidth):
# the bound is the prediction, and the last column says how much of it each shape reached. A point far below both
# roofs is limited by neither compute nor memory but by overheads (small shapes, a library's slow path).
#
# ### Host memory vs HBM
#
# **HBM**, *high-bandwidth memory*, is DRAM stacked beside the GPU die on a wide interface. Seed article 004 (on
# AI's growing memory demand) claims that mainstream DDR5 delivers about 50-100 GB/s while HBM3 reaches 3.2 TB/s
# and more, "dozens of times" DDR5 `[seed-004]`. A DDR5 channel is 8 bytes wide (two 32-bit subchannels,
# `[jedec-ddr5]`), so its peak is channels × 8 B × transfers per second: the seed's range is a *desktop* with two
# channels. A server socket has 8 channels (Intel Xeon 4th gen, DDR5-4800, `[intel-xeon4]`) or 12 (AMD EPYC
# 9004, DDR5-4800, `[amd-epyc9004]`):

# %%
def ddr_peak(channels: int, mega_transfers_per_s: int) -> float:
    """Peak DDR bandwidth in bytes/s: channels x 8 bytes x transfers/s [jedec-ddr5]."""
    return channels * 8 * mega_transfers_per_s * 1e6


ddr = pd.DataFrame({
    "system": ["desktop, 2 x DDR5-4800", "desktop, 2 x DDR5-6400", "Xeon 4th gen socket, 8 x DDR5-4800",
               "EPYC 9004 socket, 12 x DDR5-4800"],
    "peak (GB/s)": [ddr_peak(2, 4800) / GB, ddr_peak(2, 6400) / GB, ddr_peak(8, 4800) / GB, ddr_peak(12, 4800) / GB],
})
ddr

# %% [markdown]
# HBM figures are per device: an H100 SXM's 3.35 TB/s is that one GPU reading its own stacks; eight GPUs in a
# server each have their own, and none reads another's at that rate. The figure puts the bandwidth measured here
# next to both.

# %%
SEED_004_DDR5_GB_S = (50, 100)  # seed article 004's claim for mainstream DDR5, GB/s
hbm = hardware.to_frame([gpu(k) for k in ("a100-80gb-sxm", "h100-sxm", "h200-sxm", "mi300x")])
measured = bandwidth.assign(label=lambda d: d["kind"] + " " + d["array_bytes"].map(fmt_bytes))
fig, ax = plt.subplots(figsize=(7.5, 4.5))
ax.bar(measured["label"], measured["bytes_per_s"] / 1e9, color="tab:blue", label=f"measured on {info.name}")
ax.bar(ddr["system"].str.replace(" socket", "").str.replace(", ", "\n"), ddr["peak (GB/s)"], color="tab:green",
       label="DDR5 peak: channels x 8 B x rate")
hbm_names = hbm["name"].str.replace("NVIDIA ", "").str.replace("AMD Instinct ", "")
ax.bar(hbm_names, hbm["bandwidth_bytes_per_s"] / 1e9, color="tab:orange", label="memlab table (datasheets), per GPU")
ax.axhspan(*SEED_004_DDR5_GB_S, color="tab:green", alpha=0.2, label="seed 004's DDR5 claim")
ax.set(yscale="log", ylabel="bandwidth (GB/s)", title="Memory bandwidth: measured here, DDR5 peaks, per-GPU HBM")
ax.tick_params(axis="x", rotation=60, labelsize=8)
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
bandwidth_png = ch.save_figure(fig, "bandwidth")

# %%
dram = dram_row  # the largest array, with the kernel of the best roof (section 3)
h100 = gpu("h100-sxm")
pd.Series({
    "largest array (beyond the last-level cache)": fmt_bytes(int(dram["array_bytes"])),
    f"measured on it ({dram['kind']})": fmt_rate(dram["bytes_per_s"], "B/s"),
    "H100 SXM HBM3, table": fmt_rate(h100.bandwidth_bytes_per_s, "B/s"),
    "ratio HBM / measured": f"{h100.bandwidth_bytes_per_s / dram['bytes_per_s']:.0f}x",
    "ratio HBM / 2-channel DDR5-6400 desktop": f"{h100.bandwidth_bytes_per_s / ddr_peak(2, 6400):.0f}x",
    "ratio HBM / 12-channel DDR5-4800 server socket": f"{h100.bandwidth_bytes_per_s / ddr_peak(12, 4800):.1f}x",
}, name="bandwidth").to_frame()

# %%
in_cache = bandwidth[bandwidth["array_bytes"] < bandwidth["array_bytes"].max()]
cache_best = float(in_cache["bytes_per_s"].max()) if len(in_cache) else float("nan")
dram_best = float(largest["bytes_per_s"].max())
Markdown(
    "**Reading it.** The seed's \"dozens of times\" holds against a two-channel desktop "
    f"({h100.bandwidth_bytes_per_s / ddr_peak(2, 6400):.0f}x) but shrinks to "
    f"{h100.bandwidth_bytes_per_s / ddr_peak(12, 4800):.1f}x against a 12-channel server socket. A process with a "
    "few cores sees a slice of either. "
    + (f"Here the cache-sized arrays measured up to {fmt_rate(cache_best, 'B/s')}, "
       f"{cache_best / dram_best:.1f}x the largest array's {fmt_rate(dram_best, 'B/s')}: a bandwidth measured on "
       "arrays that fit in a cache is the cache's, not DRAM's." if cache_best > dram_best else
       f"In this run the cache-sized arrays ({fmt_rate(cache_best, 'B/s')} at best) came out no faster than the "
       f"largest one ({fmt_rate(dram_best, 'B/s')}): timings on a shared machine carry its noise."))

# %%
recorded = ch.recorded("00_your_machine_gpu")
recorded  # the GPU run recorded by scripts/gpu_session.sh, where the repo has one (nothing shows otherwise)

# %%
ch.published("00")

# %% [markdown]
# ## 4. The misreading, part 1: dense vs sparse peaks
#
# Since Ampere, NVIDIA datasheets print tensor-core figures "with sparsity": 2:4 structured sparsity (two of
# every four weights zero, in a pattern the hardware skips) doubles the rate. Dense training never runs at that
# figure. memlab's table stores the dense peak and, where the datasheet prints one, the sparse figure as printed:
# it is not always exactly twice the dense one (the L40S prints 362.05 and 733). An MFU computed against the
# sparse figure comes out at about half its true value.

# %%
rows = [gpu(k) for k in ("a100-80gb-sxm", "h100-sxm", "h200-sxm", "l40s", "b200", "mi300x")]
pd.DataFrame({
    "gpu": [r.name for r in rows],
    "dense bf16 (TFLOP/s)": [r.peak("bf16") / 1e12 for r in rows],
    "2:4 sparse, as printed (TFLOP/s)": [None if r.sparse_peak("bf16") is None else r.sparse_peak("bf16") / 1e12
                                         for r in rows],
    "2 x dense (TFLOP/s)": [2 * r.peak("bf16") / 1e12 for r in rows],
    "ridge point (FLOP/byte)": [r.peak("bf16") / r.bandwidth_bytes_per_s for r in rows],
    "table notes": [r.notes for r in rows],
})

# %% [markdown]
# Seed article 001's "312 TFLOPS" GPU is the A100's *dense* bf16 peak (first row): the article divided by the
# right number. The same card's sparse figure is twice that. The *ridge point* column is dense peak over memory
# bandwidth: a kernel doing fewer FLOPs per byte than that cannot reach the peak on that card however well it is
# written (section 3's roofline), and a decoding step's GEMV, at about 1 FLOP per byte in bf16, sits hundreds of
# times below it.


# %%
no_sparse = [r for r in rows if r.sparse_peak("bf16") is None]
Markdown(f"Rows with an empty 'as printed' cell: {', '.join(r.name for r in no_sparse)}. memlab's table stores a "
         "sparse figure only where its source quote prints one; these rows' notes say the vendor prints 2x dense "
         "'with structured sparsity' (" + "; ".join(f"{r.name}: {2 * r.peak('bf16') / 1e12:,.1f} TFLOP/s bf16"
                                                   for r in no_sparse)
         + ", the 2 x dense column). The lesson does not change: divide by the dense column."
         if no_sparse else "Every row stores its printed sparse figure.")

# %% [markdown]
# One more default decides which fp32 column a GPU runs at. TF32 (10-bit mantissa, fp32's range) runs fp32 matmuls
# on the tensor cores, and torch switches it per library (the cell reads this torch's defaults):

# %%
h100_row = gpu("h100-sxm")
Markdown(f"In this torch ({torch.__version__}): `torch.backends.cuda.matmul.allow_tf32` = "
         f"{torch.backends.cuda.matmul.allow_tf32}, `torch.backends.cudnn.allow_tf32` = "
         f"{torch.backends.cudnn.allow_tf32}. "
         + (f"So an fp32 matmul on an H100 SXM runs at the table's fp32 peak, {h100_row.peak('fp32') / 1e12:,.1f} "
            "TFLOP/s, unless `torch.set_float32_matmul_precision(\"high\")` turns TF32 on "
            f"({h100_row.peak('tf32') / 1e12:,.1f} TFLOP/s dense)" if not torch.backends.cuda.matmul.allow_tf32 else
            f"So an fp32 matmul on an H100 SXM runs on TF32 ({h100_row.peak('tf32') / 1e12:,.1f} TFLOP/s dense), not "
            f"at the fp32 peak ({h100_row.peak('fp32') / 1e12:,.1f} TFLOP/s)")
         + ": an MFU must divide by the peak of the path the matmuls actually take.")

# %% [markdown]
#
# ## 5. The misreading, part 2: GB vs GiB, and the unit of a ratio
#
# Memory is counted in powers of two (GiB = 2³⁰ bytes; nvidia-smi prints MiB) and marketed in "GB". A datasheet's
# GB is a product decision, not a power-of-two die size: HBM3e stacks 24 Gb dies, 24 GB per eight-high stack
# `[micron-hbm3e]`, and NVIDIA sells the H200 as 141 GB, less than its six stacks hold. memlab's table reads a
# datasheet's "N GB" as N GiB (GPUs report within a few % of that); read as decimal gigabytes it would be 7 %
# less.
#
# Seed article 000 ("視訊記憶體利用率", *memory utilization*) defines U_cap as memory in use over the physically
# available total `[seed-000]`. The ratio has no unit: it is the same in bytes, MiB or GiB as long as numerator and
# denominator share one. The trap is mixing them: memory in use as nvidia-smi prints it (MiB) over the marketed
# "GB" figure times 1000. Measured on this device now:

# %%
if ch.on_cpu:
    total = info.total_memory_bytes
    used = total - psutil.virtual_memory().available
else:
    free, total = torch.cuda.mem_get_info(ch.device)
    used = total - free
marketed_gb = round(total / GB)  # the figure a vendor would print for this capacity
pd.DataFrame({
    "U_cap computed as": ["bytes / bytes", "GiB / GiB", "MiB in use / (marketed GB x 1000)",
                          "GiB in use / marketed GB"],
    "value": [used / total, (used / GiB) / (total / GiB), (used / MiB) / (marketed_gb * 1000),
              (used / GiB) / marketed_gb],
}).assign(value=lambda d: d["value"].map("{:.2%}".format))

# %% [markdown]
# The first two rows agree; the mixed ones are off by the unit ratio (MiB/MB = 1.049) and the marketing rounding.
# The same capacities in both units:

# %%
units = pd.DataFrame({
    "what": ["this device (reported)", "H100 SXM (memlab table)", "'80 GB' read as decimal"],
    "bytes": [info.total_memory_bytes, h100.memory_bytes, 80 * GB],
})
units["GB (10^9 B)"] = (units["bytes"] / 1e9).round(2)
units["GiB (2^30 B)"] = (units["bytes"] / GiB).round(2)
units["bytes"] = units["bytes"].map("{:,}".format)
units

# %% [markdown]
# ## Exercises
#
# Write your answer in place of `...` and run the cell: the check says whether it is right (with the exact value
# and why), or how far off, with a hint. Answers may carry units, e.g. `"74.5 GiB"`. Each check ends with a
# collapsed solution. (Exercise 1 is above, before the measurement.)
#
# **Exercise 2.** `nvidia-smi` on an H100 80GB HBM3 prints `61440MiB / 81559MiB` (the total it reports for this
# card, less than the marketed 80 GB read as 81,920 MiB). What is U_cap, in %?

# %%
answer = ...
check("00.ucap-units", answer, used_mib=61_440, total_mib=81_559, card="h100-sxm")

# %% [markdown]
# **Exercise 3.** Take seed article 001's example: an A100 doing about 160 TFLOP/s of useful bf16 work. Someone
# divides it by the A100's bf16 figure printed *with sparsity*. What MFU, in %, do they report?

# %%
answer = ...
check("00.a100-sparse-mfu", answer)

# %% [markdown]
# **Exercise 4.** At its peak bandwidth (memlab's table), how many milliseconds does an H200 SXM need to read
# all of its memory once? Use the table row `gpu("h200-sxm")`: its `memory_bytes` and `bandwidth_bytes_per_s`.
# (That is the floor for one decoding step of a model that fills the card.)

# %%
answer = ...
check("00.h200-read-all", answer)

# %% [markdown]
# ## Summary
#
# - Peaks come from a sourced table row (GPU) or a measurement (CPU, labelled "best measured"); an unknown GPU
#   gets no peak rather than a borrowed one. Every MFU in this course divides by the **dense** peak of the dtype
#   the matmuls run in; the datasheet's sparse figure is printed beside it, not derived.
# - Single matmuls reach their ceiling only when large: small and skinny shapes (a GEMV) sit under the memory
#   roof. A step's MFU cannot exceed the achieved/peak of the matmuls it runs, at their own shapes and dtype.
# - Bandwidth depends on where the data lives: arrays sized from this machine's caches measure cache or DRAM.
#   The seed's 50-100 GB/s is a two-channel desktop; a server socket peaks at 300-460 GB/s; HBM figures are per
#   GPU, several to dozens of times those.
# - "GB" on a datasheet is a marketed capacity (the H200's 141 GB is not a power of two); a ratio such as U_cap
#   is unit-free as long as both sides are in one unit: MiB over marketed GB is the slip.

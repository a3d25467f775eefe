# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
#   memlab:
#     runs_alone: it measures CPU occupancy and achieved FLOP/s
# ---

# %% [markdown]
# # 09 · What nvidia-smi's numbers count, and their CPU twins
#
# **The common belief.** "GPU-Util is 100 %, so the GPU is fully used"; "memory at 85-95 % is healthy"; "GPU-Util
# below 70 % means a memory bottleneck"; "`nvidia-smi dmon` shows bandwidth use". Seed 001 [seed-001] already
# warns that GPU-Util only says a kernel was running; seed 000 [seed-000] gives the 85-95 % rule and the
# utilisation ratios U_cap, U_bw, U_eff; seed 004 [seed-004] gives the 70 % rule and a monitoring script.
#
# Each monitor number is a *time fraction* or a *policy*, not a measure of useful work. This chapter shows it with
# measurements:
#
# 1. CPU % for a loop doing no arithmetic, a copy and a matmul (the twin of GPU-Util);
# 2. process RSS against live tensor bytes (the twin of "memory used" against allocated);
# 3. on a GPU: GPU-Util and NVML's memory ledger, measured (recorded data shown when present), and the DCGM
#    metrics and throttle reasons to read instead;
# 4. U_cap, U_eff and U_bw from a real run, and what each hides;
# 5. seed 004's monitoring script, run and corrected; the 85-95 % and 70 % rules against preallocation policies.

# %% tags=["parameters"]
scale = "auto"
device = "auto"
seed = 0
out_dir = "../reports/build/09_nvidia_smi"

# %%
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Markdown, display

from memlab import Setup, chapter, check, detect, gpu, preset, run_step, trace_gpt, training_loop
from memlab.course.chapter import as_percent
from memlab.labs import allocator, monitors
from memlab.measure import roofline
from memlab.predict.gpu import device as device_terms
from memlab.units import GB, GiB, MiB

ch = chapter(scale, device, seed, out_dir, ci_threads=1)  # repeatable: detect() measures 1 thread's peak
info = detect(device=ch.device)
cpu = detect(device="cpu")
CUDA = ch.device_type == "cuda"
SIZES = {  # what the scale changes: how long each CPU-% loop runs, how many bytes the RSS experiment allocates
    "ci": dict(busy_s=0.4, rss_bytes=64 * MiB),
    "full": dict(busy_s=2.0, rss_bytes=512 * MiB),
}[ch.scale]
STEPS = {  # what the device changes: the training step of sections 4 and 5
    "cpu": dict(model="tiny-gpt", setup=Setup(batch=4, seq=64)),
    "cuda": dict(model="gpt2", setup=Setup(batch=8, seq=1024, precision="amp-bf16", attention="flash")),
}
ON_DEVICE = STEPS[ch.device_type]
ch

# %% [markdown]
# ## 1. Busy is not useful: CPU % for three loops
#
# `psutil`'s process CPU % is time occupancy, like GPU-Util: the CPU time this process's threads ran over the
# wall time. GPU-Util is the share of NVML's sample period (between 1/6 s and 1 s, depending on the product)
# during which *one or more* kernels ran (NVML API, `nvmlUtilization_t` [nvml-api]). They differ in what they
# count: a process's CPU % sums its threads, so it exceeds 100 % on several cores [psutil], while GPU-Util
# saturates at 100 % whether a kernel uses one of an H100's 132 SMs or all of them. Each loop below runs for the
# same time on one thread: a pure-Python counter (no floating-point work), a memory-bound copy, and a matmul.
#
# **Exercise 1 (predict first).** Which loop will show the highest CPU %: `"busy"`, `"copy"`, `"matmul"`, or
# `"same"` (all within 25 % of each other)? Write your prediction; the next cell measures the three loops
# without showing them, the check compares, and the table and figure come after it.

# %%
prediction = ...

# %%
busy = monitors.cpu_busy_vs_work(duration_s=SIZES["busy_s"], peak_flops_per_s=None)  # measured, shown below

# %%
check("09.cpu-percent", prediction, table=busy)

# %% tags=["reveals-09.cpu-percent"]
fig, ax1 = plt.subplots(figsize=(7.5, 3.8), layout="constrained")
x = range(len(busy))
ax1.bar([i - 0.27 for i in x], busy["cpu_pct"], 0.27, label="CPU % (psutil, left axis)", color="tab:grey")
ax1.set(ylabel="process CPU %", xticks=list(x), xticklabels=busy["loop"],
        title="Same CPU %, very different work (one thread each)")
ax2 = ax1.twinx()
ax2.bar(list(x), busy["flops_per_s"] / 1e9, 0.27, label="GFLOP/s achieved (right axis)", color="tab:blue")
ax2.bar([i + 0.27 for i in x], busy["bytes_per_s"] / 1e9, 0.27, label="GB/s moved, read + write (right axis)",
        color="tab:orange")
ax2.set(ylabel="GFLOP/s, or GB/s")
fig.legend(loc="outside lower center", ncols=3, fontsize=8)
ch.save_figure(fig, "cpu_percent_vs_flops")
busy[["loop", "cpu_pct", "flops_per_s", "bytes_per_s", "torch_threads"]].rename(columns={
    "cpu_pct": "CPU (%)", "flops_per_s": "FLOP/s", "bytes_per_s": "bytes/s moved", "torch_threads": "torch threads",
}).round(2)

# %%
copy_row = busy.set_index("loop").loc["copy (memory-bound)"]
mm_row = busy.set_index("loop").loc["matmul (fp32)"]
Markdown(
    f"**Reading it (computed).** CPU % ranges {busy['cpu_pct'].min():.0f}-{busy['cpu_pct'].max():.0f} % over the "
    f"three loops (on a shared machine, the share the scheduler gave this process). The busy loop does no useful "
    f"work; the copy does {copy_row['bytes_per_s'] / 1e9:.1f} GB/s of useful, bandwidth-bound work and no FLOPs; "
    f"the matmul {mm_row['flops_per_s'] / 1e9:.1f} GFLOP/s. Time occupancy sees none of this difference. GPU-Util "
    f"has the same blind spot, worse: one kernel spinning on one of a GPU's many SMs reads 100 %.")

# %% [markdown]
# ## 2. Memory "used" is not memory in use: RSS vs live tensors
#
# PyTorch's CUDA caching allocator keeps freed blocks reserved for reuse, so nvidia-smi keeps showing them
# [pytorch-cuda-memory]. The C library does the same on a CPU: tensors below glibc's mmap threshold come from the
# heap, and freed heap pages stay in the process until `malloc_trim` (the twin of `torch.cuda.empty_cache`).

# %%
rss = monitors.rss_vs_live_bytes(total_bytes=SIZES["rss_bytes"])
fig, ax = plt.subplots(figsize=(7.5, 3.6), layout="constrained")
pos = range(len(rss))
ax.bar([i - 0.2 for i in pos], rss["live_tensor_bytes"] / MiB, 0.4, label="live tensor bytes (exact)")
ax.bar([i + 0.2 for i in pos], rss["rss_delta_bytes"] / MiB, 0.4, label="RSS above start (what top shows)")
ax.set(xticks=list(pos), xticklabels=rss["stage"], ylabel="MiB", title="Freed is not returned: RSS vs live tensors")
ax.tick_params(axis="x", labelsize=8)
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
ch.save_figure(fig, "rss_vs_live")
ch.record_ledger(pd.DataFrame({"experiment": "RSS vs live tensor bytes", "component": rss["stage"], "unit": "bytes",
                               "predicted": rss["live_tensor_bytes"], "measured": rss["rss_delta_bytes"],
                               "kind": "contrast"}))  # on purpose: RSS is not the tensors' bytes
pd.DataFrame({"stage": rss["stage"], "live tensors (MiB)": rss["live_tensor_bytes"] / MiB,
              "RSS above start (MiB)": rss["rss_delta_bytes"] / MiB}).style.hide(axis="index").format(precision=1)

# %% [markdown]
# ## 3. On a GPU: GPU-Util and the NVML ledger
#
# On CUDA this section measures, in this process: NVML GPU-Util while one `torch.cuda._sleep` kernel spins, while
# 1-element adds run back to back, during a big matmul and during a 1 GiB copy, with MFU and bandwidth beside
# each; and NVML "used" taken apart into other processes + CUDA context + the allocator's reserve, stage by stage
# (allocate, free half, `empty_cache`). `python scripts/record_utilisation.py --out DIR` records the same as data files
# with provenance (a fresh process, so the context is measured from zero).

# %%
if CUDA:
    gpu_util = monitors.gpu_util_demo(ch.device, duration_s=2.0)
    ledger = monitors.nvml_memory_ledger(ch.device)
    ch.save_table(gpu_util, "gpu_util")
    ch.save_table(ledger, "nvml_ledger")
    ch.record_ledger(pd.DataFrame({
        "experiment": "NVML used = other + context + reserved", "component": ledger["stage"], "unit": "bytes",
        "predicted": ledger["other_bytes"] + ledger["context_bytes"] + ledger["reserved_bytes"],
        "measured": ledger["nvml_used_bytes"]}).dropna())
    display(gpu_util)
    display(ledger)
recorded = [r for r in (ch.recorded(f"utilisation_{n}") for n in ("gpu_util", "nvml_ledger")) if r is not None]
recorded if recorded else Markdown("No GPU-Util or NVML ledger recording is in `data/recorded/`: on this page the "
                                   "GPU's side is the definitions (NVML, DCGM), the tables below and the published "
                                   "measurements after them.")

# %%
ch.published("09")

# %% [markdown]
# **What nvidia-smi would show for section 4's GPU step.** The same step traced on fake tensors (no GPU needed) and
# its allocations replayed through memlab's model of the CUDA caching allocator (torch 2.13 rules; a model, not a
# GPU measurement), with what the device adds on top, as `memlab estimate --gpu` counts it: two cuBLAS handles'
# workspaces on an H100 (sizes from PyTorch's `CublasHandlePool.cpp`) and the CUDA context. No context is measured
# here: with torch's lazy module loading the documented figures run from 254 to 426 MiB (pytorch#86509 to
# unsloth-zoo#1053); the bar takes the high end, as the verdict does. The published V100 figure above (1,343 MiB)
# is an older, eagerly loaded stack.

# %%
gpu_cfg, gpu_setup = preset(STEPS["cuda"]["model"]), STEPS["cuda"]["setup"]
gpu_step = trace_gpt(gpu_cfg, gpu_setup).replay()
context = device_terms.CUDA_CONTEXT_HIGH_BYTES
handles = device_terms.handles_of("train")  # the Python thread's and autograd's
smi = allocator.nvidia_smi_view(gpu_step, context, "documented range's high end (lazy loading)",
                                workspace_bytes=device_terms.workspace_bytes("h100-sxm", handles),
                                workspace_source="CublasHandlePool.cpp, sm90: 2 handles")
ch.save_table(smi, "nvidia_smi_view")
smi_total = int(smi["bytes"].sum())
fig, ax = plt.subplots(figsize=(8, 2.6), layout="constrained")
left = 0.0
for (layer, nbytes), color in zip(smi[["layer", "bytes"]].itertuples(index=False),
                                  ("tab:blue", "tab:cyan", "tab:orange", "tab:olive", "tab:grey"), strict=True):
    ax.barh(0, nbytes / GiB, left=left, color=color, label=layer.lstrip("+ "))
    left += nbytes / GiB
ax.set(yticks=[], xlabel="GiB", title=f"{gpu_cfg.name}, batch {gpu_setup.batch}, sequence {gpu_setup.seq}, bf16 "
       "autocast: what nvidia-smi would show, layer by layer (GiB)\nallocator layers: a model (torch 2.13 rules), "
       "not a measurement; workspaces and context: documented sizes")
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
ch.save_figure(fig, "nvidia_smi_layers")
smi.assign(GiB=smi["bytes"] / GiB).drop(columns="bytes").round(2)

# %%
tensors, cache = int(smi["bytes"].iloc[0]), gpu_step.total.reserved_bytes - int(smi["bytes"].iloc[0])
workspaces = int(smi.loc[smi["layer"] == "+ cuBLAS workspaces", "bytes"].sum())
Markdown(f"**The misreading, with numbers.** \"nvidia-smi used = my tensors\": nvidia-smi would show about "
         f"{smi_total / GiB:.1f} GiB for this step, of which the tensors at their peak are {tensors / GiB:.1f} GiB "
         f"({tensors / smi_total:.0%}). The allocator's cache adds {cache / GiB:.1f} GiB, the cuBLAS workspaces "
         f"{workspaces / MiB:.0f} MiB and the context {context / GiB:.2f} GiB; none of them is a tensor, and "
         "`empty_cache` can return only the cache's wholly free segments, never the workspaces' or the context.")

# %%
ch.cpu_note("GPU-Util, NVML's memory ledger and the CUDA context exist only with a GPU and its driver; the two "
            "sections above are their CPU twins, and the GPU rows appear here only when run on CUDA or recorded.")

# %% [markdown]
# `nvidia-smi dmon` prints one line per interval. Its columns, read as NVIDIA's nvidia-smi documentation defines
# them [nvidia-smi]: `sm` is the same time fraction as GPU-Util; `mem` is the fraction of time the memory
# controller was busy (not bandwidth, not capacity: seed 004 reads it as bandwidth [seed-004]); `fb` is
# framebuffer memory used in MiB (the "memory used" of the ledger above).

# %%
pd.DataFrame([
    ("sm", "% of the sample period a kernel ran on the GPU (= GPU-Util)", "useful FLOPs (see MFU)"),
    ("mem", "% of the sample period device memory was read or written", "how many bytes per second moved"),
    ("fb", "MiB of device memory used, all processes and contexts", "what tensors are live"),
    ("pwr / gtemp", "board power (W) and GPU temperature (C)", "work done"),
    ("mclk / pclk", "memory and SM clocks (MHz)", "whether the clocks are throttled for a reason"),
], columns=["dmon column", "what it measures", "what it does not"])

# %% [markdown]
# **What to read instead: DCGM's profiling metrics.** NVIDIA's Data Center GPU Manager samples hardware counters
# that GPU-Util and `mem` do not [dcgm-prof] (`dcgmi dmon -e 1002,1003,1004,1005`; each is a fraction of the
# sample interval, averaged over the SMs or the memory interface):

# %%
pd.DataFrame([
    ("1002", "SM_ACTIVE", "share of time, averaged over all SMs, that an SM had at least one warp resident",
     "GPU-Util at 100 % with 1 of 132 SMs busy reads about 0.8 % here"),
    ("1003", "SM_OCCUPANCY", "resident warps over the SMs' maximum, averaged over time and SMs",
     "occupancy as chapter 08 defines it; high is not required for a fast GEMM"),
    ("1004", "PIPE_TENSOR_ACTIVE", "share of cycles the tensor pipes were busy",
     "seed 001's 'tensor cores > 80 % busy', measured; it counts all executed tensor work (recomputation, padding, "
     "tile waste), so it tracks the hardware-FLOP rate (HFU-like), not MFU's model FLOPs"),
    ("1005", "DRAM_ACTIVE", "share of cycles the device memory interface was sending or receiving data",
     "the bandwidth-like number seed 004 wanted from dmon's 'mem'"),
], columns=["field id", "metric (DCGM_FI_PROF_ + name)", "what it measures", "what it answers here"])

# %% [markdown]
# **Is the clock the datasheet's?** A peak FLOP/s figure assumes the boost clock. `nvidia-smi -q -d PERFORMANCE`
# (NVML `nvmlDeviceGetCurrentClocksEventReasons` [nvml-clocks]) says why the clock is lower right now; the
# reasons that matter for a training run:

# %%
pd.DataFrame([
    ("gpu_idle", "nothing is running: the clock drops, not a problem"),
    ("sw_power_cap", "the board is at its power limit (nvidia-smi -pl): the clock is lowered to stay under it"),
    ("hw_slowdown", "a hardware signal (power brake or over-temperature) halves the clock or more"),
    ("hw_thermal_slowdown / sw_thermal_slowdown", "the GPU or its memory is too hot"),
    ("applications_clocks_setting", "someone set application clocks below the maximum"),
], columns=["clocks_event_reasons.*", "meaning"])

# %% [markdown]
# ## 4. U_cap, U_eff and U_bw from a real run
#
# Seed 000 defines U_cap = allocated / total, U_bw = achieved / peak bandwidth and U_eff = (P + G + O + A) /
# allocated [seed-000]. On this device, from one measured training step (exact bytes from `run_step`) and the
# process's memory as the OS sees it:

# %%
cfg, setup = preset(ON_DEVICE["model"]), ON_DEVICE["setup"]
m = run_step(cfg, setup, ch.device, steps=2, seed=seed, with_counted_flops=False)
states = m.model_state_bytes() + m.activations_bytes
if CUDA:
    held, total, held_name = m.cuda_peak_reserved_bytes, info.total_memory_bytes, "peak reserved (allocator)"
    bw = roofline.bandwidth_bytes_per_s([roofline.beyond_cache_bytes(ch.device)], ["copy"], device=ch.device)
    peak_bw = info.accelerator.bandwidth_bytes_per_s if info.accelerator else None
else:
    held, total, held_name = m.host_rss_bytes, cpu.total_memory_bytes, "process RSS"
    bw = roofline.bandwidth_bytes_per_s([roofline.beyond_cache_bytes("cpu")], ["copy"], device="cpu",
                                        repeats=3, warmup=1)
    peak_bw = None
u = pd.Series({
    "P+G+O+A, exact (MiB)": states / MiB,
    f"{held_name} (MiB)": held / MiB,
    "U_cap = held / total (%)": 100 * held / total,
    "U_eff = (P+G+O+A) / held (%)": 100 * states / held,
    "measured copy bandwidth (GB/s)": float(bw["bytes_per_s"].iloc[0]) / GB,
    "U_bw = achieved / peak (%)": round(100 * float(bw["bytes_per_s"].iloc[0]) / peak_bw, 4) if peak_bw else
    "not computed: no peak for this VM's share of the memory bus",
}, name=f"{cfg.name}, batch {setup.batch}, seq {setup.seq}").map(lambda v: round(v, 4) if isinstance(v, float) else v)
u.to_frame()

# %% [markdown]
# **What each hides.** U_cap says nothing about what the bytes are: the same model reads 3 % or 95 % under
# different framework policies (computed from the policies in section 5; no second policy runs here). U_eff is
# low on a CPU because the process also holds the interpreter and torch's libraries (hundreds of MiB), and on a
# GPU because of the allocator's cache and fragmentation; it does not say whether the cache is needed at the next
# step's peak. U_bw needs the peak of the memory this process can use. A datasheet gives the socket's (for
# example, an AMD EPYC 9004 has 12 channels of DDR5-4800, 460.8 GB/s [amd-epyc9004]; this page's CPU is named in
# the parameters cell's output), but this process runs in a virtual machine's slice of it, of unknown size, so U_bw
# is left blank rather than divided by the whole socket.
#
# **Exercise 2.** A vLLM server on an H200 SXM (memlab's table) runs with its default `gpu_memory_utilization`;
# its weights and the KV cache its requests actually use take 40 GiB. What is its U_eff, in %?

# %%
answer = ...
check("09.u-eff-vllm", answer, used_gib=40)

# %% [markdown]
# ## 5. Seed 004's monitor, and the 85-95 % and 70 % rules
#
# Seed 004's script [seed-004] divides NVML's and psutil's byte counts by `1024**3` and prints "GB". Run once here,
# with the exact bytes, the seed's label and the two correct readings:

# %%
mon = monitors.monitor_snapshot()
no_gpu = mon["field"].eq("unavailable")
if no_gpu.any():
    why = str(mon.loc[no_gpu, "reason"].iloc[0]).split(":")[0] if "reason" in mon.columns else "NVML did not answer"
    display(Markdown(f"{why} on this machine, so the script's GPU lines print nothing; its host lines:"))
mon[~no_gpu].drop(columns=[c for c in ("reason",) if c in mon.columns]).round(3)

# %%
Markdown(f"The seed's \"GB\" is GiB, and a GiB is {GiB / GB - 1:.1%} larger than a GB: the same bytes read "
         f"{1 - GB / GiB:.1%} smaller in GiB than in GB. It is the gap between a card's \"80 GB\" (80 GiB) and its "
         f"{80 * GiB / 1e9:.1f} × 10⁹ bytes.")

# %% [markdown]
# **The 85-95 % rule.** Seed 000 gives 85-95 % as a healthy range of *training* memory utilisation, "empirical, not
# a hard standard" [seed-000]. Read two ways. As an nvidia-smi reading, "memory used" is the sum of policies, not
# of the workload. JAX preallocates 75 % of the
# GPU's memory at its first operation [jax-gpu-memory]; vLLM reserves `gpu_memory_utilization = 0.9` of it for
# weights, activations and KV cache [vllm-engine-args]; PyTorch's caching allocator grows on demand and holds what
# it has reserved, plus the CUDA context. By policy alone, nothing run, for a job that needs 2 GiB on an H200
# (memlab's table; the CUDA context's few hundred MiB left out):

# %%
h200 = gpu("h200-sxm")
JAX_PREALLOCATE, VLLM_FRACTION = 0.75, 0.90  # the two frameworks' documented defaults (SOURCES.md)
JOB_GIB = 2.0  # an assumed small job: what its tensors need at the peak
policies = pd.DataFrame({
    "framework default": ["PyTorch (grows on demand)", "JAX (preallocates)", "vLLM (gpu_memory_utilization)"],
    "memory nvidia-smi shows (GiB)": [JOB_GIB, JAX_PREALLOCATE * h200.memory_bytes / GiB,
                                      VLLM_FRACTION * h200.memory_bytes / GiB],
})
policies["'memory utilisation' (%)"] = 100 * policies["memory nvidia-smi shows (GiB)"] * GiB / h200.memory_bytes
policies["in the 85-95 % band"] = policies["'memory utilisation' (%)"].between(85, 95)
policies.round(2)

# %%
in_band = policies.loc[policies["in the 85-95 % band"], "framework default"].tolist()
room_lo, room_hi = 0.05 * h200.memory_bytes / GiB, 0.15 * h200.memory_bytes / GiB
Markdown(f"**Reading it (computed).** For the same {JOB_GIB:g}-GiB job, the reading is "
         + ", ".join(f"{name.split(' (')[0]} {pct:.1f} %" for name, pct in
                     zip(policies["framework default"], policies["'memory utilisation' (%)"], strict=True))
         + f". Only {', '.join(n.split(' (')[0] for n in in_band) or 'none'} falls in the \"healthy\" band; "
         + f"JAX's {JAX_PREALLOCATE:.0%} is below it and PyTorch's reading is the job's own size: as a reading of "
           "nvidia-smi the band measures the framework's policy, not the workload. As a *target* for a PyTorch "
           "training job's peak reserved bytes (size the batch so the peak sits just under the card), it is a "
           f"heuristic: on an H200 it leaves {room_lo:.0f}-{room_hi:.0f} GiB for the CUDA context, the allocator's "
           "fragmentation and the step-to-step variation of the peak, which chapter 01 measures.")

# %% [markdown]
# **The 70 % rule.** Seed 004 says GPU-Util that stays below 70 % very likely means a memory bottleneck, and names
# the causes in the same sentence: slow data loading or kernel-launch overhead [seed-004]. The causes are the right
# ones; the label is not. By NVML's definition GPU-Util counts the time a kernel runs, so a bandwidth-bound kernel
# that keeps the GPU busy reads 100 % [nvml-api]: a memory bottleneck does not lower it. Its CPU twin, measured
# (CPU time fractions, not GPU-Util): the fraction of a step's time spent computing, for a data-starved loop (the
# seed's first cause), and, from section 1's measurement, the copy loop's CPU % over the pure-Python busy loop's
# (both got the same share of a shared machine, so the ratio says how busy the copy kept its core; it is limited by
# memory all the while):

# %%
plain = training_loop(cfg, setup, ch.device, steps=3, label="fast loader", seed=seed)
starved = training_loop(cfg, setup, ch.device, steps=3, label="slow loader",
                        delay_s=plain.model_step_s / setup.batch, seed=seed)
busy_fraction = pd.DataFrame([{
    "loop": r.label, "compute time / step time": 1 - r.phase_s["data"] / r.step_s, "mfu": r.mfu,
} for r in (plain, starved)] + [{"loop": "copy loop (section 1: its CPU % over the busy loop's)",
                                 "compute time / step time": copy_row["cpu_pct"] / busy["cpu_pct"].iloc[0],
                                 "mfu": 0.0}])
as_percent(busy_fraction, ["compute time / step time", "mfu"]).round(2)

# %% [markdown]
# The starved loop computes for only part of each step (its "utilisation" is low) and the cure is the loader, as
# the seed says. The copy loop is as busy as the busy loop while memory is all that limits it: a memory bottleneck
# shows as full occupancy, not as low. Utilisation is time occupancy in both directions.
#
# **Exercise 3.** A JAX job that needs 6 GiB runs on an NVIDIA L4 (memlab's table: its nominal capacity) with JAX's
# defaults. How many
# GiB does nvidia-smi's memory column show for it right after its first operation (the CUDA context left out)?

# %%
answer = ...
check("09.jax-l4-gib", answer, need_gib=6, card="l4")

# %% [markdown]
# **Exercise 4.** Seed 004's script prints `45.0GB` of memory in use (it divides the bytes by `1024**3`). How
# many decimal GB is that?

# %%
answer = ...
check("09.printed-gb", answer, printed=45.0)

# %% [markdown]
# ## The seed's claims, answered

# %%
ch.seed_claims([
    ("000", "U_cap = allocated / total", "holds with a qualification",
     f"{u['U_cap = held / total (%)']:.2f} % here; unit-free only if both sides are bytes "
     f"(GiB vs GB is {GiB / GB - 1:.1%})"),
    ("000", "U_eff = (P+G+O+A) / allocated", "holds, hides the rest",
     f"{u['U_eff = (P+G+O+A) / held (%)']:.1f} % of the {held_name}: interpreter, libraries and caches are the rest"),
    ("000", "nvidia-smi ≠ effective use; active vs reserved", "holds",
     f"RSS kept {rss['rss_delta_bytes'].iloc[2] / MiB:.0f} MiB for {rss['live_tensor_bytes'].iloc[2] / MiB:.0f}"
     " MiB of live tensors until malloc_trim"),
    ("000", "85-95 % is healthy (training) memory utilisation",
     "as an nvidia-smi reading, does not hold; as a training target, a heuristic" if 0 < len(in_band) < len(policies)
     else "holds",
     f"by policy, a {JOB_GIB:g}-GiB job reads {policies.iloc[0, 2]:.1f} % (PyTorch), {JAX_PREALLOCATE:.0%} (JAX), "
     f"{VLLM_FRACTION:.0%} (vLLM); as a peak target it leaves {room_lo:.0f}-{room_hi:.0f} GiB of an H200"),
    ("000", "targets: cap 80-95 %, BW 60-90 %, MFU 30-60 %", "unsourced",
     "cap is a policy (above); MFU depends on its peak (chapter 08)"),
    ("001", "GPU-Util = fraction of time a kernel runs", "holds", "NVML's definition; CPU % twin: "
     f"{busy['cpu_pct'].min():.0f}-{busy['cpu_pct'].max():.0f} % for 0 to "
     f"{busy['flops_per_s'].max() / 1e9:.1f} GFLOP/s"),
    ("004", "monitor script, /1024**3 labelled GB", "does not hold", "the figure is GiB: 80 GiB = "
     f"{80 * GiB / GB:.1f} GB"),
    ("004", "GPU-Util < 70 % means a memory bottleneck (slow loading, launch overhead)",
     "the causes hold; the label 'memory bottleneck' does not"
     if busy_fraction.iloc[1, 1] < 0.7 and busy_fraction.iloc[2, 1] > 0.7 else "not settled by this run",
     "NVML counts time a kernel runs, so a bandwidth-bound kernel reads 100 %; CPU twin (not GPU-Util): a starved "
     f"loop computes {busy_fraction.iloc[1, 1]:.0%} of its time, the memory-bound copy keeps its core "
     f"{busy_fraction.iloc[2, 1]:.0%} as busy as the busy loop"),
    ("004", "nvidia-smi dmon shows bandwidth use", "does not hold", "'mem' is controller busy time, not bytes/s"),
], columns=["seed", "claim", "verdict", "number (this run)"])

# %% [markdown]
# ## Summary
#
# - GPU-Util and CPU % are time occupancy: a loop doing nothing useful reads like a matmul. Divide FLOPs by
#   the peak (MFU, chapter 08) to know how much work was done.
# - "Memory used" (nvidia-smi, RSS) counts what the process holds: live tensors, plus the allocator's cache, plus
#   the CUDA context or the interpreter. Freed memory stays until `empty_cache` / `malloc_trim`.
# - For a GPU step, nvidia-smi's "used" is the allocator's reserved peak plus the CUDA context: section 3 replays the
#   step through a model of the caching allocator and puts a published context on top; the tensors are only part of it.
# - To see how busy the GPU really is, read DCGM's SM_ACTIVE, SM_OCCUPANCY, PIPE_TENSOR_ACTIVE and DRAM_ACTIVE,
#   and the clocks' event reasons before trusting a datasheet peak.
# - U_cap is a policy (PyTorch grows on demand, JAX takes 75 %, vLLM 90 %); U_eff hides what the rest is; U_bw needs
#   a peak the device actually has.
# - `dmon`'s `mem` is controller busy time, `fb` is memory used; neither is bandwidth. Print GiB as GiB.

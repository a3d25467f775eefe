# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 05 · Data parallelism (DDP, ZeRO, FSDP): what each stage shards, measured on real ranks
#
# **The common belief.** "ZeRO stage 1/2/3 shards optimizer states / gradients / parameters over the GPUs, so
# memory goes from O(N) to O(N/k) for k GPUs" (seed 000's table, `[seed-000]`), and "stage 3 also shards the
# parameters, so in theory a model of any size can be trained with limited GPU memory" (`[seed-004]`, which also
# gives a DeepSpeed ZeRO-2 config with CPU offload).
#
# This chapter launches real data-parallel ranks with `torchrun` (gloo on a CPU, NCCL on GPUs), trains the
# reference GPT under DDP, ZeRO-1 and FSDP2 and measures on every rank the bytes it holds and the bytes its
# collectives move. Then it checks the seeds' claims against those numbers:
#
# 1. the formula: per-rank model states and communication per ZeRO stage [rajbhandari2019];
# 2. the experiment: N = 1, 2, 4 ranks on a CPU (1-8 GPUs on CUDA), as many as this machine runs, five strategies, one
#    launch per N;
# 3. prediction vs measurement: states, the gathered parameters inside the step, bytes moved;
# 4. what does not shrink: activations and the gathered layer, from 8 to 1024 ranks;
# 5. the seed's DeepSpeed config, and its FSDP2 equivalent; many nodes;
# 6. the same FSDP2 step three ways (the estimate, memlab's trace, torchtitan's estimator).
#
# Data parallelism splits the batch, never the sample: what it cannot shrink (one micro-batch's activations, the
# gathered layer) is where chapter 06 picks up, with the layouts that split the model and the sequence (TP, SP,
# PP, CP) and the experts (EP).

# %% tags=["parameters"]
scale = "auto"
device = "auto"
seed = 0
out_dir = "../reports/build/05_zero_fsdp"

# %%
import importlib.util
import json
import textwrap
from pathlib import Path

import hjson
import matplotlib.pyplot as plt
import pandas as pd
import torch
from IPython.display import Markdown, display

from memlab import (
    Overheads,
    Setup,
    WorkerSpec,
    chapter,
    check,
    compare_trace,
    estimate,
    launch_sweep,
    machine_capacity,
    predicted_rank,
    preset,
    ring_wire_bytes,
    run_step,
    sharding_ledger,
    torchrun_command,
    trace_gpt,
    zero_comm_bytes,
)
from memlab.units import GiB, MiB

ch = chapter(scale, device, seed, out_dir)
gpus = 0 if ch.on_cpu else torch.cuda.device_count()
on_gpus = ch.scale == "full" and gpus >= 2  # one NCCL rank per GPU; otherwise gloo ranks on the CPU
# the ranks' model, micro-batch, steps and world sizes, by where they run; at full scale section 4 also traces
# GPT-3 175B over a fake 8-rank group (about a minute of CPU)
RANKS = {"gloo": dict(model="tiny-gpt", batch=2, seq=32, steps=1, device="cpu", sizes=(1, 2, 4)),
         "nccl": dict(model="gpt2", batch=4, seq=512, steps=3, device="auto", sizes=(1, 2, 4, 8))}[
    "nccl" if on_gpus else "gloo"]
trace_gpt3_8_ranks = ch.scale == "full"
ch

# %% [markdown]
# ## 1. The formula
#
# With Ψ parameters, ZeRO stage 1 divides the optimizer states by N, stage 2 also the gradients, stage 3 also the
# parameters (`memlab.predict.memory.sharding.zero_divisors`). Communication per step and rank, in the paper's
# convention
# (an all-reduce counts twice its buffer: a reduce-scatter then an all-gather) is 2Ψ for DDP and stages 1-2, and
# 3Ψ for stage 3, which all-gathers the parameters again in backward (`memlab.predict.parallel.communication`).

# %%
model = preset(RANKS["model"])
batch, seq = RANKS["batch"], RANKS["seq"]
STRATEGIES = ["ddp", "zero1", "fsdp2-zero2", "fsdp2-zero3", "fsdp2-offload"]
psi = 4 * model.param_count()  # fp32 gradients: one copy, in bytes
formula = pd.DataFrame([{"strategy": s, **{f"N={n}": sum(predicted_rank(model, s, n, batch=batch, seq=seq)[c]
                                                          for c in ("params", "grads", "optimizer"))
                                           for n in (1, 2, 4, 8)}} for s in STRATEGIES])
formula["comm / Ψ"] = [sum(zero_comm_bytes(psi, stage).values()) / psi for stage in (0, 1, 2, 3, 3)]
print(f"{model.name}: {model.param_count():,} parameters, Ψ = {psi:,} B of fp32 gradients")
formula

# %% [markdown]
# **The paper's own table, reproduced.** ZeRO's Table 1 gives the per-device model states of a 7.5 B-parameter
# model (mixed precision with Adam: K = 12 bytes of optimizer state per parameter, so 16 in all) for each stage and
# data-parallel degree, in GB `[rajbhandari2019]`. The estimator, asked the same question (`estimate(7_500_000_000,
# Setup(precision="mixed-bf16", zero_stage=k, world_size=N))`), beside it:

# %%
# ZeRO Table 1, 7.5 B model, per-device GB, as printed [rajbhandari2019] (stage 0 = the baseline, 120 GB at every N)
ZERO_TABLE1_GB = {1: (120, 120, 120), 4: (52.5, 41.3, 30), 16: (35.6, 21.6, 7.5), 64: (31.4, 16.6, 1.88),
                  256: (30.4, 15.4, 0.47), 1024: (30.1, 15.1, 0.12)}
table1 = []
for n, printed in ZERO_TABLE1_GB.items():
    for stage, gb in zip((1, 2, 3), printed, strict=True):
        est = estimate(7_500_000_000, Setup(precision="mixed-bf16", zero_stage=stage, world_size=n))
        table1.append({"N": n, "stage": f"ZeRO-{stage}", "paper (GB)": gb,
                       "memlab estimate (GB)": est.model_state_bytes() / 1e9})
table1 = pd.DataFrame(table1)
digits = table1["paper (GB)"].map(lambda v: len(f"{v}".split(".")[1]) if "." in f"{v}" else 0)
table1["agrees to the printed digits"] = (table1["memlab estimate (GB)"] - table1["paper (GB)"]).abs() <= (
    0.5 * 10.0 ** (-digits) + 1e-9)
ch.save_table(table1, "zero_table1")
display(table1.pivot(index="N", columns="stage", values="memlab estimate (GB)").round(3))
Markdown(f"{int(table1['agrees to the printed digits'].sum())} of {len(table1)} cells of the paper's table agree "
         "with the estimator to the digits the paper prints"
         + ("." if table1["agrees to the printed digits"].all() else "; the others: " + ", ".join(
             f"N={r.N} {r.stage}" for r in table1[~table1["agrees to the printed digits"]].itertuples()) + "."))

# %% [markdown]
# **The collectives, once.** A rank is one process (one GPU); c10d is torch.distributed's communication layer, run
# by NCCL on GPUs and gloo on CPUs. *all-reduce*: every rank ends with the sum of everyone's buffer (DDP's gradient
# sync). *reduce-scatter*: every rank ends with the sum of one 1/N slice. *all-gather*: every rank ends with every
# rank's slice (ZeRO-3 rebuilding a layer's parameters). *broadcast*: one rank's buffer to all. A ring all-reduce
# is a reduce-scatter then an all-gather, each N − 1 steps in which every rank sends one 1/N chunk to its
# neighbour: each rank sends 2(N − 1)/N of the buffer, which is why the paper counts an all-reduce as 2Ψ:

# %%
fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), layout="constrained")
ring_n = 4
angle = [2 * 3.14159265 * i / ring_n for i in range(ring_n)]
xy = [(__import__("math").cos(a), __import__("math").sin(a)) for a in angle]
for i, (x, y) in enumerate(xy):
    axes[0].add_patch(plt.Circle((x, y), 0.22, color="tab:blue", alpha=0.8))
    axes[0].text(x, y, f"rank {i}", ha="center", va="center", color="white", fontsize=8)
    nx, ny = xy[(i + 1) % ring_n]
    axes[0].annotate("", xy=(nx * 0.78 + x * 0.22, ny * 0.78 + y * 0.22),
                     xytext=(x * 0.78 + nx * 0.22, y * 0.78 + ny * 0.22),
                     arrowprops=dict(arrowstyle="->", color="0.3"))
axes[0].set(xlim=(-1.5, 1.5), ylim=(-1.5, 1.5), aspect="equal",
            title=f"ring of N = {ring_n}: each step, every rank\nsends one 1/N chunk to its neighbour")
axes[0].axis("off")
ns = [2, 4, 8, 16, 64, 256]
axes[1].plot(ns, [ring_wire_bytes(2.0, n) for n in ns], "-o", label="ring all-reduce: 2(N−1)/N")
axes[1].axhline(2.0, ls=":", color="k", label="ZeRO's convention: 2")
axes[1].set(xscale="log", xlabel="ranks N", ylabel="bytes sent per rank / buffer bytes",
            title="what one rank sends for an all-reduce")
axes[1].legend(fontsize=8)
ch.save_figure(fig, "ring_allreduce")

# %% [markdown]
# **Exercise 1 (predict before you measure).** Under ZeRO stage 3 as the ZeRO paper counts it (every parameter
# all-gathered in the forward and again in the backward, the gradients reduce-scattered) over N = 4 ranks, with ring
# collectives, how many MiB does one rank of this chapter's model send per training step (Ψ = its fp32 gradient
# bytes, printed above)? Answer before running the launch below; section 3 then shows what FSDP2 moves.

# %%
answer = ...
check("05.zero3-ring-mib", answer, model=model, world_size=4)

# %% [markdown]
# ## 2. The experiment: real ranks
#
# `launch_sweep` starts torchrun's launcher once per N (the ranks are real processes joined
# by a c10d rendezvous; the launcher forks them so torch is imported once) and runs every strategy on every rank:
# DDP, DDP + `ZeroRedundancyOptimizer` (ZeRO-1), FSDP2 `fully_shard` with `reshard_after_forward=False`
# (ZeRO-2-like) and `True` (ZeRO-3), and ZeRO-3 with `CPUOffloadPolicy`. Each rank counts its local bytes exactly
# and every collective its step dispatched (`c10d::*` ops). A failing rank raises one `LaunchError` with its
# traceback. Every rank signals ready once torch is imported, and the rendezvous starts only then (a slow start is
# retried once); a launch past its timeout is killed with every rank. The world sizes this machine cannot run at
# once (one GPU per NCCL rank; CPU cores and memory for gloo ranks: `machine_capacity`) are left out, and the cell
# says why. At N = 1 the volume cell is empty: the step still calls each collective on its one rank, a call that
# moves no byte.

# %%
spec = WorkerSpec(config=model, batch=batch, seq=seq, strategies=tuple(STRATEGIES), steps=RANKS["steps"],
                  device=RANKS["device"])
capacity = machine_capacity(spec)
sizes = capacity.largest(RANKS["sizes"])
display(Markdown(capacity.sentence(RANKS["sizes"])))
runs = launch_sweep(spec, sizes, timeout_s=180)
rows = [r for run in runs.values() for r in run.rows]
measured = pd.DataFrame([r for r in rows if r["status"] == "ok"])
ch.save_table(pd.concat([run.frame() for run in runs.values()]), "ranks")
print(f"{len(rows)} rows from {sum(sizes)} ranks in {next(iter(runs.values())).wall_s:.1f} s; "
      f"backend {measured['backend'].iloc[0]}")
launched = measured.groupby(["strategy", "world_size"], sort=False)[
    ["params_bytes", "grads_bytes", "optimizer_bytes", "gathered_peak_bytes", "comm_volume_bytes"]].mean()
# one rank moves no byte: torch still calls each collective (a no-op), which the counter would count as volume
launched.loc[launched.index.get_level_values("world_size") == 1, "comm_volume_bytes"] = float("nan")
launched

# %%
if not on_gpus and not ch.on_cpu:
    print(f"{gpus} GPU(s) visible: the ranks ran on the CPU with gloo; NCCL ranks need one GPU each")
ch.cpu_note("gloo ranks on CPU cores share one memory: the bytes per rank are exact, but there is no allocator "
            "peak, no offload (host and device are the same memory, so the offload row is skipped) and no "
            "meaningful step time or bandwidth; a multi-GPU run measures those with NCCL.")

# %% [markdown]
# ## 3. Prediction vs measurement
#
# `memlab.compare.sharding.sharding_ledger` puts the estimator's per-rank bytes next to the mean over ranks.

# %%
ledger = sharding_ledger(rows, model)
ch.record_ledger(ledger)
exact = ledger[ledger["component"].isin(["params", "grads", "optimizer"])]
worst = ((exact["predicted"] - exact["measured"]).abs() / exact["measured"]).max()
print(f"model states: {len(exact)} rows, largest |relative error| {worst:.2%}")
ledger[~ledger["component"].isin(["params", "grads", "optimizer"])]

# %%
fig, axes = plt.subplots(1, len(sizes), figsize=(3.4 * len(sizes) + 1.6, 3.8), sharey=True, squeeze=False,
                         layout="constrained")
axes = axes[0]
ok = [s for s in STRATEGIES if s in set(measured["strategy"])]
for ax, n in zip(axes, sizes, strict=True):
    part = measured[measured["world_size"] == n].groupby("strategy", sort=False).mean(numeric_only=True).loc[ok]
    bottom = 0
    for comp, color in (("params", "C0"), ("grads", "C1"), ("optimizer", "C2")):
        ax.bar(ok, part[f"{comp}_bytes"] / MiB, bottom=bottom, color=color, label=comp)
        bottom = bottom + part[f"{comp}_bytes"] / MiB
    pred = [sum(predicted_rank(model, s, n, batch=batch, seq=seq)[c] for c in ("params", "grads", "optimizer"))
            for s in ok]
    ax.scatter(ok, [p / MiB for p in pred], color="k", marker="_", s=400, zorder=3, label="predicted total")
    ax.set_title(f"N = {n} ranks")
    ax.tick_params(axis="x", rotation=60)
axes[0].set_ylabel("MiB per rank (measured)")
fig.legend(*axes[0].get_legend_handles_labels(), fontsize=8, loc="outside right upper")
fig.suptitle(f"{model.name}, AdamW fp32: model states on one rank, measured on {measured['backend'].iloc[0]} ranks")
ch.save_figure(fig, "states_per_rank")

# %% [markdown]
# Reading it: DDP keeps every model state on every rank (and more than this count, next cell); ZeRO-1 divides the
# AdamW moments by N (not exactly: torch's ZeroRedundancyOptimizer hands whole tensors to ranks, so the shares differ
# by a tensor); FSDP2 divides all three. Between steps the two FSDP2 settings hold the same bytes:
# `reshard_after_forward=False` differs *inside* the step.
#
# **DDP's buckets.** The `ddp` bars count each parameter's `.grad`. DDP's reducer also keeps its own flat gradient
# **buckets** (25 MiB each by default, `bucket_cap_mb`) to all-reduce, a second gradient-sized copy, unless
# `gradient_as_bucket_view=True` makes the `.grad` tensors views into them; PyTorch's documentation says that saves
# "memory equal to the total gradients size" `[pytorch-ddp]`. memlab's ranks run the default, so real DDP (and
# ZeRO-1 under DDP) holds one more gradient copy than the bars:

# %%
ddp_rows = measured.query("strategy in ['ddp', 'zero1']").groupby(["strategy", "world_size"], sort=False)
ddp_rows = ddp_rows[["params_bytes", "grads_bytes", "optimizer_bytes"]].mean().reset_index()
states = ddp_rows[["params_bytes", "grads_bytes", "optimizer_bytes"]].sum(axis=1)
ddp_rows["counted (B/param)"] = states / model.param_count()
ddp_rows["with the reducer's buckets (B/param)"] = ddp_rows["counted (B/param)"] + psi / model.param_count()
ddp_rows[["strategy", "world_size", "counted (B/param)", "with the reducer's buckets (B/param)"]].round(2)

# %% [markdown]
# The gathered parameters (the transient the sum misses) and the collective volume, in ZeRO's convention (the
# buffer sizes each c10d op was called with, an all-reduce counted twice; the ring column is the (N − 1)/N formula
# applied to it, not a measurement of the wire, and gloo's algorithms are not all rings):

# %% tags=["reveals-05.zero3-ring-mib"]
comm = measured[measured["world_size"] > 1].groupby(["strategy", "world_size"], sort=False)
comm = comm[["comm_volume_bytes", "gathered_peak_bytes"]].mean().reset_index()
comm["measured / Ψ"] = comm["comm_volume_bytes"] / psi
comm["predicted / Ψ"] = [predicted_rank(model, s, n)["comm_volume"] / psi for s, n in
                         zip(comm["strategy"], comm["world_size"], strict=True)]
comm["wire bytes/rank (ring)"] = [ring_wire_bytes(v, n) for v, n in
                                  zip(comm["comm_volume_bytes"], comm["world_size"], strict=True)]
comm["gathered / full params"] = comm["gathered_peak_bytes"] / psi
if on_gpus:  # the step-time cost of the traffic and the allocator's peak, measured on NCCL ranks
    cuda_cols = measured.groupby(["strategy", "world_size"], sort=False)[["step_time_s", "cuda_peak_allocated_bytes"]]
    comm = comm.merge(cuda_cols.mean().reset_index(), on=["strategy", "world_size"])
ch.save_table(comm, "communication")
fig, ax = plt.subplots(figsize=(7, 3.4))
top = comm[comm["world_size"] == max(sizes)]
ax.bar(top["strategy"], top["measured / Ψ"], label="counted at the c10d ops (ZeRO's convention)")
ax.scatter(top["strategy"], top["predicted / Ψ"], color="k", marker="_", s=500, zorder=3,
           label="ZeRO paper [rajbhandari2019]")
ax.set_ylabel("volume per rank per step / Ψ")
ax.set_title(f"Bytes moved per step, N = {max(sizes)}, in units of Ψ = one gradient copy")
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
ch.save_figure(fig, "communication")
comm

# %% [markdown]
# **The misreading.** Two of the paper's numbers need the implementation next to them. torch's
# `ZeroRedundancyOptimizer` moves **3Ψ**, not 2Ψ: it runs under DDP's full all-reduce and then broadcasts every
# rank's updated partition. And FSDP2's ZeRO-3 holds more than "one layer" gathered: the root module's own
# parameters (here the embeddings, tied to the head) stay gathered from forward to backward, next to the running
# block. That is FSDP2's default for the root (`reshard_after_forward=None` becomes False there, since backward
# needs the root at once; memlab's ranks leave it to that default), and it is why ZeRO-3 moves 3Ψ less the root's
# parameters here. The root's forward spans the whole model (the embedding first, the tied head last), so wrapping
# the embedding and the head as units of their own, as torchtitan does (section 6), is what shrinks it. With
# `reshard_after_forward=False` the whole model is gathered by the end of forward: ZeRO-2's memory *inside* the
# step, ZeRO-3's between steps, and 2Ψ of traffic instead of 3Ψ.

# %% [markdown]
# ## 4. What does not shrink
#
# Data parallelism splits the batch, not the sample: each rank runs its own micro-batch, so its activations do
# not depend on N. Measured on one process with the same micro-batch, against the estimator:

# %%
one = run_step(model, Setup(batch=batch, seq=seq), ch.device, steps=1, with_counted_flops=False, with_mfu=False)
act = estimate(model, Setup(batch=batch, seq=seq), device_type=ch.device_type).activations_bytes
display(Markdown(f"activations per rank for micro-batch {batch} x {seq}: measured {one.activations_bytes:,} B, "
                 f"predicted "
                 f"{act:,} B, for every N"))

# %% [markdown]
# The estimator at real size: GPT-3 175B, mixed-bf16 AdamW, ZeRO-3, micro-batch 1 × 2048 with full recompute,
# one gathered block (two with prefetch), from 8 to 1024 ranks.

# %%
big = preset("gpt-3-175b")
floor = []
for n in (8, 16, 64, 256, 1024):
    s = Setup(batch=1, seq=2048, precision="mixed-bf16", zero_stage=3, world_size=n, recompute="full")
    b = estimate(big, s, overheads=Overheads(gathered_layers=2))
    floor.append({"ranks": n, "model states GiB": b.model_state_bytes() / GiB,
                  "activations GiB": b.activations_bytes / GiB,
                  "gathered blocks GiB": b.overhead["zero3_gathered_params"] / GiB, "total GiB": b.total_gib,
                  # the phase-aware peak (memlab.predict.memory.phases): the floor placed inside the step
                  "peak GiB": b.peak_bytes / GiB, "peak in": f"{b.peak_step} {b.peak_phase}"})
floor = pd.DataFrame(floor)
ch.save_table(floor, "gpt3_per_rank")
fig, ax = plt.subplots(figsize=(6, 3.4))
ax.stackplot(floor["ranks"], floor["model states GiB"], floor["activations GiB"], floor["gathered blocks GiB"],
             labels=["model states (÷N)", "activations (per rank)", "2 gathered blocks"])
ax.set_xscale("log", base=2)
ax.set_xlabel("data-parallel ranks N")
ax.set_ylabel("GiB per rank (predicted)")
ax.set_title("GPT-3 175B under ZeRO-3: what 1/N does not divide")
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
ch.save_figure(fig, "zero3_floor")
big_psi = 2 * big.param_count()  # bf16 gradients
print(f"every ZeRO-3 step moves {sum(zero_comm_bytes(big_psi, 3).values()) / 1e12:.2f} TB per rank, whatever N")
smallest = floor[(floor["model states GiB"] < floor["activations GiB"])
                 & (floor["model states GiB"] < floor["gathered blocks GiB"])]
display(Markdown(f"the model states are the smallest term from {smallest['ranks'].min():,} ranks "
                 f"on" if len(smallest) else
                 f"the model states stay above another term at every N up to {floor['ranks'].max():,}"))
root_bytes = big.vocab_size * big.d_model * 2 * (1 if big.tied_embeddings else 2)  # embedding (and head), bf16
display(Markdown(f"not in the table: FSDP2's default keeps the root module gathered after the forward (section "
                 f"3 measured it on "
                 f"the small model); for GPT-3 that is its {'tied ' if big.tied_embeddings else ''}embedding and head, "
                 f"{root_bytes / GiB:.2f} GiB in bf16 on every rank, on top of the gathered blocks"))
floor.round(2)

# %% [markdown]
# From some number of ranks on (the cell above prints where) the model states are the smallest term: the
# per-rank floor is the activations of one micro-batch and the gathered blocks, and every step still moves 3Ψ per
# rank. "Arbitrarily large" is bounded by one layer fitting gathered, by activations, and by the network.
#
# The sum of terms is not the most a rank holds at once. The phase-aware estimate (`peak` columns above) places
# the floor inside the step: with few ranks the optimizer step holds the peak, with many the backward's
# recomputed block and its gradients do. The optimizer-step transient is **implementation-dependent**: it is
# memlab's runner (fp32 copies of the 16-bit gradients for the master update, and foreach AdamW's scratch). FSDP2
# with `MixedPrecisionPolicy` keeps the fp32 shards as the master and reduce-scatters into fp32 gradient shards
# (no copy); `fused=True` AdamW has no scratch; DeepSpeed caps the step's transient with `sub_group_size`. The
# estimate with the fused step, beside the runner's:

# %%
impl = []
for n in (8, 64, 1024):
    row = {"ranks": n}
    for name, kw in (("memlab runner (foreach)", {}), ("fused AdamW", {"optimizer_impl": "fused"})):
        s = Setup(batch=1, seq=2048, precision="mixed-bf16", zero_stage=3, world_size=n, recompute="full", **kw)
        b = estimate(big, s, overheads=Overheads(gathered_layers=2))
        row[f"{name}: peak GiB"] = b.peak_bytes / GiB
        row[f"{name}: peak in"] = f"{b.peak_step} {b.peak_phase}"
    impl.append(row)
pd.DataFrame(impl).round(2)

# %% [markdown]
# **Gradient accumulation under ZeRO-3.** With k micro-batches per optimizer step, DDP (with `no_sync`) and ZeRO-1/2
# communicate the gradients once per step, but ZeRO-3 re-gathers the parameters in every micro-batch's forward and
# backward: (2k + 1)Ψ per optimizer step instead of 3Ψ, when the gradients are reduce-scattered once (FSDP2's
# `set_requires_gradient_sync(False)` on the first k − 1 micro-batches, which keeps unsharded gradients meanwhile;
# reduce-scattering in every micro-batch makes it 3kΨ). For GPT-3's bf16 Ψ:

# %%
acc_rows = [{"micro-batches k": k, "DDP / ZeRO-1/2 (TB)": sum(zero_comm_bytes(big_psi, 2).values()) / 1e12,
             "ZeRO-3 (TB)": ((2 * k + 1) * big_psi) / 1e12} for k in (1, 2, 4, 8)]
pd.DataFrame(acc_rows).round(2)

# %% [markdown]
# **Volume is time, on a topology.** The bytes a collective moves bound its time from below (full link rates, no
# latency, nothing overlapped with compute), but only once we know which link each byte crosses. On 8-GPU nodes NCCL
# runs the collective hierarchically, one ring or tree per NIC: inside a node each GPU moves (G − 1)/G of the volume
# over NVLink, and across nodes each GPU's NIC carries the cross-node part of a 1/G slice, so the node's G NICs
# share the inter-node bytes `[thakur2005]` (`memlab.predict.parallel.communication.comm_time_floor_s`). Only with
# one GPU per node does every byte of the ring cross that GPU's own NIC. Two published per-GPU rates: an InfiniBand
# NDR port, 400 Gb/s `[nvidia-connectx7]`, and H100 SXM's NVLink, 900 GB/s counted in both directions
# `[nvidia-h100-datasheet]`, so half of it each way. The floor is checked against a published run: nccl-tests on
# 2 nodes × 8 H100 with 200 Gb/s per GPU all-reduced 8 GiB in 47.5 ms `[nccl-tests-a3mega]`:

# %%
from memlab.predict.parallel.communication import comm_time_floor_s

LINKS_BYTES_PER_S = {"InfiniBand NDR, 400 Gb/s per GPU": 400e9 / 8,  # [nvidia-connectx7]
                     "NVLink 4 (H100 SXM), 900 GB/s both ways": 900e9 / 2}  # [nvidia-h100-datasheet]
ib_rate, nvlink_rate = LINKS_BYTES_PER_S.values()
NCCL_TESTS_A3MEGA = {"buffer_bytes": 8 * 2**30, "nodes": 2, "gpus_per_node": 8, "nic_bytes_per_s": 200e9 / 8,
                     "measured_s": 47.535e-3}  # [nccl-tests-a3mega]: all_reduce_perf, 8 GiB, out of place
check_run = comm_time_floor_s(2 * NCCL_TESTS_A3MEGA["buffer_bytes"], gpus_per_node=8, nodes=2,
                              nic_bytes_per_s=NCCL_TESTS_A3MEGA["nic_bytes_per_s"])
per_gpu_claim = 2 * NCCL_TESTS_A3MEGA["buffer_bytes"] / NCCL_TESTS_A3MEGA["nic_bytes_per_s"]
display(Markdown(f"published check: the floor for nccl-tests' 8 GiB all-reduce on 2 x 8 H100 is "
                 f"{check_run['floor'] * 1e3:.1f} "
                 f"ms, measured {NCCL_TESTS_A3MEGA['measured_s'] * 1e3:.1f} ms "
                 + ("(above the floor, as a floor "
                    "requires)" if NCCL_TESTS_A3MEGA["measured_s"] >= check_run["floor"] else
                    "(BELOW the floor: the model is wrong)")
                 + f"; all the volume over one GPU's NIC would claim at least {per_gpu_claim * 1e3:.0f} ms"))
RANKS_BIG = 1024  # GPT-3's data-parallel ranks for the floor (it changes with (M - 1)/M only)
topologies = {"one GPU per node, IB NDR": dict(gpus_per_node=1, nodes=RANKS_BIG),
              "8-GPU nodes, one IB NDR NIC per GPU, NVLink inside": dict(gpus_per_node=8, nodes=RANKS_BIG // 8,
                                                                       nvlink_bytes_per_s=nvlink_rate),
              "one 8-GPU node, NVLink only": dict(gpus_per_node=8, nodes=1, nvlink_bytes_per_s=nvlink_rate)}
steps = pd.DataFrame([{"strategy": name, "bytes per rank per step (TB)": v / 1e12,
                       **{f"{topo}: s per step, at least": comm_time_floor_s(v, nic_bytes_per_s=ib_rate,
                                                                             **kw)["floor"]
                          for topo, kw in topologies.items()}}
                      for name, v in (("DDP / ZeRO-1/2 (2Ψ)", sum(zero_comm_bytes(big_psi, 2).values())),
                                      ("ZeRO-3 (3Ψ)", sum(zero_comm_bytes(big_psi, 3).values())))])
steps.round(2)

# %%
one_gpu, eight_gpu = steps.columns[2], steps.columns[3]
Markdown(f"On 8-GPU nodes with one 400 Gb/s NIC per GPU, a GPT-3 step ({RANKS_BIG:,} ranks) spends at least "
         f"{steps[eight_gpu].min():.2f} s (DDP) to {steps[eight_gpu].max():.2f} s (ZeRO-3) communicating; the "
         f"{steps[one_gpu].min():.0f} to {steps[one_gpu].max():.0f} s of the first column hold only with one GPU per "
         "node, where every byte of the ring crosses that GPU's NIC. Either way it is seconds per step, which is why "
         "ZeRO-3 overlaps its all-gathers with compute (FSDP2 prefetches the next unit while the current one runs, "
         "so about two units are gathered at once, the estimate's `gathered_layers=2`), why large micro-batches "
         "amortise it, and why ZeRO-3 stays inside a node or a fast domain when it can (hybrid sharding, HSDP: shard "
         "within a node, replicate across nodes). The floors are bounds, not predictions: latency, protocol overhead "
         "and what is not overlapped come on top (the published run reached "
         f"{check_run['floor'] / NCCL_TESTS_A3MEGA['measured_s']:.0%} of its floor's rate).")

# %% [markdown]
# At full scale `memlab.tracing.tracer` checks it at 8 ranks: the real step of the reference GPT at GPT-3 size, FSDP2
# over a fake 8-rank process group (`memlab.tracing.fake_dist`), rank 0's bytes, nothing allocated.

# %%
display(Markdown("peak inside the step: " + ", ".join(f"N={r}: {p}" for r, p in zip(floor["ranks"], floor["peak in"],
                                                                         strict=True))))
if trace_gpt3_8_ranks:
    s8 = Setup(batch=1, seq=2048, precision="mixed-bf16", zero_stage=3, world_size=8, recompute="full")
    traced8 = compare_trace(estimate(big, s8, overheads=Overheads(gathered_layers=2)), trace_gpt(big, s8))
    ch.save_table(traced8, "gpt3_traced_8_ranks")
    out = traced8.assign(**{"predicted GiB": traced8["predicted"] / GiB, "traced GiB": traced8["measured"] / GiB})
    out = out[["component", "predicted GiB", "traced GiB", "rel_error"]].round(3)
else:
    out = ch.cpu_note("at ci scale the table is the estimate's; the GPT-3 175B trace over a fake 8-rank group runs "
                      "at full scale (about a minute of CPU: 96 blocks under FSDP2, on fake tensors)")
out

# %% [markdown]
# ## 5. The seed's DeepSpeed config, and FSDP2
#
# Seed 004's `ds_config.json` (quotes restored; they are lost in the stored text) carries `//` comments. JSON has
# no comments, so `json.load` rejects it. DeepSpeed's own loader does not use `json`: `DeepSpeedConfig` reads the
# file with **hjson** (deepspeed/runtime/config.py), which accepts `//` comments. Paths that pre-parse the file
# with `json` (Hugging Face Accelerate's `HfDeepSpeedConfig`, the Trainer's `--deepspeed`) reject it. Both
# parsers, run on the seed's text:

# %%
SEED_CONFIG = """{
  "train_batch_size": 32,
  "zero_optimization": {
    "stage": 2, // stage 2: shard optimizer states and gradients
    "offload_optimizer": {
      "device": "cpu" // optional: offload optimizer states to the CPU
    },
    "allgather_partitions": true, "allgather_bucket_size": 5e8, "overlap_comm": true,
    "reduce_scatter": true, "reduce_bucket_size": 5e8
  },
  "fp16": {"enabled": true}
}"""
try:
    json.loads(SEED_CONFIG)
    json_verdict = "accepts it"
except json.JSONDecodeError as err:
    json_verdict = f"rejects it ({err})"
try:
    parsed = hjson.loads(SEED_CONFIG)
    hjson_verdict = f"accepts it (zero_optimization.stage = {parsed['zero_optimization']['stage']})"
except hjson.HjsonDecodeError as err:
    hjson_verdict = f"rejects it ({err})"
parsers = pd.DataFrame({"parser": ["json.loads (Accelerate's HfDeepSpeedConfig, plain Python)",
                                   f"hjson.loads {hjson.__version__} (DeepSpeed's DeepSpeedConfig)"],
                        "on the seed's config": [json_verdict, hjson_verdict]})
ch.save_table(parsers, "deepspeed_config_parsers")
display(parsers)
# the installed DeepSpeed's own loader, read from its source (not imported: that takes seconds)
ds_spec = importlib.util.find_spec("deepspeed")
ds_config = None if ds_spec is None else Path(ds_spec.submodule_search_locations[0], "runtime", "config.py")
ds_lines = ([] if ds_config is None or not ds_config.exists()
            else [ln.strip() for ln in ds_config.read_text().splitlines() if "hjson.load" in ln])
print(textwrap.fill(f"installed deepspeed/runtime/config.py loads a config with: {ds_lines[0]}" if ds_lines else
                    "DeepSpeed is not installed here (or its loader moved): the hjson row stands for its loader by "
                    "its docs", 80))

# %%
fsdp2 = pd.DataFrame([
    ("train_batch_size: 32", "global batch = micro-batch × grad. accumulation × world size (set in the data loader)"),
    ("stage: 2", "fully_shard(block, reshard_after_forward=False) per block, then on the root (same 2Ψ; params "
                 "sharded at rest and gathered every forward, unlike DeepSpeed stage 2's resident 16-bit params)"),
    ("offload_optimizer: cpu", "fully_shard(..., offload_policy=CPUOffloadPolicy()): parameters, gradients AND "
                               "optimizer states on the host (no optimizer-only offload); the step runs on CPU"),
    ("allgather_partitions / allgather_bucket_size", "one all-gather per fully_shard unit: the bucket is the module"),
    ("reduce_scatter / reduce_bucket_size", "gradients are always reduce-scattered, one call per unit"),
    ("overlap_comm: true", "default: all-gathers and reduce-scatters run on their own streams with implicit prefetch;"
                           " module.set_modules_to_forward_prefetch([...]) for explicit prefetch"),
    ("fp16.enabled", "equivalent: mp_policy=MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype="
                     "torch.float32) plus a ShardedGradScaler; recommended instead (a different format): "
                     "param_dtype=torch.bfloat16, no scaler"),
], columns=["DeepSpeed key", "FSDP2 (torch.distributed.fsdp) equivalent"])
ch.save_table(fsdp2, "deepspeed_to_fsdp2")
fsdp2

# %% [markdown]
# The offload row, predicted (a CPU cannot show it; on CUDA the `fsdp2-offload` strategy measures it): the
# device keeps only what is gathered, the host keeps the shards and the states.

# %%
off = predicted_rank(model, "fsdp2-offload", max(sizes), batch=batch, seq=seq)
pd.Series({"device: model states (B)": off["params"] + off["grads"] + off["optimizer"],
           "device: gathered parameters in the step (B)": off["gathered"],
           "host: shards + AdamW states (B)": off["host"]}).to_frame(f"{model.name}, N={max(sizes)}, predicted")

# %% [markdown]
# **Many nodes.** The same worker runs on a cluster: the command below on every node (8 GPUs each, 4 nodes),
# with one node's address as the rendezvous endpoint. The estimator answers per-rank memory for any N first.

# %%
cluster = torchrun_command(8, nnodes=4, rdzv_endpoint="node0.example:29500")
print(" ".join([*cluster, "-m", "memlab.run.distributed.worker", "'<spec json>'", "out/"]))

# %%
recorded = ch.recorded("05_zero_fsdp_gpu")
recorded  # the GPU run recorded by scripts/gpu_session.sh, where the repo has one (nothing shows otherwise)

# %%
ch.published("05")

# %% [markdown]
# ## 6. The same FSDP2 step, three ways: the estimate, memlab's trace, torchtitan's estimator
#
# torchtitan (v0.2.2) shipped a memory estimator: the model under `FakeTensorMode`, sharded with its `apply_fsdp`
# plan (the embedding, each block, and the final norm + output layer as their own units; `MixedPrecisionPolicy`
# with bf16 parameters and fp32 reduction, no autocast), the loss computed outside the model, two iterations under
# torch's `FSDPMemTracker`. memlab models the same choices as Setup fields (`fsdp_units="torchtitan"`,
# `fsdp_loss="outside"`, `fsdp_param_dtype="bf16"`), applies them in the trace and the ranks with one function
# (`memlab.model.fsdp.shard_model`), and runs torchtitan's protocol with its torch pieces as the peer
# (`memlab.tracing.peer`: torchtitan's own package does not import on a CPU-only torch, its MoE kernels need
# triton). Each residual is named with its size below.

# %%
from memlab.studies.titan import TITAN_DEBUG, recorded_titan, residual_names, titan_rows

titan_shape = dict(batch=1, seq=128) if ch.scale == "ci" else dict(batch=8, seq=2048)
titan = titan_rows(TITAN_DEBUG, Setup(**titan_shape, attention="flash", world_size=8, optimizer_impl="fused"))
ch.save_table(pd.DataFrame([titan]), "titan_peer_debugmodel")
print("\n".join(textwrap.fill(line, 80) for line in residual_names(titan)))  # wrapped to the page
pd.Series({k: v for k, v in titan.items() if k.endswith(("step2", "max"))}).to_frame(titan["setup"])

# %% [markdown]
# At full size (torchtitan's Llama-3-8B training shape), recorded by `scripts/record_titan_peer.py` on a CPU with
# fake tensors (a few minutes: shown as recorded, not rerun here; it is no GPU measurement):

# %%
rec = recorded_titan()
if rec is None:
    shown = "no recorded full-size peer run yet: python scripts/record_titan_peer.py writes it"
else:
    print(textwrap.fill(f"{rec['provenance']['kind']} · torch {rec['provenance']['torch']} · "
                        f"{rec['provenance']['date']}", 80))
    for row in rec["rows"]:
        print(textwrap.fill(f"{row['model']}: " + "; ".join(residual_names(row)[:3]), 80))
    shown = (pd.DataFrame(rec["rows"]).set_index("model")[["estimate_step2", "trace_step2", "titan_step2",
                                                             "titan_printed_max"]] / GiB).round(3).rename(
        columns={"estimate_step2": "estimate, step 2 (GiB)", "trace_step2": "trace, step 2 (GiB)",
                 "titan_step2": "torchtitan, step 2 (GiB)", "titan_printed_max": "torchtitan's printed max (GiB)"})
shown

# %% [markdown]
# ## Exercises
#
# **Exercise 2.** Llama-2-70B (preset `llama-2-70b`) trained with DDP + torch's `ZeroRedundancyOptimizer`, bf16
# gradients: how many TB does each rank move per step, by what section 3 measured for this implementation?

# %%
answer = ...
check("05.llama70b-zero1-tb", answer, table=comm)

# %% [markdown]
# **Exercise 3.** Llama-2-70B, mixed-bf16 AdamW, ZeRO-3 over 64 ranks: model states per rank, in GiB?

# %%
answer = ...
check("05.llama70b-zero3", answer)

# %% [markdown]
# **Exercise 4.** Doubling the ranks from 512 to 1024 under ZeRO-3: by what factor does GPT-3's predicted
# per-rank total of section 4 shrink? (1 would be "not at all", 2 "halved".)

# %%
answer = ...
check("05.zero3-floor", answer)

# %% [markdown]
# ## Summary
#
# - The estimator reproduces ZeRO's Table 1 (a published figure). On real ranks (gloo on a CPU), per-rank `.grad`,
#   parameters and AdamW states follow the ZeRO divisors for DDP and FSDP2, and within one tensor for torch's
#   ZeRO-1 (whole tensors per rank); real DDP adds its reducer's gradient buckets unless
#   `gradient_as_bucket_view=True`.
# - Seed 000's "O(N) → O(N/k)" holds for **model states, per stage**; activations do not shrink with k, and
#   ZeRO-3 adds gathered parameters inside the step (one block plus FSDP2's root here; all of them with
#   `reshard_after_forward=False`).
# - Communication: DDP moves exactly 2Ψ per rank per step, as the paper says; FSDP2's ZeRO-3 moves the paper's 3Ψ
#   less the root module's own parameters (FSDP2's default keeps the root gathered from forward to backward, so it
#   gathers it once); torch's ZeRO-1 moves 3Ψ (all-reduce + broadcast), in ZeRO's convention; with k accumulated
#   micro-batches ZeRO-3 moves (2k + 1)Ψ per optimizer step.
# - Seed 004's "stage 3 trains arbitrarily large models" overclaims: the floor is activations + gathered blocks,
#   and 3Ψ of traffic per step; its config is not valid JSON (comments) but DeepSpeed's hjson loader accepts it,
#   and each key has an FSDP2 equivalent.
# - What data parallelism does not divide is one micro-batch's activations on every rank, however many ranks:
#   chapter 06 splits the sample itself (TP, SP, PP, CP) and the experts (EP), each at a traffic price of its
#   own.

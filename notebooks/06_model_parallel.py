# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 · Model parallelism (TP, SP, PP, CP, EP): what each layout splits, and what it sends
#
# **The common belief.** Seed 004 ranks the fixes for memory and puts the distributed ones third, as one family:
# "when a single card or a single machine cannot meet the need, use distributed techniques such as ZeRO, model
# parallelism and pipeline parallelism" (第三优先级分布式层面……使用ZeRO、模型并行、流水线并行等分布式技术,
# `[seed-004]`); its troubleshooting table blames slow multi-GPU training on "all-reduce communication too frequent
# or too large, in model parallelism or data parallelism", and answers with faster links, NVLink or InfiniBand
# (`[seed-004]`). Read together: the layouts are interchangeable ways to spread one model's memory, and what they
# send is one kind of traffic.
#
# Chapter 05 measured what data parallelism divides (the model states) and what it does not (one micro-batch's
# activations, the gathered layer). This chapter spends the same 8 ranks on Llama-2-7B five other ways and checks
# the belief against what each rank holds and sends:
#
# 1. the formula: what tensor (TP), sequence (SP), pipeline (PP) and context (CP) parallelism divide, per rank,
#    against one rank and ZeRO-3 [korthikanti2022; narayanan2021; liu2023];
# 2. the pipeline's schedule: 1F1B and GPipe, rank by rank;
# 3. the experiment: torch's own pipeline schedules, DTensor's tensor and sequence parallelism and a ring
#    attention, run on a fake process group and counted byte by byte (and, at full scale, on real gloo ranks);
# 4. the price: what each layout sends per rank, and on which link it can afford to;
# 5. expert parallelism (EP) for a mixture of experts, predicted and traced;
# 6. published GPU measurements of TP and CP layouts (torchtitan on H100).

# %% tags=["parameters"]
scale = "auto"
device = "auto"
seed = 0
out_dir = "../reports/build/06_model_parallel"

# %%
import re
import textwrap

import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Markdown, display

from memlab import Setup, chapter, check, preset, ring_wire_bytes, zero_comm_bytes
from memlab.units import GiB

ch = chapter(scale, device, seed, out_dir)
ch

# %% [markdown]
# ## 1. The formula: what each layout splits
#
# Chapter 05's floor is one micro-batch's activations on every rank: data parallelism, ZeRO-3 included, splits the
# batch, never the sample. Four layouts split the sample itself, here each spending the same 8 ranks on one model
# (Llama-2-7B, mixed-bf16 AdamW, micro-batch 1 × 4096, flash attention, no recompute):
#
# - **TP** (tensor parallelism, Megatron-LM): each block's attention heads and MLP columns split over t ranks
#   [shoeybi2019]; the tensors inside attention and the MLP shrink by t, the block's LayerNorm and residual
#   inputs stay whole on every rank [korthikanti2022, Table 2: sbh(10 + 24/t + 5as/(ht)) per layer];
# - **TP + SP** (sequence parallelism): those remaining tensors split along the sequence, so all of it is ÷ t
#   [korthikanti2022, Sec. 4.2.2];
# - **PP** (pipeline parallelism): the blocks split into stages, each rank runs its L/p blocks on a stream of
#   micro-batches [narayanan2021];
# - **CP** (context parallelism): every rank keeps every layer and s/cp tokens of each sequence, attention passing
#   K/V chunks round a ring [liu2023].
#
# `memlab.studies.parallel.parallel_layouts` runs the estimator over the layouts
# (`memlab.predict.parallel.pipeline.parallel_estimate`
# for PP and CP: their worst rank). First, a prediction.

# %% [markdown]
# **Exercise 1 (predict before the table).** Under PP over 8 ranks with the 1F1B schedule and 8 micro-batches of
# the shape above, rank 0 holds 4 of Llama-2-7B's 32 blocks. Its saved activations at its peak, as a fraction of one
# unsplit rank's activations for one micro-batch (1 = "no smaller")? Answer before running the next cell.

# %%
answer = ...
check("06.pp-first-stage-activations", answer)

# %% tags=["reveals-06.pp-first-stage-activations"]
from memlab.predict.parallel.communication import cp_sent_bytes, pp_sent_bytes, tp_sent_bytes
from memlab.predict.parallel.pipeline import in_flight, micro_batch_bytes, parallel_estimate
from memlab.studies.parallel import parallel_layouts

llama = preset("llama-2-7b")
par_setup = Setup(batch=1, seq=4096, precision="mixed-bf16", attention="flash")
LAYOUT_NAMES = ("1 rank", "ZeRO-3 over 8", "TP 8", "TP 8 + SP", "PP 8, 1F1B", "PP 8, GPipe", "CP 8")
# predicted for GPUs (CUDA's kernels and widths) on every machine: the layouts are a question about GPU training
layouts = parallel_layouts(llama, par_setup, device_type="cuda")
layouts.insert(0, "name", LAYOUT_NAMES)
ch.save_table(layouts, "parallel_layouts_llama2_7b")
shown_layouts = layouts.assign(**{f"{c.removesuffix('_bytes')} GiB": layouts[c] / GiB for c in
                                  ("states_bytes", "activations_bytes", "buffers_bytes", "peak_bytes")})
shown_layouts[["name", "layout", "ranks", "states GiB", "activations GiB", "buffers GiB", "peak GiB"]].round(2)

# %%
lay = layouts.set_index("name")
act_ratio = lay["activations_bytes"] / lay.loc["1 rank", "activations_bytes"]
smallest = act_ratio.drop("1 rank").idxmin()
Markdown(f"Per-rank activations against one rank's: ZeRO-3 {act_ratio['ZeRO-3 over 8']:.2f}×, TP "
         f"{act_ratio['TP 8']:.2f}×, TP + SP {act_ratio['TP 8 + SP']:.2f}×, PP under 1F1B "
         f"{act_ratio['PP 8, 1F1B']:.2f}× (its worst rank), CP {act_ratio['CP 8']:.2f}×; the smallest is "
         f"{smallest}. The peak is another matter: CP keeps every parameter and AdamW state on every rank "
         f"({lay.loc['CP 8', 'states_bytes'] / GiB:.1f} GiB of states, peak {lay.loc['CP 8', 'peak_gib']:.1f} GiB), "
         f"so it is combined with ZeRO over the same ranks in practice; TP shards the states and the "
         f"activations at once (peak {lay.loc['TP 8', 'peak_gib']:.1f} GiB, "
         f"{lay.loc['TP 8 + SP', 'peak_gib']:.1f} GiB with SP).")

# %%
fig, ax = plt.subplots(figsize=(8, 3.8), layout="constrained")
names = list(lay.index)[::-1]
left = pd.Series(0.0, index=names)
for col, label, color in (("states_bytes", "model states", "C0"), ("activations_bytes", "saved activations", "C1"),
                          ("buffers_bytes", "pipeline buffers", "C2")):
    ax.barh(names, lay.loc[names, col] / GiB, left=left, color=color, label=label)
    left = left + lay.loc[names, col] / GiB
ax.scatter(lay.loc[names, "peak_gib"], names, color="k", marker="|", s=300, zorder=3, label="peak (worst rank)")
ax.set_xlabel("GiB per rank (predicted)")
ax.set_title("Llama-2-7B, micro-batch 1 × 4096, mixed-bf16 AdamW, on GPUs: per-rank bytes by layout")
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
ch.save_figure(fig, "parallel_layouts")

# %%
summed = lay["states_bytes"] + lay["activations_bytes"] + lay["buffers_bytes"]
below = [f"{k} ({lay.loc[k, 'peak_gib']:.1f} GiB against {summed[k] / GiB:.1f})" for k in lay.index
         if lay.loc[k, "peak_bytes"] < summed[k]]
Markdown("The tick is the phase-aware peak (the estimate phase by phase), not the bar's sum: the states, the saved "
         "tensors and the buffers do not all coexist at one moment (the gradients are allocated in backward, while "
         "the saved tensors are freed), and the step's transients come on top. "
         + (f"The peak is below the sum for {', '.join(below)}." if below else "Every peak is above its sum here."))

# %% [markdown]
# ## 2. The pipeline's schedule decides what a stage holds
#
# **Why PP's first stage keeps (almost) everything.** A rank saves each micro-batch's activations from its forward
# until that micro-batch's backward. GPipe runs all m forwards, then all m backwards: every rank holds m
# micro-batches at once [huang2019]. 1F1B (PipeDream-Flush) starts backwards as soon as the last stage can: rank r
# runs p − r warm-up forwards, then alternates one forward and one backward, so it holds min(p − r, m) at once
# [narayanan2021, Sec. 2.2.1; torch's `Schedule1F1B`]. Rank 0 then holds p micro-batches of L/p blocks: as much
# as one micro-batch through all L blocks (with m ≥ p). 1F1B bounds the activations by p (not m, as GPipe), but
# does not divide them by p. In flight and peak, per rank:

# %%
pp_rows = []
for sched in ("1f1b", "gpipe"):
    rep = parallel_estimate(llama, par_setup.with_(pp=8, micro_batches=8, pp_schedule=sched),
                            device_type="cuda")
    for r in rep.rows:
        pp_rows.append({"schedule": sched, "rank": r.rank, "holds": r.holds, "in flight": r.in_flight[0],
                        "activations GiB": r.activations_bytes / GiB, "peak GiB": r.peak_bytes / GiB})
pp_rows = pd.DataFrame(pp_rows)
assert [in_flight("1f1b", 8, 8, r)[0] for r in range(8)] == list(pp_rows.query("schedule == '1f1b'")["in flight"])
pp_rows.pivot(index="rank", columns="schedule", values=["in flight", "activations GiB", "peak GiB"]).round(2)

# %% [markdown]
# What 1F1B costs in time is its bubble, (p − 1)/(m + p − 1) of the step idle on every rank [narayanan2021]:
# chapter 08 computes it beside MFU. Here the question is memory.
#
# ## 3. The experiment: torch's own code, traced rank by rank
#
# **A pipeline traced: torch's own schedules, on a fake group.** `memlab.studies.pipeline.trace_stage` runs
# `torch.distributed.pipelining`'s `Schedule1F1B` and `ScheduleGPipe` for one rank's stage on a fake process group
# (sends return at once, nothing arrives) and counts every live storage. This is evidence from outside the formula:
# torch's real schedules decide what is alive when, not memlab's model of them. It runs on the CPU with real fp32
# tensors (small shapes: the stage's tensors are allocated), so it is no GPU measurement. The prediction's peak is
# a bound with named slack (the gradients not yet allocated at the peak moment, and one block's or the loss's
# backward temporaries as the estimator bounds them); the bytes held after the step are predicted exactly:

# %%
from memlab.studies.parallel_ranks import pp_setup
from memlab.studies.pipeline import trace_stage

tiny = preset("tiny-gpt")  # real fp32 tensors: small shapes on every machine; at full scale 8 blocks over 4 ranks
trace_model, trace_pp = (tiny, 2) if ch.scale == "ci" else (tiny.with_(name="tiny-gpt, 8 blocks", n_layers=8), 4)
traced_pp = []
for sched in ("1f1b", "gpipe"):
    s_pp = pp_setup(sched, trace_pp)  # fp32 SGD, trace_pp + 1 micro-batches of 2 x 64
    rows_pred = parallel_estimate(trace_model, s_pp, device_type="cpu").rows
    for r in range(trace_pp):
        tr, row = trace_stage(trace_model, s_pp, r), rows_pred[r]
        slack = row.states_bytes // 2 + row.transient_bytes  # fp32 SGD: the states are parameters + gradients
        traced_pp.append({"schedule": sched, "rank": r, "predicted peak (B)": tr.predicted_peak_bytes,
                          "traced peak (B)": tr.peak_bytes, "named slack bound (B)": slack,
                          "peak within the bound": 0 <= tr.predicted_peak_bytes - tr.peak_bytes <= slack,
                          "predicted after step (B)": tr.predicted_end_bytes, "traced after step (B)": tr.end_bytes})
traced_pp = pd.DataFrame(traced_pp)
ch.save_table(traced_pp, "pipeline_fake_group_trace")
display(Markdown(f"{trace_model.name}, pp = {trace_pp}, {trace_pp + 1} micro-batches: after the step "
                 f"{int((traced_pp['predicted after step (B)'] == traced_pp['traced after step (B)']).sum())} of "
                 f"{len(traced_pp)} ranks exact; peak within its named bound on "
                 f"{int(traced_pp['peak within the bound'].sum())} of {len(traced_pp)}"))
traced_pp

# %%
if ch.scale == "full":  # real gloo ranks under torchrun: real sends and receives (about 7 s on 2 CPU cores)
    from memlab.studies.parallel_ranks import measure_parallel_ranks, parallel_ranks_ledger

    ranks_ledger = parallel_ranks_ledger(measure_parallel_ranks("tiny-gpt", 2))
    ch.save_table(ranks_ledger, "parallel_ranks_gloo")
    shown_ranks = ranks_ledger
else:
    shown_ranks = ch.cpu_note("at ci scale the pipeline is traced on a fake group only; at full scale "
                              "the chapter also runs PP and TP on 2 real gloo ranks under torchrun "
                              "(about 7 s, over this chapter's ci budget)")
shown_ranks

# %% [markdown]
# **TP, TP + SP and CP traced, rank by rank.** The same fake group carries the other layouts' real code.
# `memlab.tracing.tensor_parallel` applies DTensor's `parallelize_module` to the reference GPT: q, k, v, gate and
# up column-parallel, o and down row-parallel [shoeybi2019]; with SP, as torch's TP tutorial and torchtitan's
# `parallelize_llama` write it, the norms are `SequenceParallel`, attention and MLP all-gather their input and o and
# down reduce-scatter back to the rank's s/t tokens [korthikanti2022]. Torch's own context parallelism
# (`torch.distributed.tensor.experimental.context_parallel`) does not run on a CPU (below, its error), so
# `memlab.tracing.context_parallel` traces a ring attention written here on point-to-point sends, the variant the
# estimator models: each rank attends its s/cp queries to the K/V chunks passed round the ring [liu2023].
# Each row is one rank and one phase: the estimator's bytes, the trace's, the named terms of the traced code that
# the estimate does not count, and what is left (for CP's attention rows: the bytes one attention core adds to a
# one-rank trace at s/cp tokens, against the estimator's K/V-chunk transient; the backward one is a bound, its
# peak moment need not be the one-rank kernel's):

# %%
from memlab.studies.parallel_traces import traced_parallel_rows
from memlab.tracing.context_parallel import TORCH_CP_ERRORS

# fake tensors, so any size runs: at ci scale tiny-gpt over 2 ranks (a second a rank); at full scale Llama-2-7B over
# 8 ranks at 4096 tokens, the layouts above (about 35 s of CPU). SP's first rank only (TP's ranks hold the same
# bytes; benchmarks/parallel_traces.py traces every rank), CP's first and last (they differ)
par_model, par_t, par_shape = (tiny, 2, dict(batch=2, seq=64)) if ch.scale == "ci" else (
    llama, int(lay.loc["TP 8", "ranks"]), dict(batch=1, seq=par_setup.seq))
par_ranks = (0, par_t - 1)
traced_par = traced_parallel_rows(par_model, tp=par_t, cp=par_t, ranks=par_ranks, sp_ranks=(0,), **par_shape)
ch.save_table(traced_par, "parallel_fake_group_traces")
print(textwrap.fill(f"torch's context_parallel on a CPU: {TORCH_CP_ERRORS['default (flash for CPU)']}", 80))
display(Markdown(f"{par_model.name}, {par_t} ranks, {par_shape['batch']} x {par_shape['seq']} tokens: "
                 f"{int((traced_par['left'] == 0).sum())} of {len(traced_par)} rank/phase rows exact once the "
                 f"named terms are "
                 "added"))
traced_par[["layout", "rank", "phase", "predicted", "traced", "named", "left", "kind"]]

# %%
from memlab.tracing.tensor_parallel import sequence_parallel_terms

gathered = sum(sequence_parallel_terms(par_model, Setup(**par_shape, tp=par_t, sp=True), device_type="cpu").values())
sp_exact = bool((traced_par[traced_par["layout"] == f"TP {par_t} + SP"]["left"] == 0).all())
cp_rows = traced_par[traced_par["layout"] == f"CP {par_t}"]
cp_fwd = cp_rows[cp_rows["phase"] == "attention forward"].set_index("rank")
cp_phases_exact = bool((cp_rows[~cp_rows["phase"].str.startswith("attention")]["left"] == 0).all())
r0, r_last = cp_fwd.loc[0], cp_fwd.loc[par_ranks[1]]
Markdown(("Every TP + SP row is exact" if sp_exact else "Some TP + SP rows are not exact")
         + " once DTensor's own choice is named: its column-parallel linears save their all-gathered input "
         f"({gathered:,} bytes on each rank here: the q/k/v and MLP inputs of every block and the LM head's, "
         "(1 − 1/t) of each), where Megatron-LM, which the estimate counts, saves the s/t shard and all-gathers it "
         "again in backward [korthikanti2022, Sec. 4.2.2]. In CP, rank 0 attends only to its own chunk (causal) and "
         + ("holds exactly" if r0["traced"] == r0["predicted"] else "does not hold")
         + f" the received K/V chunk the estimator predicts ({r0['predicted']:,} bytes); rank {par_ranks[1]} also "
         f"merges partial outputs by their log-sum-exp, {r_last['traced'] - r_last['predicted']:,} bytes "
         "of fp32 temporaries the estimate leaves out. "
         + ("CP's phase peaks equal the estimate at s/cp tokens" if cp_phases_exact
            else "CP's phase peaks differ from the estimate at s/cp tokens")
         + ": the ring's buffers live inside attention, below the peak of these shapes. These are CPU traces on "
         "fake tensors: evidence about what the code allocates, not a GPU measurement.")

# %% [markdown]
# ## 4. The price: bytes on the wire
#
# Each layout sends something else, so its memory comes with traffic. Per rank and per training step (bytes
# sent, in the communicated dtype bf16), from `memlab.predict.parallel.communication`: ZeRO-3's 3Ψ (chapter 05,
# section 1) over a ring; TP's four all-reduces of the (b s, h) block output per block, two in forward and two in
# backward, each sending 2(t − 1)/t of its buffer [shoeybi2019; thakur2005] (SP the same bytes as
# reduce-scatters and all-gathers [korthikanti2022]); PP's stage output forward and its gradient backward, b s h per
# micro-batch per boundary [narayanan2021]; CP's K/V chunks round the ring in forward and, with their gradients,
# in backward [liu2023], plus the weight gradients' all-reduce over the CP ranks (which hold the same weights).
# The layouts do not run the same work per step: ZeRO-3 runs 8 sequences (one per rank), PP 8 micro-batches, TP
# and CP one sequence on 8 ranks. Two kinds of traffic are kept apart: the weights' synchronisation (ZeRO-3's 3Ψ,
# CP's gradient all-reduce), paid once per optimizer step, which a real job amortises over its whole global batch
# (CP ranks fold into the data-parallel group), and the activation traffic (TP's all-reduces, PP's sends, CP's K/V
# ring), paid for every sequence.

# %%
# two published per-GPU link rates (the same as chapter 05's section 4), for the time floors below
LINKS_BYTES_PER_S = {"InfiniBand NDR, 400 Gb/s per GPU": 400e9 / 8,  # [nvidia-connectx7]
                     "NVLink 4 (H100 SXM), 900 GB/s both ways": 900e9 / 2}  # [nvidia-h100-datasheet]
ib_rate, nvlink_rate = LINKS_BYTES_PER_S.values()
n8 = 8
tokens = par_setup.batch * par_setup.seq
grad_psi = 2 * llama.param_count()  # one bf16 copy of the parameters (or gradients), bytes
pp_boundary = micro_batch_bytes(llama, par_setup.with_(pp=n8, micro_batches=n8), "cuda").boundary
kv_chunk = 2 * par_setup.batch * (par_setup.seq // n8) * llama.kv_dim * 2  # K and V of one rank's tokens, bf16
tp_bytes = tp_sent_bytes(tokens, llama.d_model, llama.n_layers, n8)
pp_bytes = max(pp_sent_bytes(pp_boundary, n8, n8, r) for r in range(n8))
sent = {"1 rank": (0.0, 0.0, 1),  # (weights' sync per step, activation traffic per step, sequences per step)
        "ZeRO-3 over 8": (ring_wire_bytes(sum(zero_comm_bytes(grad_psi, 3).values()), n8), 0.0, n8),
        "TP 8": (0.0, tp_bytes, 1), "TP 8 + SP": (0.0, tp_bytes, 1),
        "PP 8, 1F1B": (0.0, pp_bytes, n8), "PP 8, GPipe": (0.0, pp_bytes, n8),
        "CP 8": (ring_wire_bytes(sum(zero_comm_bytes(grad_psi, 0).values()), n8),
                 cp_sent_bytes(kv_chunk, llama.n_layers, n8), 1)}
wire = pd.DataFrame([{"name": k, "peak GiB per rank": lay.loc[k, "peak_gib"], "sequences per step": q,
                      "weight sync per step (GB)": g / 1e9, "activation traffic per sequence (GB)": a / q / 1e9,
                      "GB sent per rank per step": (g + a) / 1e9}
                     for k, (g, a, q) in sent.items()])
ch.save_table(wire, "parallel_communication")
wire.round(2)

# %%
from memlab.predict.parallel.communication import tp_allreduce_buffer_bytes
from memlab.studies.parallel_ranks import column_modules

fused_reduces = tp_allreduce_buffer_bytes(tokens, llama.d_model, llama.n_layers)
torch_reduces = tp_allreduce_buffer_bytes(tokens, llama.d_model, llama.n_layers, column_modules=column_modules(llama))
one_buffer = llama.n_layers * tokens * llama.d_model * 2  # one (b s, h) bf16 all-reduce in every block, bytes
Markdown(f"The TP rows count Megatron's plan, whose q/k/v and gate/up projections are one fused linear each: "
         f"{fused_reduces // one_buffer} all-reduces a block. torch's "
         f"`parallelize_module` over separate q, k, v, gate and up modules (memlab's trace and gloo ranks) all-reduces "
         f"each column-parallel module's input gradient on its own: "
         f"{torch_reduces // one_buffer} a block, {torch_reduces / fused_reduces:.2f}x "
         f"the bytes. Those are not typed in from the paper: memlab's collective counter counts every c10d call "
         f"real ranks issue, and at full scale the gloo ledger above sets each rank's all-reduce buffers and pipeline "
         f"sends next to these formulas (`memlab shard --layouts` prints the same rows).")

# %%
w = wire.set_index("name")
per_seq = w["activation traffic per sequence (GB)"].drop("1 rank")
per_seq = per_seq[per_seq > 0]  # layouts that move activations (ZeRO-3 moves only weights)
cp_grads = ring_wire_bytes(sum(zero_comm_bytes(grad_psi, 0).values()), n8)
cp_kv = cp_sent_bytes(kv_chunk, llama.n_layers, n8)
tp_s = w.loc["TP 8", "GB sent per rank per step"] * 1e9
Markdown(f"Per sequence, of the activation traffic, {per_seq.idxmin()} sends the least ({per_seq.min():.2f} GB per "
         "rank" + (", at its stage boundaries only, point to point" if per_seq.idxmin().startswith("PP") else "")
         + f") and {per_seq.idxmax()} the most ({per_seq.max():.1f} GB); the weights' synchronisation "
         f"(ZeRO-3 {w.loc['ZeRO-3 over 8', 'weight sync per step (GB)']:.1f} GB, CP's gradient all-reduce "
         f"{w.loc['CP 8', 'weight sync per step (GB)']:.1f} GB) is paid once per optimizer step, whatever the "
         "global batch, so it is not ranked per sequence. TP's "
         f"{tp_s / 1e9:.1f} GB per sequence sit in collectives inside every block, on the critical path: at the "
         f"InfiniBand rate of one NDR port ({ib_rate / 1e9:.0f} GB/s per GPU) at least {tp_s / ib_rate:.2f} s per "
         f"sequence, over NVLink {tp_s / nvlink_rate:.3f} s, which is why TP stays inside a node's NVLink domain "
         "while PP and data parallelism cross nodes [narayanan2021]. "
         + ("CP's traffic is mostly the weight gradients' all-reduce, as in data parallelism:" if cp_grads > cp_kv
            else "CP's traffic is mostly its K/V chunks, not the weight gradients' all-reduce:")
         + f" {cp_grads / 1e9:.1f} GB of gradients, {cp_kv / 1e9:.1f} GB of K/V chunks (ring attention as "
         "[liu2023] runs it, an assumption: implementations differ).")

# %% [markdown]
# **Exercise 2.** Llama-2-7B under TP over 4 ranks (no SP), micro-batch 2 × 2048 in bf16, ring all-reduces: how
# many GiB does each rank send in the blocks' all-reduces for one micro-batch's forward and backward?

# %%
answer = ...
check("06.tp4-allreduce-gib", answer)

# %% [markdown]
# ## 5. Expert parallelism: a mixture of experts split over ranks
#
# A mixture of experts keeps every expert's weights resident while each token runs through only top_k of them
# (Mixtral-8x7B: 8 experts a layer, top-2 [jiang2024]), so its states are large and its activations those of a much
# smaller dense model. Expert parallelism (EP) puts `n_experts / ep` of each layer's experts on each of ep ranks;
# a token's hidden state goes to the ranks of the experts its router chose by one all-to-all (*dispatch*) and comes
# back by a second (*combine*), and backward sends their gradients the same way [lepikhin2020, Sec. 3.1;
# rajbhandari2022, Sec. 5]. The ep ranks are drawn from the data-parallel ranks (Megatron-Core's
# `--expert-model-parallel-size`, DeepSpeed-MoE's expert-data-parallel groups [megatron-moe; rajbhandari2022]), so
# here they are 8 data-parallel ranks under ZeRO-1, the dense states sharded over all 8 and the experts' over the
# 8 / ep ranks that hold the same experts. memlab's reference router is dropless (no capacity factor [fedus2021]),
# so how many tokens a rank's experts receive depends on the routing: `balanced` (every expert the same share) or
# `worst` (every rank's tokens choose this rank's experts). `memlab.predict.parallel.experts.expert_estimate` gives one
# rank's bytes under both; `memlab estimate --preset ref:mixtral-8x7b --ep 8 --world-size 8 ...` prints the same.

# %%
from memlab.predict.parallel.experts import ep_layouts, expert_estimate
from memlab.tracing.experts import trace_gpt_ep

mixtral = preset("mixtral-8x7b")  # the reference GPT with Mixtral-8x7B's sizes
ep_setup = Setup(batch=1, seq=4096, precision="bf16", attention="flash", zero_stage=1, world_size=8)
ep_table = ep_layouts(mixtral, ep_setup, (1, 2, 4, 8), device_type="cuda")
ch.save_table(ep_table, "expert_parallel_mixtral")
shown_ep = ep_table.assign(**{f"{c.removesuffix('_bytes').replace('_', '-')} GiB": ep_table[c] / GiB for c in
                              ("states_bytes", "activations_bytes", "all_to_all_bytes", "peak_bytes", "sent_bytes")})
shown_ep[["ep", "routing", "local_experts", "states GiB", "activations GiB", "all-to-all GiB", "peak GiB",
          "sent GiB"]].rename(columns={"local_experts": "local experts"}).round(2)

# %%
bal = ep_table[ep_table.routing == "balanced"].set_index("ep")
worst = ep_table[ep_table.routing == "worst"].set_index("ep")
Markdown(f"From ep = 1 to 8 a rank's model states fall from {bal.loc[1, 'states_bytes'] / GiB:.1f} to "
         f"{bal.loc[8, 'states_bytes'] / GiB:.1f} GiB (the experts' share divides by ep, the attention, embeddings "
         f"and router do not). Under balanced routing its saved activations stay "
         f"{bal.loc[8, 'activations_bytes'] / GiB:.1f} GiB at every ep: a rank's experts receive t × top_k pairs "
         f"whatever ep, as many as its own tokens send. The worst case is the price of a dropless router: at ep = 8 "
         f"every rank's tokens can pick this rank's expert, {worst.loc[8, 'activations_bytes'] / GiB:.1f} GiB of "
         f"activations and a peak of {worst.loc[8, 'peak_bytes'] / GiB:.1f} GiB against "
         f"{bal.loc[8, 'peak_bytes'] / GiB:.1f} GiB balanced (a capacity factor would cap it, dropping tokens); "
         f"the worst rank receives ep × min(k, E / ep) pairs per token (k experts per token, E experts), "
         f"{worst.loc[2, 'activations_bytes'] / GiB:.1f}, {worst.loc[4, 'activations_bytes'] / GiB:.1f} and "
         f"{worst.loc[8, 'activations_bytes'] / GiB:.1f} GiB of activations at ep = 2, 4, 8. "
         f"The all-to-alls send {bal.loc[2, 'sent_bytes'] / GiB:.1f} GiB per rank per step at ep = 2 and "
         f"{bal.loc[8, 'sent_bytes'] / GiB:.1f} GiB at ep = 8 when balanced: (ep − 1)/ep of the pairs leave the "
         f"rank, four times per layer; the worst rank sends back every pair the other ranks sent it, "
         f"{worst.loc[8, 'sent_bytes'] / GiB:.1f} GiB at ep = 8.")

# %%
fig, (ax_m, ax_c) = plt.subplots(1, 2, figsize=(9, 3.4), layout="constrained")
for routing, style in (("balanced", "o-"), ("worst", "s--")):
    part = ep_table[ep_table.routing == routing]
    ax_m.plot(part.ep, part.peak_bytes / GiB, style, label=f"peak, {routing} routing")
    ax_c.plot(part.ep, part.sent_bytes / GiB, style, label=f"{routing} routing" + (" (the hot rank)"
                                                                                    if routing == "worst" else ""))
ax_m.plot(bal.index, bal.states_bytes / GiB, "^:", label="model states")
for ax in (ax_m, ax_c):
    ax.set_xscale("log", base=2)
    ax.set_xticks([1, 2, 4, 8], ["1", "2", "4", "8"])
    ax.set_xlabel("expert-parallel degree ep (of 8 data-parallel ranks)")
    ax.legend(fontsize=8)
ax_m.set_ylabel("GiB per rank (predicted)")
ax_m.set_title("Mixtral-8x7B, 1 × 4096, bf16 AdamW, ZeRO-1: memory", fontsize=9)
ax_c.set_ylabel("GiB sent per rank per step")
ax_c.set_title("all-to-all traffic (dispatch + combine, fwd + bwd)", fontsize=9)
ch.save_figure(fig, "expert_parallel_mixtral")

# %% [markdown]
# **Traced.** `memlab.tracing.experts.trace_gpt_ep` runs the reference GPT with each MoE layer's experts split over
# a fake process group's ranks and `all_to_all_single` dispatch and combine, rank 0 counted on fake tensors (so on
# any machine, no GPU evidence). A fake tensor has no values to route by, so the trace forces balanced routing. The
# estimate and the trace agree to the byte but for two named residuals: Adam's per-tensor step counters (4 bytes a
# tensor) and the loss scalar.

# %%
ep_checks = []
# one small shape here (about 2 s of CPU); tests/tracing/test_expert_trace.py checks two, top-1 and top-2
ep_shapes = ((preset("tiny-moe").with_(n_layers=1, vocab_size=128), Setup(batch=2, seq=16, world_size=2, ep=2)),)
for cfg_ep, s_ep in ep_shapes:
    tr_ep, r_ep = trace_gpt_ep(cfg_ep, s_ep, device_type="cpu"), expert_estimate(cfg_ep, s_ep, device_type="cpu")
    fwd = tr_ep.phase("forward").end_by_category
    n_tensors = sum(1 for n_, _, _ in cfg_ep.param_shapes() if ".experts." not in n_
                    or int(n_.split(".experts.")[1].split(".")[0]) < cfg_ep.n_experts // s_ep.ep)
    ep_checks.append({"shape": f"top-{cfg_ep.top_k}, ep {s_ep.ep}, {s_ep.precision}",
                      "predicted states (B)": r_ep.states_bytes,
                      "traced states (B)": tr_ep.phase("optimizer step").end_bytes - r_ep.buffers_bytes
                      - 2 * s_ep.batch * s_ep.seq * 8 - 4 * n_tensors,
                      "predicted activations (B)": r_ep.activations_bytes,
                      "traced activations (B)": fwd["activations"] + fwd["inputs"] - 4})
ep_checks = pd.DataFrame(ep_checks)
ch.save_table(ep_checks, "expert_parallel_trace")
assert (ep_checks["predicted states (B)"] == ep_checks["traced states (B)"]).all()
assert (ep_checks["predicted activations (B)"] == ep_checks["traced activations (B)"]).all()
ep_checks

# %% [markdown]
# **Exercise 3.** Mixtral-8x7B as above (bf16) but with a micro-batch of 3 × 4096, EP over 8 ranks, balanced
# routing: how many GiB does each rank send by all-to-all in one step (every MoE layer's dispatch and combine,
# forward and backward)?

# %%
answer = ...
check("06.ep8-all-to-all-gib", answer)

# %% [markdown]
# ## 6. Published GPU evidence
#
# Everything above is predicted, or traced on a CPU: none of it is a GPU measurement. The GPU evidence is
# published: torchtitan's Llama 3.1 runs on H100 with FSDP2 × TP (with SP) and FSDP2 × CP, each row with its
# source, beside memlab's prediction for that setup and what explains the residual.

# %%
recorded = ch.recorded("06_model_parallel_gpu")
recorded  # the GPU run recorded by scripts/gpu_session.sh, where the repo has one (nothing shows otherwise)

# %%
evidence = ch.published("06")
evidence

# %%
from memlab.compare.published import published_rows

cp_rows = sorted(((int(re.search(r"context parallel (\d+)", r.parallel).group(1)), r) for r in published_rows(
    chapter="06") if "context parallel" in r.parallel), key=lambda pair: pair[0])
refused = evidence.frame[evidence.frame["memlab"].astype(str).str.startswith("refused")]["row"].tolist()
(cp_lo, first), (cp_hi, last) = cp_rows[0], cp_rows[-1]
seq_lo, seq_hi = int(first.seq), int(last.seq)
held = [float(r.figure) for _, r in cp_rows]
Markdown(f"torchtitan's CP rows measure CP's promise: from cp = {cp_lo} to {cp_hi} the sequence grows "
         f"{seq_hi // seq_lo}× ({seq_lo:,} → {seq_hi:,} tokens, one sequence per group of cp GPUs) while each "
         f"GPU's peak reserved stays between {min(held)} and {max(held)} {first.unit}: a rank holds the activations "
         "of s/cp tokens, as section 1 predicts. "
         + (f"memlab refuses {len(refused)} of these rows ({', '.join(refused)}: see the table's last column), so "
            "there the published figure stands alone." if refused else ""))

# %% [markdown]
# **The misreading.** "ZeRO, model parallelism, pipeline parallelism" are not three settings of one knob. Each
# divides something else: ZeRO the model states, TP the tensors inside attention and the MLP (with SP all of a
# block's), PP the blocks (while 1F1B leaves its first stage about one micro-batch through every block), CP the
# tokens (but not the states, which is why it runs folded into the data-parallel group), EP the experts' states
# (while a dropless router can send one rank every token). And each sends something else: TP's all-reduces sit in
# every block on the critical path, so TP stays inside a node's NVLink; PP sends only at its stage boundaries, so
# it crosses nodes; the gradients' all-reduce of data parallelism and CP is paid once per optimizer step, the
# activation traffic once per sequence. "Faster links" is the answer for TP; for PP and data parallelism, over
# InfiniBand, what overlaps with compute matters first.

# %% [markdown]
# ## Summary
#
# - Data parallelism splits the batch; TP, TP + SP, PP and CP split the sample. On Llama-2-7B at 8 ranks
#   (predicted), TP divides the tensors inside attention and the MLP, TP + SP and CP all of a block's; PP's 1F1B
#   bounds a rank by p micro-batches of its L/p blocks, so its first stage keeps about one micro-batch through
#   every block (Exercise 1), and GPipe holds all m.
# - torch's own code agrees with the estimator: the pipeline schedules traced on a fake group, DTensor's TP and
#   SP, and a ring attention, byte for byte once DTensor's own choices (its saved all-gathered input under SP) and
#   the log-sum-exp merge of ring attention are named. These are CPU traces, not GPU measurements; the GPU
#   evidence is torchtitan's published runs.
# - Each layout has its own traffic: TP four all-reduces of the block output per block (Exercise 2), PP its
#   boundary sends, CP its K/V ring plus the gradients' all-reduce, EP four all-to-alls per MoE layer
#   (Exercise 3). Seed 004's "all-reduce too frequent or too large" fits data parallelism and TP; PP and EP send
#   point to point and all-to-all.
# - Seed 004's "ZeRO, model parallelism, pipeline parallelism" as one family does not hold: the layouts divide
#   different terms and send different bytes over different links, so real jobs combine them (FSDP × TP inside a
#   node, PP and data parallelism across nodes).

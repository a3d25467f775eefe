# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 · Anatomy of an OOM
#
# **The common belief.** Seed article 004 `[seed-004]` opens with the error everyone has seen,
# "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB...", and its troubleshooting table blames
# "批次大小过大 … 内存泄漏如张量未释放" (*a batch that is too large … a leak, tensors not released*), prescribes
# `torch.no_grad()` for inference, and calls `torch.cuda.empty_cache()` "治标不治本" (*treating the symptom, not
# the cause*). Its budget for a 7B model is 14 + 14 + 56 = 84 GB before activations.
#
# An OOM message says much more than "tried to allocate". This chapter reads it field by field, shows where the
# bytes were when a step failed, predicts the largest batch that fits and then finds it, and turns the seed's
# troubleshooting rows into loops whose bytes are measured per iteration:
#
# 1. the message, decoded; 2. where the bytes were: step 1 survives, step 2 dies; 3. predict, then find, the
# largest batch; 4. fragmentation; 5. memory snapshots; 6. leaks, `no_grad`, cycles and `empty_cache`, measured.

# %% tags=["parameters"]
scale = "auto"
device = "auto"
seed = 0
out_dir = "../reports/build/01_oom"

# %%
import dataclasses
import textwrap

import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Markdown, display

from memlab import (
    RECORDED_OOM_MESSAGES,
    Setup,
    chapter,
    check,
    decode_oom,
    emulate_smaller_gpu,
    estimate,
    fragmentation_probe,
    gpu,
    live_training_steps,
    max_batch,
    parse_oom_message,
    preset,
    record_memory_history,
    run_step,
    snapshot_timeline,
    stacked_by_label,
    trace_gpt,
)
from memlab.compare import plots
from memlab.compare.published import KIND_WORDS, snapshot_checks
from memlab.labs import allocator, oom
from memlab.model.step import build_training, token_batch, train_step
from memlab.predict.fit import ALLOCATED_ONLY
from memlab.predict.gpu.device import DeviceOverheads
from memlab.units import GB, GiB, KiB, MiB

ch = chapter(scale, device, seed, out_dir, ci_threads=1)  # tiny models: more threads only add contention
SIZES = {"ci": dict(model="tiny-gpt", seq=64, batches=list(range(1, 13)), leak_iters=8),
         "full": dict(model="gpt2", seq=1024, batches=[1, 2, 4, 6, 8, 12, 16], leak_iters=20)}[ch.scale]
ch

# %% [markdown]
# ## 1. The message, decoded
#
# Since torch 2.1 the message is a set of sentences: the request, the card's capacity and what is free, what this
# process holds in total, what live tensors hold ("allocated by PyTorch") and what the caching allocator keeps
# without a tensor in it ("reserved but unallocated"). `memlab.measure.oom.parse_oom_message` reads every shape
# torch has printed. On CUDA the cell makes a real one (a small card emulated with
# `set_per_process_memory_fraction`); on a CPU it decodes messages real GPUs printed, quoted from public reports.

# %%
model = preset(SIZES["model"])
seq = SIZES["seq"]
if not ch.on_cpu:
    cap_bytes = 4 * GiB
    with emulate_smaller_gpu(cap_bytes, ch.device):
        failed = run_step(model, Setup(batch=64, seq=seq, precision="fp32"), ch.device, steps=1,
                          with_counted_flops=False, with_mfu=False)
    message, where = (failed.oom or {}).get("raw", ""), f"produced here on {failed.device_name} (capped at 4 GiB)"
else:
    message, where = RECORDED_OOM_MESSAGES[0].message, (f"{RECORDED_OOM_MESSAGES[0].source}, "
                                                       f"{RECORDED_OOM_MESSAGES[0].torch}")
info = parse_oom_message(message)
if ch.on_cpu:
    cap_bytes = info.total_capacity_bytes
print(textwrap.fill(f"{where}:", 80) + "\n" + textwrap.fill(message, 80) + "\n")  # wrapped to the page
decoded = pd.DataFrame(decode_oom(info))
ch.save_table(decoded, "oom_decoded")
decoded[["in the message", "GiB", "meaning", "for the fix"]].round({"GiB": 3})

# %%
if info.process_in_use_bytes is not None and info.reserved_total_bytes is not None:
    outside = info.process_in_use_bytes - info.reserved_total_bytes
    display(Markdown(f"in use by the process {info.process_in_use_bytes / GiB:.2f} GiB = allocator reserve "
                     f"{info.reserved_total_bytes / GiB:.2f} GiB + {outside / GiB:.2f} GiB outside PyTorch's allocator "
                     "(the CUDA context and loaded kernels, NCCL buffers, any library calling cudaMalloc itself): what "
                     "nvidia-smi counts and no PyTorch block holds"))

# %%
share = info.tried_to_allocate_bytes / cap_bytes  # on CUDA: the emulated card, not the whole GPU
display(Markdown(f"the failed request is {share:.1%} of the capacity: " + (
               "the card was already full; look at what holds it" if share < 0.1 else "that one tensor is too big")))

# %% [markdown]
# A small request next to a full card means the memory was already taken; a request near the capacity means one
# tensor is too big. "Allocated by PyTorch" is the workload; "in use by this process" minus the allocator's
# reserve is the CUDA context (with its loaded kernel images; `CUDA_MODULE_LOADING=LAZY`, torch's default since
# 2.0, loads far fewer), NCCL's communicator buffers and any library that calls `cudaMalloc` itself. cuBLAS and
# cuDNN workspaces are *not* outside: PyTorch hands them blocks from its own allocator, so they sit inside
# "reserved". Every shape of the message, from real
# reports, with the fields each one states (seed 004 quotes only "Tried to allocate"):

# %%
shapes = []
for rec in RECORDED_OOM_MESSAGES:
    i = parse_oom_message(rec.message)
    shapes.append({"message": rec.key, "reported in": f"{rec.source}, torch {rec.torch}",
                   "fields stated": len(decode_oom(i)),
                   "tried (GiB)": i.tried_to_allocate_bytes / GiB,
                   "free (GiB)": i.free_bytes / GiB if i.free_bytes is not None else float("nan"),
                   "allocated (GiB)": (i.allocated_by_pytorch_bytes or 0) / GiB,
                   "reserved, unallocated (GiB)": (i.reserved_unallocated_bytes
                                                   if i.reserved_unallocated_bytes is not None
                                                   else (i.reserved_total_bytes or 0)
                                                   - (i.allocated_by_pytorch_bytes or 0)) / GiB})
shapes = pd.DataFrame(shapes)
ch.save_table(shapes, "oom_shapes")
shapes.drop(columns="fields stated").round(2)  # the count feeds seed claim #30 below

# %% [markdown]
# **Exercise 1 (before the next cell judges it).** The `fragmented-2.5` message says "reserved but unallocated
# is large, try expandable_segments". Suppose that setting let the allocator hand out *every* reserved-but-unallocated
# byte, on top of what the driver still has free. By how many GiB would the request still be short?

# %%
answer = ...
check("01.fragmented-short", answer)

# %% [markdown]
# A large "reserved but unallocated" is a *candidate* for fragmentation, not a diagnosis. Before it raises, the
# allocator has already returned every wholly free cached segment to the driver and retried
# `[pytorch-caching-allocator]`, so what stays reserved sits in segments that still hold a live tensor. The test is
# arithmetic: even a perfect layout can serve at most free + reserved-but-unallocated. `memlab.labs.oom.oom_kind`
# applies it to each message:

# %% tags=["reveals-01.fragmented-short"]
kinds = pd.DataFrame([{"message": rec.key, **oom.oom_kind(parse_oom_message(rec.message))}
                      for rec in RECORDED_OOM_MESSAGES])
ch.save_table(kinds, "oom_kinds")
kinds

# %% [markdown]
# ## 2. Where the bytes were: why step 1 survives and step 2 dies
#
# `live_training_steps` counts the bytes of every live tensor at every op of two AdamW steps, stacked by the phase
# that allocated them. Adam's two moments are created inside the first `optimizer.step()`; from then on every
# forward and backward runs on top of them. A card whose capacity lies between the two steps' peaks passes step 1
# and fails in step 2.

# %%
setup = Setup(batch=4, seq=seq, precision="fp32", optimizer="adamw")
for_loop = setup.with_(optimizer_impl="for-loop")  # one parameter at a time: the live steps and their estimate
live = live_training_steps(model, for_loop, ch.device, steps=2, seed=seed)
step_peaks = live.step_peaks()
card = int((step_peaks[1] + step_peaks[2]) // 2)
markers = live.frame.loc[live.frame["label"].ne(live.frame["label"].shift()), ["op", "label"]]
fig = plots.live_stacked(stacked_by_label(live.frame),
                         title=f"{model.name}, fp32 + AdamW, b=4, s={seq}: live tensor bytes over two steps",
                         source=f"every tensor op counted on the {ch.device_type.upper()}; dashed: a card between "
                                "the two steps' peaks; red: the step-2 peak", markers=markers, capacity_bytes=card,
                         mark_peak=True)
ch.save_figure(fig, "two_steps_live")
# beside each measured peak, the phase-aware estimator's (memlab.predict.memory.phases) for the same for-loop AdamW
predicted = estimate(model, for_loop, device_type=ch.device_type)
against = live.against(predicted)
ch.save_table(against, "two_steps_peaks_predicted")
display(Markdown(f"predicted peak {predicted.peak_bytes / MiB:.2f} MiB in the {predicted.peak_step} step's "
                 f"{predicted.peak_phase}; measured {live.peak_bytes / MiB:.2f} MiB ({live.peak_label})"))
against.assign(**{"measured MiB": against["measured"] / MiB, "predicted MiB": against["predicted"] / MiB,
                  "predicted vs measured": against["rel_error"].map("{:+.3%}".format)})[
    ["step", "phase", "measured MiB", "predicted MiB", "predicted vs measured"]].round(
    {"measured MiB": 3, "predicted MiB": 3})

# %%
m = run_step(model, setup, ch.device, steps=1, seed=seed, with_counted_flops=False, with_mfu=False)
phases = pd.DataFrame(m.phases)
u_sum = (m.params_bytes + m.grads_bytes + m.optimizer_bytes + m.activations_bytes) / live.peak_bytes
at_peak = live.held_at_peak()  # the op where step 2 peaks: who holds its bytes, by where they were allocated
held = {"parameters (P)": at_peak.get("params", 0), "Adam's state (O)": at_peak.get("step 1: optimizer step", 0),
        "forward's saved tensors (A)": at_peak.get("step 1: forward", 0) + at_peak.get("step 2: forward", 0),
        "made by backward so far": at_peak.get("step 2: backward", 0)}
logits_bytes = setup.batch * seq * model.vocab_size * 4  # one fp32 tensor of the logits' shape, b·s·V·4 B
smallest_param_bytes = min(p.untyped_storage().nbytes() for p in build_training(model, setup, ch.device,
                                                                               seed=seed)[0].parameters())
backward_made = int(held["made by backward so far"])
n_logits = round(backward_made / logits_bytes)
leftover = backward_made - n_logits * logits_bytes
no_grad_yet = 0 <= leftover < smallest_param_bytes  # too few bytes left for even the smallest weight gradient
u_peak = (held["parameters (P)"] + held["Adam's state (O)"] + held["forward's saved tensors (A)"]) / live.peak_bytes
display(Markdown(f"step 1 peak {step_peaks[1] / MiB:.2f} MiB, step 2 peak {step_peaks[2] / MiB:.2f} MiB "
                 f"(+{step_peaks[2] / step_peaks[1] - 1:.0%}): the optimizer state, {m.optimizer_bytes / MiB:.2f} MiB, "
                 "is new in step 2."))
display(Markdown(f"Seed 000's 'effective utilisation' adds each component at its own largest: (P + G + O + A) / peak = "
                 f"{u_sum:.2f}. But the components are never all there at once. At the step-2 peak P + O + A = "
                 f"{u_peak:.2f} of "
                 f"it; the other {1 - u_peak:.2f} ({backward_made:,} B) was made by backward so far: {n_logits} fp32 "
                 f"tensor(s) of the logits' shape (b·s·V·4 = {logits_bytes:,} B each) plus {leftover:,} B, "
                 + ("less than the smallest weight gradient: no gradient exists yet (G = 0)." if no_grad_yet
                    else "which includes weight gradients.")))
pd.DataFrame({"at the step-2 peak (MiB)": {k: v / MiB for k, v in held.items()}}).assign(
    **{"share of the peak (%)": lambda d: 100 * d["at the step-2 peak (MiB)"] * MiB / live.peak_bytes}).round(3)

# %%
phases.rename(columns={c: f"{c} (B)" for c in ("params", "grads", "optimizer", "activations")})

# %% [markdown]
# ## 3. Predict, then find, the largest batch that fits
#
# **Exercise 2 (predict first).** The card below has the capacity printed by the cell. With the model and
# setup of section 2, what is the largest batch that fits? Answer before running section 3's measuring cell;
# the check compares with memlab's fit search (`max_batch`).

# %%
if not ch.on_cpu:
    card_spec = gpu("t4")  # a 16 GiB card, emulated on this GPU with set_per_process_memory_fraction
else:
    budget = estimate(model, setup.with_(batch=6)).total_bytes
    card_spec = dataclasses.replace(gpu("t4"), key="budget", name=f"a {budget / MiB:.1f} MiB budget",
                                    memory_bytes=budget)
print(f"{card_spec.name}: {card_spec.memory_bytes / MiB:,.1f} MiB")

# %%
answer = ...
check("01.largest-batch", answer, model=model, setup=setup, card=card_spec)

# %% [markdown]
# The measurement: one run per batch, an OOM kept as a row (`status`), not a crash. On CUDA the cap is real
# (`emulate_smaller_gpu`); on a CPU, which has no allocator to refuse, each batch's measured peak of live
# tensor bytes is compared with the budget.

# %% tags=["reveals-01.largest-batch"]
batches = SIZES["batches"]
found = oom.fit_sweep(model, setup, batches, card_spec.memory_bytes, ch.device, steps=2, seed=seed)
predicted_total = [estimate(model, setup.with_(batch=b)).total_bytes for b in batches]
found["predicted (sum of components)"] = predicted_total
# a budget caps the step's tensors (a CPU's live bytes); set_per_process_memory_fraction caps the allocator's
# reserved bytes, so on a GPU the reserve and the workspaces count, the CUDA context does not
fit = max_batch(model, setup, card_spec, device=ALLOCATED_ONLY if ch.on_cpu else DeviceOverheads(cuda_context_bytes=0))
measured_max = int(found.loc[found["status"] == "ok", "batch"].max()) if (found["status"] == "ok").any() else 0
checked = "CPU live-bytes check" if ch.on_cpu else "measured"  # a CPU refuses nothing: peaks against a budget
display(Markdown(f"fit search (estimator): batch {fit.words()}; {checked}: batch {measured_max} ({fit.reason})"))
ch.record_ledger(pd.DataFrame([{"experiment": f"{model.name} fp32 AdamW s={seq} on {card_spec.name}",
                                "component": "largest batch" + (f" ({checked})" if ch.on_cpu else ""),
                                "unit": "batch", "predicted": fit.value, "measured": measured_max,
                                "note": checked}]))
ch.save_table(found.drop(columns="oom_message", errors="ignore"), "fit_sweep")
found[["batch", "status"]].assign(**{"measured peak (MiB)": found["peak_bytes"] / MiB,
                                     "predicted, sum of components (MiB)": found["predicted (sum of components)"] / MiB,
                                     }).round(3)

# %%
fig, ax = plt.subplots(figsize=(8, 4), layout="constrained")
ax.plot(found["batch"], found["peak_bytes"] / MiB, "-o", label="measured peak")
ax.plot(found["batch"], found["predicted (sum of components)"] / MiB, "--", label="estimator: sum of components")
ax.axhline(card_spec.memory_bytes / MiB, color="red", ls=":", label=card_spec.name)
ax.set(xlabel="batch", ylabel="bytes (MiB)",
       title=f"{model.name}, fp32 + AdamW, s={seq}: the largest batch, predicted and measured\n"
             f"measured on {ch.device} ({'live tensor bytes' if ch.on_cpu else 'allocator peak'})")
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
ch.save_figure(fig, "largest_batch")

# %%
slope_m = (found["peak_bytes"].iloc[-1] - found["peak_bytes"].iloc[0]) / (batches[-1] - batches[0])
slope_p = (predicted_total[-1] - predicted_total[0]) / (batches[-1] - batches[0])
print(f"per extra sample: measured peak +{slope_m / KiB:.0f} KiB, estimator's sum +{slope_p / KiB:.0f} KiB")

# %% [markdown]
# The estimator adds the components, each at its largest; the measured peak is the largest *moment* of the step,
# which holds the activations together with the temporaries of the backward pass (the fp32 logits' gradient
# above all), and those grow with the batch too. The phase-aware estimate (`estimate(...).peak_bytes`, the
# largest of its phases) predicts that moment, and it is what `max_batch` searches with:

# %%
peaks = pd.DataFrame([{"batch": b, "measured peak": p,
                       "predicted peak": estimate(model, setup.with_(batch=b, optimizer_impl="for-loop"),
                                                  device_type=ch.device_type).peak_bytes}
                      for b, p in zip(found["batch"], found["peak_bytes"], strict=True)])
peaks["rel_error"] = (peaks["predicted peak"] - peaks["measured peak"]) / peaks["measured peak"]
ch.save_table(peaks, "fit_sweep_peaks")
over = {c: peaks.loc[peaks[c] > card_spec.memory_bytes, "batch"].min() for c in ("measured peak", "predicted peak")}
print(f"first batch over {card_spec.name}: measured {over['measured peak']}, predicted peak {over['predicted peak']}")
mib = ("measured peak", "predicted peak")
peaks.assign(**{c: peaks[c] / MiB for c in mib}, rel_error=peaks["rel_error"].map("{:+.3%}".format)).rename(
    columns={"measured peak": "measured peak (MiB)", "predicted peak": "predicted peak (MiB)",
             "rel_error": "predicted vs measured"}).round({"measured peak (MiB)": 3, "predicted peak (MiB)": 3})

# %% [markdown]
# ## 4. Fragmentation: "reserved but unallocated"
#
# **The allocator's rules.** The CUDA caching allocator takes memory from the driver (`cudaMalloc`) in
# **segments** and cuts them into **blocks**, one per tensor; a freed block stays cached for reuse. Requests are
# rounded up to 512 B; those of at most 1 MiB share 2 MiB segments (the *small pool*), larger ones get 20 MiB
# segments (under 10 MiB) or their own segment rounded up to 2 MiB (the *large pool*). A request takes the
# smallest cached block of its pool that fits, **split** when the rest is worth keeping; blocks of at least
# `max_split_size_mb` are never split. Each CUDA stream has its own pools (a tensor used on a second stream is
# held until `record_stream`'s stream is done). When `cudaMalloc` fails, the allocator first returns every wholly
# free cached segment to the driver and retries; only then it raises `[pytorch-caching-allocator]`
# `[pytorch-cuda-memory]`. `memlab.labs.allocator` applies these rules (the per-stream pools and expandable
# segments named, not modelled). What a request costs:

# %%
sizes = [4, 1000, 600 * KiB, int(1.5 * MiB), 6 * MiB, 12 * MiB + 1, 100 * MiB + 1]
pd.DataFrame({"request": [f"{n:,} B" for n in sizes],
              "block (B)": [f"{allocator.rounded_size(n):,}" for n in sizes],
              "pool": [allocator.pool_of(n) for n in sizes],
              "new segment (MiB)": [allocator.segment_size(n) / MiB for n in sizes]})

# %% [markdown]
# The same rules on a sequence: a 170 MiB budget filled with 6 MiB tensors (three per 20 MiB segment), every other
# one freed, then one 30 MiB request. The holes add up to far more than 30 MiB, but no hole is 30 MiB, no segment is
# wholly free for the retry to return, and the driver has less than 30 MiB left:

# %%
BUDGET, TENSOR, REQUEST = 170 * MiB, 6 * MiB, 30 * MiB
frag_sim = allocator.replay(allocator.interleaved_frees(24, TENSOR, REQUEST), BUDGET)
fig = allocator.draw_segments(frag_sim, title=f"Caching-allocator rules: 24 tensors of {TENSOR / MiB:.0f} MiB, "
                              f"every other freed, then {REQUEST / MiB:.0f} MiB in a {BUDGET / MiB:.0f} MiB budget",
                              source="the caching allocator's documented rules, replayed (not a measurement)")
ch.save_figure(fig, "allocator_fragmentation")
retry_sim = allocator.replay([*allocator.interleaved_frees(24, TENSOR, REQUEST)[:24],
                              ("free", "t0"), ("free", "t1"), ("free", "t2"), ("alloc", "big", REQUEST)], BUDGET)
sim_rows = pd.DataFrame([
    {"case": "every other tensor freed", "request served": frag_sim.oom is None,
     "reserved but unallocated (MiB)": (frag_sim.oom or {}).get("reserved_unallocated_bytes",
                                                                frag_sim.reserved_unallocated_bytes) / MiB,
     "largest cached block (MiB)": (frag_sim.oom or {}).get("largest_free_block_bytes", 0) / MiB,
     "returned to the driver by the retry (MiB)": frag_sim.released_on_retry_bytes / MiB},
    {"case": "three neighbours freed (one whole segment)", "request served": retry_sim.oom is None,
     "reserved but unallocated (MiB)": retry_sim.reserved_unallocated_bytes / MiB,
     "largest cached block (MiB)": 0.0,
     "returned to the driver by the retry (MiB)": retry_sim.released_on_retry_bytes / MiB}])
kind_sim = oom.oom_kind(parse_oom_message(
    f"CUDA out of memory. Tried to allocate {REQUEST / MiB:.2f} MiB. GPU 0 has a total capacity of "
    f"{BUDGET / MiB:.2f} MiB of which {frag_sim.oom['driver_free_bytes'] / MiB:.2f} MiB is free. Of the allocated "
    f"memory {frag_sim.oom['allocated_bytes'] / MiB:.2f} MiB is allocated by PyTorch, and "
    f"{frag_sim.oom['reserved_unallocated_bytes'] / MiB:.2f} MiB is reserved by PyTorch but unallocated."))
display(sim_rows)
display(Markdown(f"the first case as an OOM message, judged by oom_kind: {kind_sim['kind']}. The second request "
                 f"is served "
                 "only because the allocator itself returned the wholly free segment and retried: an "
                 "empty_cache() call "
                 "before it would have changed nothing."))

# %% [markdown]
# `fragmentation_probe` fills a
# capped card with equal blocks, frees every other one and asks for one larger tensor, once with the default
# allocator and once with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, each in a fresh process (a clean
# choice: the allocator reads the variable when CUDA starts, but `torch.cuda.memory._set_allocator_settings` can
# switch expandable segments on or off during a run).

# %%
if not ch.on_cpu:
    frag = pd.DataFrame([fragmentation_probe(2 * GiB, expandable_segments=e) for e in (False, True)])
    ch.save_table(frag.drop(columns="message", errors="ignore"), "fragmentation")
    display(frag.drop(columns="message", errors="ignore"))
else:
    display(ch.cpu_note("a CPU run has no caching allocator: torch's CPU tensors come from malloc and go back "
                        "to it when freed, so there is no 'reserved but unallocated' to measure. The GPU run "
                        "below is shown when the repo has one recorded."))
rec = ch.recorded("01_fragmentation_gpu")
rec  # the GPU run recorded by scripts/gpu_session.sh, where the repo has one (nothing shows otherwise)

# %% [markdown]
# **The full model, on this chapter's step.** `memlab.predict.gpu` models the allocator with everything the small
# picture above leaves out (expandable segments, `max_split_size_mb`, `roundup_power2_divisions`, the garbage
# collection threshold), read from torch 2.13's `CUDACachingAllocator.cpp`. `Trace.replay()` feeds it every
# allocation and free of section 2's step, in order, as the fake-tensor trace saw them. The step is traced at the
# full scale (gpt2, sequence 1024) on any machine: fake tensors hold no memory. Every number below is this model's
# output, not a GPU measurement.

# %%
step_trace = trace_gpt(preset("gpt2"), setup.with_(seq=1024))
by_phase = allocator.phase_table(step_trace.replay())
ch.save_table(by_phase, "allocator_model_phases")
MIB_COLUMNS = {"requested_bytes": "requested (MiB)", "allocated_bytes": "allocated (MiB)",
               "reserved_bytes": "reserved (MiB)", "unused_at_peak_bytes": "unused at peak (MiB)",
               "largest_free_bytes": "largest free (MiB)"}
by_phase.set_index("phase").div(MiB).rename(columns=MIB_COLUMNS).round(0)

# %%
fig, ax = plt.subplots(figsize=(8, 3.6), layout="constrained")
pos = range(len(by_phase))
for k, (col, label) in enumerate([("requested_bytes", "requested: the tensors' bytes"),
                                  ("allocated_bytes", "allocated: their 512 B-rounded blocks"),
                                  ("reserved_bytes", "reserved: segments taken from the driver")]):
    ax.bar([i + (k - 1) * 0.27 for i in pos], by_phase[col] / GiB, 0.27, label=label)
ax.set_xticks(list(pos), by_phase["phase"], rotation=30, ha="right", fontsize=8)
ax.set(ylabel="peak in the phase (GiB)",
       title="gpt2, fp32 + AdamW, batch 4, sequence 1024: requested, allocated and reserved peaks per phase (GiB)\n"
             "a model of the caching allocator (torch 2.13 rules) replayed on the traced step, not a GPU measurement")
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
ch.save_figure(fig, "allocator_model_phases")

# %%
at_peak = step_trace.replay().total
display(Markdown(
    f"At the step's peak the tensors request {at_peak.requested_bytes / GiB:.2f} GiB; rounding to 512 B blocks "
    f"adds {(at_peak.active_bytes - at_peak.requested_bytes) / MiB:.0f} MiB, the segments "
    f"{(at_peak.reserved_at_peak_bytes - at_peak.active_bytes) / MiB:,.0f} MiB more: cached free blocks, the "
    f"largest {at_peak.largest_free_bytes / MiB:.0f} MiB, left by tensors the earlier phases freed. Reserved never "
    "falls, because nothing calls `empty_cache`."))

# %% [markdown]
# **Exercise 3 (predict first).** Run the same step with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`. What
# is its peak reserved, in GiB? The check replays it; the table after it shows all three settings.

# %%
answer = ...
check("01.expandable-reserved", answer, trace=step_trace)

# %% tags=["reveals-01.expandable-reserved"]
settings = allocator.settings_table(step_trace)
ch.save_table(settings, "allocator_model_settings")
settings.set_index("setting").drop(columns="segments").div(MiB).rename(columns=MIB_COLUMNS).round(0).assign(
    **{"segments or pages mapped": settings["segments"].to_numpy()})

# %%
peak_of = settings.set_index("setting")["reserved_bytes"]
base = peak_of["torch's defaults"]
display(Markdown(
    f"Expandable segments change the reserved peak by {(peak_of['expandable_segments:True'] - base) / MiB:+,.0f} "
    f"MiB: one segment per pool grows page by page, so a freed page serves any later request. "
    f"`max_split_size_mb:20` changes it by {(peak_of['max_split_size_mb:20'] - base) / MiB:+,.0f} MiB: blocks of "
    "20 MiB and more are no longer split, so a large cached block cannot serve a smaller request and a new segment "
    "is taken instead. PyTorch documents it as a way to limit fragmentation for runs near the card's capacity "
    "`[pytorch-cuda-memory]`; on this step, which fits, it costs memory."))

# %% [markdown]
# The 24-tensor picture above, through the full model with each setting, on the same 170 MiB budget:

# %%
demo = allocator.demo_on_model(allocator.interleaved_frees(24, TENSOR, REQUEST), BUDGET)
display(demo.assign(**{"reserved (MiB)": demo["reserved_bytes"] / MiB}).drop(columns="reserved_bytes").round(0))
served = demo.loc[demo["served"], "setting"].tolist()
display(Markdown(
    (f"Served only with {', '.join(served)}." if served else f"No setting serves the {REQUEST / MiB:.0f} MiB "
     "request. With expandable segments the large pool maps 20 MiB pages (`large_segment_size_mb`); the freed "
     f"{TENSOR / MiB:.0f} MiB holes leave no page wholly free to unmap, and the driver has too little left for new "
     "pages.")
    + (" The small picture and the full model agree on this pattern" if demo.iloc[0]["served"] == demo.iloc[1]["served"]
       and demo.iloc[0]["reserved_bytes"] == demo.iloc[1]["reserved_bytes"] else
       " The small picture and the full model differ on this pattern")
    + "; the full model adds what each setting does on a real step's sizes."))

# %%
published_01 = ch.published("01")
published_01

# %%
pub = published_01.frame
pub_reserved = pub[pub["what the number is"].str.startswith(KIND_WORDS["reserved"])]
steady = step_trace.replay().total
display(Markdown(
    "Published beside the model: torchtitan's reserved peaks (GPU measurements, labelled published) are "
    + ", ".join(f"{r.published} against memlab's allocated {r.memlab} ({r.residual})"
                for r in pub_reserved.itertuples())
    + ". Part of each residual is the allocator's reserve: on this chapter's step the model reserves "
      f"{100 * (steady.reserved_bytes / steady.requested_bytes - 1):.0f} % above the requested peak. The rest is "
      "named, not fitted: those runs are FSDP2 over 8 GPUs (communication buffers, reduce-scatter outputs) and "
      "some use torch.compile or Float8, none of which this single-GPU eager trace replays."))

# %% [markdown]
# **Is the model of the allocator right? Real GPUs' snapshots.** Others have published allocator snapshots
# (`torch.cuda.memory._snapshot()`) recorded on their GPUs: a fine-tuning course, Stanford CS336 students profiling a
# Transformer LM, a research script. Each history is replayed through memlab's model from the segments the
# allocator already held when recording began; the model must make the segments the GPU made, in the same order,
# and end with the GPU's layout and reserved bytes. Published GPU data, replayed here; `data/published/README.md`
# cites each file at its commit.

# %%
snapshots = pd.DataFrame(snapshot_checks())
snapshots.assign(**{"segments made, GPU / model": [f"{g} / {m}" for g, m in zip(
                        snapshots["gpu_segments_made"], snapshots["model_segments_made"], strict=True)],
                    "same segments, in order": snapshots["segments_match"].map({True: "yes", False: "no"}),
                    "same final layout": snapshots["layout_match"].map({True: "yes", False: "no"}),
                    "reserved at the end, GPU (MiB)": snapshots["gpu_reserved_bytes"] / MiB,
                    "model (MiB)": snapshots["model_reserved_bytes"] / MiB,
                    "model vs GPU (%)": 100 * snapshots["reserved_error"],
                    "frees of blocks from before the history": snapshots["unplaced_frees"]})[
    ["snapshot", "events", "segments made, GPU / model", "same segments, in order", "same final layout",
     "reserved at the end, GPU (MiB)", "model (MiB)", "model vs GPU (%)",
     "frees of blocks from before the history"]].round(2)

# %%
exact = snapshots[snapshots["segments_match"] & snapshots["layout_match"]]
misses = snapshots.drop(exact.index)
unplaced = misses[misses["unplaced_frees"] > 0]
unexplained = misses[misses["unplaced_frees"] == 0]
display(Markdown(
    f"In {len(exact)} of {len(snapshots)} published snapshots the model makes the GPU's segments in order and ends "
    "with its layout and reserved bytes exactly."
    + (f" {len(misses)} miss, by at most {100 * misses['reserved_error'].abs().max():.2f} % of the reserved bytes."
       if len(misses) else "")
    + (f" In {', '.join(unplaced['snapshot'])} the history frees blocks allocated before it began "
       f"({', '.join(f'{n:,}' for n in unplaced['unplaced_frees'])}), whose places the snapshot does not record, so "
       "the model cannot start where the GPU started." if len(unplaced) else "")
    + (f" In {', '.join(unexplained['snapshot'])} the start is recorded whole and the model still differs from the "
       "GPU's segment number " + ", ".join(str(int(i) + 1) for i in unexplained["first_difference"])
       + ": the snapshot names no torch version or allocator settings, and the cause is not found." if len(unexplained)
       else "")))

# %% [markdown]
# **Got an OOM? Read these, in this order.** The message (section 1), then `torch.cuda.memory_stats()` at the
# failure (an `except torch.OutOfMemoryError` block), whose keys end in `.all.current` / `.all.peak`:
#
# 1. *Tried to allocate* against *free + reserved but unallocated*: above it, the request is too big for any
#    layout (`oom_kind` "too big"): shrink it or free tensors.
# 2. `allocated_bytes` (live tensors) against your estimate's peak (`estimate(...).peak_bytes`): a surplus that grows
#    per iteration is a leak (section 6).
# 3. `reserved_bytes - allocated_bytes` and `inactive_split_bytes` (cached pieces of split blocks): large while the
#    request is under them is fragmentation: `expandable_segments:True`, or `max_split_size_mb`.
# 4. `num_alloc_retries` and `num_ooms`: retries mean the free-and-retry path already ran (each a full
#    `cudaFree` sweep, slow); `max_memory_reserved()` against the capacity says how close the cache came.
# 5. *In use by this process* minus reserved: the CUDA context, NCCL buffers, libraries outside the allocator.
#    `PYTORCH_NO_CUDA_MEMORY_CACHING=1` turns the cache off to debug (slow: every free is a `cudaFree`).
#
# **Catch the next one.** Turn on the allocator's history before the step
# (`torch.cuda.memory._record_memory_history(max_entries=100_000)`) and, in the `except torch.OutOfMemoryError`
# block, write it out with `torch.cuda.memory._dump_snapshot("oom.pickle")`: the file opens at
# https://pytorch.org/memory_viz, whose *Active Memory Timeline* shows which tensors filled the card and whose
# *Allocator State History* shows the segments and their holes (section 5). `torch.cuda.memory_summary()` prints the
# same statistics as a text table. Two more `PYTORCH_CUDA_ALLOC_CONF` settings act on the cache
# `[pytorch-cuda-memory]`: `garbage_collection_threshold:0.6` starts returning unused cached blocks once usage
# passes that fraction of the memory allowed, instead of only at a failed `cudaMalloc`, and
# `roundup_power2_divisions:4` rounds requests to a few sizes between powers of two, so a freed block fits a later
# request more often.
#
# Paste your own message between the quotes and run the cell: the decoder and `oom_kind` read it.

# %%
your_message = ""  # paste "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ..." here
if your_message.strip():
    yours = parse_oom_message(your_message)
    display(pd.DataFrame(decode_oom(yours)), pd.Series(oom.oom_kind(yours)).to_frame("your OOM"))
else:
    print("No message pasted: the decoder would read any of section 1's shapes.")

# %% [markdown]
# ## 5. Memory snapshots
#
# On CUDA, `memlab.measure.cuda.record_memory_history` wraps `torch.cuda.memory._record_memory_history` and
# `_dump_snapshot`: the pickle it writes opens at https://pytorch.org/memory_viz, and
# `memlab.measure.snapshot.snapshot_timeline` draws it offline, stacked by the phase that allocated each block.
# `torch.profiler.profile(profile_memory=True)` (seed 004's suggestion) records per-op allocations too, but
# without the allocator's segments. On a CPU, section 2's figure is the same picture from the live-tensor counter.

# %%
if not ch.on_cpu:
    with record_memory_history(ch.out_dir / "step_snapshot.pickle") as snap_path:
        run_step(model, setup, ch.device, steps=1, with_counted_flops=False, with_mfu=False)
    tl = snapshot_timeline(snap_path)
    cats = [c for c in ("forward", "backward", "optimizer", "other") if c in tl.columns]
    fig = plots.live_stacked(tl.set_index("event")[cats], title=f"{model.name}: CUDA allocator snapshot",
                             source=f"{snap_path.name} (open it at pytorch.org/memory_viz)")
    ch.save_figure(fig, "cuda_snapshot")
    plt.show()
else:
    display(ch.cpu_note("a snapshot records the CUDA allocator; there is none here. The cell below replays this "
                        "step's own requests through the allocator's rules instead (section 4), a computed picture, "
                        "not a snapshot."))
    snap_model, snap_step = build_training(model, setup, ch.device, seed=seed)
    snap_idx, snap_tgt = token_batch(model.vocab_size, setup.batch, setup.seq, ch.device, seed)
    params_alloc = [("alloc", f"param {i}", p.untyped_storage().nbytes())
                    for i, p in enumerate(snap_model.parameters())]
    requests = params_alloc + allocator.record_allocations(
        lambda: [train_step(snap_step, lambda: snap_model(snap_idx, snap_tgt), label=i) for i in (1, 2)])
    replayed = allocator.replay(requests, 2**40)
    alloc_b, reserved_b = zip(*replayed.timeline, strict=True)
    fig, ax = plt.subplots(figsize=(8, 3.6), layout="constrained")
    ax.plot(range(len(alloc_b)), [b / MiB for b in alloc_b], label="allocated (blocks, 512 B rounding)")
    ax.plot(range(len(reserved_b)), [b / MiB for b in reserved_b], label="reserved (segments)")
    ax.plot(range(len(alloc_b)), [(r - a) / MiB for a, r in replayed.timeline], ":",
            label="reserved but unallocated")
    ax.set(xlabel="allocation or free event (two training steps)", ylabel="MiB",
           title=f"{model.name}, fp32 + AdamW, b={setup.batch}: this step's requests replayed through the caching "
                 "allocator's rules\n(computed from the rules on a CPU run, not a CUDA snapshot)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    ch.save_figure(fig, "allocator_replay_of_the_step")
    top = max(range(len(alloc_b)), key=alloc_b.__getitem__)
    display(Markdown(f"{len(requests):,} requests and frees; at the allocated peak {alloc_b[top] / MiB:.2f} MiB "
                     f"the rules "
                     f"reserve {reserved_b[top] / MiB:.2f} MiB ({(reserved_b[top] - alloc_b[top]) / MiB:.2f} "
                     f"MiB cached, "
                     f"unused); {len(replayed.segments)} segments at the end, "
                     f"{sum(seg['pool'] == 'small' for seg in replayed.segments)} of them in the small pool"))

# %% [markdown]
# ## 6. The troubleshooting row, measured
#
# Four loops over the reference GPT (`memlab.labs.oom`), each as the bug and as the fix, with the live tensor
# bytes above the weights at the end of every iteration:
#
# - **keep-loss**: a training loop that keeps `loss` instead of `loss.item()` for logging;
# - **eval-grad**: evaluation without `torch.no_grad()`, summing the loss tensor;
# - **cycle**: an exception kept in a local variable, a reference cycle freed only by the garbage collector
#   (here every 4 iterations);
# - **empty-cache**: the eval-grad leak with `torch.cuda.empty_cache()` after every iteration (on CUDA only: a CPU
#   has no cache, so on a CPU this panel *is* the eval-grad loop run again).

# %%
loops = pd.concat([oom.leak_loop(c, fixed=f, iters=SIZES["leak_iters"], device=ch.device, seed=seed)
                   for c in oom.CASES for f in (False, True)], ignore_index=True)
growth = (loops.groupby(["case", "fixed"], sort=False)
          .apply(lambda d: pd.Series({"bytes per iteration": oom.growth_per_iteration(d),
                                      "largest held": d["bytes_above_weights"].max()}), include_groups=False)
          .reset_index())
ch.save_table(loops, "leak_loops")
ch.save_table(growth, "leak_growth")
growth.round(1)

# %%
fig, axes = plt.subplots(2, (len(oom.CASES) + 1) // 2, figsize=(9, 6.4), layout="constrained", sharey=False)
for ax, case in zip(axes.flat, oom.CASES, strict=True):
    for fixed, style in ((False, "-o"), (True, "--s")):
        d = loops[(loops["case"] == case) & (loops["fixed"] == fixed)]
        ax.plot(d["iteration"], d["bytes_above_weights"] / KiB, style, ms=3, label="fixed" if fixed else "bug")
    ax.set(title=case + (" (= eval-grad on a CPU)" if case == "empty-cache" and ch.on_cpu else ""),
           xlabel="iteration", ylabel="live bytes above\nthe weights (KiB)")
    ax.legend(fontsize=9, loc="upper left")
fig.suptitle(f"Seed 004's OOM row as loops over {model.name}: live tensor bytes per iteration, measured on "
             f"the {ch.device_type.upper()}", fontsize=11)
ch.save_figure(fig, "leak_loops")

# %% [markdown]
# What the numbers say, row by row. Keeping `loss` after `backward` leaks only the scalar's storage per iteration
# (the table's bytes): `backward` frees the graph's saved
# tensors (its nodes stay, in host memory). The same habit in an evaluation loop without `no_grad` keeps every
# batch's whole graph, activations included: the real leak. The reference cycle is a sawtooth that only `gc`
# resets: its slope over whole periods is about zero, but it holds several iterations' tensors at its top, enough
# to tip a full card. `empty_cache` cannot change the live bytes: it returns *unallocated* cached segments to the
# driver, so `nvidia-smi` shows less while the tensors that fill the card stay. It does not treat the OOM symptom
# either: before raising on a PyTorch request, the allocator returns those segments itself and retries (section 4's
# second case). What it does do is give cached memory back to everything *outside* the allocator: other processes,
# and allocations in this process that bypass it (section 1: NCCL's communicator buffers, created at the first
# collective, and any library calling `cudaMalloc` itself), which fail while PyTorch's cache holds the memory. Each
# call costs a synchronising `cudaFree`.

# %% [markdown]
# ## 7. Seed 004's 7B budget, checked
#
# "7B × 2 bytes = 14 GB parameters, ≈ 14 GB gradients, 7B × 4 × 2 = 56 GB Adam: 84 GB." Llama-2-7B
# `[touvron2023]` has 6.74 B parameters, and fp16 mixed precision also keeps an fp32 master copy
# `[micikevicius2018]`:

# %%
llama = preset("llama-2-7b")
b7 = estimate(llama, Setup(batch=1, seq=512, precision="mixed-bf16", optimizer="adamw"))
n7 = llama.param_count()
seven = pd.DataFrame({
    "seed 004 (GB)": {"params": 14, "grads": 14, "optimizer (moments + master)": 56},
    "memlab (GB)": {"params": b7.params_bytes / 1e9, "grads": b7.grads_bytes / 1e9,
                    "optimizer (moments + master)": b7.optimizer_bytes / 1e9},
})
seven.loc["total"] = seven.sum()
seven["memlab (GiB)"] = seven["memlab (GB)"] * GB / GiB
print(f"{n7 / 1e9:.2f} B parameters; master copy {b7.optimizer_detail.get('master', 0) / 1e9:.1f} GB")
seven.round(1)

# %% [markdown]
# The seed forgets the 4-byte master copy: 16 B/param, 108 GB (100 GiB) for 6.74 B parameters, not 84.

# %% [markdown]
# ## Seed claims, answered

# %%
eval_leak = growth.query("case == 'eval-grad' and not fixed")["bytes per iteration"].item()
keep_leak = growth.query("case == 'keep-loss' and not fixed")["bytes per iteration"].item()
ch.seed_claims([
    {"#": 3, "claim": "U_eff = (P + G + O + A) / allocated [seed-000]", "verdict": "holds with a qualification",
     "number": f"{u_sum:.2f} with each component at its own largest; at the step-2 peak P + O + A = {u_peak:.2f}"
               + (", no gradient yet" if no_grad_yet else "")
               + f"; the other {1 - u_peak:.2f} is backward's {n_logits} logits-sized fp32 tensor(s)"},
    {"#": 13, "claim": "nvidia-smi ≠ effective use; active vs reserved [seed-000]", "verdict": "holds",
     "number": f"decoded message: {(info.process_in_use_bytes - info.allocated_by_pytorch_bytes) / GiB:.2f} GiB "
               "in use by the process but in no tensor"},
    {"#": 30, "claim": "the OOM text is 'Tried to allocate 2.00 GiB' [seed-004]",
     "verdict": "holds with a qualification",
     "number": f"today's message states {int(shapes['fields stated'].max())} fields; the request alone misleads"},
    {"#": 32, "claim": "7B: 14 + 14 + 56 = 84 GB [seed-004]", "verdict": "does not hold",
     "number": f"{seven.loc['total', 'memlab (GB)']:.1f} GB for {n7 / 1e9:.2f} B parameters (fp32 master omitted)"},
    {"#": 41, "claim": "torch.profiler profile_memory, Nsight [seed-004]", "verdict": "holds (tools exist)",
     "number": "the allocator snapshot (section 5) is the finer tool; CUDA only"},
    {"#": 44, "claim": "OOM row: batch, leak, no_grad, empty_cache treats symptoms [seed-004]",
     "verdict": "holds for batch, leak and no_grad; empty_cache cannot prevent an OOM on a PyTorch request",
     "number": f"eval without no_grad leaks {eval_leak / KiB:.0f} KiB/iteration; a kept loss after backward "
               f"{keep_leak:.0f} B of tensor per iteration; empty_cache frees no live byte, and the allocator's own "
               "retry already frees what it would for a PyTorch request; it helps only allocations outside the "
               "allocator (other processes, NCCL, cudaMalloc callers) (allocator rules, section 4; not measured on "
               "this CPU)"},
    {"#": 48, "claim": "priority: algorithm > system > distributed > offload [seed-004]",
     "verdict": "an opinion, not a measurable claim", "number": "—"},
])

# %% [markdown]
# ## Exercises
#
# (Exercises 1, 2 and 3 are in sections 1, 3 and 4.)
#
# **Exercise 4.** Which field of an OOM message measures the allocator's cache, the candidate for fragmentation (as
# opposed to a too-large workload)? Answer with the option's letter.

# %%
answer = ...
check("01.fragmentation-field", answer)

# %% [markdown]
# **Exercise 5.** Section 6's keep-loss loop (the bug: `losses.append(loss)` after `backward`) runs for 1,000
# iterations on a GPU. By how many bytes has `torch.cuda.memory_allocated()` grown from the kept losses at the end?

# %%
answer = ...
check("01.kept-losses-cuda", answer, table=growth, iterations=1000)

# %% [markdown]
# ## Summary
#
# - An OOM message states the request, capacity, free memory, this process's total, the live tensors and the
#   allocator's unused reserve; each points to a different fix.
# - Optimizer state appears during the first `optimizer.step()`: step 2's peak is higher than step 1's.
# - The largest batch that fits is decided by the step's peak moment, not by the sum of components.
# - A large "reserved but unallocated" is fragmentation only when the request is at most free + reserved but
#   unallocated; above that no layout fits it (the `fragmented-2.5` message is such a too-big request).
#   `expandable_segments:True` is the fix to try for real fragmentation.
# - Replayed on the chapter's own step, the allocator model (torch 2.13 rules; a model, not a GPU measurement) splits
#   the gap between the tensors and nvidia-smi into rounding (small), cached free blocks (most of it) and what each
#   `PYTORCH_CUDA_ALLOC_CONF` setting changes: expandable segments shrink the reserve, a small `max_split_size_mb`
#   grows it on a step that fits.
# - The allocator rounds every request up to 512 B, packs small ones into 2 MiB segments, and frees its wholly
#   unused cache and retries before any OOM: `empty_cache` cannot prevent one.
# - Leaks are bytes that grow per iteration: eval without `no_grad` keeps whole graphs; a kept `loss` after
#   backward only a scalar (512 B each on CUDA); cycles wait for `gc`; `empty_cache` frees no live tensor.
# - Seed 004's 7B budget omits the fp32 master: 108 GB, not 84.

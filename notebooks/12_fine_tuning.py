# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 12 · Fine-tune on your card: full, LoRA and QLoRA
#
# **The common belief.** Seed article 004 `[seed-004]`:
# "今天想要在单卡上微调一个70亿参数的LLaMA模型24GB显存都显得捉襟见肘"
# (*today, fine-tuning a 7-billion-parameter LLaMA on one card, even 24 GB looks tight*). Most people who ask
# "will it fit?" are not pre-training: they fine-tune a published model on one card, and what they switch on is
# LoRA `[hu2021]` (train two small matrices per adapted Linear, freeze the rest) or QLoRA `[dettmers2023]` (the same
# adapters on a 4-bit base).
#
# This chapter answers it with the libraries people use:
#
# 1. the formula: full fine-tuning, LoRA and QLoRA of Llama-2-7B on a 24 GB card, component by component and
#    phase by phase (`memlab.predict.memory.finetune`), and what to switch on to fit, ranked by the peak
#    (`memlab.predict.fit`);
# 2. the trace: the real Hugging Face Llama-2-7B wrapped by peft `[peft]`, at full size, on fake tensors;
# 3. the measurement: small peft models of three families (LoRA, and QLoRA with bitsandbytes' NF4) trained one step
#    on this machine, every saved tensor counted, beside the prediction;
# 4. what a frozen base still saves, and the misreading it explains;
# 5. the public calculators on the same runs.

# %% tags=["parameters"]
scale = "auto"
device = "auto"
seed = 0
out_dir = "../reports/build/12_fine_tuning"

# %%
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Markdown, display

from memlab import Setup, chapter, check, estimate, fits, from_hf, gpu, load_config, trace_hf
from memlab.predict.fit import BORDERLINE_SHARE, levers, plan_to_fit
from memlab.predict.memory.finetune import adapter_elements, qlora_base_bytes
from memlab.run.hf import predict_hf, run_hf
from memlab.studies import calculators
from memlab.units import GiB, MiB

ch = chapter(scale, device, seed, out_dir, ci_threads=1)  # tiny models: more threads only add contention
# seq: the 7B question's sequence; traced_seq, traced_layers: the trace's sequence and blocks (ci: the 7B's full
# width, 8 of its 32 blocks; full: all of it); tiny: the families measured with peft, at batch x tiny_seq tokens;
# fsdp_seq, fsdp_layers: the LoRA-under-FSDP traces (ci: 2 blocks at the 7B's width)
SIZES = {"ci": dict(seq=2048, traced_seq=256, traced_layers=8, tiny=("llama", "qwen2", "gpt2"), batch=2,
                    tiny_seq=24, fsdp_seq=128, fsdp_layers=2),
         "full": dict(seq=2048, traced_seq=2048, traced_layers=32,
                      tiny=("llama", "qwen2", "mistral", "gpt2", "stablelm"), batch=2, tiny_seq=64, fsdp_seq=2048,
                      fsdp_layers=32)}[ch.scale]
ON_DEVICE = {  # the card asked about, and the device type its prediction and trace are for
    "cpu": dict(card="rtx-4090", device_type="cuda"),
    "cuda": dict(card="rtx-4090", device_type="cuda"),
}[ch.device_type]
ch

# %% [markdown]
# ## 1. The formula: three ways to fine-tune a 7B model
#
# A LoRA adapter on a Linear `W` (in → out) adds `A` (r × in) and `B` (out × r) and computes
# `W x + (α/r) · B A x`; only `A` and `B` train `[hu2021]`. So the base keeps its weights and nothing else: no
# gradients, no optimizer state. peft keeps the adapters in fp32 even over a bf16 base (its default
# `autocast_adapter_dtype=True`), so their gradients and Adam moments are fp32 too `[peft]`. QLoRA stores the
# base's block matrices in NF4: 4 bits a weight, one absmax per 64 weights, itself quantised to 8 bits with one
# fp32 constant per 256 absmax values (double quantisation) `[dettmers2023]` `[bitsandbytes]`.
#
# The setups below are what a user runs: full fine-tuning with bf16 weights and an fp32 master copy (ZeRO's
# 16 B/param `[rajbhandari2019]`), the cheap alternative of freezing the embeddings and most blocks (bf16, the top ones
# trained in full), LoRA rank 16 on peft's default targets (q and v), and QLoRA rank 16 on every linear layer, as
# the QLoRA paper places its adapters (it uses rank 64 `[dettmers2023]`); batch 1, fused attention.

# %%
cfg7 = from_hf(load_config("llama-2-7b", "full"))
card = gpu(ON_DEVICE["card"])
dt = ON_DEVICE["device_type"]
ALL = "q,k,v,o,gate,up,down"
plans = {
    "full (mixed-bf16)": Setup(seq=SIZES["seq"], precision="mixed-bf16", attention="flash"),
    "frozen bottom 24 of 32 (bf16)": Setup(seq=SIZES["seq"], precision="bf16", attention="flash", finetune="frozen",
                                           frozen_layers=24),
    "LoRA r=16 on q,v": Setup(seq=SIZES["seq"], precision="bf16", attention="flash", finetune="lora",
                              lora_rank=16),
    "LoRA r=16 on all": Setup(seq=SIZES["seq"], precision="bf16", attention="flash", finetune="lora",
                              lora_rank=16, lora_targets=ALL),
    "QLoRA r=16 on all": Setup(seq=SIZES["seq"], precision="bf16", attention="flash", finetune="qlora",
                               lora_rank=16, lora_targets=ALL),
}
est = {name: estimate(cfg7, s, device_type=dt) for name, s in plans.items()}
table = pd.DataFrame([{"setup": name, **{f"{k} (GiB)": v / GiB for k, v in e.components().items()},
                       "peak (GiB)": e.peak_gib, "peak phase": f"{e.peak_step} {e.peak_phase}",
                       f"on the {card.name}": fits(e, card).margin()} for name, e in est.items()])
ch.save_table(table, "llama7b_finetune_plans")
table.round(2)

# %%
fig, ax = plt.subplots(figsize=(9, 4.5), layout="constrained")
bottom = [0.0] * len(est)
for comp in ("params", "grads", "optimizer", "activations", "overhead"):
    vals = [e.components()[comp] / GiB for e in est.values()]
    words = {"params": "parameters", "grads": "gradients", "optimizer": "optimizer states"}
    ax.bar(list(est), vals, bottom=bottom, label=words.get(comp, comp))
    bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
ax.scatter(list(est), [e.peak_gib for e in est.values()], marker="D", color="black", zorder=3,
           label="peak over the step's phases")
ax.axhline(card.memory_bytes / GiB, color="red", ls="--", label=f"{card.name}: {card.memory_bytes / GiB:.0f} GiB")
ax.set(ylabel="bytes on the device (GiB)",
       title=f"Llama-2-7B fine-tuned at batch 1, seq {SIZES['seq']}: components (bars) and peak (diamonds), "
             "predicted by memlab's estimator")
ax.tick_params(axis="x", labelsize=8)
ax.legend(fontsize=7, loc="upper right")
ch.save_figure(fig, "llama7b_finetune_components")

# %%
full, lora, qlora = est["full (mixed-bf16)"], est["LoRA r=16 on q,v"], est["QLoRA r=16 on all"]
n_ad = adapter_elements(cfg7, 16, ("q", "v"))
base_q, quantised = qlora_base_bytes(cfg7)
print(f"LoRA r=16 on q,v trains {n_ad:,} of {cfg7.param_count():,} weights "
      f"({n_ad / cfg7.param_count():.2%}); its states: {lora.model_state_bytes() / GiB:.2f} GiB against full "
      f"fine-tuning's {full.model_state_bytes() / GiB:.1f} GiB.")
print(f"QLoRA's base: {quantised:,} weights in NF4 (4 bits each plus the quantisation constants of exercise 3), "
      f"the rest in bf16: {base_q / GiB:.2f} GiB against {lora.params_bytes / GiB:.2f} GiB for the bf16 base.")
for name, e in est.items():
    v = fits(e, card)
    print(f"{name}: peak {e.peak_gib:.1f} GiB in the {e.peak_step} {e.peak_phase}: "
          f"{v.margin()} on the {card.memory_bytes / GiB:.0f} GiB {card.name} (device-used "
          f"{v.device.device_low_bytes / GiB:.1f} to {v.device.device_high_bytes / GiB:.1f} GiB; the tensors' "
          f"headroom {v.headroom_bytes / GiB:+.1f} GiB)")
print(f"device-used adds to the peak the CUDA context, cuBLAS workspaces and the caching allocator's reserve (from 0 "
      f"to the bound memlab derives from its rules); borderline: that range straddles the card, or its high end is "
      f"above {BORDERLINE_SHARE:.0%} of it (seed 000's empirical line for training memory): the allocator, which no "
      "CPU run measures, decides it (memlab trace --gpu replays it on the traced step)")

# %% [markdown]
# What is predicted only: **the CUDA kernel's dequantised copy and where paged optimizers' states live**. QLoRA
# itself is traced:
# bitsandbytes registers fake kernels for its 4-bit ops, so `trace_hf` quantises a fake base to NF4 with
# bitsandbytes' own `quantize_4bit` (`memlab.model.hf.fake_params4bit`) and traces the step; a test asserts the fake
# trace equals the real CPU one phase by phase, and `python benchmarks/qlora_trace.py` traces the full 7B (too slow
# for this page). The dequantised bf16 copy of one weight that CUDA's `gemm_4bit` makes inside its kernel (the
# named overhead `qlora_dequantised_weight`) and paged optimizers' managed memory (section 1b) are seen by no CPU
# trace, which books a paged optimizer's states apart as the estimate does: they come from the QLoRA paper and the
# bitsandbytes code. At small sizes QLoRA is measured (section 3): bitsandbytes
# quantises and runs NF4 on a CPU. A GPU-marked test (`tests/predict/memory/test_finetune.py`) checks the stored NF4
# bytes on a CUDA device.

# %% [markdown]
# **What to switch on, ranked.** Start from full fine-tuning (mixed-bf16) and switch on each lever of
# `memlab.predict.fit.LEVERS` alone: recompute, kernels, precision, the loss options, offload, sharding, and the
# fine-tuning ones (LoRA, QLoRA, frozen blocks, 8-bit AdamW). `levers()` ranks them by the **peak** each gives,
# the most a step holds at once over its phases (never the sum of components), plus what the device adds
# (device-used), each with its cost; `plan_to_fit()` adds the best one at a time until the step fits the card for
# certain.

# %%
ranked = levers(cfg7, plans["full (mixed-bf16)"], card, world_size=8)
lever_table = pd.DataFrame([{"lever": r.name, "peak (GiB)": r.peak_bytes / GiB, "peak phase": r.peak_phase,
                             "device-used (GiB)": f"{r.device_low_bytes / GiB:.1f}-{r.device_bytes / GiB:.1f}",
                             f"on the {card.name}": r.word(), "extra TFLOP/step": r.extra_flops / 1e12,
                             "host (GiB)": r.host_bytes / GiB, "cost": r.cost} for r in ranked])
ch.save_table(lever_table, "llama7b_levers")
chosen, fitted, fitted_peak = plan_to_fit(cfg7, plans["full (mixed-bf16)"], card, world_size=8)
fitted_verdict = fits(estimate(cfg7, fitted), card)
print(f"full fine-tuning peaks at {full.peak_gib:.1f} GiB; {sum(r.fits for r in ranked)} of {len(ranked)} levers "
      f"fit the {card.memory_bytes / GiB:.0f} GiB {card.name} alone for certain, "
      f"{sum(r.may_fit and not r.fits for r in ranked)} more if the allocator's reserve stays small; to fit, switch "
      f"on: {' + '.join(chosen) or 'nothing'} -> peak {fitted_peak / GiB:.2f} GiB, device-used up to "
      f"{fitted_verdict.used_bytes / GiB:.2f} GiB ({'fits' if fitted_verdict.fits else 'still does not fit'})")
lever_table.round(2)

# %%
fig, ax = plt.subplots(figsize=(9, 4.5), layout="constrained")
shade = {"fits": "tab:green", "reserve decides": "tab:orange", "does not fit": "tab:gray"}
ax.barh(lever_table["lever"], lever_table["peak (GiB)"], color=[shade[w] for w in lever_table[f"on the {card.name}"]])
ax.axvline(full.peak_gib, color="black", ls=":", label=f"full fine-tuning (mixed-bf16): {full.peak_gib:.1f} GiB")
ax.axvline(card.memory_bytes / GiB, color="red", ls="--", label=f"{card.name}: {card.memory_bytes / GiB:.0f} GiB")
ax.invert_yaxis()
ax.tick_params(axis="y", labelsize=7)
ax.set(xlabel="predicted tensor peak (GiB)", title=f"Llama-2-7B, batch 1, seq {SIZES['seq']}: each lever alone, "
       "ranked by device-used\n(green: fits for certain; orange: the allocator's reserve decides; grey: does not fit)")
ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
ch.save_figure(fig, "llama7b_levers")

# %% [markdown]
# ## 1b. The recipe people run
#
# The setups above are the formula's clean cases. What users launch is a recipe: peft's `LoraConfig(r=16,
# target_modules="all-linear")` on a 4-bit base, **gradient checkpointing** switched on (the HF Trainer's
# `gradient_checkpointing=True`, TRL's SFT scripts, Axolotl, torchtune and LitGPT all do), **gradient accumulation**
# to reach the batch they want, bf16, and whatever attention transformers picks. memlab takes the recipe as written:
# `lora_targets` in peft's spelling, `recompute="full"` as transformers checkpoints (every decoder layer,
# non-reentrant), `grad_accum_steps`, and `attention="auto"`, the kernel the libraries run:
# transformers' default `sdpa`, dispatched by torch to flash on the 4090 (sm89) for bf16 without a mask
# (`memlab.predict.spec.kernels`, checked against torch's own dispatch). The first line of each answer says which.

# %%
from memlab.predict.fit import max_batch
from memlab.predict.spec.kernels import resolved

recipe = Setup(seq=SIZES["seq"], precision="bf16", finetune="qlora", lora_rank=16, lora_targets="all-linear",
               recompute="full", grad_accum_steps=4, attention="auto")
recipes = {"QLoRA r=16 all-linear, checkpointing, accumulation 4": recipe,
           "the same without checkpointing": recipe.with_(recompute="none"),
           "the same under eager attention": recipe.with_(attention="eager"),
           "LoRA r=16 q_proj,v_proj, checkpointing, accumulation 4": recipe.with_(finetune="lora",
                                                                                  lora_targets="q_proj,v_proj")}
rows = []
for name, setup in recipes.items():
    setup, why = resolved(cfg7, setup, device_type=dt, gpu=card.key)
    e = estimate(cfg7, setup, device_type=dt)
    rows.append({"recipe": name, "attention": setup.attention, "peak at batch 1 (GiB)": e.peak_gib,
                 "peak phase": f"{e.peak_step} {e.peak_phase}",
                 f"largest batch on the {card.name}, for certain": max_batch(cfg7, setup, card.key).value,
                 "may fit up to": max_batch(cfg7, setup, card.key).up_to})
recipe_table = pd.DataFrame(rows)
ch.save_table(recipe_table, "llama7b_recipes")
print(resolved(cfg7, recipe, device_type=dt, gpu=card.key)[1])
recipe_table.round(2)

# %% [markdown]
# Checkpointing is what makes the recipe roomy: each block keeps only its input, and one block at a time is
# recomputed in backward, so the batch can grow several-fold. Without it the adapters' fp32 input copies and the
# frozen base's activations of every block stay until backward. The peaks are live tensors; the largest-batch
# columns add what a real card adds (the CUDA context, cuBLAS workspaces, and the caching allocator's reserve from
# none to its bound): the batch that fits for certain, and the batch above which nothing fits.
#
# **The recipe as QLoRA scripts write it.** Many scripts call peft's `prepare_model_for_kbit_training(model)` before
# `get_peft_model` `[peft]`. It does two things the table above leaves out:
#
# - it casts every 16-bit parameter that is not a 4-bit weight (embeddings, norms, LM head) to fp32;
# - it switches checkpointing on with empty arguments, which transformers passes on as they are, and torch 2.13's
#   `checkpoint` reads a missing `use_reentrant` as **reentrant** (with a warning). A later
#   `Trainer(gradient_checkpointing=True)` switches it back to non-reentrant: the last call wins.
#
# memlab names the two effects `kbit_prepare=True` and `checkpoint_reentrant=True`. The formula refuses both and the
# trace answers: transformers' code, quantised by bitsandbytes' own `quantize_4bit` on fake tensors, wrapped by peft
# (two of the 7B's blocks at its full width at ci scale, all 32 at full scale).

# %%
prep_cfg = {**load_config("llama-2-7b", "full"), "num_hidden_layers": SIZES["fsdp_layers"]}
prep_base = Setup(seq=SIZES["fsdp_seq"], precision="bf16", attention="flash", finetune="qlora", lora_rank=16,
                  lora_targets="all-linear", recompute="full")
prep_setups = {"Trainer(gradient_checkpointing=True)": prep_base,
               "prepare_model_for_kbit_training, then the Trainer's checkpointing": prep_base.with_(kbit_prepare=True),
               "prepare_model_for_kbit_training alone (reentrant)": prep_base.with_(kbit_prepare=True,
                                                                                   checkpoint_reentrant=True)}
prep = {name: trace_hf(prep_cfg, s, device_type=dt) for name, s in prep_setups.items()}
prep_table = pd.DataFrame([{"QLoRA r=16 all-linear, checkpointed by": name, "peak (GiB)": t.peak_bytes / GiB,
                            "parameters (GiB)": t.components()["params"] / GiB,
                            "peak phase": f"{t.peak_step} {t.peak_phase}"} for name, t in prep.items()])
ch.save_table(prep_table, "qlora_kbit_prepare_trace")
plain_t, cast_t, reentrant_t = prep.values()
print(f"{SIZES['fsdp_layers']} blocks at the 7B's width, seq {SIZES['fsdp_seq']}: the fp32 casts add "
      f"{(cast_t.components()['params'] - plain_t.components()['params']) / GiB:.2f} GiB of parameters "
      f"(embedding and head, {prep_cfg['vocab_size']:,} x {prep_cfg['hidden_size']:,} each, from 2 to 4 bytes, "
      "whatever the depth); reentrant checkpointing "
      f"adds {(reentrant_t.peak_bytes - cast_t.peak_bytes) / MiB:.1f} MiB at the backward peak (each block's output, "
      "recomputed whole and held through the block's inner backward)")
prep_table.round(3)

# %% [markdown]
# **On a card without bf16.** A T4 (sm75) has no bf16 units, so the recipe there computes the 4-bit layers in fp16
# (`bnb_4bit_compute_dtype=torch.float16`) under fp16 autocast and a `GradScaler` (`Trainer(fp16=True)`):
# memlab's `precision="amp-fp16"`. Flash attention needs sm80, so torch dispatches SDPA to the memory-efficient
# kernel. memlab's `amp-fp16` loads the model in fp32, so the embedding, norms and head take 4 bytes a parameter; a
# script that loads it with `torch_dtype=torch.float16` keeps them at 2 bytes, a setup neither the formula nor the
# trace models yet (the estimate says so).

# %%
t4 = gpu("t4")
t4_recipe, t4_why = resolved(cfg7, recipe.with_(precision="amp-fp16"), device_type=dt, gpu=t4.key)
t4_est = estimate(cfg7, t4_recipe, device_type=dt)
print(t4_why)
print(f"QLoRA recipe on the {t4.memory_bytes / GiB:.0f} GiB {t4.name}: peak {t4_est.peak_gib:.2f} GiB at batch 1 "
      f"({t4_est.peak_step} {t4_est.peak_phase}); largest micro-batch that fits on device-used: "
      f"{max_batch(cfg7, t4_recipe, t4.key).words()}")

# %% [markdown]
# **Paged optimizers.** The QLoRA paper's script trains with `paged_adamw_32bit` `[dettmers2023]`: bitsandbytes
# keeps the Adam states of every tensor of at least 100,000 elements in CUDA managed memory (`cudaMallocManaged`),
# which torch's caching allocator never sees `[bitsandbytes]`. They are on the device while there is room and move to
# host RAM under pressure, so they count on nvidia-smi but not in `torch.cuda.memory_allocated()`, and they never
# cause torch's out-of-memory error. memlab reports them apart (`paged_bytes`), outside every phase and the peak.

# %%
paged_rows = []
for rank in (16, 64):
    e = estimate(cfg7, recipe.with_(attention="flash", lora_rank=rank, optimizer="paged-adamw"), device_type=dt)
    paged_rows.append({"QLoRA all-linear, paged_adamw_32bit": f"rank {rank}", "peak (GiB)": e.peak_gib,
                       "paged states (GiB)": e.paged_bytes / GiB, "on the device, paged resident (GiB)":
                       e.device_peak_bytes / GiB,
                       f"states fit beside the peak on the {card.name}": e.device_peak_bytes <= card.memory_bytes})
paged_table = pd.DataFrame(paged_rows)
ch.save_table(paged_table, "qlora_paged_optimizer")
print(f"rank 64 on the {card.name}: {fits(e, card).paged_note()}")
paged_table.round(2)

# %% [markdown]
# **LoRA and QLoRA under FSDP.** Sharding the model over 8 GPUs is the other recipe people run: the base sharded,
# the small adapters trained on every rank. For QLoRA the published FSDP-QLoRA recipe stores the packed 4-bit weights
# as bf16 (`bnb_4bit_quant_storage=torch.bfloat16`) so that FSDP can shard them with the other bf16 parameters
# `[answerai2024]`; bitsandbytes' quantisation constants are attributes, not parameters, and stay whole on every rank.
# The formula refuses adapters under ZeRO/FSDP; the trace answers: transformers' code wrapped by peft, every decoder
# layer an FSDP2 unit, over a fake 8-rank process group (at ci scale two of the 7B's blocks at its full width; the
# full scale traces all 32).

# %%
fsdp_cfg = {**load_config("llama-2-7b", "full"), "num_hidden_layers": SIZES["fsdp_layers"]}
fsdp_setup = Setup(seq=SIZES["fsdp_seq"], precision="bf16", attention="flash", finetune="lora", lora_rank=16,
                   recompute="full")
one_rank = trace_hf(fsdp_cfg, fsdp_setup, device_type=dt)
eight = trace_hf(fsdp_cfg, fsdp_setup.with_(zero_stage=3, world_size=8), device_type=dt)
qlora_eight = trace_hf(fsdp_cfg, prep_base.with_(zero_stage=3, world_size=8), device_type=dt)
fsdp_table = pd.DataFrame([{"layout": layout, "peak (GiB)": t.peak_bytes / GiB,
                            "parameters at the peak (GiB)": t.peak_by_category.get("parameters", 0) / GiB,
                            "peak phase": f"{t.peak_step} {t.peak_phase}"}
                           for layout, t in (("LoRA, one GPU", one_rank), ("LoRA, FSDP2 over 8, rank 0", eight),
                                             ("QLoRA, one GPU", plain_t),
                                             ("QLoRA (bf16 storage), FSDP2 over 8, rank 0", qlora_eight))])
ch.save_table(fsdp_table, "lora_fsdp_trace")
root_gib = 2 * fsdp_cfg["vocab_size"] * fsdp_cfg["hidden_size"] * 2 / GiB  # embedding + untied head, bf16
print(f"Llama-2-7B's width, {SIZES['fsdp_layers']} blocks, seq {SIZES['fsdp_seq']}: LoRA traced on one GPU "
      f"{one_rank.peak_bytes / GiB:.2f} GiB, under FSDP2 over 8 ranks {eight.peak_bytes / GiB:.2f} GiB on rank 0: "
      + ("sharding the frozen base saves memory here" if eight.peak_bytes < one_rank.peak_bytes else
         f"more than one GPU at this depth: the root unit (embedding and head, {root_gib:.2f} GiB) stays gathered "
         "from forward into backward and each layer is gathered beside its shard, which only more blocks "
         "outweigh"))
print(f"QLoRA at the same size: one GPU {plain_t.peak_bytes / GiB:.2f} GiB, FSDP-QLoRA over 8 ranks "
      f"{qlora_eight.peak_bytes / GiB:.2f} GiB on rank 0, of which {qlora_eight.components()['params'] / GiB:.3f} GiB "
      f"of parameters at rest against {plain_t.components()['params'] / GiB:.3f} GiB on one GPU: the NF4 base shards, "
      "its quantisation constants stay whole on every rank")
fsdp_table.round(3)

# %% [markdown]
# **Exercise 4 (predict first).** The QLoRA recipe above (r=16 on every linear layer, checkpointing, bf16, the
# attention transformers picks, seq 2048): what is the largest micro-batch whose predicted **tensor** peak fits the
# 24 GB RTX 4090 (the tensors alone, before the context, workspaces and reserve the recipe table's two ends count)?
# Work it out from the table's batch-1 peak and what one more sequence adds, then check.

# %%
answer = ...
check("12.recipe-max-batch", answer)

# %% [markdown]
# ## 2. The trace: the real model, wrapped by peft, at full width
#
# `trace_hf` builds `AutoModelForCausalLM.from_config` for the Llama-2-7B config inside a fake-tensor mode (at ci
# scale with fewer of its blocks, so the page builds in seconds; the full scale traces all of them), wraps it
# with `peft.get_peft_model` (`memlab.model.hf.apply_lora`) and traces two training steps: every storage PyTorch
# would hold, counted by MemTracker, with nothing allocated. (peft moves each adapter onto its base layer's
# device after creating it; the tracer lets fake parameters be moved, and gives frozen ones no gradient hook.)

# %%
traced_setup = plans["LoRA r=16 on q,v"].with_(seq=SIZES["traced_seq"])
traced_hf = {**load_config("llama-2-7b", "full"), "num_hidden_layers": SIZES["traced_layers"]}
tr = trace_hf(traced_hf, traced_setup, device_type=dt)
# the trace runs on the CPU, where torch keeps Adam's per-tensor step counters on the same device as the states
pred_tr = estimate(from_hf(traced_hf), traced_setup, device_type=dt, step_on_device=True)
print(f"traced: Llama-2-7B's config with {SIZES['traced_layers']} of its {cfg7.n_layers} blocks, "
      f"{from_hf(traced_hf).param_count():,} parameters, on fake tensors")
tc, pc = tr.components(), pred_tr.components()
residual = tc["activations"] - pc["activations"]
trace_table = pd.DataFrame([{"component": k, "traced (B)": tc[k], "predicted (B)": pc[k],
                             "traced - predicted (B)": tc[k] - pc[k]} for k in ("params", "grads", "optimizer",
                                                                                   "activations")])
ch.save_table(trace_table, "llama7b_lora_trace")
display(trace_table)
states_equal = all(tc[k] == pc[k] for k in ("params", "grads", "optimizer"))
ids_only = residual == 16 * traced_setup.tokens + 4
Markdown(f"**Reading it (computed).** Traced at {traced_setup.seq:,} tokens, the states "
         f"{'equal the estimate to the byte' if states_equal else 'differ from the estimate'}; the activations "
         f"differ by {residual:,} B, which "
         + (f"is 2 × 8 B × {traced_setup.tokens:,} tokens + 4 B: the batch's input ids (held by the loop but saved "
            "by no frozen embedding), its labels (of which the loss saves a shifted copy the estimate counts) and "
            "the loss." if ids_only else f"is not 2 × 8 B × {traced_setup.tokens:,} tokens + 4 B."))

# %% [markdown]
# ## 3. The measurement: peft (and bitsandbytes' NF4) on this machine
#
# Each tiny model of `memlab/predict/families/configs/tiny` trains one step, as the full model would, with peft adding
# the adapters (`memlab.run.hf.run_hf`): every tensor saved for backward is counted, and so are the states.

# %%
tb, ts = SIZES["batch"], SIZES["tiny_seq"]
lora_qv = Setup(finetune="lora", lora_rank=8)
qlora_qv = Setup(finetune="qlora", precision="bf16", lora_rank=8)


def measured(family: str, dtype: str = "fp32", lora: Setup | None = None, dropout: float = 0.0):
    """One real training step of the tiny ``family`` (peft-wrapped when ``lora``): memlab's config, the measurement."""
    cfg = load_config(family, "tiny")
    if lora is not None and dropout:
        lora = lora.with_(lora_dropout=dropout)
    return run_hf(cfg, attn_implementation="eager", dtype=dtype, batch=tb, seq=ts, seed=seed, lora=lora)


# %% [markdown]
# **Exercise 1 (predict before measuring).** Take the tiny Llama, fp32, eager attention, at the batch and sequence
# above. LoRA on q and v freezes everything else. What fraction of full fine-tuning's saved-for-backward bytes
# does the LoRA step still save? (A fraction.) Answer before running the cell: it measures both steps, then checks.

# %%
answer = ...
check("12.lora-saved-share", answer, family="llama", batch=tb, seq=ts, seed=seed)

# %%
rows = []
for fam in SIZES["tiny"]:
    for mode, dtype, lo, p in (("full", "fp32", None, 0.0), ("LoRA q,v", "fp32", lora_qv, 0.0),
                               ("LoRA q,v dropout 0.1", "fp32", lora_qv, 0.1), ("LoRA q,v", "bf16", lora_qv, 0.0),
                               ("QLoRA q,v (NF4)", "bf16", qlora_qv, 0.0)):
        if lo is not None and lo.finetune == "qlora" and fam == "gpt2":
            continue  # bitsandbytes quantises nn.Linear; GPT-2's blocks are Conv1D
        tcfg, m = measured(fam, dtype, lo, p)
        pr = predict_hf(tcfg, m)
        rows.append({"family": fam, "mode": mode, "dtype": dtype, "measured saved (B)": m.saved_bytes,
                     "predicted saved (B)": pr["activations"], "measured states (B)": m.states_bytes,
                     "predicted states (B)": pr["params"] + pr["grads"] + pr["optimizer"]})
tiny = pd.DataFrame(rows)
tiny["saved exact"] = tiny["measured saved (B)"] == tiny["predicted saved (B)"]
tiny["states exact"] = tiny["measured states (B)"] == tiny["predicted states (B)"]
ch.save_table(tiny, "tiny_peft_measured")
print(f"{int(tiny['saved exact'].sum())} of {len(tiny)} runs: saved activations predicted to the byte; "
      f"{int(tiny['states exact'].sum())} of {len(tiny)}: model states to the byte (measured on {ch.device})")
tiny

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
labels = [f"{r.family}\n{r.mode}\n{r.dtype}" for r in tiny.itertuples()]
for ax, what in zip(axes, ("saved", "states"), strict=True):
    ax.bar(range(len(tiny)), tiny[f"measured {what} (B)"] / MiB, color="tab:blue", label="measured (peft, this run)")
    ax.scatter(range(len(tiny)), tiny[f"predicted {what} (B)"] / MiB, marker="x", color="black", zorder=3,
               label="predicted (memlab.predict.estimate)")
    ax.set_xticks(range(len(tiny)), labels, fontsize=5, rotation=90)
    ax.set(ylabel="MiB", title=("saved for backward" if what == "saved" else "parameters + gradients + optimizer")
           + f", b={tb} s={ts}")
fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=2, fontsize=7)
fig.suptitle(f"Tiny models, full fine-tuning vs LoRA and QLoRA with peft and bitsandbytes, one step on {ch.device}",
             fontsize=10)
ch.save_figure(fig, "tiny_peft_measured_vs_predicted")

# %% [markdown]
# ## 4. What a frozen base still saves
#
# Autograd saves a tensor only for a gradient it must compute. A Linear `y = x Wᵀ` has two gradients it might
# compute: its input's (`grad_y @ W`) and its weight's (`grad_yᵀ @ x`).
#
# **Exercise 2 (predict first).** In a block above the first, LoRA on q and v: which tensors of the frozen `k_proj`
# does the step keep for backward? (The check measures the tiny Llama's step, every saved tensor with the module
# that saved it.)

# %%
answer = ...
check("12.frozen-linear-saves", answer, family="llama", batch=tb, seq=ts, seed=seed)

# %% [markdown]
# A frozen Linear above the first block still needs its input's gradient, for the blocks below, so it keeps its
# weight, already resident, and not its input, which only the weight's gradient needs. A frozen RMSNorm weight
# makes `weight * x̂` keep nothing; LayerNorm's kernel keeps its input and statistics whatever asks for a gradient.
# The bottom block's input needs no gradient at all, so its first norm keeps nothing, and its attention core keeps
# only what the adapted projections need. Each adapter adds its input (for `A`'s gradient) and `A`'s `t × r` output
# (for `B`'s).

# %%
lora_all = est["LoRA r=16 on all"]
full_bf16 = estimate(cfg7, Setup(seq=SIZES["seq"], precision="bf16", attention="flash"), device_type=dt)
print(f"The misreading: LoRA saves memory everywhere. At 7B, seq {SIZES['seq']}, bf16: full fine-tuning saves "
      f"{full_bf16.activations_bytes / GiB:.2f} GiB for backward, LoRA on q,v {lora.activations_bytes / GiB:.2f} "
      f"GiB, LoRA on all linear layers {lora_all.activations_bytes / GiB:.2f} GiB: peft casts each adapted module's "
      f"bf16 input to the fp32 adapter's dtype, and each copy is saved for A's gradient "
      f"({len(plans['LoRA r=16 on all'].lora_target_kinds)} fp32 copies per block, one of them d_ff wide).")
lora_all_terms = {k: v / GiB for k, v in lora_all.activation_detail.items()}
pd.Series(lora_all_terms, name="GiB").round(3)

# %% [markdown]
# **Exercise 3.** QLoRA's quantisation constants, with double quantisation (one 8-bit absmax per 64 weights, one
# fp32 constant per 256 absmax values): how many bits do they add per parameter?

# %%
answer = ...
check("12.qlora-dq-bits", answer)

# %% [markdown]
# ## 5. The public calculators on the same runs
#
# Each calculator is scored only on what it claims for a fine-tune (`memlab.studies.calculators`): gpu_poor has
# LoRA and QLoRA modes (rank-free adapter states; its full-training activations, eager attention's) that assume
# 16-bit weights, so it is scored on bf16 runs only `[gpu-poor]`; accelerate has no LoRA mode and is given no claim
# `[accelerate-estimate]`; the full-training formulas give no number. The runs are section 3's small peft runs
# (fp32 and bf16) and one full-width one: the real peft-wrapped Llama-2-7B traced on fake tensors (bf16, SDPA; at
# ci scale 8 of its 32 blocks at 256 tokens, at full scale all of it at 2,048).

# %%
measured_lora = {}
for dtype in ("fp32", "bf16"):  # section 3's runs, not re-run
    runs = calculators.lora_runs({f: load_config(f, "tiny") for f in SIZES["tiny"]}, tb, ts, lora_rank=lora_qv.lora_r,
                                 dtype=dtype)
    done = tiny[(tiny["mode"] == "LoRA q,v") & (tiny["dtype"] == dtype)]
    measured_lora |= {r: {"states": int(t["measured states (B)"]), "activations": int(t["measured saved (B)"])}
                      for r, (_, t) in zip(runs, done.iterrows(), strict=True)}
wide_lora = calculators.Run({**load_config("llama-2-7b", "full"), "num_hidden_layers": SIZES["traced_layers"]}, 1,
                            SIZES["traced_seq"], "bf16", "sdpa", name="llama-2-7b", finetune="lora",
                            lora_rank=lora_qv.lora_r)
shoot = pd.concat([calculators.finetune_shoot_out(list(measured_lora), measured_lora),
                   calculators.shoot_out([(wide_lora, calculators.traced_truth(wide_lora))],
                                         tools=calculators.FINETUNE_TOOLS)], ignore_index=True)
ch.save_table(shoot, "lora_shoot_out")


def errors_in_percent(frame):
    """The error table of a shoot-out frame, signed errors in % (exact to 0.05 % prints 0.0 %; run counts and
    scopes as they are)."""
    return calculators.error_table(frame).set_index("tool").map(
        lambda v: v if not isinstance(v, float) else "0.0 %" if abs(v) < 5e-4 else f"{v:+.1%}".replace("%", " %"))


print("on the full-width trace only:")
errors_in_percent(shoot[shoot["truth"] == "traced"])

# %%
print("on the small peft runs only (in-sample for memlab):")
errors_in_percent(shoot[shoot["truth"] == "measured"])

# %% [markdown]
# ## The seed's claim, answered

# %%
full_e, qv_fit = est["full (mixed-bf16)"], fits(est["LoRA r=16 on q,v"], card)
recipe_batch = int(recipe_table.iloc[0][f"largest batch on the {card.name}, for certain"])
recipe_up_to = int(recipe_table.iloc[0]["may fit up to"])
tight = full_e.peak_bytes > card.memory_bytes
ch.seed_claims([
    ("004", "fine-tuning a 7B LLaMA on one card: even 24 GB looks tight",
     ("holds for full fine-tuning, not for the recipe people run" if tight and recipe_batch >= 2 else
      "holds" if tight else "does not hold"),
     f"full fine-tuning peaks at {full_e.peak_gib:.0f} GiB, {full_e.peak_bytes / card.memory_bytes:.1f}x the "
     f"{card.memory_bytes / GiB:.0f} GiB card; LoRA r=16 on q,v without checkpointing is {qv_fit.margin()} "
     f"(device-used margin {qv_fit.margin_bytes / GiB:+.1f} GiB); QLoRA r=16 all-linear with checkpointing fits "
     f"batch {recipe_batch} for certain and up to {recipe_up_to} at {SIZES['seq']:,} tokens (predicted for CUDA, "
     "on device-used)"),
], columns=["seed", "claim", "verdict", "number (this run)"])

# %%
ch.published("12")

# %% [markdown]
# ## Summary
#
# - LoRA freezes the base: its weights stay, their gradients and optimizer states go; peft's fp32 adapters and
#   their states are small next to the base (section 1's printout).
# - A frozen base still saves most activations: everything its activations' gradients need. Only the inputs kept
#   for weight gradients disappear, and each adapter adds its own input and a rank-wide output; over a bf16 base
#   peft's fp32 casts can make LoRA on every linear layer save more than full fine-tuning.
# - What to switch on is ranked by the peak each lever gives, never by a sum (`memlab.predict.fit.levers`,
#   section 1's table), each with its cost; the fine-tuning levers change what is trained, the others how.
# - QLoRA shrinks the base to NF4, 4 bits a weight plus the constants of exercise 3 `[dettmers2023]`; measured small
#   on this machine to the byte, traced on fake tensors at 7B (`benchmarks/qlora_trace.py`); the CUDA kernel's
#   dequantised copy and paged optimizers are predicted only.
# - The recipe as scripts write it is answered: gradient checkpointing and accumulation by the formula;
#   `prepare_model_for_kbit_training`'s fp32 casts and reentrant checkpointing, and FSDP-QLoRA's sharded bf16-stored
#   base, by the trace; fp16 compute on a T4; paged optimizers' states reported apart from the allocator's peak.
# - The trace of the real peft-wrapped 7B-wide model equals the estimate's states to the byte, and its activations up to
#   the batch's token ids; small peft runs of several families are predicted to the byte (in-sample: memlab's
#   family traits were written from these families, so this checks the bookkeeping, not a new family).

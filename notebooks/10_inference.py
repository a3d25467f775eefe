# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 10 · Inference: weights, the KV cache, quantised weights and experts
#
# **The common beliefs.** Seed 000 (`[seed-000]`) lists INT8/INT4 weights ("parameter memory 2-4× smaller") and
# PagedAttention ("paging, like virtual memory, reduces KV-cache fragmentation") among the fixes, says the KV
# cache "grows linearly with the number of concurrent users", and corrects a misreading about mixture-of-experts
# models with another: "what one forward pass actually loads into GPU memory is the active experts plus the
# shared layers".
#
# Serving a language model runs in two phases. **Prefill** is one forward pass over the whole prompt; it writes
# the keys and values of every prompt token into the KV cache. **Decode** then generates one token per step: each
# step runs the model on one new token per sequence and reads every weight and the whole cache. This chapter
# serves the reference GPT with its KV cache and measures, then scales the same formulas up:
#
# 1. the formula: weights + KV cache (GQA vs MHA) + the prefill's transient;
# 2. the experiment: prefill and decode on the reference GPT, KV bytes against context and batch, tokens/s;
# 3. "will model M serve N users at context C on GPU G?", as `generate()` runs it, the largest batch per context,
#    and vLLM's KV pool (`gpu_memory_utilization`, block size);
# 4. the decode roofline: time per token ≥ bytes read / bandwidth, and the batch at which decode turns
#    compute-bound;
# 5. int8 and int4 weights, both measured on the CPU with torch's own kernels;
# 6. PagedAttention: the share of reserved KV memory in use, at completion and during serving [kwon2023];
# 7. mixture of experts: every expert resident, and at batch-1 decode most of them idle.

# %% tags=["parameters"]
scale = "auto"
device = "auto"
seed = 0
out_dir = "../reports/build/10_inference"

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from IPython.display import Markdown

from memlab import (
    GPT,
    Setup,
    chapter,
    check,
    count_flops,
    decode_flops,
    estimate,
    forward_flops,
    gpu,
    kv_cache_bytes,
    kv_waste,
    ledger,
    max_batch,
    max_sequences,
    model_states,
    preset,
    reserved_tokens,
    run_step,
    serving_table,
    shape_summary,
    synthetic_request_lengths,
    token_ids,
    vllm_kv_blocks,
)
from memlab.course.chapter import as_percent
from memlab.labs import inference
from memlab.units import GB, GiB, MiB

ch = chapter(scale, device, seed, out_dir, ci_threads=1)  # tiny models on a shared machine: 1 thread
SIZES = {  # what the scale changes: the GQA and MHA models served in section 2, and their contexts
    "ci": dict(gqa="tiny-llama", mha="tiny-gpt", contexts=(64, 256)),
    "full": dict(gqa="llama-3-8b", mha="llama-2-7b", contexts=(1024, 4096)),
}[ch.scale]
DTYPE = {"cpu": "fp32", "cuda": "bf16"}[ch.device_type]  # served weights and KV cache
ch

# %% [markdown]
# ## 1. The formula
#
# Serving holds the weights once and, per sequence, the keys and values of every past token in every layer:
# 2 × n_layers × n_kv_heads × head_dim × bytes per token (`memlab.predict.memory.inference.kv_cache_bytes`).
# Grouped-query
# attention (GQA) shares each KV head among several query heads, so it divides that by n_heads / n_kv_heads.

# %%
kv_models = ["llama-2-7b", "llama-3-8b", "mistral-7b", "llama-2-70b", "mixtral-8x7b"]
per_token = pd.DataFrame([{"model": n, "query heads": c.n_heads, "KV heads": c.n_kv_heads,
                           "KV bytes / token / layer (bf16)": kv_cache_bytes(c, 1, 1, "bf16") / c.n_layers,
                           "KV MiB / token (all layers)": kv_cache_bytes(c, 1, 1, "bf16") / MiB,
                           "KV GiB at 32 users x 4096": kv_cache_bytes(c, 32, 4096, "bf16") / GiB}
                          for n in kv_models for c in [preset(n)]])
ch.save_table(per_token, "kv_per_token")
per_token.round(3)

# %% [markdown]
# **Exercise 1 (predict before you measure).** The CPU run below serves `tiny-llama` (see
# `preset("tiny-llama")` for its layers, KV heads and head size) to 4 sequences of 256 tokens, cache in fp32. How
# many bytes does its KV cache take?

# %%
tiny_llama = preset("tiny-llama")

# %%
answer = ...
check("10.tiny-kv", answer)

# %% [markdown]
# ## 2. The experiment: prefill and decode with a KV cache
#
# `run_step(..., Setup(mode="inference"))` builds the reference GPT, preallocates its KV cache (as serving engines
# do), runs a prefill of the prompt and then one-token decode steps, and times both. Two models: MHA (`tiny-gpt`)
# and GQA (`tiny-llama`), several contexts and batches.

# %%
small, mha, contexts = preset(SIZES["gqa"]), preset(SIZES["mha"]), SIZES["contexts"]
grid = [(small, b, s) for b in (1, 4) for s in contexts] + [(mha, 4, s) for s in contexts]
served = []
for cfg, b, s in grid:
    m = run_step(cfg, Setup(mode="inference", batch=b, seq=s, inference_weights=DTYPE, kv_cache_dtype=DTYPE),
                 ch.device, steps=4, with_counted_flops=False, with_mfu=not ch.on_cpu)
    served.append((cfg, m))
exercise_run = next((m for cfg, m in served if cfg == tiny_llama and m.setup["batch"] == 4 and m.setup["seq"] == 256
                     and DTYPE == "fp32"), None) or run_step(
    tiny_llama, Setup(mode="inference", batch=4, seq=256, inference_weights="fp32", kv_cache_dtype="fp32"), "cpu",
    steps=1, with_counted_flops=False, with_mfu=False)
print(f"exercise 1, measured: tiny-llama's KV cache for 4 x 256 tokens in fp32 is {exercise_run.kv_cache_bytes:,} B")
rows = pd.DataFrame([{"model": cfg.name, "batch": m.setup["batch"], "context": m.setup["seq"],
                      "weights B": m.params_bytes, "KV cache B": m.kv_cache_bytes,
                      "KV B / token / layer": m.kv_cache_bytes / (m.setup["batch"] * m.setup["seq"] * cfg.n_layers),
                      "prefill s": m.prefill_time_s, "decode s/token": m.decode_time_per_token_s,
                      "decode tokens/s": m.tokens_per_s} for cfg, m in served])
ch.save_table(rows, "served")
served_ledger = ledger(served)
ch.record_ledger(served_ledger)
kv_rows = served_ledger[served_ledger["component"].isin(["params", "kv_cache"])]
print(f"weights and KV cache: {len(kv_rows)} rows, largest |relative error| {kv_rows['rel_error'].abs().max():.2%}")
rows

# %%
ch.cpu_note("KV and weight bytes are exact storage sizes; prefill and decode times on CPU cores say nothing about "
            "a GPU, where decode is bound by reading the weights and the cache from HBM at every token.")

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), layout="constrained")
for i, cfg in enumerate((mha, small)):
    part = rows[rows["model"] == cfg.name]
    for b in sorted(part["batch"].unique()):
        p = part[part["batch"] == b]
        axes[0].plot(p["context"], p["KV cache B"] / MiB, marker="o", color=f"C{i}",
                     linestyle="-" if b == 1 else "--", label=f"{cfg.name}, batch {b}")
    ctx = np.array(sorted(part["context"].unique()))
    axes[0].plot(ctx, kv_cache_bytes(cfg, 4, ctx, DTYPE) / MiB, color="k", alpha=0.3, linewidth=4, zorder=0)
axes[0].set_xlabel("context (tokens)")
axes[0].set_ylabel("KV cache (MiB), measured")
axes[0].set_title("KV cache vs context and batch (grey: predicted)")
axes[0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
# the GQA model also ran batch 1: its prediction too (batch 4's is drawn in the loop above, for both models)
axes[0].plot(ctx, kv_cache_bytes(small, 1, ctx, DTYPE) / MiB, color="k", alpha=0.3, linewidth=4, zorder=0)
one = rows[(rows["batch"] == 4) & (rows["context"] == max(contexts))].set_index("model")  # one setting, not a mean
one[["prefill s", "decode s/token"]].plot.bar(ax=axes[1], rot=0, logy=True)
axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
axes[1].set_ylabel("seconds (log)")
axes[1].set_title(f"batch 4, context {max(contexts)}: prefill vs one decode step, {served[0][1].device_name}")
ch.save_figure(fig, "kv_growth_and_phases")

# %% [markdown]
# ## 3. Will model M serve N users at context C on GPU G?
#
# `Setup(mode="inference")` describes transformers' `generate()`: a prefill of the prompt that keeps the logits of
# the last position only (`logits_to_keep=1`, what `generate()` passes to the model [hf-transformers]), then decode
# steps with a dynamic cache that grows by `torch.cat` (its default cache). The estimate of a step is weights + KV
# cache + the prefill's largest moment: a block's MLP, its attention or the head
# (`memlab.predict.memory.inference`; exact against the reference GPT's trace under a fused kernel,
# `benchmarks/inference_vs_trace.py`). bf16 weights and cache, 32 users at 4096 tokens each, five answers:
#
# - **plain forward, eager** and **plain forward, SDPA**: `logits_to_keep=0` (the logits of every prompt position),
#   with eager attention or a fused kernel (`attention="flash"`);
# - **generate(), eager** and **generate(), SDPA**: `max_batch` of the default setup;
# - **weights + KV, 100 % of the card**: what the weights leave, over one sequence's cache (`max_sequences`);
# - **vLLM's pool**: `vllm_kv_blocks`: (`gpu_memory_utilization` × the card − the weights − the activation peak of
#   the forward vLLM profiles at start-up) // (`block_size` tokens × KV bytes per token), defaults 0.9 and 16
#   [vllm-engine-args] [vllm-worker]. The profiled peak is vLLM's own measurement; here it is *assumed* to be the
#   estimate's largest moment of one 4096-token SDPA prefill.
#
# The capacity is memlab's table's nominal figure (80 GiB for an H100 SXM); the CUDA context takes a few hundred
# MiB more, which vLLM's 10 % margin covers.

# %%
cards = ["l4", "a100-80gb-sxm", "h100-sxm", "h200-sxm"]
users, context = 32, 4096
serve_models = ["llama-2-7b", "llama-3-8b", "mistral-7b", "mixtral-8x7b", "llama-2-70b"]
gen_eager = Setup(mode="inference", batch=1, seq=context, attention="eager")  # generate(): logits_to_keep=1
gen_sdpa = gen_eager.with_(attention="flash")
plain_eager = gen_eager.with_(logits_to_keep=0)  # a plain forward: every prompt position's logits
plain_sdpa = plain_eager.with_(attention="flash")


def vllm_budget(cfg, card: str):
    """vLLM's KV pool on ``card`` (memlab.predict.paging.vllm_kv_blocks), the profiled peak assumed to be one SDPA
    prefill of ``context`` tokens (the estimate's largest moment)."""
    profiled = estimate(cfg, gen_sdpa)
    return vllm_kv_blocks(gpu(card).memory_bytes, profiled.params_bytes, profiled.activations_bytes,
                          kv_cache_bytes(cfg, 1, 1, "bf16"))


serve = []
for name in serve_models:
    cfg = preset(name)
    detail = estimate(cfg, plain_eager).activation_detail
    for card in cards:
        serve.append({"model": name, "card": card, "weights GiB": estimate(cfg, gen_sdpa).params_bytes / GiB,
                      "plain forward, eager": max_batch(cfg, plain_eager, card).value,
                      "plain forward, SDPA": max_batch(cfg, plain_sdpa, card).value,
                      "generate(), eager": max_batch(cfg, gen_eager, card).value,
                      "generate(), SDPA": max_batch(cfg, gen_sdpa, card).value,
                      "generate(), SDPA, may fit up to": max_batch(cfg, gen_sdpa, card).up_to,
                      "weights + KV, 100 % of the card": max_sequences(cfg, gpu(card).memory_bytes, context),
                      "vLLM pool (0.9)": vllm_budget(cfg, card).sequences(context),
                      "largest plain-forward moment": max(detail, key=detail.get),
                      "its GiB / sequence": max(detail.values()) / GiB})
serve = pd.DataFrame(serve)
serve[f"serves {users}? (vLLM pool)"] = serve["vLLM pool (0.9)"].ge(users).map({True: "yes", False: "no"})
ch.save_table(serve, "serve_table")
h100_rows = serve[serve["card"] == "h100-sxm"].drop(columns="card").set_index("model")
h100_rows.round(2)

# %%
l38 = serve.set_index(["model", "card"]).loc[("llama-3-8b", "h100-sxm")]
l38_plain = estimate(preset("llama-3-8b"), plain_sdpa).activation_detail
l38_gen = estimate(preset("llama-3-8b"), gen_sdpa).activation_detail
l38_pool = vllm_budget(preset("llama-3-8b"), "h100-sxm")
Markdown(
    f"**Reading it (computed).** For Llama-3-8B on an H100 an eager forward is limited by its score matrix "
    f"({estimate(preset('llama-3-8b'), plain_eager).activation_detail['attention_scores'] / GiB:.1f} GiB per "
    f"{context:,}-token sequence), whatever logits it keeps: {l38['plain forward, eager']} sequences. With SDPA a "
    f"plain forward is limited by the logits of every position ({l38_plain['logits'] / GiB:.1f} GiB per sequence, "
    f"a 128k vocabulary): {l38['plain forward, SDPA']} sequences. `generate()` keeps one row of logits, so its "
    f"largest moment is a block's MLP ({l38_gen['mlp'] / GiB:.2f} GiB): {l38['generate(), SDPA']}, a lower bound "
    "for it (its cache grows by `torch.cat`, with transient copies and fragmentation; a batch is padded to its "
    "longest prompt; nothing is paged or reused as in an engine). vLLM's pool is "
    f"{l38_pool.pool_bytes / GiB:.0f} GiB in {l38_pool.blocks:,} blocks of {l38_pool.block_size} tokens "
    f"({l38_pool.block_bytes / MiB:.0f} MiB each): {l38['vLLM pool (0.9)']} sequences, against "
    f"{l38['weights + KV, 100 % of the card']} on 100 % of the card, so \"32 users?\" is "
    f"**{l38[f'serves {users}? (vLLM pool)']}** (Llama-2-7B, four times the cache per token: "
    f"**{serve.set_index(['model', 'card']).loc[('llama-2-7b', 'h100-sxm'), f'serves {users}? (vLLM pool)']}**).")

# %% [markdown]
# The same question on every card, with vLLM's pool: how many 4096-token sequences fit.

# %%
serve.pivot_table(index="model", columns="card", values="vLLM pool (0.9)", sort=False)[cards]

# %% [markdown]
# GQA is the difference between rows: Llama-2-7B (32 KV heads) needs four times the cache of Llama-3-8B or
# Mistral-7B (8 KV heads) per token. Mixtral and Llama-2-70B do not fit most single cards at all; they need tensor
# parallelism (`Setup(tp=...)`).
#
# The `max_batch` columns decide on what the device shows (the CUDA context, cuBLAS workspaces and the caching
# allocator's reserve on top of the tensors) and give the batch that fits **for certain**: the reserve at the bound
# memlab derives from the allocator's rules. "may fit up to" is the other end, with no reserve at all; between
# them the allocator decides, and `memlab trace --gpu CARD --max-batch` replays it on the traced step.
#
# **The serving search.** `serving_table` runs `max_batch` at each context length: the most sequences
# `generate()` can prefill together and then decode, on a 24 GB and an 80 GB card (SDPA, bf16), from both ends.

# %%
search_ctx = [1024, 2048, 4096, 8192, 16384, 32768]
search = pd.DataFrame([{**row, "model": name, "card": card}
                       for name in ("llama-2-7b", "llama-3-8b") for card in ("rtx-4090", "h100-sxm")
                       for row in serving_table(preset(name), Setup(mode="inference", attention="flash"), card,
                                                search_ctx)])
ch.save_table(search, "serving_search")
search.assign(both=[f"{a:,}" if a == b else f"{a:,}-{b:,}" for a, b in zip(search["max_batch"],
                                                                            search["max_batch_up_to"], strict=True)]
              ).pivot_table(index=["model", "card"], columns="context", values="both", aggfunc="first", sort=False)

# %%
fig, ax = plt.subplots(figsize=(7.5, 3.6), layout="constrained")
for i, ((name, card), part) in enumerate(search.groupby(["model", "card"], sort=False)):
    fits = part[part["max_batch"] > 0]  # a context where not even one sequence fits is left off the log axis
    ax.plot(fits["context"], fits["max_batch"], marker="o", color=f"C{i}",
            label=f"{name} on {gpu(card).name}: for certain")
    may = part[part["max_batch_up_to"] > 0]
    ax.plot(may["context"], may["max_batch_up_to"], ls="--", color=f"C{i}", alpha=0.6, label="  may fit up to")
ax.set(xscale="log", yscale="log", xlabel="context per sequence (tokens)",
       ylabel="sequences served at once",
       title="generate()'s largest batch per context (predicted on device-used, bf16, SDPA)")
ax.set_xticks(search_ctx, [f"{c // 1024}k" for c in search_ctx])
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
ch.save_figure(fig, "serving_search")

# %% [markdown]
# **The cache kind.** `generate()`'s dynamic cache concatenates each layer's keys and values at every step, so for
# a moment a layer's old values sit beside the new ones; a static cache (`kv_cache="static"`, transformers'
# `StaticCache`) is preallocated to the full length and written in place, but is held whole from the prefill on.

# %%
cache_cfg = preset("llama-3-8b")
cache_rows = pd.DataFrame([
    {"cache": kind, "kept logits": keep or "all",
     **{f"{r.phase} GiB": r.peak_bytes / GiB for r in estimate(cache_cfg, Setup(
         mode="inference", batch=8, seq=8192, attention="flash", kv_cache=kind, logits_to_keep=keep)).phases}}
    for kind in ("dynamic", "static") for keep in (1, 0)])
ch.save_table(cache_rows, "cache_kinds")
cache_rows.round(2)

# %% [markdown]
# **How an engine keeps that pool full.** *Continuous batching* (iteration-level scheduling, Orca [yu2022])
# admits a new request into the running batch at any decode step, as soon as a finished one frees its KV slots,
# instead of waiting for the whole batch to end. *Chunked prefill* [agrawal2023] cuts a long prompt's prefill into
# chunks of a fixed number of tokens and runs them in the same steps as other requests' decodes, so a long prompt
# neither stalls the decodes nor needs a transient sized for the whole prompt. Both are why an engine's limit is
# weights + KV + a bounded per-step transient, not the whole batch's prefill.

# %% [markdown]
# ## 4. The decode roofline
#
# A decode step reads every weight once and each sequence's whole cache, and does 2 FLOPs per multiplied weight per
# sequence (one multiply-add; the embedding lookup multiplies nothing), plus 4 × layers × h × context FLOPs per
# sequence for attention over the cache (`decode_flops`: Kaplan's count [kaplan2020], which has QKᵀ only, with
# both QKᵀ and AV). So
# time per step ≥ max(bytes read / HBM bandwidth, FLOPs / peak) [williams2009] [pope2022]. At batch b the
# weights' arithmetic intensity is about 2b FLOPs per 2 bytes: b FLOP/B in bf16, far below an H100's ridge point
# (peak / bandwidth). Decode stays bandwidth-bound until the batch nears that ridge, and the cache, read per
# sequence, never amortises. Serving reports two latencies: the time to first token (TTFT, mostly the prefill)
# and the time per output token (TPOT, one decode step). *Memory-bandwidth utilisation* (MBU [databricks2023]) is
# bytes read per step / TPOT / peak bandwidth: the decode analogue of MFU. Predicted for Llama-3-8B on an H100 SXM
# at 4096 tokens of context (memlab's table's bandwidth and dense bf16 peak; no kernel reaches either):

# %%
def decode_bound(cfg, card: str, batch: int, ctx: int) -> dict[str, float]:
    """Roofline bound of one decode step (bf16 weights and cache): bytes, FLOPs, the two times, tokens/s."""
    g = gpu(card)
    w = estimate(cfg, Setup(mode="inference", batch=1, seq=1)).params_bytes
    kv = kv_cache_bytes(cfg, batch, ctx, "bf16")
    flops = decode_flops(cfg, batch, ctx)
    t_mem, t_flop = (w + kv) / g.bandwidth_bytes_per_s, flops / g.peak("bf16")
    return {"batch": batch, "weights + KV read (GB)": (w + kv) / GB, "fits the card": w + kv <= g.memory_bytes,
            "FLOPs (T)": flops / 1e12,
            "memory time (ms)": 1e3 * t_mem, "compute time (ms)": 1e3 * t_flop,
            "bound": "memory" if t_mem >= t_flop else "compute",
            "tokens/s at the bound": batch / max(t_mem, t_flop), "ms per token per sequence": 1e3 * max(t_mem, t_flop)}


dec_cfg, dec_card = preset("llama-3-8b"), "h100-sxm"
batches = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
roof_all = pd.DataFrame([decode_bound(dec_cfg, dec_card, b, context) for b in batches])
roof_short = pd.DataFrame([decode_bound(dec_cfg, dec_card, b, 128) for b in batches])
ch.save_table(roof_all, "decode_roofline")
beyond = roof_all[~roof_all["fits the card"]]
roof = roof_all[roof_all["fits the card"]].drop(columns="fits the card")  # a batch whose cache does not fit: no row
print(f"at {context:,} tokens, batches " + ", ".join(f"{b:,}" for b in beyond["batch"])
      + f" need {', '.join(f'{v:.0f}' for v in beyond['weights + KV read (GB)'])} GB of weights + KV, beyond the "
      f"{gpu(dec_card).memory_bytes / GB:.1f} GB of one {gpu(dec_card).name}: left out of the table and the figure"
      if len(beyond) else f"every batch shown fits one {gpu(dec_card).name} at {context:,} tokens")
ridge = gpu(dec_card).peak("bf16") / gpu(dec_card).bandwidth_bytes_per_s
roof.round(2)

# %%
fig, ax = plt.subplots(figsize=(7.5, 3.8), layout="constrained")
for frame, ctx_label, style in ((roof, f"context {context} (batches that fit)", "-"),
                                (roof_short[roof_short["fits the card"]], "context 128", "--")):
    ax.plot(frame["batch"], frame["memory time (ms)"], "C0" + style, marker="o",
            label=f"bytes / bandwidth, {ctx_label}")
    ax.plot(frame["batch"], frame["compute time (ms)"], "C3" + style, marker="s", label=f"FLOPs / peak, {ctx_label}")
ax.set(xscale="log", yscale="log", xlabel="sequences in the decode batch", ylabel="time of one decode step (ms)",
       title=f"Decode roofline: {dec_cfg.name} on {gpu(dec_card).name} (predicted, bf16)")
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
ch.save_figure(fig, "decode_roofline")

# %%
first_compute = roof_short.loc[roof_short["bound"] == "compute", "batch"]
Markdown(
    f"**Reading it (computed).** At batch 1 a step must read {roof['weights + KV read (GB)'].iloc[0]:.1f} GB, so no "
    f"kernel can beat {roof['ms per token per sequence'].iloc[0]:.2f} ms per token "
    f"({roof['tokens/s at the bound'].iloc[0]:.0f} tokens/s) on {gpu(dec_card).bandwidth_bytes_per_s / 1e12:.2f} "
    f"TB/s, while its FLOPs would take {roof['compute time (ms)'].iloc[0]:.3f} ms. With a short context the weights "
    f"dominate and the step turns compute-bound at batch "
    f"{int(first_compute.iloc[0]) if len(first_compute) else 'beyond ' + str(batches[-1])} (the ridge point is "
    f"{ridge:.0f} FLOP/B); at {context:,} tokens every sequence adds its own "
    f"{kv_cache_bytes(dec_cfg, 1, context, 'bf16') / GB:.2f} GB of cache, so decode stays memory-bound "
    f"{'at every batch that fits' if (roof['bound'] == 'memory').all() else 'far longer'}, and the card's "
    f"*capacity* ends the sweep (batch {int(roof['batch'].max()):,} is the last power of two that fits) before "
    "the compute roof is reached. This is why int8/int4 "
    f"weights and GQA speed up decode: they cut the bytes read, not the FLOPs. A CPU run says nothing about these "
    f"GPU times: the reference GPT's weights here fit in the CPU's caches.")

# %% [markdown]
# ## 5. int8 and int4 weights
#
# Predicted: 2-D block matrices quantised with their scales (int8: one fp32 scale per output row; int4: one fp16
# scale and a 4-bit zero point per group of 128 [lin2023]), embeddings, head and norms in 16 bits.

# %%
quant = []
for name in ["llama-2-7b", "llama-3-8b", "mixtral-8x7b"]:
    cfg = preset(name)
    bf16 = estimate(cfg, Setup(mode="inference", batch=1, seq=1, inference_weights="bf16")).params_bytes
    for w in ("bf16", "int8", "int4"):
        b = estimate(cfg, Setup(mode="inference", batch=1, seq=1, inference_weights=w)).params_bytes
        quant.append({"model": name, "weights": w, "GiB": b / GiB, "bf16 / this": bf16 / b})
quant = pd.DataFrame(quant)
ch.save_table(quant, "quantised_weights")
ratios = quant.pivot_table(index="model", columns="weights", values="bf16 / this", sort=False)
ratios.round(2)

# %% [markdown]
# On the CPU, two of torch's own quantised paths run on every `nn.Linear` of the reference GPT:
#
# - **int8**: `torch.ao.quantization.quantize_dynamic` (`memlab.labs.inference.int8_linear_bytes`). The count is
#   of int8 *elements*, one byte each, beside the estimator's count of the same matrices: a bookkeeping check
#   (memlab's count against torch's tensor shapes), not a measurement of fbgemm's packed storage. torch's dynamic
#   int8 is per-tensor (one scale per matrix), the estimator's int8 per-row (one fp32 scale per output row), so
#   the scale bytes are not checked.
# - **int4**: torch's CPU int4 kernels, `aten._convert_weight_to_int4pack_for_cpu` and
#   `aten._weight_int4pack_mm_for_cpu` (the ones torchao's `Int4CPULayout` calls; `memlab.labs.inference.
#   int4_linear_bytes`). This *is* storage: the bytes of the packed uint8 tensors and of their bf16 scale-and-zero
#   tensors, and a real bf16 matmul through them. torch's layout keeps a bf16 scale *and* a bf16 zero per group
#   (4 bytes), the estimator's AWQ/GPTQ layout an fp16 scale and a 4-bit zero (2.5 bytes) [lin2023].

# %%
q_cfg = preset("tiny-gpt")  # at both scales: the measurement builds the model in this process
q8 = inference.int8_linear_bytes(GPT(q_cfg))
q4 = inference.int4_linear_bytes(GPT(q_cfg), group_size=128)
group_sizes = sorted({g for _, _, g in q4["layers"]})
quant_meas = pd.DataFrame([
    {"format": "int8 (quantize_dynamic)", "what is counted": "int8 elements (int_repr): a bookkeeping check",
     "measured B": q8["int8_weight_bytes"], "predicted B": shape_summary(q_cfg).quantizable_elements},
    {"format": f"int4 weights (CPU int4pack, groups of {'/'.join(map(str, group_sizes))})",
     "what is counted": "packed uint8 storage", "measured B": q4["packed_bytes"], "predicted B": q4["elements"] // 2},
    {"format": "int4 scales and zeros (torch's CPU layout)", "what is counted": "bf16 tensors' storage",
     "measured B": q4["scale_zero_bytes"], "predicted B": sum(4 * n * k // g for n, k, g in q4["layers"])},
])
quant_meas["fp32 B of the same weights"] = q4["float_bytes"]
ch.record_ledger(pd.DataFrame({"experiment": f"{q_cfg.name} quantised Linear weights (CPU kernels)",
                               "component": quant_meas["format"], "unit": "bytes",
                               "predicted": quant_meas["predicted B"], "measured": quant_meas["measured B"]}))
print(f"the estimator's int4 layout (fp16 scale + 4-bit zero per group of 128) would keep "
      f"{sum(2.5 * n * k / 128 for n, k, _ in q4['layers']):,.0f} B of scales for these matrices at groups of 128; "
      f"{q8['quantized_layers']} int8 layers; int4: largest relative error of one bf16 matmul per layer "
      f"{q4['max_rel_error']:.1%} (4-bit quantisation error of random weights, not a kernel fault)")
quant_meas

# %%
lo8, hi8, lo4, hi4 = ratios["int8"].min(), ratios["int8"].max(), ratios["int4"].min(), ratios["int4"].max()
quant_verdict = ("holds" if lo8 >= 2 and hi4 <= 4 and lo4 >= 2 else "holds with a qualification"
                 if lo8 >= 1.5 and lo4 >= 2 else "does not hold")
Markdown(
    f"**Seed 000's \"2-4× smaller\": {quant_verdict}** (computed from the table above). Against 16-bit weights int8 "
    f"gives {lo8:.2f}-{hi8:.2f}× and int4 {lo4:.2f}-{hi4:.2f}×: both fall short of 2× and 4× by what stays in 16 "
    f"bits (scales, norms and above all the embedding and LM head; {ratios['int4'].idxmin()}'s vocabulary gives "
    f"the lowest int4 ratio). Against fp32 the factors double. int4 pays off most in decode, where section 4's "
    f"bound is bytes read; prefill is compute-bound, and a kernel that dequantises int4 to bf16 before the matmul "
    f"does not make it faster.")

# %% [markdown]
# ## 6. PagedAttention: the share of reserved KV memory in use
#
# A serving engine that keeps each request's cache in one contiguous slot must reserve it before the output
# length is known. The vLLM paper [kwon2023] compares reserving the maximum (2048 tokens), the true length
# rounded up to a power of two, the exact length (an oracle), and paging in 16-token blocks. Computed here for
# 1,000 synthetic, seeded requests (lognormal prompt and output lengths), two ways:
#
# - `used_share` **at completion**: each request's final length over what it reserved (`memlab.predict.paging.
#   kv_waste`): only the over-reservation;
# - **during serving**, the paper's measure: the time-averaged share of reserved slots holding a token while the
#   requests decode, one token per step (`memlab.labs.inference.serving_occupancy`). A contiguous slot is
#   reserved at admission, so even the oracle's slot is mostly empty early in a request's life; paging allocates a
#   block only when the last one fills. Not modelled: queueing, preemption and the external fragmentation between
#   slots, which lower the contiguous policies' figures further.

# %%
reqs = synthetic_request_lengths(1000, seed=ch.seed, max_len=2048)
waste = pd.DataFrame(kv_waste(reqs["total"], max_len=2048, block_tokens=16))
kv_token = kv_cache_bytes(preset("llama-3-8b"), 1, 1, "bf16")
h100 = gpu("h100-sxm")
budget = h100.memory_bytes - estimate(preset("llama-3-8b"), Setup(mode="inference", batch=1, seq=1)).params_bytes
waste[f"llama-3-8b requests in one {h100.name} after the weights"] = [
    int(budget // (kv_token * reserved_tokens(reqs["total"], p, max_len=2048).mean())) for p in waste["policy"]]
waste["in use during serving (time-averaged)"] = [
    inference.serving_occupancy(reqs["prompt"], reqs["output"], p, max_len=2048, block_tokens=16)
    for p in waste["policy"]]
ch.save_table(waste, "paged_waste")
print(f"mean request {reqs['total'].mean():.0f} tokens (prompt {reqs['prompt'].mean():.0f}, output "
      f"{reqs['output'].mean():.0f}); longest {reqs['total'].max()}")
as_percent(waste[["policy", "reserved_tokens", "used_share", "in use during serving (time-averaged)",
                  waste.columns[-2]]], ["used_share", "in use during serving (time-averaged)"], 1)

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), layout="constrained")
axes[0].hist(reqs["total"], bins=60, color="C0")
axes[0].set_xlabel("request length (prompt + output tokens)")
axes[0].set_ylabel("requests")
axes[0].set_title("synthetic request mix (seeded)")
xp = np.arange(len(waste))
axes[1].bar(xp - 0.2, waste["used_share"] * 100, 0.4, label="at completion")
axes[1].bar(xp + 0.2, waste["in use during serving (time-averaged)"] * 100, 0.4, label="during serving (paper's)")
axes[1].set(xticks=xp, xticklabels=waste["policy"], ylabel="reserved KV memory in use (%)",
            title="KV memory holding real tokens, per policy")
axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
ch.save_figure(fig, "paged_attention")

# %%
occ = waste.set_index("policy")["in use during serving (time-averaged)"]
paged_verdict = "holds" if occ["paged"] > occ.drop("paged").max() else "does not hold"
Markdown(
    f"**Seed 000's \"PagedAttention reduces KV-cache waste\": {paged_verdict}** (computed). During serving, paging "
    f"keeps {occ['paged']:.1%} of its reserved KV memory in use; contiguous slots keep {occ['max']:.1%} (max_len), "
    f"{occ['pow2']:.1%} (power of two) and even the oracle only {occ['oracle']:.1%}, although the oracle's "
    f"at-completion share is 100 %. Evidence from outside memlab: the vLLM paper measured 20.4-38.2 % of KV memory "
    f"holding tokens in the systems it profiled (Orca with an oracle: 38.2 %) and about 96 % in vLLM (its Fig. 2) "
    f"[kwon2023]. This chapter's figures are higher than the paper's contiguous ones because it models no "
    f"external fragmentation and no queueing; the ordering and paging's near-full pool agree.")

# %% [markdown]
# ## 7. Mixture of experts: resident vs active
#
# `TransformerConfig(n_experts=..., top_k=..., n_shared_experts=...)` describes a mixture of experts:
# `param_count()` counts every expert, `active_param_count()` the ones a token runs through.

# %%
mix = preset("mixtral-8x7b")
moe_table = pd.DataFrame({
    "parameters (B)": [mix.param_count() / 1e9, mix.active_param_count() / 1e9],
    "bf16 weight memory GiB": [estimate(mix, Setup(mode="inference", batch=1, seq=1)).params_bytes / GiB,
                               2 * mix.active_param_count() / GiB],
    "forward GFLOP / token (seq 1)": [forward_flops(mix.with_(n_experts=8, top_k=8), 1, 1) / 1e9,
                                      forward_flops(mix, 1, 1) / 1e9]},
    index=["all 8 experts (what is resident)", "top-2 experts (what one token uses)"])
moe_table.round(2)

# %% [markdown]
# The measured twin: the reference GPT with an MoE MLP (`tiny-moe`: 8 experts, top-2, one shared expert), its
# resident bytes, the FLOPs torch counts for a forward, and how many tokens of one batch each expert received.

# %%
moe = preset("tiny-moe")
torch.manual_seed(ch.seed)
moe_model = GPT(moe).eval()
idx = token_ids(moe.vocab_size, 4, 64, seed=ch.seed)
resident = model_states(moe_model).params_bytes
counted = count_flops(lambda: moe_model(idx))
load = inference.expert_load(moe_model, idx)
moe_meas = pd.Series({"resident weight bytes (measured)": resident,
                      "all parameters x 4 B (predicted)": 4 * moe.param_count(),
                      "active parameters x 4 B": 4 * moe.active_param_count(),
                      "forward FLOPs counted": counted,
                      "forward FLOPs predicted (active)": forward_flops(moe, 4, 64),
                      "experts that received tokens, per layer": int((load > 0).sum(1).min())}).to_frame(moe.name)
ch.record_ledger(pd.DataFrame([
    {"experiment": f"{moe.name} forward b4x64", "component": "params (all experts resident)", "unit": "bytes",
     "predicted": 4 * moe.param_count(), "measured": resident},
    {"experiment": f"{moe.name} forward b4x64", "component": "forward FLOPs (active experts)", "unit": "FLOPs",
     "predicted": forward_flops(moe, 4, 64), "measured": counted}]))
moe_meas

# %% [markdown]
# **What a step reads.** Resident is every expert. What a step *reads* depends on how many tokens it routes: for
# uniform, independent top-k routing over n experts, an expert receives none of T tokens with probability
# ((n − k) / n)^T (`memlab.labs.inference.experts_idle_share`). The measured twin routes 1 to 256 tokens
# through `tiny-moe`'s router at its random initialisation (not exactly uniform, so it can differ from the
# formula):

# %%
idle = []
for t in (1, 2, 4, 8, 16, 32, 256):
    row = {"tokens in the step": t,
           "experts idle, uniform routing (%)": 100 * inference.experts_idle_share(moe.n_experts, moe.top_k, t),
           f"{mix.name}: expert bytes read / resident (uniform, %)":
               100 * (1 - inference.experts_idle_share(mix.n_experts, mix.top_k, t))}
    counts = inference.expert_load(moe_model, token_ids(moe.vocab_size, 1, t, seed=ch.seed))
    row[f"{moe.name}: experts idle, measured (mean over layers, %)"] = 100 * float((counts == 0).float().mean())
    idle.append(row)
idle = pd.DataFrame(idle)
ch.save_table(idle, "experts_idle")
idle.round(1)

# %%
idle_1 = inference.experts_idle_share(mix.n_experts, mix.top_k, 1)
idle_256_exp = int(np.floor(np.log10(inference.experts_idle_share(mix.n_experts, mix.top_k, 256)))) + 1
moe_verdict = "does not hold" if inference.experts_idle_share(mix.n_experts, mix.top_k, 256) < 0.01 else "holds"
Markdown(
    f"**Seed 000's \"a forward loads only the active experts\": {moe_verdict} for what is resident, and holds for "
    f"what batch-1 decode reads** (computed). Every expert is resident: the measured bytes of section 7 are all "
    f"of them, and prefill or a large batch routes tokens to every expert (at 256 tokens the chance an expert is "
    f"idle is ({mix.n_experts - mix.top_k}/{mix.n_experts})^256, below 10^{idle_256_exp}). At batch-1 decode a "
    f"token uses {mix.top_k} of {mix.n_experts} experts per layer, so {idle_1:.0%} of the expert weights are idle "
    f"and a step reads about {mix.active_param_count() / 1e9:.1f} B of {mix.param_count() / 1e9:.1f} B parameters: "
    f"that is why Mixtral decodes at about the speed of a 13B dense model when bandwidth-bound [jiang2024], and why "
    f"keeping idle experts in host memory with an LRU cache works for small-batch decode [eliseev2023]. By 16 "
    f"tokens per step only {100 * inference.experts_idle_share(mix.n_experts, mix.top_k, 16):.1f} % of experts are "
    f"idle.")

# %%
recorded = ch.recorded("10_inference_gpu")
recorded if recorded is not None else Markdown(
    "**GPU evidence.** No GPU run of this chapter is recorded in `data/recorded/`. The GPU figures on this page "
    "are section 4's roofline bound (predicted from the datasheet), the vLLM paper's measured KV occupancy "
    "(section 6) and the published measurements below; the CPU times of section 2 are not GPU evidence.")

# %%
ch.published("10")

# %% [markdown]
# ## Exercises
#
# **Exercise 2.** Every expert of a mixture is resident. How many L4 cards (memlab's table), at the fewest, does
# Mixtral-8x7B need just to hold its bf16 weights, split across them (tensor parallelism)?

# %%
answer = ...
check("10.mixtral-cards", answer, model="mixtral-8x7b", card="l4")

# %% [markdown]
# **Exercise 3.** Under the power-of-two reservation policy of section 6, what share of one 1,100-token
# request's reservation, in %, holds no token?

# %%
answer = ...
check("10.pow2-empty", answer, tokens=1100, policy="pow2")

# %% [markdown]
# **Exercise 4.** On one H200 SXM (memlab's table), how many sequences of 8,192 tokens can a serving engine hold
# for Llama-3-8B (bf16 weights and cache, weights + KV only)?

# %%
answer = ...
check("10.llama3-h200-8k", answer, model="llama-3-8b", card="h200-sxm", tokens=8192)

# %% [markdown]
# ## Summary
#
# - Inference memory is weights + KV cache + a transient; the KV cache is 2 × layers × KV heads × head_dim ×
#   bytes per token and grows linearly with context × users. On the reference GPT the preallocated cache matches
#   the formula's bytes: a bookkeeping check (the model allocates the shape the formula describes), not an
#   independent measurement. GQA divides it by n_heads / n_kv_heads.
# - A plain forward with eager attention is limited by its score matrix and the logits of every position;
#   `generate()` keeps the last position's logits, and with SDPA weights + KV + a block's MLP is its lower bound:
#   its dynamic cache grows by `torch.cat` (transient copies, allocator fragmentation), a batch is padded to its
#   longest prompt with a 4-D mask, and unlike an engine nothing is paged or reused.
#   vLLM's pool is 0.9 of the card minus the weights and a profiled activation peak, in blocks of 16 tokens:
#   section 3 answers "32 users?" with it, and `serving_table` gives the largest batch per context.
# - Decode reads every weight and the whole cache per step: time per token ≥ bytes / bandwidth until the batch
#   approaches the ridge point; long contexts keep it memory-bound (section 4, predicted).
# - int8 (element count) and int4 (packed storage, torch's CPU kernels) were run on the CPU; against bf16 the
#   savings fall short of 2× and 4× by the unquantised embeddings, head and scales.
# - PagedAttention keeps nearly all of its pool in use during serving; contiguous slots, even the oracle's, do
#   not (time-averaged occupancy, the paper's measure).
# - Mixture of experts: every expert is resident; a large batch reads them all, batch-1 decode reads the active
#   ones only.

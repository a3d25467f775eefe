# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 09 · Inference: weights, the KV cache, quantised weights and experts
#
# **The common beliefs.** Seed 000 (`[seed-000]`) lists INT8/INT4 weights ("parameter memory 2-4× smaller") and
# PagedAttention ("paging, like virtual memory, reduces KV-cache fragmentation") among the fixes, says the KV
# cache "grows linearly with the number of concurrent users", and corrects a misreading about mixture-of-experts
# models with another: "what one forward pass actually loads into GPU memory is the active experts plus the
# shared layers".
#
# This chapter serves the reference GPT with its KV cache and measures, then scales the same formulas up:
#
# 1. the formula: weights + KV cache (GQA vs MHA) + the prefill's transient;
# 2. the experiment: prefill and decode on the reference GPT, KV bytes against context and batch, tokens/s;
# 3. "will model M serve N users at context C on GPU G?", for real presets and cards;
# 4. int8 and int4 weights: measured int8 on the CPU, int4 predicted;
# 5. PagedAttention: what contiguous reservations waste, for a synthetic request mix [kwon2023];
# 6. mixture of experts: every expert resident, FLOPs follow the active ones.

# %% tags=["parameters"]
scale = "auto"
device = "auto"
seed = 0
out_dir = "../reports/build/09_inference"

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from memlab import (
    GPT,
    Setup,
    chapter,
    check,
    count_flops,
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
    shape_summary,
    synthetic_request_lengths,
    token_ids,
)
from memlab.labs import inference
from memlab.units import GiB, MiB

ch = chapter(scale, device, seed, out_dir)
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
# 2 × n_layers × n_kv_heads × head_dim × bytes per token (`memlab.predict.inference.kv_cache_bytes`). Grouped-query
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
check("09.tiny-kv", answer)

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
phase = rows.groupby("model", sort=False)[["prefill s", "decode s/token"]].mean()
phase.plot.bar(ax=axes[1], rot=0, logy=True)
axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
axes[1].set_ylabel("seconds (log)")
axes[1].set_title(f"prefill vs one decode step, on {served[0][1].device_name}")
ch.save_figure(fig, "kv_growth_and_phases")

# %% [markdown]
# ## 3. Will model M serve N users at context C on GPU G?
#
# Two answers for bf16 weights and cache, 32 users at 4096 tokens each. A serving engine sizes its KV pool from
# what the weights leave and computes prefill logits for the last token only: weights + KV cache decide
# (`memlab.predict.paging.max_sequences`). The estimator's full `max_batch` adds the largest transient of a
# full-prompt forward, here the fp32 logits of every prompt token at once (what a plain Hugging Face forward
# makes): that transient, not the cache, is what limits a naive server. The measured small-scale twin is section 2.

# %%
cards = ["l4", "a100-80gb-sxm", "h100-sxm", "h200-sxm"]
users, context = 32, 4096
serve = []
for name in ["llama-2-7b", "llama-3-8b", "mistral-7b", "mixtral-8x7b", "llama-2-70b"]:
    cfg = preset(name)
    s = Setup(mode="inference", batch=1, seq=context)
    row = {"model": name, "weights GiB": estimate(cfg, s).params_bytes / GiB}
    for card in cards:
        n = max_sequences(cfg, gpu(card).memory_bytes, context)
        row[card] = f"{'yes' if n >= users else 'no'}: {n} ({max_batch(cfg, s, card).value} naive)"
    serve.append(row)
serve = pd.DataFrame(serve)
ch.save_table(serve, "serve_table")
print(f"{users} users x {context} tokens? cells: fits, then most users (weights + KV), then (naive full-prompt "
      "forward, estimator's max_batch)")
serve

# %% [markdown]
# GQA is the difference between rows: Llama-2-7B (32 KV heads) needs four times the cache of Llama-3-8B or
# Mistral-7B (8 KV heads) per token, so it serves far fewer users on the same card. Mixtral and Llama-2-70B do
# not fit most single cards at all; they need tensor parallelism (`Setup(tp=...)`).

# %% [markdown]
# ## 4. int8 and int4 weights
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
quant.pivot_table(index="model", columns="weights", values="bf16 / this", sort=False).round(2)

# %% [markdown]
# Measured: torch's own dynamic int8 quantisation of every `nn.Linear` of the reference GPT
# (`memlab.labs.inference.int8_linear_bytes`), its packed int8 bytes next to the estimator's count of the same
# matrices. int4 has no CPU kernel in torch: it stays predicted.

# %%
q_cfg = preset("tiny-gpt")  # at both scales: the measurement builds the model in this process
q = inference.int8_linear_bytes(GPT(q_cfg))
pd.Series({"int8 weight bytes, measured": q["int8_weight_bytes"],
           "int8 weight bytes, predicted": shape_summary(q_cfg).quantizable_elements,
           "fp32 bytes before": q["float_bytes_before"],
           "left in float (embeddings, norms, head)": q["float_param_bytes"],
           "quantised layers": q["quantized_layers"]}).to_frame(f"{q_cfg.name}")

# %% [markdown]
# Seed 000's "2-4× smaller" holds with a qualification: against 16-bit weights int8 gives a little under 2×, and
# int4 falls short of 4× by as much as the model's unquantised part weighs (scales, norms, and above all the
# embedding and LM head: Llama-3's untied 128k-row vocabulary keeps its ratio near 3×); against fp32 the factors
# double.

# %% [markdown]
# ## 5. PagedAttention: what contiguous reservations waste
#
# A serving engine that keeps each request's cache in one contiguous slot must reserve it before the output
# length is known. The vLLM paper [kwon2023] compares reserving the maximum (2048 tokens), the true length
# rounded up to a power of two, the exact length (an oracle), and paging in 16-token blocks. Computed here for
# 1,000 synthetic, seeded requests (lognormal prompt and output lengths):

# %%
reqs = synthetic_request_lengths(1000, seed=ch.seed, max_len=2048)
waste = pd.DataFrame(kv_waste(reqs["total"], max_len=2048, block_tokens=16))
kv_token = kv_cache_bytes(preset("llama-3-8b"), 1, 1, "bf16")
h100 = gpu("h100-sxm")
budget = h100.memory_bytes - estimate(preset("llama-3-8b"), Setup(mode="inference", batch=1, seq=1)).params_bytes
waste[f"llama-3-8b requests in one {h100.name} after the weights"] = [
    int(budget // (kv_token * reserved_tokens(reqs["total"], p, max_len=2048).mean())) for p in waste["policy"]]
ch.save_table(waste, "paged_waste")
print(f"mean request {reqs['total'].mean():.0f} tokens (prompt {reqs['prompt'].mean():.0f}, output "
      f"{reqs['output'].mean():.0f}); longest {reqs['total'].max()}")
waste.round(3)

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), layout="constrained")
axes[0].hist(reqs["total"], bins=60, color="C0")
axes[0].set_xlabel("request length (prompt + output tokens)")
axes[0].set_ylabel("requests")
axes[0].set_title("synthetic request mix (seeded)")
axes[1].bar(waste["policy"], waste["used_share"] * 100)
axes[1].set_ylabel("reserved KV memory in use (%)")
axes[1].set_title("KV memory holding real tokens, per policy")
ch.save_figure(fig, "paged_attention")

# %% [markdown]
# With paging, waste is less than one block per request; reserving the maximum leaves most of the cache empty.
# Seed 000's "PagedAttention reduces KV-cache fragmentation" holds, and it is the reservation, not only the
# fragmentation, that paging removes. (The same vLLM paper profiles 20-38 % useful KV memory in earlier systems,
# its Fig. 2; the fractions above come from this chapter's synthetic mix.)

# %% [markdown]
# ## 6. Mixture of experts: resident vs active
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
# **The misreading.** "A forward loads only the active experts" (seed 000) does not hold: every expert is
# resident (the measured bytes are all of them), and in a batch of a few hundred tokens every expert receives
# tokens, so every expert's weights are read at every step. What follows the active experts is the work per
# token, not the memory. Offloading idle experts is possible only when a whole step leaves an expert unused.

# %%
recorded = ch.recorded("09_inference_gpu")
recorded if recorded is not None else "No GPU measurements for this chapter are recorded in data/recorded/ yet."

# %% [markdown]
# ## Exercises
#
# **Exercise 2.** Every expert of a mixture is resident. How many L4 cards (memlab's table), at the fewest, does
# Mixtral-8x7B need just to hold its bf16 weights, split across them (tensor parallelism)?

# %%
answer = ...
check("09.mixtral-cards", answer, model="mixtral-8x7b", card="l4")

# %% [markdown]
# **Exercise 3.** Under the power-of-two reservation policy of section 5, what share of one 1,100-token
# request's reservation, in %, holds no token?

# %%
answer = ...
check("09.pow2-empty", answer, tokens=1100, policy="pow2")

# %% [markdown]
# **Exercise 4.** On one H200 SXM (memlab's table), how many sequences of 8,192 tokens can a serving engine hold
# for Llama-3-8B (bf16 weights and cache, weights + KV only)?

# %%
answer = ...
check("09.llama3-h200-8k", answer, model="llama-3-8b", card="h200-sxm", tokens=8192)

# %% [markdown]
# ## Summary
#
# - Inference memory is weights + KV cache + a transient; the KV cache is 2 × layers × KV heads × head_dim ×
#   bytes per token and grows linearly with context × users, as measured byte for byte on the reference GPT.
#   GQA divides it by n_heads / n_kv_heads.
# - int8 weights were measured on the CPU (torch's dynamic quantisation, matching the estimator's count); against
#   bf16, int8 saves a little under 2× and int4 between about 3× and 4×, less for large vocabularies: seed 000's
#   "2-4×" holds against 16-bit weights, with the embeddings and head as the qualification.
# - PagedAttention: for a synthetic heavy-tailed request mix, reserving max_len leaves most of the KV memory
#   empty; paging wastes under one block per request (seed 000 holds, computed).
# - Mixture of experts: every expert is resident and, in a batch, every expert is read; FLOPs follow the active
#   experts. Seed 000's "only the active experts are loaded" does not hold.

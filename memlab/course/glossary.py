"""The course's one glossary: every jargon term of the chapters, defined once, and linked at its first use.

:data:`GLOSSARY` holds the terms (name, definition, the patterns that find it in a chapter's prose).
:func:`link_first_uses` is a build step over the executed notebooks' markdown: the first use of each term in a
chapter becomes a link to its entry (a ``{term}`` role), so the notebooks a learner opens in JupyterLab stay plain.
Code (fenced or inline), headings, links and roles are never rewritten. Definitions are memlab's own words; the
formulas they mention carry their source key (see ``memlab/SOURCES.md``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

GLOSSARY_DOC = "glossary"
"""The glossary page's document name in the book (``glossary.md``)."""


@dataclass(frozen=True)
class Term:
    """One glossary entry. ``patterns``: regexes (case-sensitive) that find a use of the term in prose; empty
    means the name itself as a whole word."""

    name: str
    definition: str
    patterns: tuple[str, ...] = ()

    @property
    def regex(self) -> re.Pattern[str]:
        """One pattern matching any use of the term."""
        parts = self.patterns or (re.escape(self.name),)
        return re.compile("|".join(rf"(?<![\w`-])(?:{p})(?![\w`])" for p in parts))


_SYMBOL = r"(?= ?=| the \w)"
"""A shape letter counts as used where a chapter sets it (``s = 2048``) or names it (``s the sequence length``)."""

GLOSSARY: tuple[Term, ...] = (
    Term("s", "Sequence length: the number of tokens in one training sample (or in the context, for inference).",
         (r"s" + _SYMBOL,)),
    Term("b", "Batch size: the number of sequences processed in one step (per device, unless said otherwise).",
         (r"b" + _SYMBOL,)),
    Term("h", "Hidden size: the width of the residual stream, the length of each token's vector between blocks.",
         (r"h" + _SYMBOL,)),
    Term("a", "Number of attention heads.", (r"a" + _SYMBOL,)),
    Term("L", "Number of layers (transformer blocks).", (r"L" + _SYMBOL,)),
    Term("V", "Vocabulary size: the number of rows of the embedding table and columns of the output layer.",
         (r"V" + _SYMBOL,)),
    Term("activations", "The tensors a forward pass saves for the backward pass (inputs of matmuls, norms, "
         "attention probabilities, dropout masks); they grow with batch size and sequence length."),
    Term("optimizer state", "What the optimizer keeps per parameter between steps: Adam's two moments (8 bytes per "
         "parameter in fp32); created at the first step.", (r"optimizer states?",)),
    Term("master weights", "An fp32 copy of 16-bit weights, kept by the optimizer so that small updates are not "
         "rounded away.", (r"master (?:weights|copy)", r"fp32 master")),
    Term("bf16", "bfloat16: a 16-bit float with fp32's exponent range and 8 bits of precision; needs no loss "
         "scaling."),
    Term("fp16", "IEEE half precision: 16 bits, 11 of precision and a small exponent range, so small gradients "
         "underflow without loss scaling."),
    Term("autocast", "PyTorch's automatic mixed precision (AMP): inside the context, chosen ops (matmuls) run in "
         "16 bits on 16-bit copies of fp32 weights, which are kept until backward.", (r"autocast", r"AMP")),
    Term("GradScaler", "Multiplies the loss by a scale before backward so fp16 gradients do not underflow, and "
         "divides it out before the step; the scale shrinks on overflow and grows back."),
    Term("foreach", "A PyTorch optimizer implementation that updates all parameters with one multi-tensor kernel per "
         "operation; fast, but its scratch tensors are sized like all parameters at once (the default on CUDA)."),
    Term("GiB", f"Gibibyte, 2³⁰ = {2**30:,} bytes (MiB: 2²⁰, KiB: 2¹⁰); what PyTorch and nvidia-smi print as "
         f"'GB' or 'MiB'. 80 GB is {80e9 / 2**30:.1f} GiB.", (r"[GMK]iB",)),
    Term("GB", f"Gigabyte, 10⁹ bytes: the unit of datasheets. 1 GiB is {2**30 / 1e9:.3f} GB.", (r"GB",)),
    Term("HBM", "High-bandwidth memory: DRAM stacked beside the GPU die on a very wide interface (TB/s)."),
    Term("DRAM", "Dynamic RAM: main memory (DDR on a host, HBM or GDDR on a GPU), far slower than on-chip caches."),
    Term("OOM", "Out of memory: an allocation the device cannot satisfy; PyTorch raises "
         "``torch.OutOfMemoryError`` with a message naming the sizes involved."),
    Term("caching allocator", "PyTorch's CUDA memory manager: it keeps freed blocks reserved for reuse instead of "
         "returning them to the driver, so 'reserved' is at least 'allocated'.", (r"caching allocator",)),
    Term("segment", "(allocator) one region the caching allocator obtained from the driver with ``cudaMalloc``, "
         "split into blocks; (checkpointing) a run of consecutive transformer blocks recomputed together.",
         (r"segments?",)),
    Term("block", "(allocator) a piece of a segment handed out for one tensor or kept free for reuse; (model) one "
         "transformer layer: attention plus MLP, with their norms.", (r"blocks?",)),
    Term("pool", "(allocator) the caching allocator's sets of free blocks, one for small (≤ 1 MiB) and one for "
         "large requests; a request is served from its pool before new memory is reserved.", (r"pools?",)),
    Term("reserved", "Bytes the caching allocator holds from the driver (``torch.cuda.memory_reserved``): the "
         "allocated bytes plus cached free blocks. What nvidia-smi sees of PyTorch, besides the CUDA context.",
         (r"reserved(?= (?:bytes|memory|but))",)),
    Term("allocated", "Bytes of live tensors (``torch.cuda.memory_allocated``), rounded up to the allocator's block "
         "sizes.", (r"allocated(?= (?:bytes|memory))",)),
    Term("expandable segments", "The caching allocator's option (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``)"
         " to grow one segment by mapping more pages, so freed holes can be unmapped and fragmentation shrinks.",
         (r"expandable[_ ]segments(?::True)?",)),
    Term("fragmentation", "Free memory split into holes too small for a request: the sum is enough, no single hole "
         "is. Seen as reserved-but-unallocated bytes."),
    Term("checkpointing", "Activation (gradient) checkpointing: keep only some inputs in forward and recompute the "
         "rest during backward, trading FLOPs for memory.", (r"checkpointing", r"recomputation")),
    Term("selective recomputation", "Recomputing only the attention part (softmax, its dropout and the scores) in "
         "backward, the part that grows with s² [korthikanti2022].", (r"selective(?: recomputation)?",)),
    Term("non-reentrant", "torch.utils.checkpoint's recommended implementation (``use_reentrant=False``): it "
         "recomputes through saved-tensor hooks rather than a nested autograd call."),
    Term("SDPA", "torch.nn.functional.scaled_dot_product_attention: one fused call that picks a flash, "
         "memory-efficient or math kernel; the fused ones never store the s × s score matrix."),
    Term("FlashAttention", "An attention kernel that computes softmax(QKᵀ)V in tiles in fast on-chip memory, keeps "
         "only a per-row log-sum-exp for backward and recomputes the scores there [dao2022].",
         (r"FlashAttention", r"Flash Attention")),
    Term("log-sum-exp", "log Σ exp(xᵢ) per row of the scores: the one number per row a fused attention kernel saves "
         "so backward can rebuild the softmax."),
    Term("GQA", "Grouped-query attention: several query heads share one key/value head, so the KV cache shrinks by "
         "the group size.", (r"GQA", r"grouped-query attention")),
    Term("MHA", "Multi-head attention with one key/value head per query head (no sharing)."),
    Term("KV cache", "The keys and values of every past token, kept during generation so each new token attends "
         "without recomputing them; 2 · L · s · (KV heads · head size) · bytes per sequence."),
    Term("prefill", "The first inference pass over the whole prompt, which fills the KV cache."),
    Term("decode", "Inference after prefill: one token per step, reading all weights and the KV cache each time."),
    Term("PagedAttention", "vLLM's KV-cache layout in fixed-size pages, allocated as a sequence grows, so no memory "
         "is reserved for tokens that never come [kwon2023]."),
    Term("MoE", "Mixture of experts: layers with many MLPs (experts) of which a router picks a few per token; all "
         "experts are resident in memory, the FLOPs follow the active ones.", (r"MoE", r"mixture[- ]of[- ]experts")),
    Term("int8", "8-bit integer weights (with a scale per row or group): 1 byte per parameter instead of 2."),
    Term("int4", "4-bit integer weights packed two per byte, with group scales."),
    Term("DDP", "DistributedDataParallel: every rank holds the whole model and its states, and gradients are "
         "all-reduced after backward."),
    Term("ZeRO", "Zero Redundancy Optimizer: stage 1 shards the optimizer state over the data-parallel ranks, stage "
         "2 the gradients too, stage 3 the parameters too [rajbhandari2019].", (r"ZeRO(?:-[123])?",)),
    Term("FSDP", "Fully Sharded Data Parallel, PyTorch's ZeRO-3: parameters are sharded and all-gathered layer by "
         "layer around their use.", (r"FSDP2?",)),
    Term("all-reduce", "A collective that sums a tensor over all ranks and leaves the sum on every rank."),
    Term("all-gather", "A collective that concatenates every rank's shard so each rank holds the whole tensor."),
    Term("reduce-scatter", "A collective that sums over ranks and leaves each rank one shard of the sum."),
    Term("c10d", "PyTorch's distributed communication layer (process groups, collectives, the rendezvous)."),
    Term("torchrun", "PyTorch's launcher: starts one process per rank and sets up their rendezvous."),
    Term("NCCL", "NVIDIA's collective communication library, the backend for GPU ranks."),
    Term("gloo", "A collective communication backend that runs on CPUs."),
    Term("rank", "One process of a distributed job, numbered 0 to world size − 1.", (r"ranks?",)),
    Term("phase-aware estimate", "The largest of a step's phase peaks (forward, backward, optimizer step, with what "
         "each holds at once), as ``estimate(...).peak_bytes``: what decides whether a step fits, unlike the sum of "
         "components.", (r"phase-aware(?: estimate)?",)),
    Term("ledger", "A chapter's table of numbers side by side (predicted and measured, or a bound and an achieved "
         "value), one row per component and experiment; the build page summarises every chapter's."),
    Term("fake tensors", "Tensors under FakeTensorMode: shapes, dtypes and devices without storage, so a full-size "
         "step can be traced on a laptop.", (r"fake tensors?",)),
    Term("tensor core", "The matrix units of NVIDIA GPUs that give the datasheet's 16-bit (and lower) peak FLOP/s; "
         "they need suitably shaped and aligned matrices.", (r"[Tt]ensor cores?",)),
    Term("ridge point", "On a roofline, the arithmetic intensity where the bandwidth roof meets the compute roof: "
         "peak FLOP/s over bandwidth."),
    Term("micro-batch", "One slice of a batch processed at a time (gradient accumulation, pipeline stages).",
         (r"micro-batch(?:es)?",)),
    Term("offload", "Keeping optimizer states or parameters in host memory and moving them to the device when "
         "needed (ZeRO-Offload, FSDP's CPUOffloadPolicy).", (r"[Oo]ffload(?:ing)?",)),
    Term("KV heads", "The key/value heads of an attention layer; with GQA fewer than the query heads.",
         (r"KV heads?",)),
    Term("FLOP/s", "Floating-point operations per second; TFLOP/s is 10¹² of them.", (r"T?FLOP/s",)),
    Term("MFU", "Model FLOPs utilisation: the FLOP/s the model's own arithmetic needs at the achieved step time, over "
         "the device's dense peak FLOP/s [chowdhery2022]."),
    Term("HFU", "Hardware FLOPs utilisation: like MFU but counting the FLOPs actually executed, recomputation "
         "included; HFU ≥ MFU."),
    Term("roofline", "The bound min(peak FLOP/s, arithmetic intensity × memory bandwidth) on what an op can "
         "achieve [williams2009]."),
    Term("arithmetic intensity", "FLOPs per byte moved to or from memory; above the ridge point an op can be "
         "compute-bound, below it is memory-bound."),
    Term("dense peak", "The datasheet's FLOP/s for ordinary (dense) matrices; the larger 'sparse' figure assumes "
         "2:4 structured sparsity.", (r"dense peaks?", r"sparse peaks?")),
    Term("GPU-Util", "nvidia-smi's utilization.gpu: the fraction of time at least one kernel was running, not how "
         "much of the GPU it used."),
    Term("NVML", "NVIDIA Management Library: the driver's API behind nvidia-smi (memory used, utilisation)."),
    Term("RSS", "Resident set size: the physical memory a process holds, as the OS counts it."),
    Term("U_cap", "Seed 000's capacity utilisation: memory in use over memory on the card."),
    Term("U_bw", "Seed 000's bandwidth utilisation: bytes per second achieved over peak bandwidth."),
    Term("U_eff", "Seed 000's effective utilisation: the share of used memory that holds useful state."),
    Term("pipeline bubble", "In pipeline parallelism, the idle time while stages wait for the first micro-batches "
         "to arrive and the last to drain.", (r"pipeline bubbles?", r"bubbles?")),
    Term("FakeTensorMode", "A PyTorch mode in which tensors carry shapes and dtypes but no storage: a full-size step "
         "runs without allocating its memory."),
    Term("MemTracker", "PyTorch's tool that attributes memory to modules and categories during a step."),
    Term("seed article", "One of the three articles (in Chinese) the course grew from: seed 000, 001 and 004; see "
         "{doc}`seeds`.", (r"[Ss]eed articles?", r"[Ss]eeds? 00[014]")),
    Term("GEMV", "General matrix-vector product: one vector times a matrix (m = 1), about 2 FLOPs per matrix element "
         "read, so it is limited by memory bandwidth, not compute."),
    Term("cast cache", "Autocast's cache of the 16-bit copies it made of fp32 weights (``cache_enabled=True``, the "
         "default): a weight used twice is cast once, and the copies live until the outermost autocast context "
         "exits.", (r"cast cache",)),
    Term("op lists", "Autocast's per-device tables of which ops run in 16 bits (matmul, linear, conv, SDPA), which "
         "in fp32 (on CUDA softmax, log_softmax, layer_norm, losses), and which in the widest input dtype.",
         (r"op lists?",)),
    Term("broadcast", "A collective that copies one rank's tensor to every rank.", (r"broadcasts?",)),
    Term("bucket", "(DDP) a flat buffer into which DDP's reducer copies gradients to all-reduce them together "
         "(25 MiB by default); a second gradient copy unless ``gradient_as_bucket_view=True``.",
         (r"buckets?(?= |,|\.|:)",)),
    Term("max_split_size_mb", "A caching-allocator option (``PYTORCH_CUDA_ALLOC_CONF``): cached blocks at least this "
         "large are never split for a smaller request, which limits fragmentation of big blocks.",
         (r"max_split_size_mb",)),
    Term("MAMF", "Maximum achievable matmul FLOP/s: the best FLOP/s a sweep of matmul shapes reaches on a device, "
         "below the datasheet peak [bekman-mamf]."),
    Term("TF32", "TensorFloat-32: fp32 matmuls run on tensor cores with fp32's range and 10 bits of mantissa; off by "
         "default in PyTorch since 1.12 [pytorch-tf32]."),
    Term("occupancy", "(GPU) warps resident on an SM over the most it can hold, set by a kernel's registers, shared "
         "memory and block size; read with a kernel profiler.", (r"(?<!time )(?<!KV )(?<!averaged )occupancy",)),
    Term("wave quantisation", "A GEMM's output tiles run in waves of one tile per SM; a tile count just above a "
         "multiple of the SM count leaves most SMs idle in the last wave [nvidia-gemm-perf].",
         (r"[Ww]ave quantisation",)),
    Term("tile quantisation", "A matrix dimension that is not a multiple of the kernel's tile leaves the last tiles "
         "partly empty, work done on padding [nvidia-gemm-perf].", (r"[Tt]ile quantisation",)),
    Term("1F1B", "\"One forward, one backward\": a pipeline schedule in which each stage alternates a micro-batch's "
         "forward and another's backward once the pipeline is full; same bubble as GPipe, at most p micro-batches "
         "in flight [narayanan2021]."),
    Term("MBU", "Memory-bandwidth utilisation: bytes a decode step must read (weights + KV cache) over its time, "
         "over the peak bandwidth; the decode analogue of MFU [databricks2023]."),
    Term("continuous batching", "Iteration-level scheduling: a serving engine adds a request to the running batch at "
         "any decode step, as soon as another finishes [yu2022].", (r"[Cc]ontinuous batching",)),
    Term("chunked prefill", "Splitting a long prompt's prefill into fixed-size chunks run in the same steps as other "
         "requests' decodes [agrawal2023].", (r"[Cc]hunked prefill",)),
    Term("DCGM", "NVIDIA Data Center GPU Manager: samples hardware counters (SM activity, occupancy, tensor-pipe and "
         "DRAM activity) that nvidia-smi does not show [dcgm-prof]."),
    Term("FlashDecoding", "Attention for decode split along the KV sequence, so one query token's attention over a "
         "long cache runs on many SMs, then the partial results are merged [flash-decoding].", (r"Flash-?Decoding",)),
    Term("context parallelism", "Splitting one sequence's tokens over devices, attention exchanging K and V between "
         "them (Ring Attention [liu2023], DeepSpeed Ulysses [jacobs2023]).", (r"[Cc]ontext parallelism",)),
)
"""Every term the chapters use, defined once. Order is the glossary page's order."""


_PROTECTED = re.compile(
    r"(```.*?```|~~~.*?~~~|\{[a-z:-]+\}`[^`]*`|`[^`\n]*`|!?\[[^\]\n]*\]\([^)\n]*\)|<[^>\n]+>|^ {0,3}#[^\n]*"
    r"|^\s*\(\S+\)=\s*$|\$[^$\n]+\$)", re.S | re.M)
"""Markdown that is never rewritten: fenced and inline code, roles, links and images, HTML tags, headings, MyST
targets and inline math."""


def prose_pieces(text: str) -> Iterator[tuple[bool, str]]:
    """``text`` cut into ``(is_prose, piece)`` pieces; only prose pieces may be rewritten."""
    pos = 0
    for m in _PROTECTED.finditer(text):
        if m.start() > pos:
            yield True, text[pos:m.start()]
        yield False, m.group(0)
        pos = m.end()
    if pos < len(text):
        yield True, text[pos:]


def prose(text: str) -> str:
    """Only the prose of ``text`` (protected pieces replaced by a space)."""
    return "".join(piece if ok else " " for ok, piece in prose_pieces(text))


def _role(shown: str, term: Term) -> str:
    return f"{{term}}`{shown} <{term.name}>`"


def link_first_uses(markdown_cells: list[str], terms: tuple[Term, ...] = GLOSSARY) -> list[str]:
    """The cells' markdown with the first use of each term (in cell order) linked to its glossary entry."""
    seen: set[str] = set()
    out = []
    for text in markdown_cells:
        pieces = []
        for is_prose, piece in prose_pieces(text):
            if is_prose:
                piece = _link_piece(piece, terms, seen)
            pieces.append(piece)
        out.append("".join(pieces))
    return out


def _link_piece(piece: str, terms: tuple[Term, ...], seen: set[str]) -> str:
    """One prose piece with the first use of each not-yet-seen term linked (earliest match first, no overlaps)."""
    hits = []
    for term in terms:
        if term.name in seen:
            continue
        m = term.regex.search(piece)
        if m:
            hits.append((m.start(), m.end(), term))
    result, pos = [], 0
    for start, end, term in sorted(hits, key=lambda h: (h[0], -h[1])):
        if start < pos or term.name in seen:
            continue  # overlaps a longer term linked already; its next use is found in a later piece or cell
        result += [piece[pos:start], _role(piece[start:end], term)]
        seen.add(term.name)
        pos = end
    return "".join(result) + piece[pos:]


def first_uses(markdown_cells: list[str], terms: tuple[Term, ...] = GLOSSARY) -> dict[str, str]:
    """Term name -> the text of its first use in the cells' prose (unlinked), for every term a chapter uses."""
    found: dict[str, tuple[int, int, str]] = {}
    for i, text in enumerate(markdown_cells):
        body = prose(text)
        for term in terms:
            m = term.regex.search(body)
            if m and term.name not in found:
                found[term.name] = (i, m.start(), m.group(0))
    return {name: hit[2] for name, hit in found.items()}


def linked_terms(markdown: str) -> list[str]:
    """The term names ``{term}`` roles in ``markdown`` link to, in order."""
    return [m.group(2) or m.group(1) for m in re.finditer(r"\{term\}`([^`<]*?)(?:\s*<([^>]+)>)?`", markdown)]


def glossary_markdown(terms: tuple[Term, ...] = GLOSSARY) -> str:
    """The glossary page (MyST markdown, Sphinx's ``glossary`` directive): one entry per term, sorted."""
    from memlab.course.bibliography import link_citations

    lines = ["# Glossary", "", "Every term the chapters use, defined once. A chapter links each term at its first "
             "use; this page is in the sidebar for the rest.", "", "```{glossary}", ":sorted:", ""]
    for term in terms:
        lines += [term.name, f"  {link_citations(term.definition)}", ""]
    return "\n".join([*lines, "```", ""])

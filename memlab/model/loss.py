"""The language-model loss: LM head + cross-entropy, plain, chunked or fused (Liger-style), on the last N positions.

At a modern vocabulary the loss is where a step's memory spikes: the logits are ``t x V`` (tokens x vocabulary) and
Hugging Face's ``ForCausalLMLoss`` (transformers/loss/loss_utils.py) upcasts them to fp32 before the cross-entropy,
whose log-softmax is another fp32 ``t x V`` tensor kept for backward. Three ways to compute the same loss:

- ``plain``: ``F.linear`` then ``cross_entropy(logits.float())``, as HF models and the reference GPT do.
- ``chunked``: the head and the loss over ``chunk`` tokens at a time, each chunk under non-reentrant activation
  checkpointing (``torch.utils.checkpoint``), so only the head's input is kept and one chunk's logits exist at a
  time, in forward and again (recomputed) in backward.
- ``fused``: a fused linear + cross-entropy after Liger-Kernel's ``LigerFusedLinearCrossEntropyFunction``
  [liger2024] (src/liger_kernel/ops/fused_linear_cross_entropy.py): in forward, chunk by chunk, the logits, the
  loss and the gradient of the logits, then the gradients of the head's input (``t x h``) and weight (``V x h``)
  accumulated at once; those two are what backward keeps (and scales by the incoming gradient). Liger's Triton
  kernel writes the logits' gradient in place over the 16-bit logits; this pure-torch reference (which runs on a
  CPU and under FakeTensorMode, so it can be measured and traced) upcasts each chunk to fp32, so its chunk
  transient is larger than Liger's: :mod:`memlab.predict.memory.activations` models this reference.

``call`` (``Setup.loss_call``): ``labels`` hands the labels to a transformers model, whose ``ForCausalLMLoss`` upcasts
the logits and shifts the labels; ``manual`` is the tutorial form, ``logits = model(input_ids).logits`` then
``F.cross_entropy(logits.view(-1, V), targets.view(-1))`` on the user's own next-token targets: no upcast (the
log-softmax is in the logits' dtype, or fp32 under autocast, whose CPU and CUDA lists both run cross_entropy in
fp32 [pytorch-amp]) and no shifted copy of the labels.

``keep`` (HF's ``logits_to_keep``): logits and loss for the last ``keep`` positions of each sequence only.
Chunks follow Liger's rule by default: ``next_pow2(ceil(t / ceil(V / h)))`` tokens, so a chunk's logits are about
as large as the head's input. Units: tokens, elements.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from memlab.errors import SetupError
from memlab.predict.memory.loss import chunk_tokens

LOSS_KINDS = ("plain", "chunked", "fused")
LOSS_CALLS = ("labels", "manual")


@dataclass(frozen=True)
class LossOptions:
    """How :func:`lm_loss` computes the loss: ``kind`` (plain, chunked, fused), ``chunk`` tokens per chunk (0:
    :func:`memlab.predict.memory.loss.chunk_tokens`), ``keep`` last positions per sequence (0: all), ``call`` how a
    transformers model's loss is called (module docstring; ``manual`` only with the plain loss on every position).
    From a Setup: :meth:`of`."""

    kind: str = "plain"
    chunk: int = 0
    keep: int = 0
    call: str = "labels"

    def __post_init__(self) -> None:
        if self.kind not in LOSS_KINDS:
            raise SetupError(f"loss must be one of {', '.join(LOSS_KINDS)}, got {self.kind!r}")
        if self.call not in LOSS_CALLS:
            raise SetupError(f"loss_call must be one of {', '.join(LOSS_CALLS)}, got {self.call!r}")
        if self.call == "manual" and (self.kind != "plain" or self.keep):
            raise SetupError("loss_call='manual' is the plain cross-entropy on every position's logits: use "
                             "loss='plain' without logits_to_keep")

    @classmethod
    def of(cls, setup: object) -> LossOptions:
        """The options of a :class:`memlab.predict.spec.setup.Setup` (its ``loss``, ``loss_chunk``,
        ``logits_to_keep``)."""
        return cls(getattr(setup, "loss", "plain"), getattr(setup, "loss_chunk", 0),
                   getattr(setup, "logits_to_keep", 0), getattr(setup, "loss_call", "labels"))


def _chunk_sum(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tgt: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy of one chunk (fp32 upcast as HF's loss does; targets of -100 ignored, as torch's)."""
    return F.cross_entropy(F.linear(x, weight, bias).float(), tgt, reduction="sum")


class FusedLinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``x @ weight.T + bias`` against ``tgt`` with the gradients computed in forward, chunk
    by chunk (Liger-Kernel's scheme [liger2024]); backward scales the kept gradients by the incoming one."""

    @staticmethod
    def forward(ctx, x, weight, bias, tgt, chunk, ignore_index=None):  # type: ignore[override]
        if ignore_index is not None:  # Hugging Face's shifted labels end in -100: mask them, divide by the rest
            valid = tgt != ignore_index
            n = valid.sum()
            tgt = tgt.masked_fill(~valid, 0)
        else:
            valid, n = None, x.shape[0]
        grad_x = torch.zeros_like(x)
        grad_w = torch.zeros_like(weight) if weight.requires_grad else None
        grad_b = torch.zeros_like(bias) if bias is not None and bias.requires_grad else None
        total = torch.zeros((), dtype=torch.float32, device=x.device)
        for start in range(0, x.shape[0], chunk):
            xc, tc = x[start:start + chunk], tgt[start:start + chunk, None]
            logp = torch.log_softmax(F.linear(xc, weight, bias).float(), dim=-1)  # the chunk's logits, fp32
            picked = logp.gather(1, tc)
            if valid is not None:
                picked = picked * valid[start:start + chunk, None]
            total.sub_(picked.sum())
            # d(mean CE)/d logits = (softmax - one_hot) / n, in place over the log-probabilities
            grad = logp.exp_().scatter_add_(1, tc, torch.full_like(tc, -1, dtype=logp.dtype)).div_(n)
            if valid is not None:
                grad.mul_(valid[start:start + chunk, None])
            del logp
            grad = grad.to(xc.dtype)
            torch.mm(grad, weight.to(grad.dtype), out=grad_x[start:start + chunk])
            if grad_w is not None:
                grad_w.addmm_(grad.t(), xc.to(grad_w.dtype))
            if grad_b is not None:
                grad_b.add_(grad.sum(0))
            del grad
        ctx.save_for_backward(grad_x, grad_w, grad_b)
        return total.div_(n)

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        # in place, as Liger's element_mul_kernel: the kept gradients are handed on, no copies
        grad_x, grad_w, grad_b = ctx.saved_tensors
        for g in (grad_x, grad_w, grad_b):
            if g is not None:
                g.mul_(grad_out.to(g.dtype))
        return grad_x, grad_w, grad_b, None, None, None


def logits_loss(logits: torch.Tensor, targets: torch.Tensor, *, upcast: bool = True) -> torch.Tensor:
    """The plain next-token loss on computed logits: cross-entropy of the fp32 logits, averaged over every token
    (the reference GPT's default; FSDP2 runs with the loss outside the model call it on the returned logits).
    ``upcast=False``: on the logits as they are (the tutorial's hand-written loss, ``Setup.loss_call='manual'``);
    targets of -100 are ignored either way (cross_entropy's default ``ignore_index``)."""
    return F.cross_entropy((logits.float() if upcast else logits).view(targets.numel(), -1), targets.reshape(-1))


def lm_loss(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
            options: LossOptions = LossOptions(), *, ignore_index: int | None = None) -> torch.Tensor:
    """Mean next-token cross-entropy of the LM head (``weight``: vocab x width, ``bias`` or None) over ``hidden``
    (batch, seq, width) against ``targets`` (batch, seq), computed as ``options`` says (module docstring).
    ``ignore_index``: a target value left out of the loss and of its mean (Hugging Face's -100); None: every
    target counts (the reference GPT's batches)."""
    b, s, h = hidden.shape
    if options.keep and options.keep < s:
        hidden, targets = hidden[:, s - options.keep:], targets[:, s - options.keep:]
        s = options.keep
    if options.kind == "plain":
        return logits_loss(F.linear(hidden, weight, bias), targets)
    x, tgt = hidden.reshape(b * s, h), targets.reshape(b * s)
    chunk = chunk_tokens(b * s, weight.shape[0], h, options.chunk)
    if options.kind == "fused":
        return FusedLinearCrossEntropy.apply(x, weight, bias, tgt, chunk, ignore_index)
    total = None
    for start in range(0, b * s, chunk):
        part = checkpoint(_chunk_sum, x[start:start + chunk], weight, bias, tgt[start:start + chunk],
                          use_reentrant=False)
        total = part if total is None else total + part
    return total / ((tgt != ignore_index).sum() if ignore_index is not None else b * s)


def hf_causal_lm_loss(model: torch.nn.Module, input_ids: torch.Tensor, labels: torch.Tensor,
                      options: LossOptions = LossOptions(), attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The loss of a transformers causal LM under ``options``: plain is the model's own (``model(input_ids,
    labels=...)``, and ``logits_to_keep=N`` with the last N labels); chunked and fused run the base model for the
    hidden states and :func:`lm_loss` over its output embeddings (the LM head), with the labels shifted as
    ``ForCausalLMLoss`` shifts them (padded with -100, which is ignored). ``attention_mask``: the (batch, seq)
    0/1 mask handed to the model (None: no mask, memlab's default call). ``options.call='manual'``: the model is
    called without labels and :func:`logits_loss` (no upcast) runs on its logits against the next-token targets,
    a fresh contiguous (batch, seq) tensor (ending in -100) as a user's data loader hands them."""
    extra = {} if attention_mask is None else {"attention_mask": attention_mask}
    if options.call == "manual":
        targets = torch.cat([labels[:, 1:], labels.new_full((labels.shape[0], 1), -100)], dim=1)
        return logits_loss(model(input_ids=input_ids, **extra).logits, targets, upcast=False)
    if options.kind == "plain":
        from memlab.model.hf import quiet_transformers

        with quiet_transformers():  # a class without a known loss_type (GPT-2's) logs that it uses ForCausalLMLoss
            if options.keep and options.keep < input_ids.shape[1]:
                return model(input_ids=input_ids, labels=labels[:, -options.keep:], logits_to_keep=options.keep,
                             **extra).loss
            return model(input_ids=input_ids, labels=labels, **extra).loss
    lm = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft's wrapper: the causal LM it
    out = lm.base_model(input_ids=input_ids, **extra)  # adapts in place, whose base model is the decoder
    hidden = out[0] if isinstance(out, tuple) else out.last_hidden_state
    head = lm.get_output_embeddings()
    shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]
    return lm_loss(hidden, head.weight, head.bias, shifted, options, ignore_index=-100)

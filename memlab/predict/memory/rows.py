"""The names of the saved-tensor rows that other code finds by name: one home, so a renamed row renames every match
(:mod:`memlab.predict.memory.activations` makes the rows; the phases, fine-tuning and the pipeline find these). No
torch."""

from __future__ import annotations


class RowName:
    """The names of the rows other code finds by name (the phases, fine-tuning, the pipeline): one home, so a
    renamed row renames every match."""

    INPUT_IDS = "input token ids"
    TARGET_IDS = "target token ids"
    POSITION_IDS = "position ids"
    LOSS_NORMALISER = "loss normaliser (total_weight)"
    HEAD_COPY = "16-bit copy of LM-head weight"
    HEAD_INPUT = "LM-head input"
    EMBEDDING_DROPOUT = "embedding dropout mask"
    LOG_SOFTMAX = "log-softmax of logits, fp32"
    ROTARY = "rotary cos and sin (one pair per forward and rope kind)"

"""compare: prediction next to measurement.

``ledger`` (formula, trace and measurement per component and phase; :func:`compare` for one pair), ``calculators``
(every public estimator run on the same runs; ``formulas``, the ones that are formulas; ``scoring``, each tool
scored only on what it claims: signed errors, scopes, held-out configs), ``sharding`` (data-parallel strategies
against the ranks' measurements), ``plots`` (the standard figures), ``agreement`` (the estimator against memlab's
trace over a seeded sample of the Setup space, phase by phase), ``titan`` (torchtitan's memory estimator as a peer
on the same FSDP2 setups, residuals named), ``parallel`` (TP, SP, PP, CP and ZeRO layouts of one model side by
side, per rank), ``pipeline`` (pipeline ranks run on a fake group and counted, against their prediction),
``parallel_ranks`` (pipeline and tensor-parallel ranks measured on gloo under torchrun), ``parallel_traces`` (TP,
TP + SP and ring-attention CP traced on fake groups rank by rank, residuals named), ``hf_draws`` (seeded
Hugging Face configs and calls of every family, one real step each, judged exact, refused or off), ``drift`` (the
canary of ``make upgrade-check``: every family, precision and attention, the traces, peft and bitsandbytes against
real steps under the installed releases, judged exact, drifted or broken), ``tolerances`` (the one 0.1 % every
verdict uses).

``from memlab.compare import compare`` is the one-pair comparison; the room and the function share the name, so
the function is imported from here rather than from ``memlab`` itself.
"""

from memlab.compare.ledger import compare, error_summary

__all__ = ["compare", "error_summary"]

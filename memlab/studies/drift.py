"""drift: is memlab still exact under the libraries installed here? The canary of ``make upgrade-check``.

memlab's family terms count what other people's code saves (transformers' modelling files, torch's kernels and
autograd, peft's adapters, bitsandbytes' NF4 storage). A new release can change that code, and the formula would
give the old answer without a word. :func:`drift_rows` runs, on this machine's CPU and on the installed releases,
each check whose truth is that code, and judges each against a real step:

- ``transformers``: every shipped tiny config (one per family), under eager and SDPA attention (where transformers
  builds the family with it: Gemma 2 has eager only), in fp32, bf16 and fp32 under bf16 autocast: the formula's
  saved activations and model states against a real step (:func:`memlab.run.hf.run_hf`), byte for byte;
- ``trace``: every family's fake-tensor trace (:func:`memlab.tracing.hf.trace_hf`) against the same step on real
  tensors, phase by phase;
- ``peft``: LoRA adapters on four families, formula against a real peft step;
- ``bitsandbytes``: a QLoRA (NF4) step, formula against the real step, and its fake trace against the real one.

Each row is ``exact`` (every byte equal), ``drifted`` (how far: the largest difference, in bytes and percent) or
``broken`` (the exception, in one line). Under ``requirements.lock`` every row is exact: that is what
:data:`memlab.predict.spec.versions.VERIFIED` records. ``python -m memlab.studies.drift --json PATH`` writes the rows;
``scripts/upgrade_check.py`` runs it in a scratch environment with the newest releases and prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import partial
from importlib import resources
from typing import Any


def _tiny_folder() -> Any:
    """``memlab/predict/families/configs/tiny``, the shipped tiny configs (package data, read as data)."""
    return resources.files("memlab").joinpath("predict/families/configs/tiny")


ATTENTIONS = ("eager", "sdpa")
PRECISIONS = (("fp32", False), ("bf16", False), ("fp32", True))
"""(model dtype, bf16 autocast): fp32, bf16, and an fp32 model under bf16 autocast (amp-bf16)."""
BATCH, SEQ = 2, 24
LORA_FAMILIES = ("llama", "qwen2", "mistral", "gpt2")
QLORA_FAMILY = "llama"


@dataclass(frozen=True)
class DriftRow:
    """One check: ``library`` (whose code it tests), ``family`` (the model_type), ``case`` (attention, precision,
    method), ``verdict`` (exact, drifted or broken), ``detail`` (what differed, or the error), ``worst_bytes`` and
    ``worst_percent`` (the largest difference, signed: memlab minus the real step; None unless drifted),
    ``seconds`` (wall time of the check)."""

    library: str
    family: str
    case: str
    verdict: str
    detail: str = ""
    worst_bytes: int | None = None
    worst_percent: float | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def tiny_config(family: str) -> dict[str, Any]:
    """The shipped tiny config of ``family`` (``predict/families/configs/tiny/FAMILY.json``), comment keys dropped."""
    text = _tiny_folder().joinpath(f"{family}.json").read_text()
    return {k: v for k, v in json.loads(text).items() if not k.startswith("_")}


def families() -> list[str]:
    """Every family with a shipped tiny config, sorted."""
    return sorted(p.name.removesuffix(".json") for p in _tiny_folder().iterdir() if p.name.endswith(".json"))


def judge(pairs: dict[str, tuple[int, int]]) -> tuple[str, str, int | None, float | None]:
    """(verdict, detail, worst bytes, worst percent) of named (memlab, real) byte pairs: exact when all are equal,
    else drifted with each differing pair and the largest difference."""
    off = {k: (p - m) for k, (p, m) in pairs.items() if p != m}
    if not off:
        return "exact", "", None, None
    worst = max(off, key=lambda k: abs(off[k]))
    real = pairs[worst][1]
    pct = 100.0 * off[worst] / real if real else float("inf")
    detail = "; ".join(f"{k} {v:+,} B" + (f" ({100 * v / pairs[k][1]:+.2f} %)" if pairs[k][1] else "")
                       for k, v in off.items())
    return "drifted", detail, off[worst], pct


def _check(library: str, family: str, case: str, fn: Callable[[], dict[str, tuple[int, int]]]) -> DriftRow:
    start = time.perf_counter()
    try:
        verdict, detail, worst, pct = judge(fn())
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        verdict, detail, worst, pct = "broken", f"{type(exc).__name__}: {first[:200]}", None, None
    return DriftRow(library, family, case, verdict, detail, worst, pct, round(time.perf_counter() - start, 2))


def _formula_vs_step(config: dict[str, Any], attn: str, dtype: str, autocast: bool, lora: Any = None,
                     batch: int = BATCH, seq: int = SEQ) -> dict[str, tuple[int, int]]:
    from memlab.run.hf import predict_hf, run_hf

    tc, m = run_hf(config, attn_implementation=attn, dtype=dtype, batch=batch, seq=seq, autocast=autocast, lora=lora)
    p = predict_hf(tc, m)
    return {"activations": (p["activations"], m.saved_bytes), "params": (p["params"], m.params_bytes),
            "grads": (p["grads"], m.grads_bytes), "optimizer": (p["optimizer"], m.optimizer_bytes)}


def _trace_vs_step(family: str, config: dict[str, Any], setup: Any) -> dict[str, tuple[int, int]]:
    from memlab.tracing.hf import trace_hf

    real = trace_hf({**config, "model_type": family}, setup, fake=False, device_type="cpu")
    fake = trace_hf({**config, "model_type": family}, setup, device_type="cpu")
    if [(r.step, r.phase) for r in fake.phases] != [(r.step, r.phase) for r in real.phases]:
        raise RuntimeError("the fake trace records other phases than the real step")
    return {f"{r.step} {r.phase}": (f.peak_bytes, r.peak_bytes) for f, r in zip(fake.phases, real.phases, strict=True)}


def _precision_name(dtype: str, autocast: bool) -> str:
    return "amp-bf16" if autocast else dtype


def checks(only: tuple[str, ...] = ()) -> Iterator[tuple[str, str, str, Callable[[], dict[str, tuple[int, int]]]]]:
    """(library, family, case, check) for every check :func:`drift_rows` runs; ``only`` keeps those families."""
    from memlab.predict.spec.setup import Setup
    from memlab.run.hf import attention_implementations

    keep = [f for f in families() if not only or f in only]
    kinds = {f: [a for a in ATTENTIONS if a in attention_implementations(tiny_config(f))] for f in keep}
    for family in keep:  # each attention transformers builds the family with (Gemma 2: eager only)
        for attn in kinds[family]:
            for dtype, autocast in PRECISIONS:
                yield ("transformers", family, f"{attn} {_precision_name(dtype, autocast)}",
                       partial(_formula_vs_step, tiny_config(family), attn, dtype, autocast))
    for family in keep:
        attn = kinds[family][-1]
        traced = Setup(batch=BATCH, seq=SEQ, precision="bf16", attention="math" if attn == "sdpa" else "eager")
        yield ("trace", family, f"{attn} bf16, fake vs real tensors",
               partial(_trace_vs_step, family, tiny_config(family), traced))
    for family in (f for f in LORA_FAMILIES if f in keep):
        targets = "q,v" if family == "gpt2" else "q,k,v,o,gate,up,down"
        lora = Setup(finetune="lora", lora_rank=4, lora_targets=targets)
        yield ("peft", family, f"LoRA r4 ({targets}), eager fp32",
               partial(_formula_vs_step, tiny_config(family), "eager", "fp32", False, lora=lora))
    if QLORA_FAMILY in keep:
        config = tiny_config(QLORA_FAMILY)
        qlora = Setup(finetune="qlora", precision="bf16", lora_rank=4, lora_targets="q,k,v,o,gate,up,down")
        yield ("bitsandbytes", QLORA_FAMILY, "QLoRA NF4 r4, sdpa bf16",
               partial(_formula_vs_step, config, "sdpa", "bf16", False, lora=qlora))
        qtrace = Setup(batch=BATCH, seq=16, finetune="qlora", precision="bf16", lora_rank=4, lora_targets="q,v",
                       attention="math")
        yield ("bitsandbytes", QLORA_FAMILY, "QLoRA NF4 trace, fake vs real tensors",
               partial(_trace_vs_step, QLORA_FAMILY, config, qtrace))


def drift_rows(only: tuple[str, ...] = (), progress: Callable[[DriftRow], None] | None = None) -> list[DriftRow]:
    """Run every check (:func:`checks`) on this machine's CPU, one thread, under the installed releases."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows = []
    try:
        for library, family, case, fn in checks(only):
            row = _check(library, family, case, fn)
            rows.append(row)
            if progress is not None:
                progress(row)
    finally:
        torch.set_num_threads(threads)
    return rows


def installed_versions() -> dict[str, str | None]:
    """The installed release of each library :data:`memlab.predict.spec.versions.VERIFIED` records."""
    from memlab.predict.spec.versions import VERIFIED, installed

    return {name: installed(name) for name in VERIFIED}


def main(argv: list[str] | None = None) -> int:
    """``python -m memlab.studies.drift [--json PATH] [--family F ...]``: every row, one line each as it finishes;
    exit status 0 when every row is exact, 1 otherwise."""
    import warnings

    from memlab.predict.spec.versions import UnverifiedVersionWarning

    p = argparse.ArgumentParser(prog="python -m memlab.studies.drift", description=__doc__.splitlines()[0])
    p.add_argument("--json", metavar="PATH", help="write the versions and rows as JSON")
    p.add_argument("--family", action="append", default=[], help="only this family (repeatable)")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore", UnverifiedVersionWarning)  # the versions head the output instead

    def show(r: DriftRow) -> None:
        print(f"{r.library:<13}{r.family:<13}{r.case:<46}{r.verdict:<9}{r.detail[:120]}", flush=True)

    versions = installed_versions()
    print("installed: " + ", ".join(f"{k} {v}" for k, v in versions.items()), flush=True)
    rows = drift_rows(tuple(args.family), progress=show)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"versions": versions, "rows": [r.to_dict() for r in rows]}, fh, indent=1)
    return 0 if all(r.verdict == "exact" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

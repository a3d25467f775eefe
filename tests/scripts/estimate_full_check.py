"""Full equality check of the estimator before and after a change meant to keep every result (a speed-up).

``estimate(...).to_dict()`` over the speed benchmark's whole grid (benchmarks/estimator_speed.py: 198 setups x 12
batch/seq points) for every preset and every shipped HF config (full and tiny), plus a spread of other setups
(every precision, optimizer and implementation, recompute, kernel, ZeRO stage, tp/sp, inference dtypes, overheads,
cpu/cuda, step_on_device), some ``sweep_totals`` grids and bare parameter counts: about 170,000 results, errors
included, compared pickled (values, types and dict order), about a minute and a half. The committed sample of this
is tests/predict/test_estimate_golden.py.

Usage, from the repository root: ``python tests/scripts/estimate_full_check.py dump /tmp/before.pkl`` on the old
code, then ``python tests/scripts/estimate_full_check.py check /tmp/before.pkl`` on the new.
"""
import itertools
import pickle
import sys

import numpy as np

sys.path.insert(0, ".")
from benchmarks.estimator_speed import _setups
from memlab.course.hf_configs import config_names, load_config
from memlab.predict.estimate import Overheads, estimate, sweep_totals
from memlab.predict.families.reader import from_hf
from memlab.predict.spec.model import preset, preset_names
from memlab.predict.spec.precision import PRECISION_POLICIES
from memlab.predict.spec.setup import Setup


def models():
    out = [(n, preset(n)) for n in preset_names()]
    out += [("hf:" + n, from_hf(load_config(n, "full"), name=n)) for n in config_names("full")]
    out += [("hf-tiny:" + n, from_hf(load_config(n, "tiny"), name=n)) for n in config_names("tiny")]
    return out


def extra_setups(max_seq):
    q = min(256, max_seq)
    out = []
    for p, o, impl, r, a in itertools.product(tuple(PRECISION_POLICIES),
                                               ("adamw", "adam", "sgd", "sgd-momentum", "adam-8bit", "adafactor"),
                                               ("auto", "for-loop", "foreach", "fused"),
                                               ("none", "selective", "full"),
                                               ("eager", "math", "flash", "efficient", "cudnn")):
        if impl == "fused" and o not in ("adam", "adamw", "sgd", "sgd-momentum"):
            continue
        out.append(Setup(batch=1 + (len(out) % 3), seq=q, precision=p, optimizer=o, optimizer_impl=impl,
                         recompute=r, attention=a, zero_stage=len(out) % 4, world_size=(1, 4)[len(out) % 2],
                         grad_accum_steps=(1, 2, 3)[len(out) % 3], zero_grad_to_none=bool(len(out) % 5)))
    for tp, sp in ((2, False), (2, True), (4, True)):
        out.append(Setup(batch=2, seq=q, precision="amp-bf16", tp=tp, sp=sp))
        out.append(Setup(mode="inference", batch=2, seq=q, tp=tp, kv_cache_dtype="fp8", inference_weights="int4"))
    for w, kvd in itertools.product(("fp32", "fp16", "bf16", "int8", "int4"), ("fp32", "fp16", "bf16", "fp8", "int8")):
        out.append(Setup(mode="inference", batch=3, seq=q, inference_weights=w, kv_cache_dtype=kvd, attention="math"))
    return out


def run(fn):
    try:
        return ("ok", fn())
    except Exception as exc:
        return ("err", type(exc).__name__, str(exc))


def cases():
    ovs = [None, Overheads(cuda_context_bytes=300 << 20, workspace_bytes=1 << 25, fragmentation_fraction=0.07,
                           gathered_layers=2)]
    for name, cfg in models():
        setups = _setups(cfg.max_seq)
        for s in setups:
            for b, q in itertools.product((1, 2, 4, 8), (128, 256, min(512, cfg.max_seq))):
                su = s.with_(batch=b, seq=q)
                yield (name, repr(su), "default"), lambda su=su, cfg=cfg: estimate(cfg, su).to_dict()
        for i, su in enumerate(extra_setups(cfg.max_seq)):
            ov, dev, sod = ovs[i % 2], ("cuda", "cpu")[(i // 2) % 2], (None, True, False)[i % 3]
            yield (name, repr(su), "extra", i), lambda su=su, cfg=cfg, ov=ov, dev=dev, sod=sod: estimate(
                cfg, su, overheads=ov, device_type=dev, step_on_device=sod).to_dict()
            if i % 7 == 0:
                yield (name, repr(su), "sweep", i), lambda su=su, cfg=cfg, ov=ov, dev=dev: [
                    sweep_totals(cfg, su, batch=np.arange(1, 5)[:, None], seq=np.array([[16, 64, 128]]),
                                 overheads=ov, device_type=dev, peak=pk).tolist() for pk in (False, True)]
    for n in (1_000_000, 7_000_000_000, 123_456_789):
        for i, su in enumerate(extra_setups(1024)[::11]):
            yield ("bare", n, repr(su), i), lambda su=su, n=n, i=i: estimate(n, su, device_type=("cuda", "cpu")[i % 2]
                                                                        ).to_dict()


def main():
    mode, path = sys.argv[1], sys.argv[2]
    results = {key: run(fn) for key, fn in cases()}
    if mode == "dump":
        with open(path, "wb") as f:
            pickle.dump(results, f)
        n_err = sum(r[0] == "err" for r in results.values())
        print(f"dumped {len(results)} cases ({n_err} errors)")
        return 0
    with open(path, "rb") as f:
        gold = pickle.load(f)
    assert gold.keys() == results.keys(), "case keys differ"
    bad = [k for k in gold if pickle.dumps(gold[k]) != pickle.dumps(results[k])]
    print(f"checked {len(results)} cases: {len(bad)} differ")
    for k in bad[:5]:
        print(k)
        g, r = gold[k], results[k]
        if g[0] == "ok" and r[0] == "ok" and isinstance(g[1], dict):
            for f in g[1]:
                if pickle.dumps(g[1][f]) != pickle.dumps(r[1].get(f)):
                    print("   ", f, g[1][f], "!=", r[1].get(f))
        else:
            print("   ", g, r)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

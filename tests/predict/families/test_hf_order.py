"""The order memlab says each Hugging Face family registers its parameters in is the order the real model's
``named_parameters()`` yields, on the shipped tiny configs and on drawn ones (configs these tests did not choose);
the for-loop AdamW moment the estimate counts from it is the one a real step holds."""

from __future__ import annotations

import logging
import math
import random

import pytest

pytest.importorskip("transformers")

from memlab.course.hf_configs import config_names, load_config
from memlab.errors import ConfigError, MemlabError
from memlab.predict.families.order import BLOCK_ORDER, registration_order
from memlab.predict.families.reader import SUPPORTED, from_hf
from memlab.predict.memory.sharding import shape_summary
from memlab.studies.hf_draws import draw_hf

TINY = {name: load_config(name) for name in config_names("tiny")}


def _real_shapes(cfg: dict) -> list[tuple[int, ...]]:
    import transformers

    from memlab.model.hf import quiet_logger

    with quiet_logger("transformers", logging.ERROR):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg))
    return [tuple(p.shape) for p in model.parameters()]


def _configs() -> list[tuple[str, dict]]:
    out = [(name, {k: v for k, v in cfg.items() if not k.startswith("_")}) for name, cfg in sorted(TINY.items())]
    rng = random.Random(17)
    for i in range(3 * len(TINY)):
        name = sorted(TINY)[i % len(TINY)]
        draw = draw_hf(rng, TINY[name])
        if draw.refused_key is None:
            out.append((f"{name} draw {i}", dict(draw.config)))
    return out


def test_every_supported_family_has_an_order() -> None:
    assert set(SUPPORTED) <= set(BLOCK_ORDER)


@pytest.mark.parametrize(("label", "cfg"), _configs(), ids=[label for label, _ in _configs()])
def test_the_order_is_the_real_models(label: str, cfg: dict) -> None:
    try:
        config = from_hf(cfg)
    except MemlabError:
        pytest.skip("refused by from_hf")
    sizes = [math.prod(s) for s in _real_shapes(cfg)]  # elements: GPT-2's Conv1D stores (in, out)
    assert [math.prod(shape) for _, shape, _ in registration_order(config)] == sizes, label
    # the loop moment the estimate counts, from the real order: max over i of 2 x n_i + n_(i-1)
    assert shape_summary(config).loop_peak_elements == max(2 * n + (sizes[i - 1] if i else 0)
                                                            for i, n in enumerate(sizes))


def test_the_order_differs_from_memlabs_where_the_family_registers_otherwise() -> None:
    llama = from_hf(TINY["llama"])
    names = [n for n, _, _ in registration_order(llama)]
    assert names[1] == "blocks.0.attn.q.weight"  # the first attention weight follows the embedding directly
    assert [n for n, _, _ in llama.param_shapes()][1] == "blocks.0.norm1.weight"  # memlab's GPT: the norm first
    assert sorted(names) == sorted(n for n, _, _ in llama.param_shapes())


def test_an_unknown_name_is_refused() -> None:
    from memlab.predict.families.order import _rank

    with pytest.raises(ConfigError, match="no registration order"):
        _rank("blocks.0.adapter.weight", BLOCK_ORDER["gpt2"])

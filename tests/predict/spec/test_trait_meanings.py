"""Every implementation trait has a one-sentence meaning a chapter can show
(memlab.predict.spec.traits.trait_meanings)."""

from __future__ import annotations

from dataclasses import fields

from memlab.predict.spec.traits import Implementation, trait_meanings


def test_every_trait_has_a_plain_meaning_without_citations() -> None:
    meanings = trait_meanings()
    assert set(meanings) == {f.name for f in fields(Implementation)}
    for name, text in meanings.items():
        assert text.endswith(".") and len(text) > 20, name
        assert "[hf-" not in text and "[modeling_" not in text and "``" not in text, name
    assert "(repeat_kv, a copy" in meanings["kv_broadcast"]  # code in the sentence is not taken for a citation


def test_every_trait_sits_in_one_group() -> None:
    """The traits by concern (TRAIT_GROUPS): each in exactly one group, read back by Implementation.group."""
    from memlab.predict.spec.traits import TRAIT_GROUPS, Implementation

    grouped = [t for traits in TRAIT_GROUPS.values() for t in traits]
    assert sorted(grouped) == sorted(Implementation.__dataclass_fields__) and len(grouped) == len(set(grouped))
    assert Implementation(rotary_fraction=0.5).group("rotary")["rotary_fraction"] == 0.5

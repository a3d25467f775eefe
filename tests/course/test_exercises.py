"""memlab.course.exercises: answers checked against computed references, unanswered never raises, solutions hidden."""

from __future__ import annotations

import pytest

from memlab.course import exercises
from memlab.course.exercises import Choice, Numeric, parse_quantity, solutions_enabled
from memlab.errors import ConfigError
from memlab.predict.models import preset

GIB = 2**30


@pytest.fixture(autouse=True)
def _no_solutions_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(exercises.SOLUTIONS_ENV, raising=False)


def gpt2_params() -> Numeric:
    return Numeric("gpt2-params", "How many parameters has GPT-2 small?",
                   reference=lambda: preset("gpt2").param_count(), hint="embeddings are tied", rtol=0.01)


def eighty_gb_in_gib() -> Numeric:
    return Numeric("gib", "An 80 GB card holds how many GiB?", reference=lambda: 80e9 / GIB,
                   hint="GB is 10^9 bytes, GiB is 2^30 bytes", unit="GiB", rtol=0.005)


def test_reference_is_computed_by_memlab_at_check_time() -> None:
    result = gpt2_params().check(preset("gpt2").param_count(), solutions=True)
    assert result.correct and result.expected == preset("gpt2").param_count()


def test_typed_in_reference_is_refused() -> None:
    with pytest.raises(ConfigError, match="callable"):
        Numeric("x", "?", reference=124_439_808, hint="")


@pytest.mark.parametrize("answer", [..., None, "", "..."])
def test_unanswered_says_so_with_the_hint_and_does_not_raise(answer: object) -> None:
    result = gpt2_params().check(answer)
    assert result.status == "unanswered"
    assert "Not answered yet" in result.message and "tied" in result.message
    assert result.expected is None


def test_within_relative_tolerance_is_correct() -> None:
    exact = preset("gpt2").param_count()
    assert gpt2_params().check(exact * 1.009).correct
    assert not gpt2_params().check(exact * 1.02).correct


def test_wrong_answer_says_how_far_off_and_hides_the_expected_value() -> None:
    result = gpt2_params().check(preset("gpt2").param_count() * 1.25)
    assert result.status == "incorrect"
    assert "25.0% too high" in result.message and "tied" in result.message
    assert result.expected is None and str(preset("gpt2").param_count()) not in result.message


@pytest.mark.parametrize(("answer", "correct"), [
    ("74.5 GiB", True), (74.5, True), ((74.51, "GiB"), True), ("80e9 B", True), ("80 GB", True),
    ("76294 MiB", True), ("80 GiB", False), ("74.5 GB", False),
])
def test_answers_carry_units_and_are_converted(answer: object, correct: bool) -> None:
    assert eighty_gb_in_gib().check(answer).correct is correct


def test_gb_for_gib_confusion_gets_a_pointed_hint() -> None:
    result = eighty_gb_in_gib().check("80 GiB")
    assert "GiB" in result.message and "1.024" in result.message


def test_an_answer_in_the_wrong_dimension_is_invalid_not_an_exception() -> None:
    result = eighty_gb_in_gib().check("3 TFLOP")
    assert result.status == "invalid" and "bytes" in result.message


def test_unreadable_answer_is_invalid() -> None:
    assert eighty_gb_in_gib().check("lots").status == "invalid"


def test_parse_quantity_scales_decimal_and_binary_prefixes() -> None:
    assert parse_quantity("1 GiB", "B") == GIB
    assert parse_quantity("1.5 TFLOP/s", "GFLOP/s") == pytest.approx(1500)
    assert parse_quantity("1,000 MB", "GB") == pytest.approx(1.0)
    assert parse_quantity("50 %", "") == pytest.approx(0.5)
    with pytest.raises(ConfigError):
        parse_quantity("1 GiB", "s")


def test_solutions_are_shown_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    wrong = preset("gpt2").param_count() * 2
    assert gpt2_params().check(wrong).expected is None
    assert "hidden" in gpt2_params().solution()
    monkeypatch.setenv(exercises.SOLUTIONS_ENV, "1")
    assert solutions_enabled()
    shown = gpt2_params().check(wrong)
    assert shown.expected == preset("gpt2").param_count()
    assert "Solution:" in shown.message
    assert f"{preset('gpt2').param_count():,}" in gpt2_params().solution()
    assert not solutions_enabled(False), "an explicit argument wins over the environment"


def dense_or_sparse() -> Choice:
    return Choice("peak", "Which figure is larger?", reference=lambda: "b", hint="sparsity doubles it",
                  options={"a": "dense", "b": "sparse"})


@pytest.mark.parametrize(("answer", "status"), [
    ("b", "correct"), ("B", "correct"), ("sparse", "correct"), ("a", "incorrect"), ("c", "invalid"),
    (..., "unanswered"),
])
def test_choice_accepts_the_key_or_the_option_text(answer: object, status: str) -> None:
    assert dense_or_sparse().check(answer).status == status


def test_choice_needs_options_and_a_reference_among_them() -> None:
    with pytest.raises(ConfigError):
        Choice("x", "?", reference=lambda: "a", hint="", options={"a": "only one"})
    broken = Choice("x", "?", reference=lambda: "z", hint="", options={"a": "1", "b": "2"})
    with pytest.raises(ConfigError, match="not an option"):
        broken.check("a")


def test_result_is_inspectable_and_renders_in_a_notebook() -> None:
    result = gpt2_params().check(...)
    assert result.to_dict()["status"] == "unanswered"
    assert 'data-status="unanswered"' in result._repr_html_()
    assert str(result).startswith("[gpt2-params] unanswered")

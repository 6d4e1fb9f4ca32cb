"""Registry and recipes: names, parameters, composition, and clear errors listing the valid names."""

from dataclasses import dataclass

import pytest

from tandem.optimize import (
    RecipeError,
    apply_recipe,
    describe,
    get,
    names,
    parameters,
    parse_recipe,
    register,
    validate_recipe,
)
from tandem.optimize.registry import OptimizerParam, RecipeStep
from tandem.optimize.types import InferenceOptimizer, OptimizedModel


def test_builtins_are_registered_with_versions_and_descriptions():
    assert {"baseline", "bf16", "int8", "speculative", "ngram"} <= set(names())
    for name, version, description, _params in describe():
        assert version and description, name


def test_parameters_are_listed_with_types_and_defaults():
    assert parameters("baseline") == []
    assert OptimizerParam("k", "int", 3) in parameters("speculative")
    assert OptimizerParam("draft", "str | None", None) in parameters("speculative")
    assert [p.name for p in parameters("int8")] == ["lm_head", "small_batch_kernel"]
    register("tagger-factory", lambda tag="a", times=1: Tagger(tag), replace=True)
    assert [(p.name, p.default) for p in parameters("tagger-factory")] == [("tag", "a"), ("times", 1)]


@pytest.mark.parametrize(
    "recipe, message",
    [
        ("speculative(q=3)", r"'speculative' has no parameter 'q'; it takes k: int = 3"),
        ("speculative(k=99)", r"k must be an integer in \[1, 16\]"),
        ("int8(lm_head=3)", r"parameter 'lm_head' must be bool, got 3"),
        ("int8+ngram(k=2.5)", r"parameter 'k' must be int, got 2.5"),
        ("baseline(x=1)", r"'baseline' takes no parameters"),
    ],
)
def test_validate_recipe_checks_parameters_without_a_model(recipe, message):
    with pytest.raises(RecipeError, match=message):
        validate_recipe(recipe)


def test_valid_recipes_validate():
    assert [s.name for s in validate_recipe("int8+kv-bf16+ngram(k=6)")] == ["int8", "kv-bf16", "ngram"]


def test_parse_recipe_with_parameters():
    steps = parse_recipe("int8+speculative(k=4, draft=models/x)")
    assert steps == [RecipeStep("int8"), RecipeStep("speculative", (("k", 4), ("draft", "models/x")))]
    assert str(steps[1]) == "speculative(k=4, draft=models/x)"
    assert parse_recipe(" ngram ( k = 3 ) ") == [RecipeStep("ngram", (("k", 3),))]
    assert parse_recipe("int8(lm_head=false)") == [RecipeStep("int8", (("lm_head", False),))]
    assert parse_recipe("int8(lm_head=True)") == [RecipeStep("int8", (("lm_head", True),))]


@pytest.mark.parametrize(
    "recipe, message",
    [
        ("int9", r"unknown optimizer 'int9'.*registered: .*baseline.*int8"),
        ("", "the recipe is empty"),
        ("int8+", "cannot parse recipe step ''"),
        ("ngram(k)", "parameter 'k' must be key=value"),
        ("int8++bf16", "cannot parse"),
    ],
)
def test_bad_recipes_are_clear_errors(recipe, message):
    with pytest.raises(RecipeError, match=message):
        parse_recipe(recipe)


def test_bad_parameter_is_a_clear_error():
    with pytest.raises(RecipeError, match="'ngram' has no parameter 'q'"):
        get("ngram", q=3)
    with pytest.raises(RecipeError, match="k must be an integer in"):
        get("ngram", k=0)
    with pytest.raises(RecipeError, match="'baseline' takes no parameters"):
        get("baseline", x=1)


@dataclass(frozen=True)
class Tagger:
    tag: str = "a"
    name: str = "tagger"
    version: str = "9.9"
    description: str = "appends a note (test)"

    def optimize(self, model: OptimizedModel) -> OptimizedModel:
        return model.with_changes(notes=(*model.notes, self.tag))


def test_register_and_compose_in_order():
    register("tagger", lambda **params: Tagger(**params), replace=True)
    assert isinstance(Tagger(), InferenceOptimizer)
    result = apply_recipe(object(), "tagger(tag=first)+tagger(tag=second)")
    assert result.notes == ("first", "second")
    assert result.applied == (("tagger", "9.9"), ("tagger", "9.9"))
    assert result.recipe == "tagger(tag=first)+tagger(tag=second)"
    with pytest.raises(RecipeError, match="already registered"):
        register("tagger", Tagger())


def test_register_rejects_bad_names():
    with pytest.raises(RecipeError, match="must be lowercase"):
        register("Bad Name", Tagger())


def test_a_name_keeps_several_versions_and_a_bare_name_means_the_default():
    from tandem.optimize import versions

    assert versions("speculative") == ["1.0", "2.0"] and versions("ngram") == ["1.0", "2.0"]
    assert get("speculative").version == "1.0"  # a new version never changes what a bare name means
    assert get("speculative@2.0").version == "2.0" and get("speculative@1.0", k=2).k == 2
    assert {(n, v) for n, v, *_ in describe()} >= {("speculative", "1.0"), ("speculative", "2.0")}
    steps = parse_recipe("int8+speculative@2.0(k_max=6)")
    assert steps[1] == RecipeStep("speculative@2.0", (("k_max", 6),))
    assert str(steps[1]) == "speculative@2.0(k_max=6)"
    with pytest.raises(
        RecipeError, match=r"'speculative' has no version '9.9'; registered: speculative@1.0, speculative@2.0"
    ):
        parse_recipe("speculative@9.9")
    with pytest.raises(RecipeError, match="optimizer 'ngram@2.0' has no parameter 'k'; it takes k_max"):
        get("ngram@2.0", k=3)  # version 2 has k_max, not k


def test_registering_a_new_version_beside_the_first():
    @dataclass(frozen=True)
    class Stamp:
        name: str = "stamp"
        version: str = "1.0"
        description: str = "test"

        def optimize(self, model):
            return model.with_changes(notes=(*model.notes, self.version))

    register("stamp", Stamp(), replace=True)
    register("stamp", Stamp(version="2.0"))
    assert apply_recipe(object(), "stamp+stamp@2.0").applied == (("stamp", "1.0"), ("stamp", "2.0"))
    with pytest.raises(RecipeError, match="already registered"):
        register("stamp", Stamp(version="2.0"))
    register("stamp", Stamp(version="3.0"), default=True)
    assert get("stamp").version == "3.0"

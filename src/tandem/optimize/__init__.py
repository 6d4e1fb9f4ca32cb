"""tandem.optimize: the optimization layer: a registry of optimizers composed into recipes.

Built-ins are registered here; third-party optimizers arrive through the `tandem.optimizers`
entry-point group. `apply_recipe(model, "int8+speculative(k=4)")` returns the OptimizedModel an
Engine runs.
"""

from tandem.optimize import registry
from tandem.optimize.int4 import Int4
from tandem.optimize.int8 import Int8
from tandem.optimize.kv_cache import KvBFloat16
from tandem.optimize.ngram import Ngram
from tandem.optimize.precision import Baseline, BFloat16
from tandem.optimize.registry import (
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
from tandem.optimize.speculative import Speculative

__all__ = [
    "RecipeError",
    "apply_recipe",
    "describe",
    "get",
    "names",
    "parameters",
    "parse_recipe",
    "register",
    "registry",
    "validate_recipe",
]

register("baseline", Baseline())
register("bf16", BFloat16())
register("int8", Int8())
register("int4", Int4())
register("kv-bf16", KvBFloat16())
register("speculative", Speculative())
register("ngram", Ngram())

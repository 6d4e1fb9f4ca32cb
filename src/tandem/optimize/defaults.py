"""The recipe served when none is named: the best recipe of the latest `tandem bench` on this CPU."""

__all__ = ["DEFAULT_RECIPE"]

DEFAULT_RECIPE = "baseline"

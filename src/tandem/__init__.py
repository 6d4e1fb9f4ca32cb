"""tandem: an LLM inference platform in two layers (optimization and scheduling) that meet at one contract."""

__version__ = "0.1.0"
__all__ = ["__version__"]

"""The one error type of model loading: it always names the file or field at fault."""

__all__ = ["ModelLoadError"]


class ModelLoadError(ValueError):
    """A model directory could not be loaded; the message names the file or config field."""

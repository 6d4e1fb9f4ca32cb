"""matplotlib, the optional extra `tandem[plots]`, imported only when a figure is asked for.

`pyplot()` is the one way tandem's commands get it: the headless Agg backend, or PlotUnavailable with
the one line that says how to install it.
"""

from __future__ import annotations

import io

__all__ = ["PlotUnavailable", "png_bytes", "pyplot"]


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'tandem[plots]'") from None
    return plt


def png_bytes(figure, title: str, dpi: int = 110) -> bytes:
    """The figure, titled and laid out, as PNG bytes; the figure is closed (pyplot keeps open ones)."""
    figure.suptitle(title)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    pyplot().close(figure)
    return buffer.getvalue()

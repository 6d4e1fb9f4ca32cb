"""matplotlib, the optional extra `tandem[plots]`, imported only when a figure is asked for.

`pyplot()` is the one way tandem's commands get it: the headless Agg backend, or PlotUnavailable with
the one line that says how to install it.
"""

from __future__ import annotations

__all__ = ["PlotUnavailable", "pyplot"]


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

"""tandem.serve: one replica's OpenAI-compatible HTTP server (`tandem serve` without gateway flags).

`create_app(config, load)` builds the FastAPI app around whatever `load()` returns (a ServedModel);
`run_server(config)` runs it under uvicorn with graceful shutdown. Its settings are
`tandem.edge.settings.Settings`, shared with the gateway (which this package never imports). Names
are imported on first use, so `tandem --help` (which imports tandem.serve.options) stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tandem.lazy import lazy_exports

if TYPE_CHECKING:  # the exports, each loaded on first use (tandem.lazy)
    from tandem.serve.app import create_app
    from tandem.serve.served import ServedModel, load_served_model
    from tandem.serve.server import run_server

__getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)

"""tandem.serve: one replica's OpenAI-compatible HTTP server (`tandem serve` without gateway flags).

`create_app(config, load)` builds the FastAPI app around whatever `load()` returns (a ServedModel);
`run_server(config)` runs it under uvicorn with graceful shutdown. Its settings are
`tandem.edge.settings.Settings` (shared with the gateway, tandem.gateway). Names are imported on
first use, so `tandem --help` (which imports tandem.serve.options) stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "ServedModel",
    "create_app",
    "load_served_model",
    "run_server",
]

_HOME = {
    "ServedModel": "tandem.serve.served",
    "create_app": "tandem.serve.app",
    "load_served_model": "tandem.serve.served",
    "run_server": "tandem.serve.server",
}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'tandem.serve' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)

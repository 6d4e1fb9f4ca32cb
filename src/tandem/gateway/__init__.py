"""tandem.gateway: the scheduling layer's front door (`tandem serve --replicas-*/--deployment ...`).

One process in front of replicas (each a plain `tandem serve`): it routes each request to a
replica (tandem.schedule's Dispatcher, on the loads replicas report on GET /load), re-runs failed
ones on another replica or the fallback variant, runs the Controller's loop (autoscaling, restarts
with backoff, rollouts) and serves the operator API. It never imports torch, the engine, the
model, the optimizers or the server (an import-linter contract): recipes cross to replicas as
text, and Profiles come from a `tandem profile` child process.

- wiring: `Gateway` (what the parts share), `build_gateway`, the backend it starts replicas with (local or Ray)
- proxy: one request through a replica, with retries, buffering and the client's disconnect
- loads: polling replicas' GET /load
- admin: GET /admin/replicas, POST /admin/use, GET /admin/rollout
- app: the FastAPI app and the control loop; run: uvicorn, signals, exit codes
- deployment, profiles, options, cli: settings -> Deployment; Profiles; the flags; `serve_gateway`
- metrics: request counts, durations, time to first byte, buffered requests

Names are imported on first use, so importing the package (the flags) stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Gateway", "build_gateway", "create_gateway_app", "run_gateway", "serve_gateway"]

_HOME = {
    "Gateway": "tandem.gateway.wiring",
    "build_gateway": "tandem.gateway.wiring",
    "create_gateway_app": "tandem.gateway.app",
    "run_gateway": "tandem.gateway.run",
    "serve_gateway": "tandem.gateway.cli",
}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'tandem.gateway' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)

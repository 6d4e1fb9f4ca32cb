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
- models, model_backend, model_metrics, models_admin, cold_start, make_room: many models behind one
  gateway (a Gateway per model over views of one backend, routed by `model`; GET /admin/models; cold
  starts per model; idle models scaled down for one a request waits for)

Names are imported on first use, so importing the package (the flags) stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tandem.lazy import lazy_exports

if TYPE_CHECKING:  # the exports, each loaded on first use (tandem.lazy)
    from tandem.gateway.app import create_gateway_app
    from tandem.gateway.cli import serve_gateway
    from tandem.gateway.run import run_gateway
    from tandem.gateway.wiring import Gateway, build_gateway

__getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)

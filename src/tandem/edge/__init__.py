"""tandem.edge: what the server and the gateway share at their edges (HTTP and files). Torch-free.

- errors: the one OpenAI-style error body, its exception and the handlers that produce it
- auth: the API-key middleware (also the fleet secret a gateway's replicas require)
- bodies, json_body: request bodies checked at the edge (size, time, UTF-8, JSON depth, lone surrogates)
- connections: a cap on open connections and a deadline for request headers (uvicorn's h11 protocol)
- logs: warnings rate-limited, so a flood cannot flood the log
- openapi: the documents list error bodies and event streams
- streams: server-sent event framing, noticing a client that left
- files: the one YAML/JSON settings-file loader and the one wording of pydantic's complaints
- settings, options: `Settings`, every setting of `tandem serve` (server and gateway), from file, TANDEM_*
  and flags; the connection flags
- server: one uvicorn configuration; uvicorn that exits 0 after SIGTERM; the logging setup
- lifeline: a replica leaves when the gateway that started it is gone

Imported module by module (`from tandem.edge.settings import Settings`), so `tandem --help` stays light.
"""

"""tandem.edge: what the server and the gateway share at their edges (HTTP and files). Torch-free.

- errors: the one OpenAI-style error body, its exception and the handlers that produce it
- auth, limits: the API-key and body-size middlewares
- streams: server-sent event framing, noticing a client that left
- files: the one YAML/JSON settings-file loader and the one wording of pydantic's complaints
- settings: `Settings`, every setting of `tandem serve` (server and gateway), from file, TANDEM_* and flags
- server: uvicorn that exits 0 after SIGTERM; the logging setup
- lifeline: a replica leaves when the gateway that started it is gone

Imported module by module (`from tandem.edge.settings import Settings`), so `tandem --help` stays light.
"""

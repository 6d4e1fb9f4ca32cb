"""A stand-in external engine: an OpenAI-compatible server that is not tandem (stdlib only, its own process).

`python tests/fake_openai_server.py --port P --served-model-name NAME [--token-delay-s S] [--metrics vllm|none]`

POST /v1/completions (streamed or not; `max_tokens` words "tok0 tok1 ...", numbered on after a prompt's
own such words (a text continuation), usage counted; `echo`
refused with 400 as servers without teacher forcing do), GET /v1/models, GET /health, and with
`--metrics vllm` GET /metrics in vLLM's names, its gauges counting the requests it is serving.
With `--api-key K` (or API_KEY in its environment) it demands `Authorization: Bearer K`. SIGTERM: stops.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from os import environ

RUNNING = 0
LOCK = threading.Lock()


def vllm_metrics(name: str, running: int) -> str:
    lines = []
    for metric, value in (("num_requests_running", running), ("num_requests_waiting", 0),
                          ("kv_cache_usage_perc", running / 8)):  # fmt: skip
        lines += [
            f"# HELP vllm:{metric} fake",
            f"# TYPE vllm:{metric} gauge",
            f'vllm:{metric}{{model_name="{name}"}} {value}',
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-model-name", default="fake")
    parser.add_argument("--token-delay-s", type=float, default=0.005)
    parser.add_argument("--metrics", choices=["vllm", "none"], default="vllm")
    parser.add_argument("--api-key", default=None, help="Demand this bearer token (default: API_KEY, if set).")
    args = parser.parse_args()
    key = args.api_key or environ.get("API_KEY")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a) -> None:
            pass

        def _send(self, code: int, body: str, kind: str = "application/json") -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if key and self.headers.get("authorization") != f"Bearer {key}":
                self._send(401, json.dumps({"error": {"message": "bad key", "code": "invalid_api_key"}}))
                return False
            return True

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, "")
            elif self.path == "/metrics" and args.metrics == "vllm":
                self._send(200, vllm_metrics(args.served_model_name, RUNNING), "text/plain; version=0.0.4")
            elif self.path == "/v1/models" and self._authorized():
                self._send(200, json.dumps({"object": "list", "data": [{"id": args.served_model_name}]}))
            elif not self.path.startswith("/v1/models"):
                self._send(404, json.dumps({"error": {"message": "not found"}}))

        def do_POST(self) -> None:
            global RUNNING
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            if not self._authorized():
                return
            if body.get("echo"):
                self._send(400, json.dumps({"error": {"message": "echo is not supported", "code": "unsupported"}}))
                return
            n = int(body.get("max_tokens") or 16)
            # A prompt ending in its own words continues their count (a stream resumed by text continuation).
            start = len(re.findall(r" tok\d+", str(body.get("prompt", ""))))
            words = [f" tok{start + i}" for i in range(n)]
            usage = {"prompt_tokens": len(str(body.get("prompt", "")).split()), "completion_tokens": n}
            usage["total_tokens"] = usage["prompt_tokens"] + n
            with LOCK:
                RUNNING += 1
            try:
                if not body.get("stream"):
                    time.sleep(args.token_delay_s * n)
                    choice = {"index": 0, "text": "".join(words), "finish_reason": "length", "logprobs": None}
                    answer = {"id": "cmpl-fake", "model": args.served_model_name, "choices": [choice], "usage": usage}
                    self._send(200, json.dumps({**answer, "object": "text_completion"}))
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for i, word in enumerate(words):
                    time.sleep(args.token_delay_s)
                    choice = {"index": 0, "text": word, "finish_reason": "length" if i == n - 1 else None}
                    self._chunk(json.dumps({"id": "cmpl-fake", "object": "text_completion", "choices": [choice]}))
                self._chunk(json.dumps({"id": "cmpl-fake", "choices": [], "usage": usage}))
                self._chunk("[DONE]")
                self.wfile.write(b"0\r\n\r\n")
            finally:
                with LOCK:
                    RUNNING -= 1

        def _chunk(self, data: str) -> None:
            event = f"data: {data}\n\n".encode()
            self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            self.wfile.flush()

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()
    sys.exit(0)


if __name__ == "__main__":
    main()

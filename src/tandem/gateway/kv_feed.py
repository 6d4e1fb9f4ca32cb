"""The I/O around the KV index (tandem.gateway.kv_index): reading replicas' KV events, and tokenizing
a request's prompt once so it can be matched against them.

- `poll_kv_events`: GET /kv/events?since=SEQ of every ready or draining tandem replica, on the
  gateway's load-polling tick (tandem.gateway.loads), with the fleet's secret like every request
  to a replica. An answer that does not follow (a gap, a restart) is asked again at once from 0 (a
  full resync). A replica that answers 404 publishes nothing (an engine without a block cache):
  it is routed on its load alone. Replicas that left the ready/draining set (exited, failed,
  restarted under a new id) are forgotten. External engines (vLLM, SGLang, llama.cpp) are not asked:
  vLLM publishes its KV events over ZMQ, which a later adapter can read into the same index.
- `prompt_ids`: the request's prompt as token ids, as the replicas tokenize it: a completions
  prompt of token ids as given; a text prompt, or chat messages (rendered by the replica's own
  chat template), through one replica's POST /tokenize. Anything else (a batch of prompts beyond
  the first, a failure, a timeout) gives None, and the request is routed on load alone.
- `kv_route`: the request's `RouteRequest` with its `PrefixMatch`, when any replica publishes; the
  proxy then tells the index which replica it was sent to (`KVIndex.expect`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import httpx

from tandem.cluster.backend import Replica, ReplicaState
from tandem.contracts import KV_EVENTS_PATH, KVEvents
from tandem.gateway.kv_index import KVIndex
from tandem.schedule.routers import RouteRequest

__all__ = ["kv_route", "poll_kv_events", "prompt_ids"]

logger = logging.getLogger("tandem.gateway")

_POLLED = (ReplicaState.READY, ReplicaState.DRAINING)
_TOKENIZE_TIMEOUT_S = 2.0
_turn = itertools.count()  # which publishing replica tokenizes next (round robin)


async def _events(client: httpx.AsyncClient, replica: Replica, since: int, timeout_s: float) -> KVEvents | int:
    """The replica's events after `since`, or the HTTP status it answered (0: no answer, or malformed)."""
    try:
        response = await client.get(replica.url + KV_EVENTS_PATH, params={"since": since}, timeout=timeout_s)
        if response.status_code != 200:
            return response.status_code
        return KVEvents.from_json(response.json())
    except httpx.HTTPError:
        return 0
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        logger.warning("ignoring the KV events of %s at %s: %s", replica.replica_id, replica.url, exc)
        return 0


async def _poll_one(client: httpx.AsyncClient, replica: Replica, index: KVIndex, timeout_s: float) -> None:
    since = index.since(replica.replica_id)
    answer = await _events(client, replica, since, timeout_s)
    if isinstance(answer, KVEvents) and not index.apply(replica.replica_id, answer, since):
        answer = await _events(client, replica, 0, timeout_s)  # the full resync
        if isinstance(answer, KVEvents) and not index.apply(replica.replica_id, answer, 0):
            index.forget([replica.replica_id])
    elif answer == 404:
        index.forget([replica.replica_id])  # publishes nothing: routed on load alone


async def poll_kv_events(
    client: httpx.AsyncClient, replicas: Sequence[Replica], index: KVIndex, timeout_s: float = 1.0
) -> None:
    """Bring `index` up to date with every ready or draining tandem replica among `replicas` (the
    backend's whole list: the others are forgotten)."""
    polled = [r for r in replicas if r.state in _POLLED and r.spec.engine is None]
    index.keep_only(r.replica_id for r in polled)
    await asyncio.gather(*(_poll_one(client, r, index, timeout_s) for r in polled))


def _tokenize_body(payload: Any) -> dict | list[int] | None:
    """What to ask /tokenize for (a dict), the ids the request already gives (a list), or None."""
    if not isinstance(payload, dict):
        return None
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        prompt = prompt[0]  # a batch of token-id prompts: the first
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]  # a batch of text prompts: the first
    if isinstance(prompt, str):
        return {"prompt": prompt}
    messages = payload.get("messages")
    if isinstance(messages, list) and messages:
        return {"messages": messages}
    return None


async def prompt_ids(client: httpx.AsyncClient, url: str, payload: Any) -> list[int] | None:
    """The request's prompt as token ids (`url`: the replica that tokenizes), None when not known."""
    body = _tokenize_body(payload)
    if body is None or isinstance(body, list):
        return body
    try:
        response = await client.post(url + "/tokenize", json=body, timeout=_TOKENIZE_TIMEOUT_S)
        if response.status_code != 200:
            return None
        tokens = response.json().get("tokens")
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return tokens if isinstance(tokens, list) and all(isinstance(t, int) for t in tokens) else None


async def kv_route(
    client: httpx.AsyncClient | None,
    replicas: Sequence[Replica],
    index: KVIndex,
    route: RouteRequest,
    payload: Any,
    now: float,
) -> tuple[RouteRequest, list[int] | None]:
    """`route` with what each publishing replica holds (or is expected to) of the request's prompt,
    and the prompt's ids (for `KVIndex.expect` once routed); unchanged and None when none publishes."""
    publishing = set(index.publishing())
    tokenizers = [r for r in replicas if r.replica_id in publishing and r.state is ReplicaState.READY]
    if client is None or not tokenizers:
        return route, None
    ids = await prompt_ids(client, tokenizers[next(_turn) % len(tokenizers)].url, payload)
    if ids is None:
        return route, None
    return replace(route, kv=index.match(ids, now=now)), ids

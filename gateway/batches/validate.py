"""Checking a batch's requests before it is stored: Anthropic's `requests` list and OpenAI's JSONL input file.

What is checked here is each request's envelope (its custom_id, its method and url, that params/body is an
object); the params themselves are checked when the item runs, as the interactive route checks them, and an
invalid one is that item's `errored` result (as at Anthropic). Anything wrong here is a 400 naming the place.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gateway.batches.store import NewItem
from kvgate.errors import InvalidRequestError

MAX_BATCH_REQUESTS = 10_000
"""Requests per batch (Anthropic allows 100,000 and 256 MB, OpenAI 50,000 and 200 MB); the body or file is
bounded by KVGATE_MAX_REQUEST_BYTES (32 MiB)."""
CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
CHAT_ENDPOINT = "/v1/chat/completions"
OPENAI_ENDPOINTS = (CHAT_ENDPOINT,)


def _params_json(params: dict[str, Any]) -> str:
    # ASCII escapes: a lone surrogate stays text the database can store, and the item's run refuses it.
    return json.dumps(params, separators=(",", ":"))


def _check_count(n: int, where: str) -> None:
    if n == 0:
        raise InvalidRequestError(f"{where}: a batch needs at least one request", param=where)
    if n > MAX_BATCH_REQUESTS:
        raise InvalidRequestError(
            f"{where}: {n} requests exceed this server's limit of {MAX_BATCH_REQUESTS} per batch", param=where
        )


def _check_custom_id(custom_id: Any, where: str, seen: set[str]) -> str:
    if not isinstance(custom_id, str) or not CUSTOM_ID.match(custom_id):
        raise InvalidRequestError(f"{where}: must be 1 to 64 characters of letters, digits, '_' or '-'", param=where)
    if custom_id in seen:
        raise InvalidRequestError(f"{where}: custom_id {custom_id!r} is used twice in this batch", param=where)
    seen.add(custom_id)
    return custom_id


def anthropic_items(body: Any) -> list[NewItem]:
    """The `requests` of a POST /v1/messages/batches body."""
    if not isinstance(body, dict) or set(body) - {"requests"}:
        extra = sorted(set(body) - {"requests"}) if isinstance(body, dict) else []
        raise InvalidRequestError(
            f"{extra[0]}: Extra inputs are not permitted" if extra else "the body must be an object"
        )
    requests = body.get("requests")
    if not isinstance(requests, list):
        raise InvalidRequestError("requests: Field required (a list of {custom_id, params})", param="requests")
    _check_count(len(requests), "requests")
    seen: set[str] = set()
    items = []
    for i, request in enumerate(requests):
        where = f"requests.{i}"
        if not isinstance(request, dict):
            raise InvalidRequestError(f"{where}: must be an object with custom_id and params", param=where)
        extra = sorted(set(request) - {"custom_id", "params"})
        if extra:
            raise InvalidRequestError(f"{where}.{extra[0]}: Extra inputs are not permitted", param=where)
        custom_id = _check_custom_id(request.get("custom_id"), f"{where}.custom_id", seen)
        params = request.get("params")
        if not isinstance(params, dict):
            raise InvalidRequestError(
                f"{where}.params: must be an object (a Messages request)", param=f"{where}.params"
            )
        items.append(NewItem(custom_id, _params_json(params)))
    return items


def openai_items(content: bytes, *, endpoint: str) -> list[NewItem]:
    """The lines of an OpenAI batch input file: {custom_id, method: POST, url: endpoint, body}."""
    where = "input_file_id"
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequestError("input_file_id: the file is not UTF-8 text", param=where) from None
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    _check_count(len(lines), where)
    seen: set[str] = set()
    items = []
    for n, line in lines:
        try:
            request = json.loads(line)
        except ValueError as exc:
            raise InvalidRequestError(f"input_file_id: line {n} is not valid JSON ({exc})", param=where) from None
        if not isinstance(request, dict):
            raise InvalidRequestError(f"input_file_id: line {n} is not a JSON object", param=where)
        custom_id = _check_custom_id(request.get("custom_id"), f"input_file_id: line {n}: custom_id", seen)
        if request.get("method") != "POST":
            raise InvalidRequestError(f"input_file_id: line {n}: method must be 'POST'", param=where)
        if request.get("url") != endpoint:
            raise InvalidRequestError(
                f"input_file_id: line {n}: url {request.get('url')!r} is not the batch's endpoint {endpoint!r}",
                param=where,
            )
        body = request.get("body")
        if not isinstance(body, dict):
            raise InvalidRequestError(f"input_file_id: line {n}: body must be an object", param=where)
        items.append(NewItem(custom_id, _params_json(body)))
    return items

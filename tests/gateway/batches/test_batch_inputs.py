"""Hostile and malformed batch input: each is a 400 (or 404) in the API's own error shape, never a 500."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from gateway.batches.validate import MAX_BATCH_REQUESTS
from tests.gateway.batches.conftest import chat_line, jsonl, message_params
from tests.gateway.harness import GatewayServer, Key


def _anthropic_error(response: httpx.Response, status: int = 400) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] in ("invalid_request_error", "not_found_error")
    return body["error"]["message"]


def _openai_error(response: httpx.Response, status: int = 400) -> dict[str, object]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{not json", "not valid JSON"),
        (b"[]", "object"),
        (b'{"requests": "many"}', "requests"),
        (b'{"requests": []}', "at least one"),
        (b'{"requests": [1]}', "requests.0"),
        (b'{"requests": [{"custom_id": "a b", "params": {}}]}', "requests.0.custom_id"),
        (b'{"requests": [{"custom_id": "", "params": {}}]}', "requests.0.custom_id"),
        (b'{"requests": [{"custom_id": "a", "params": []}]}', "requests.0.params"),
        (b'{"requests": [{"custom_id": "a", "params": {}, "x": 1}]}', "requests.0.x"),
        (b'{"requests": [{"custom_id": "a", "params": {}}, {"custom_id": "a", "params": {}}]}', "used twice"),
        (b'{"requests": [{"custom_id": "a", "params": {}}], "extra": true}', "extra"),
    ],
)
def test_bad_message_batch_bodies(batch_gateway: GatewayServer, key: Key, body: bytes, says: str) -> None:
    response = httpx.post(
        f"{batch_gateway.base_url}/v1/messages/batches",
        content=body,
        headers={"x-api-key": key.key, "content-type": "application/json"},
    )
    assert says in _anthropic_error(response)


def test_too_many_requests_per_batch(batch_gateway: GatewayServer, key: Key) -> None:
    client = batch_gateway.anthropic(key)
    requests = [{"custom_id": f"r{i}", "params": {}} for i in range(MAX_BATCH_REQUESTS + 1)]
    with pytest.raises(anthropic.BadRequestError, match=f"limit of {MAX_BATCH_REQUESTS}"):
        client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    oai = batch_gateway.openai(key)
    lines = [chat_line(batch_gateway, f"r{i}") for i in range(MAX_BATCH_REQUESTS + 1)]
    upload = oai.files.create(file=("big.jsonl", jsonl(lines)), purpose="batch")
    with pytest.raises(openai.BadRequestError, match=f"limit of {MAX_BATCH_REQUESTS}"):
        oai.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")


def test_results_before_the_end_and_unknown_ids(batch_gateway: GatewayServer, key: Key) -> None:
    headers = {"x-api-key": key.key}
    base = batch_gateway.base_url
    assert "msgbatch_nope" in _anthropic_error(
        httpx.get(f"{base}/v1/messages/batches/msgbatch_nope", headers=headers), 404
    )
    big = [{"custom_id": f"r{i}", "params": message_params(batch_gateway, max_tokens=64)} for i in range(30)]
    created = httpx.post(f"{base}/v1/messages/batches", json={"requests": big}, headers=headers).json()
    early = httpx.get(f"{base}/v1/messages/batches/{created['id']}/results", headers=headers)
    if early.status_code != 200:  # it may have ended already on a fast machine
        assert "ended" in _anthropic_error(early)
    httpx.post(f"{base}/v1/messages/batches/{created['id']}/cancel", headers=headers).raise_for_status()
    assert _anthropic_error(httpx.get(f"{base}/v1/messages/batches?limit=0", headers=headers))
    assert _anthropic_error(httpx.get(f"{base}/v1/messages/batches?after_id=msgbatch_nope", headers=headers), 404)


def _upload(batch_gateway: GatewayServer, key: Key, content: bytes, purpose: str = "batch") -> httpx.Response:
    return httpx.post(
        f"{batch_gateway.base_url}/v1/files",
        files={"file": ("in.jsonl", content)},
        data={"purpose": purpose},
        headers={"authorization": f"Bearer {key.key}"},
    )


def _create(batch_gateway: GatewayServer, key: Key, **body: object) -> httpx.Response:
    return httpx.post(f"{batch_gateway.base_url}/v1/batches", json=body, headers={"authorization": f"Bearer {key.key}"})


def test_bad_files_and_batches(batch_gateway: GatewayServer, key: Key) -> None:
    assert _openai_error(_upload(batch_gateway, key, b"{}", purpose="fine-tune"))["param"] == "purpose"
    no_file = httpx.post(
        f"{batch_gateway.base_url}/v1/files", data={"purpose": "batch"}, headers={"authorization": f"Bearer {key.key}"}
    )
    assert _openai_error(no_file)["param"] == "file"
    not_multipart = httpx.post(
        f"{batch_gateway.base_url}/v1/files", content=b"\x00\xff", headers={"authorization": f"Bearer {key.key}"}
    )
    _openai_error(not_multipart)

    good = _upload(batch_gateway, key, (chat_line(batch_gateway, "a") + "\n").encode()).json()["id"]
    window = {"completion_window": "24h"}
    unknown = _create(batch_gateway, key, input_file_id=good, endpoint="/v1/embeddings", **window)
    assert _openai_error(unknown)["param"] == "endpoint"
    assert (
        _openai_error(
            _create(batch_gateway, key, input_file_id=good, endpoint="/v1/chat/completions", completion_window="1h")
        )["param"]
        == "completion_window"
    )
    assert (
        _openai_error(_create(batch_gateway, key, endpoint="/v1/chat/completions", **window))["param"]
        == "input_file_id"
    )
    missing = _create(batch_gateway, key, input_file_id="file-nope", endpoint="/v1/chat/completions", **window)
    _openai_error(missing, 404)
    bad_metadata = _create(
        batch_gateway, key, input_file_id=good, endpoint="/v1/chat/completions", metadata={"k": 1}, **window
    )
    assert _openai_error(bad_metadata)["param"] == "metadata"

    line = json.loads(chat_line(batch_gateway, "a"))
    hostile = {
        b"not json at all\n": "line 1 is not valid JSON",
        b"[1, 2]\n": "line 1 is not a JSON object",
        b"\xff\xfe\n": "not UTF-8",
        b"\n\n": "at least one",
        (chat_line(batch_gateway, "a") + "\n" + chat_line(batch_gateway, "a")).encode(): "used twice",
        json.dumps({**line, "url": "/v1/completions"}).encode(): "line 1: url",
        json.dumps({**line, "method": "GET"}).encode(): "line 1: method",
        json.dumps({**line, "body": "x"}).encode(): "line 1: body",
        json.dumps({**line, "custom_id": 7}).encode(): "custom_id",
        (chat_line(batch_gateway, "ok") + "\n{").encode(): "line 2",
    }
    for content, says in hostile.items():
        file_id = _upload(batch_gateway, key, content).json()["id"]
        error = _openai_error(
            _create(batch_gateway, key, input_file_id=file_id, endpoint="/v1/chat/completions", **window)
        )
        assert says in str(error["message"]), (content, error)


def test_bad_params_are_the_items_errored_results(batch_gateway: GatewayServer, key: Key) -> None:
    from tests.gateway.batches.conftest import wait_for

    client = batch_gateway.anthropic(key)
    requests = [
        {"custom_id": "surrogate", "params": message_params(batch_gateway, "SURROGATE")},
        {"custom_id": "no-messages", "params": {"model": batch_gateway.model, "max_tokens": 4}},
        {"custom_id": "huge-max", "params": message_params(batch_gateway, max_tokens=10**9)},
    ]
    # A lone surrogate, as JSON can spell it (the SDK cannot send one): stored, then refused when the item runs.
    body = json.dumps({"requests": requests}).replace("SURROGATE", "\\ud800").encode()
    response = httpx.post(
        f"{batch_gateway.base_url}/v1/messages/batches",
        content=body,
        headers={"x-api-key": key.key, "content-type": "application/json"},
    )
    batch = client.messages.batches.retrieve(response.json()["id"])
    wait_for(lambda: client.messages.batches.retrieve(batch.id).processing_status == "ended")
    results = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
    assert {k: r.type for k, r in results.items()} == {k: "errored" for k in ("surrogate", "no-messages", "huge-max")}
    assert all(r.error.error.type == "invalid_request_error" for r in results.values())  # type: ignore[union-attr]

"""OpenAI Responses API through the official openai SDK: create, stream, store, chain, retrieve, delete."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import sqlalchemy as sa

from tests.gateway.harness import GatewayServer

INSTRUCTIONS = "You are the assistant of a small bakery. Keep answers to a single sentence, please. " * 12
QUESTION = "Any rye bread today? " * 8
POISON_TEMPERATURE = 1.37  # stopping_gateway's engine fails requests sampled at this temperature


class StoppingEngine:
    """The real engine, with every request stopped at the first space it writes: the tiny random model never
    ends a reply by itself, and a completed (not incomplete) response needs an end other than max_output_tokens."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def submit(self, prompt: Any, params: Any, cache: Any, request_id: str | None = None, share: Any = None) -> Any:
        return self._engine.submit(prompt, replace(params, stop=(" ",)), cache, request_id=request_id, share=share)


@pytest.fixture(scope="module")
def stopping_gateway(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    url = f"sqlite:///{tmp_path_factory.mktemp('responses-stop') / 'kvgate.db'}"
    server = GatewayServer(model_dir=tiny_llama_dir, database_url=url, wrap_engine=StoppingEngine).start()
    core = server.gateway.engine.engine.core
    append_token = core._append_token

    def faulty(tracked: Any, token: int) -> Any:
        if tracked.request.params.temperature == POISON_TEMPERATURE:
            raise RuntimeError("injected fault in this request's processing")
        return append_token(tracked, token)

    core._append_token = faulty
    try:
        yield server
    finally:
        server.stop()


def create(server: GatewayServer, key: Any, **body: Any) -> Any:
    params: dict[str, Any] = {"model": server.model, "max_output_tokens": 4, "temperature": 0, "input": QUESTION}
    params.update(body)
    return server.openai(key).responses.create(**params)


def test_string_input_gives_a_response_the_sdk_parses(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    response = create(gateway, key, instructions=INSTRUCTIONS, metadata={"order": "42"})
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.model == gateway.model
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    [message] = response.output
    assert message.type == "message" and message.role == "assistant" and message.status == "incomplete"
    assert message.content[0].type == "output_text"
    assert response.output_text == message.content[0].text
    usage = response.usage
    assert usage.output_tokens == 4 and usage.output_tokens_details.reasoning_tokens == 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens == 0
    written = usage.input_tokens_details.cache_write_tokens
    assert written > 0
    assert response.metadata == {"order": "42"} and response.instructions == INSTRUCTIONS
    assert response.store is True and response.text.format.type == "text"

    # The same request again reads what the first wrote; another tenant reads nothing.
    again = create(gateway, key, instructions=INSTRUCTIONS)
    assert again.usage.input_tokens_details.cached_tokens == written
    assert again.usage.input_tokens == usage.input_tokens
    assert again.output_text == response.output_text  # greedy: the same text, cached or not
    assert create(gateway, gateway.new_key(), instructions=INSTRUCTIONS).usage.input_tokens_details.cached_tokens == 0

    record = gateway.usage_record("req_" + response.id.removeprefix("resp_"))
    assert record is not None and record["endpoint"] == "responses"
    assert record["output_tokens"] == 4


def test_items_input_with_roles_and_parts(stopping_gateway: GatewayServer) -> None:
    gateway = stopping_gateway
    key = gateway.new_key()
    items = [
        {"role": "developer", "content": "Answer briefly."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hi! How can I help?", "annotations": []}]},
        {"role": "user", "content": [{"type": "input_text", "text": "Name a bread."}]},
    ]
    as_items = create(gateway, key, input=items, max_output_tokens=200)
    assert as_items.status == "completed" and as_items.incomplete_details is None
    assert as_items.completed_at is not None and as_items.output[0].status == "completed"
    assert as_items.usage.output_tokens < 200
    # A string input is one user message: the same prompt as that message sent as an item.
    one = create(gateway, key, input="Name a bread.")
    same = create(gateway, key, input=[{"role": "user", "content": "Name a bread."}])
    assert one.usage.input_tokens == same.usage.input_tokens and one.output_text == same.output_text


def _stream_events(server: GatewayServer, key: Any, **body: Any) -> list[Any]:
    params = {"model": server.model, "max_output_tokens": 5, "temperature": 0, "input": QUESTION, **body}
    with server.openai(key).responses.create(stream=True, **params) as stream:
        return list(stream)


def test_stream_with_create_gives_openais_event_sequence(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    events = _stream_events(gateway, key)
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 1
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",  # cut at max_output_tokens, as OpenAI ends such a stream
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == text == events[-4].text
    assert final.usage.output_tokens == 5 and final.status == "incomplete"
    assert events[0].response.id == final.id and events[0].response.status == "in_progress"
    # Streamed or not, the same text and counts.
    plain = create(gateway, key, max_output_tokens=5)
    assert plain.output_text == text and plain.usage.input_tokens == final.usage.input_tokens


def test_stream_helper_gets_the_final_response(stopping_gateway: GatewayServer) -> None:
    gateway = stopping_gateway
    key = gateway.new_key()
    client = gateway.openai(key)
    params = {"model": gateway.model, "temperature": 0, "max_output_tokens": 200, "input": "Say hi."}
    with client.responses.stream(**params) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text == "".join(deltas)
    assert final.usage.total_tokens == final.usage.input_tokens + final.usage.output_tokens
    # The streamed response was stored, under the id the stream gave.
    assert client.responses.retrieve(final.id).output_text == final.output_text


def test_store_retrieve_delete_per_tenant(any_gateway: GatewayServer) -> None:
    gateway = any_gateway  # on SQLite and PostgreSQL
    key = gateway.new_key()
    client = gateway.openai(key)
    created = create(gateway, key)
    fetched = client.responses.retrieve(created.id)
    assert fetched.model_dump() == created.model_dump()
    # Another key of the same tenant sees it; another tenant does not, and cannot delete it.
    assert gateway.openai(gateway.new_key(key.tenant_id)).responses.retrieve(created.id).id == created.id
    stranger = gateway.openai(gateway.new_key())
    with pytest.raises(openai.NotFoundError) as hidden:
        stranger.responses.retrieve(created.id)
    assert hidden.value.body["message"] == f"No response found with id '{created.id}'."
    with pytest.raises(openai.NotFoundError):
        stranger.responses.delete(created.id)
    assert client.responses.retrieve(created.id).id == created.id  # still there
    follow = create(gateway, key, previous_response_id=created.id, input="More?")
    assert client.responses.retrieve(follow.id).previous_response_id == created.id
    with gateway.db.connect() as conn:
        row = conn.execute(
            sa.text("SELECT tenant_id, status, previous_response_id, context_json FROM responses WHERE id = :i"),
            {"i": follow.id},
        ).one()
    assert row.tenant_id == key.tenant_id and row.status == "incomplete" and row.previous_response_id == created.id
    context = json.loads(row.context_json)  # earlier input, earlier output, this input
    assert [item["role"] for item in context] == ["user", "assistant", "user"]
    assert context[1]["content"][0]["text"] == created.output_text

    deleted = httpx.delete(
        f"{gateway.base_url}/v1/responses/{created.id}", headers={"authorization": f"Bearer {key.key}"}
    )
    assert deleted.status_code == 200 and deleted.json() == {"id": created.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(created.id)


def test_previous_response_id_reads_the_earlier_turn_from_cache(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    client = gateway.openai(key)
    first = create(gateway, key, max_output_tokens=8)
    assert first.usage.input_tokens_details.cached_tokens == 0
    written = first.usage.input_tokens_details.cache_write_tokens
    second = client.responses.create(
        model=gateway.model, temperature=0, max_output_tokens=4, previous_response_id=first.id, input="And rolls?"
    )
    assert second.previous_response_id == first.id
    cached = second.usage.input_tokens_details.cached_tokens
    # The whole earlier prompt, as far as the engine caches it (full 16-token blocks, never the
    # block holding the last prompt token): everything the first turn wrote is read.
    assert cached == written > 0
    assert cached > first.usage.input_tokens - 16
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens

    # The same conversation sent whole by another tenant: the same prompt, nothing cached.
    conversation = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And rolls?"},
    ]
    fresh = create(gateway, gateway.new_key(), input=conversation)
    assert fresh.usage.input_tokens == second.usage.input_tokens
    assert fresh.usage.input_tokens_details.cached_tokens == 0
    assert fresh.output_text == second.output_text

    # A third turn continues the second (the chain), and reads the second turn's prompt.
    third = client.responses.create(
        model=gateway.model, temperature=0, max_output_tokens=4, previous_response_id=second.id, input="Thanks."
    )
    assert third.usage.input_tokens_details.cached_tokens >= second.usage.input_tokens - 16


def test_previous_response_id_of_another_tenant_or_unstored_is_refused(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    mine = create(gateway, key)
    unstored = create(gateway, key, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        gateway.openai(key).responses.retrieve(unstored.id)
    for client, previous in (
        (gateway.openai(gateway.new_key()), mine.id),  # another tenant's
        (gateway.openai(key), unstored.id),  # store=false
        (gateway.openai(key), "resp_unknown"),
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model=gateway.model, max_output_tokens=2, previous_response_id=previous, input="x")
        body = refused.value.body
        assert body["param"] == "previous_response_id" and body["code"] == "previous_response_not_found"
        assert body["message"] == f"Previous response with id '{previous}' not found."
    # The owner can continue it.
    assert create(gateway, key, previous_response_id=mine.id, input="x").previous_response_id == mine.id


def test_instructions_are_not_carried_over(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    first = create(gateway, key, instructions=INSTRUCTIONS)
    second = create(gateway, key, previous_response_id=first.id, input="More?")
    assert second.instructions is None
    # Without the instructions the prompt is shorter than the earlier one plus the new turn.
    assert second.usage.input_tokens < first.usage.input_tokens


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"input": [{"type": "input_image", "image_url": "x"}]}, "input.0.type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input.0.content.0"),
        ({"background": True}, "background"),
        ({"truncation": "auto"}, "truncation"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"input": None}, "input"),
        ({"input": []}, "input"),
        ({"input": "", "previous_response_id": "resp_x"}, "input"),
        ({"model": "nope"}, "model"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"prompt_cache_retention": "24h"}, "prompt_cache_retention"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
        ({"unknown_field": 1}, "unknown_field"),
    ],
)
def test_bad_requests_are_400s_in_openais_shape(gateway: GatewayServer, body: dict[str, Any], param: str) -> None:
    key = gateway.new_key()
    payload = {"model": gateway.model, "input": "hi", "max_output_tokens": 2, **body}
    response = httpx.post(
        f"{gateway.base_url}/v1/responses", json=payload, headers={"authorization": f"Bearer {key.key}"}, timeout=60
    )
    assert response.status_code in (400, 404), response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]


def test_function_call_items_become_tool_parts() -> None:
    from gateway.prompt import ToolCallPart, ToolResultPart
    from gateway.protocols.responses import ResponsesRequest, canonical_input, to_chat

    request = ResponsesRequest.model_validate(
        {
            "model": "m",
            "input": [
                {"role": "user", "content": "Weather in Paris?"},
                {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city":"Paris"}'},
                {"type": "function_call", "call_id": "c2", "name": "time", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            ],
        }
    )
    chat = to_chat("Be brief.", canonical_input(request))
    roles = [m.role for m in chat.messages]
    assert roles == ["system", "user", "assistant", "tool"]
    assert chat.messages[2].parts == (
        ToolCallPart("c1", "weather", '{"city":"Paris"}'),
        ToolCallPart("c2", "time", "{}"),
    )
    assert chat.messages[3].parts == (ToolResultPart("c1", "sunny"),)


def test_function_tools_take_the_chat_form() -> None:
    from gateway.protocols.responses import ResponsesRequest
    from gateway.protocols.responses_tools import tool_defs

    tool = {"type": "function", "name": "weather", "description": "Weather", "parameters": {"type": "object"}}
    request = ResponsesRequest.model_validate({"model": "m", "input": "x", "tools": [tool]})
    [definition] = tool_defs(request.tools)
    assert definition.definition == {
        "type": "function",
        "function": {"name": "weather", "description": "Weather", "parameters": {"type": "object"}},
    }
    hosted = ResponsesRequest.model_validate({"model": "m", "input": "x", "tools": [{"type": "web_search"}]})
    with pytest.raises(Exception, match="tools of type 'web_search' are not supported"):
        tool_defs(hosted.tools)


def test_text_format_json_schema_constrains_the_output(gateway: GatewayServer) -> None:
    # Enums and booleans only: the tiny random model could write an unbounded string forever.
    schema = {
        "type": "object",
        "properties": {"bread": {"enum": ["rye", "wheat"]}, "fresh": {"type": "boolean"}},
        "required": ["bread", "fresh"],
        "additionalProperties": False,
    }
    response = create(
        gateway,
        gateway.new_key(),
        input="Name a bread as JSON.",
        max_output_tokens=100,
        text={"format": {"type": "json_schema", "name": "bread", "schema": schema, "strict": True}},
    )
    assert response.status == "completed"
    assert json.loads(response.output_text)["bread"] in ("rye", "wheat")
    assert response.text.format.type == "json_schema"


def test_a_bad_text_format_schema_is_a_400_naming_it(gateway: GatewayServer) -> None:
    bad = {"type": "json_schema", "name": "x", "schema": {"type": "object", "properties": 3}, "strict": True}
    with pytest.raises(openai.BadRequestError) as refused:
        create(gateway, gateway.new_key(), text={"format": bad})
    assert refused.value.body["param"] == "text.format"
    # The plain text format is accepted.
    assert create(gateway, gateway.new_key(), text={"format": {"type": "text"}}).text.format.type == "text"


def test_cost_is_in_usage_and_header(gateway: GatewayServer) -> None:
    from decimal import Decimal

    paying = gateway.new_key()
    gateway.billing.price[paying.tenant_id] = Decimal("0.000123450")
    raw = gateway.openai(paying).responses.with_raw_response.create(
        model=gateway.model, input="hi", max_output_tokens=2
    )
    assert raw.headers["kvgate-cost-usd"] == "0.000123450"
    assert raw.parse().usage.model_extra["cost_usd"] == "0.000123450"
    completion = gateway.openai(paying).completions.with_raw_response.create(
        model=gateway.model, prompt="hi", max_tokens=2
    )
    assert completion.headers["kvgate-cost-usd"] == "0.000123450"
    assert "cost_usd" not in (create(gateway, gateway.new_key()).usage.model_extra or {})


def test_a_dropped_stream_is_cancelled_recorded_and_not_stored(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    params = {"model": gateway.model, "temperature": 0, "max_output_tokens": 2000, "input": QUESTION, "stream": True}
    with httpx.stream(
        "POST", f"{gateway.base_url}/v1/responses", json=params, headers={"authorization": f"Bearer {key.key}"}
    ) as response:
        lines = response.iter_lines()
        created = next(line for line in lines if line.startswith("data:") and "response.created" in line)
    response_id = created.split('"id":"')[1].split('"')[0]
    record = gateway.usage_record("req_" + response_id.removeprefix("resp_"), wait_s=30)
    assert record is not None and record["status"] == "cancelled" and record["output_tokens"] < 2000
    with pytest.raises(openai.NotFoundError):
        gateway.openai(key).responses.retrieve(response_id)


def test_large_bodies_and_histories_are_prepared_in_request_workers(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    big = "hi" + " hello" * 1500  # over 8 KiB: prepared in a worker process, not on the event loop
    first = create(gateway, key, input=big, max_output_tokens=2)
    assert first.usage.input_tokens > 1500
    # A small body whose history is large: the second pass runs in a worker too, with the history sent along.
    second = create(gateway, key, input="And then?", previous_response_id=first.id, max_output_tokens=2)
    assert second.usage.input_tokens_details.cached_tokens == first.usage.input_tokens_details.cache_write_tokens > 1500
    assert gateway.gateway.workers._executor is not None  # the worker pool was used (it starts on first use)


def test_a_request_failing_in_the_engine_is_a_500_or_an_error_event_and_is_not_stored(
    stopping_gateway: GatewayServer,
) -> None:
    server, key = stopping_gateway, stopping_gateway.new_key()
    client = server.openai(key)
    with pytest.raises(openai.InternalServerError) as failed:
        create(server, key, temperature=POISON_TEMPERATURE)
    assert "injected fault" in failed.value.body["message"] and failed.value.body["type"] == "server_error"

    params = {"model": server.model, "input": "hi", "max_output_tokens": 8, "temperature": POISON_TEMPERATURE}
    with pytest.raises(openai.APIError, match="injected fault"):
        list(client.responses.create(stream=True, **params))
    raw = httpx.post(
        f"{server.base_url}/v1/responses",
        json={**params, "stream": True},
        headers={"authorization": f"Bearer {key.key}"},
        timeout=60,
    )
    events = [line.removeprefix("event: ") for line in raw.text.splitlines() if line.startswith("event: ")]
    assert events[:2] == ["response.created", "response.in_progress"]
    assert events[-2:] == ["error", "response.failed"]
    failed_id = raw.text.split('"id":"')[1].split('"')[0]
    assert server.usage_record("req_" + failed_id.removeprefix("resp_"))["status"] == "error"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(failed_id)
    assert create(server, key, temperature=0).status in ("completed", "incomplete")  # the engine serves on


def test_input_items_are_listed_with_ids_and_paged(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    client = gateway.openai(key)
    items = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "Hello"}]},
        {"role": "assistant", "content": "Hi!"},
        {"role": "user", "content": "Name a bread."},
    ]
    first = create(gateway, key, input=items)
    listed = client.responses.input_items.list(first.id, order="asc")
    assert [(i.type, i.role) for i in listed.data] == [
        ("message", "developer"),
        ("message", "user"),
        ("message", "assistant"),
        ("message", "user"),
    ]
    assert listed.data[2].content[0].type == "output_text" and listed.data[3].content[0].text == "Name a bread."
    # Newest first by default, and paged with `after` (the SDK follows the cursor).
    assert [i.id for i in client.responses.input_items.list(first.id)] == [i.id for i in reversed(listed.data)]
    page = client.responses.input_items.list(first.id, limit=3)
    assert len(page.data) == 3 and page.has_more
    assert len(list(page)) == 4 and len({i.id for i in page}) == 4
    # A continuation lists only its own input.
    second = create(gateway, key, previous_response_id=first.id, input="And rolls?")
    assert [i.content[0].text for i in client.responses.input_items.list(second.id)] == ["And rolls?"]
    with pytest.raises(openai.NotFoundError):
        gateway.openai(gateway.new_key()).responses.input_items.list(first.id)
    with pytest.raises(openai.BadRequestError):
        client.responses.input_items.list(first.id, after="msg_nope")


@pytest.mark.parametrize("ttl", ["30m", "12h"])
def test_prompt_cache_options_set_the_ttl_of_automatic_caching(gateway: GatewayServer, ttl: str) -> None:
    key = gateway.new_key()
    options = {"mode": "implicit", "ttl": ttl}
    first = create(gateway, key, instructions=INSTRUCTIONS, extra_body={"prompt_cache_options": options})
    record = gateway.usage_record("req_" + first.id.removeprefix("resp_"))
    assert record is not None
    # The whole prompt is written in the asked class (its full blocks, except the one holding the last
    # token, which the engine recomputes), and nothing in the others.
    assert record[f"cache_write_{ttl}_tokens"] == (first.usage.input_tokens - 1) // 16 * 16 > 0
    assert record["cache_write_5m_tokens"] == 0
    again = create(gateway, key, instructions=INSTRUCTIONS, extra_body={"prompt_cache_options": options})
    assert again.usage.input_tokens_details.cached_tokens == record[f"cache_write_{ttl}_tokens"]


def test_explicit_mode_without_breakpoints_writes_nothing(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    explicit = create(
        gateway, key, instructions=INSTRUCTIONS, extra_body={"prompt_cache_options": {"mode": "explicit"}}
    )
    record = gateway.usage_record("req_" + explicit.id.removeprefix("resp_"))
    assert record is not None and all(record[f"cache_write_{t}_tokens"] == 0 for t in ("5m", "30m", "1h", "12h", "24h"))
    # Without options, the same request is cached automatically (5m, as before prompt_cache_options).
    plain = create(gateway, key, instructions=INSTRUCTIONS)
    assert gateway.usage_record("req_" + plain.id.removeprefix("resp_"))["cache_write_5m_tokens"] > 0  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as refused:
        create(gateway, key, extra_body={"prompt_cache_options": {"ttl": "2h"}})
    assert refused.value.body["param"].startswith("prompt_cache_options")

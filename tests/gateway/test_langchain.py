"""LangChain's OpenAI and Anthropic chat models against a real `kvgate serve`, unmodified.

Chat, `bind_tools` with a tool loop, `with_structured_output` and `use_responses_api=True`:
what agent frameworks send, through the official SDKs underneath. The model is a tiny
random-weight one, so tool calls and structured answers come from constrained decoding
(tool_choice forcing a tool, a JSON schema), which is what makes them parse every time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ConfigDict, Field

from tests.gateway.serve_process import Serve

pytestmark = pytest.mark.timeout(420)


class Served:
    def __init__(self, serve: Serve) -> None:
        self.serve = serve
        self.model = serve.admin.get("/healthz").json()["model"]
        self.key = self.new_key()

    def new_key(self) -> str:
        """A key of a new tenant (its own cache salt)."""
        tenant = self.serve.admin.post("/admin/v1/tenants", json={"name": "langchain"}).json()["id"]
        return self.serve.admin.post(f"/admin/v1/tenants/{tenant}/keys", json={"name": "lc"}).json()["key"]

    def openai(self, key: str | None = None, **options: object) -> ChatOpenAI:
        return ChatOpenAI(
            model=self.model,
            base_url=self.serve.base_url + "/v1",
            api_key=key or self.key,
            temperature=0,
            max_tokens=64,
            max_retries=0,
            **options,
        )

    def anthropic(self, key: str | None = None, **options: object) -> ChatAnthropic:
        return ChatAnthropic(
            model=self.model,
            base_url=self.serve.base_url,
            api_key=key or self.key,
            temperature=0,
            max_tokens=64,
            max_retries=0,
            **options,
        )


@pytest.fixture(scope="module")
def served(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    workdir = tmp_path_factory.mktemp("langchain")
    # Short prompts here: a lower minimum lets them be cached (the default is 1,024 tokens, as at OpenAI).
    serve = Serve(
        database_url=f"sqlite:///{workdir / 'kvgate.db'}",
        model_dir=tiny_llama_dir,
        workdir=workdir,
        env={"KVGATE_MIN_CACHEABLE_TOKENS": "32"},
    )
    try:
        yield Served(serve)
    finally:
        serve.stop()


class GetWeather(BaseModel):
    """The current weather in a city."""

    # Bounded, and no other keys: a forced call from a random-weight model must end within max_tokens.
    model_config = ConfigDict(extra="forbid")
    city: str = Field(max_length=20)


def get_weather(city: str) -> str:
    return f"It is sunny in {city}."


class Answer(BaseModel):
    city: str = Field(max_length=20)
    sunny: bool


def test_plain_chat_on_both_apis(served: Served) -> None:
    for chat in (served.openai(), served.anthropic()):
        reply = chat.invoke("Say hello.")
        assert isinstance(reply.content, str | list)
        assert reply.usage_metadata is not None and reply.usage_metadata["input_tokens"] > 0


def weather_tool(api: str) -> object:
    if api == "openai":
        return GetWeather
    # Anthropic caches only what a breakpoint marks: one on the (last) tool makes the tool block a region.
    return {
        "name": "GetWeather",
        "description": GetWeather.__doc__,
        "input_schema": GetWeather.model_json_schema(),
        "cache_control": {"type": "ephemeral"},
    }


def chat_for(served: Served, api: str, key: str | None = None) -> ChatOpenAI | ChatAnthropic:
    return served.openai(key) if api == "openai" else served.anthropic(key)


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_bind_tools_runs_a_tool_loop(served: Served, api: str) -> None:
    tool = weather_tool(api)
    forced = chat_for(served, api).bind_tools([tool], tool_choice="GetWeather")
    history: list = [HumanMessage("What is the weather in Paris?")]
    first = forced.invoke(history)
    assert [call["name"] for call in first.tool_calls] == ["GetWeather"]
    assert isinstance(first.tool_calls[0]["args"]["city"], str)

    call = first.tool_calls[0]
    history += [first, ToolMessage(get_weather(**call["args"]), tool_call_id=call["id"])]
    second = chat_for(served, api).bind_tools([tool]).invoke(history)
    # Turn two resends the tools first: their block comes from the cache; another tenant reads none of it.
    assert cache_read(second) > 0
    assert cache_read(chat_for(served, api, served.new_key()).bind_tools([tool]).invoke(history)) == 0


def cache_read(reply: object) -> int:
    usage = reply.usage_metadata  # type: ignore[attr-defined]
    assert usage is not None and usage["input_tokens"] > 0
    return usage.get("input_token_details", {}).get("cache_read", 0)


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_with_structured_output_returns_the_model(served: Served, api: str) -> None:
    chat = served.openai() if api == "openai" else served.anthropic()
    answer = chat.with_structured_output(Answer).invoke("Is it sunny in Paris? Answer as JSON.")
    assert isinstance(answer, Answer)


def test_use_responses_api(served: Served) -> None:
    chat = served.openai(use_responses_api=True)
    reply = chat.invoke("Say hello.")
    assert reply.usage_metadata is not None and reply.usage_metadata["input_tokens"] > 0
    assert reply.response_metadata.get("id", "").startswith("resp_")
    answer = served.openai(use_responses_api=True).with_structured_output(Answer).invoke("Is it sunny in Paris?")
    assert isinstance(answer, Answer)

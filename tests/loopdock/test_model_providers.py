"""Providers from the dock config (``providers:``), through the public API, against a
stand-in OpenAI-compatible server on 127.0.0.1 (tests/openai_standin.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from openai_standin import Answer, FakeOpenAI, content, finish, sse, usage

from loopdock import Runtime
from loopdock.actors.dock import DockError, config_to_dict, parse_config
from loopdock.runtime.models import OpenAICompatibleAdapter, Price, ProviderSpec, default_adapters


@pytest.fixture(autouse=True)
def _no_proxies(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


async def test_an_openai_compatible_agent_completes_a_turn(tmp_path):
    answers = [sse(content("hello "), content("there"), finish("stop"), usage(2000, 1000))]
    async with trio.open_nursery() as nursery:
        server = await FakeOpenAI(answers).start(nursery)
        config = {
            "providers": {
                "openai-compatible": {
                    "baseUrl": server.base_url,
                    "apiKeyEnv": "STANDIN_API_KEY",
                    "prices": {"local-model": {"input": 1.0, "output": 3.0}},
                }
            }
        }
        with trio.fail_after(30):
            async with Runtime.open(tmp_path / "home", config=config, env={"STANDIN_API_KEY": "sk-standin"}) as rt:
                handle = await rt.create_agent(
                    session_id="s1", agent_options={"provider": "openai-compatible", "model": "local-model"}
                )
                handle.agent.followup("hi")
                await handle.agent.wait_idle()
                events = await handle.agent.session.read_events()
        nursery.cancel_scope.cancel()

    replies = [e.data for e in events if e.type == "assistant/message"]
    assert len(replies) == 1
    assert [block["text"] for block in replies[0]["content"]] == ["hello there"]
    assert replies[0]["usage"] == {"inputTokens": 2000, "outputTokens": 1000, "costUsd": pytest.approx(0.005)}
    (request,) = server.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-standin"
    assert request.body["model"] == "local-model"
    assert request.body["messages"][-1] == {"role": "user", "content": "hi"}


def test_providers_parse_and_round_trip():
    config = parse_config({
        "providers": {
            "openrouter": {"type": "openai-compatible", "base_url": "https://openrouter.ai/api/v1",
                           "api_key_env": "OPENROUTER_API_KEY", "prices": {"a/b": {"input": 1, "output": 2}}},
            "openai-compatible": {"baseUrl": "http://127.0.0.1:11434/v1"},
        }
    })  # fmt: skip
    assert config.providers["openrouter"] == ProviderSpec(
        "openai-compatible", "https://openrouter.ai/api/v1", "OPENROUTER_API_KEY", {"a/b": Price(1.0, 2.0)}
    )
    assert config.providers["openai-compatible"].api_key_env is None  # a local server: no key
    assert parse_config(config_to_dict(config)) == config


@pytest.mark.parametrize(
    ("provider", "message"),
    [
        ({"type": "nope", "baseUrl": "http://x"}, "providers.p.type must be one of openai-compatible, anthropic"),
        ({"type": "openai-compatible", "apiKeyEnv": "K"}, "providers.p.baseUrl is required"),
        ({"type": "openai-compatible", "baseUrl": "ftp://x"}, "must be an http:// or https:// URL"),
        ({"type": "openai-compatible", "baseUrl": "http://x", "apiKey": "K"}, "unknown key providers.p.apiKey"),
        ({"type": "openai-compatible", "baseUrl": "http://x", "prices": {"m": {"input": 1}}}, "output is required"),
    ],
)
def test_bad_providers_are_refused_by_field_path(provider, message):
    with pytest.raises(DockError, match=message):
        parse_config({"providers": {"p": provider}})


def test_a_key_in_place_of_a_variable_name_is_refused_without_quoting_it():
    secret = "sk-or-v1-0123456789abcdef"
    with pytest.raises(DockError, match="must name an environment variable") as info:
        parse_config({"providers": {"p": {"type": "openai-compatible", "baseUrl": "http://x", "apiKeyEnv": secret}}})
    assert secret not in str(info.value)


def test_ping_cannot_be_redefined():
    with pytest.raises(DockError, match="'ping' is built in"):
        parse_config({"providers": {"ping": {"type": "openai-compatible", "baseUrl": "http://x"}}})


def test_a_configured_deepseek_replaces_the_preset():
    spec = ProviderSpec("openai-compatible", "http://127.0.0.1:1/v1")
    registry = default_adapters({"DEEPSEEK_API_KEY": "k"}, {"deepseek": spec, "local": spec})
    assert registry.names() == ("deepseek", "local", "ping")
    adapter = registry.get("deepseek")
    assert isinstance(adapter, OpenAICompatibleAdapter) and adapter.base_url == "http://127.0.0.1:1/v1"


async def test_an_experiment_runs_a_configured_provider(tmp_path):
    from loopdock.experiment import parse_experiment, run_in_runtime

    answers = [sse(content("pong"), finish("stop"), usage(10, 1))] * 4
    async with trio.open_nursery() as nursery:
        server = await FakeOpenAI(answers).start(nursery)
        experiment = parse_experiment({
            "tasks": [{"id": "greet", "input": "hello", "target": "pong"}],
            "scorer": "includes",
            "providers": {"local": {"type": "openai-compatible", "baseUrl": server.base_url}},
            "models": ["local/m1"],
            "loops": ["standard"],
        }, base=tmp_path, default_name="local")  # fmt: skip
        with trio.fail_after(60):
            async with Runtime.open(tmp_path / "home") as rt:
                summary = await run_in_runtime(rt, experiment)
        nursery.cancel_scope.cancel()
    assert (summary.scored, summary.failed) == (1, 0)
    assert server.requests and all(r.body["model"] == "m1" for r in server.requests)


def test_an_experiments_bad_provider_names_its_field():
    from loopdock.experiment import ExperimentError, parse_experiment

    with pytest.raises(ExperimentError, match="providers.local.baseUrl is required"):
        parse_experiment({
            "tasks": [{"id": "greet", "input": "hello", "target": "pong"}], "scorer": "includes",
            "providers": {"local": {"type": "openai-compatible"}}, "models": ["local/m1"], "loops": ["standard"],
        }, base=Path("."), default_name="x")  # fmt: skip


async def test_an_anthropic_agent_completes_a_turn(tmp_path):
    events = [
        {"type": "message_start", "message": {"usage": {"input_tokens": 9, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "bonjour"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}},
        {"type": "message_stop"},
    ]
    async with trio.open_nursery() as nursery:
        server = await FakeOpenAI([Answer(events=events, named=True)]).start(nursery)
        config = {"providers": {"anthropic": {"baseUrl": f"http://127.0.0.1:{server.port}"}}}
        with trio.fail_after(30):
            async with Runtime.open(tmp_path / "home", config=config, env={"ANTHROPIC_API_KEY": "sk-ant"}) as rt:
                handle = await rt.create_agent(
                    session_id="s1",
                    agent_options={"provider": "anthropic", "model": "claude-x", "system_prompt": "Be brief."},
                )
                handle.agent.followup("hi")
                await handle.agent.wait_idle()
                events_seen = await handle.agent.session.read_events()
        nursery.cancel_scope.cancel()
    (reply,) = [e.data for e in events_seen if e.type == "assistant/message"]
    assert [block["text"] for block in reply["content"]] == ["bonjour"]
    assert reply["usage"] == {"inputTokens": 9, "outputTokens": 2}
    (request,) = server.requests
    assert request.headers["x-api-key"] == "sk-ant"
    assert request.body["model"] == "claude-x" and "Be brief." in request.body["system"]


def test_an_anthropic_provider_defaults_its_url_and_key_variable():
    spec = parse_config({"providers": {"claude": {"type": "anthropic"}}}).providers["claude"]
    assert (spec.base_url, spec.api_key_env) == ("https://api.anthropic.com", "ANTHROPIC_API_KEY")


def _anthropic_events(*blocks: list[dict], reason: str) -> Answer:
    return Answer(named=True, events=[
        {"type": "message_start", "message": {"usage": {"input_tokens": 9, "output_tokens": 1}}},
        *(event for block in blocks for event in block),
        {"type": "message_delta", "delta": {"stop_reason": reason}, "usage": {"output_tokens": 2}},
        {"type": "message_stop"},
    ])  # fmt: skip


def _block(index: int, start: dict, *deltas: dict) -> list[dict]:
    return [
        {"type": "content_block_start", "index": index, "content_block": start},
        *({"type": "content_block_delta", "index": index, "delta": delta} for delta in deltas),
        {"type": "content_block_stop", "index": index},
    ]


SIGNATURE = "RXF1aXZhbGVudCB0byBhIHNpZ25hdHVyZQ=="
REDACTED = "b3BhcXVlIHJlYXNvbmluZw=="
THINKING_AND_TOOL = _anthropic_events(
    _block(0, {"type": "thinking", "thinking": "", "signature": ""},
           {"type": "thinking_delta", "thinking": "The folder "}, {"type": "thinking_delta", "thinking": "first."},
           {"type": "signature_delta", "signature": SIGNATURE}),
    _block(1, {"type": "redacted_thinking", "data": REDACTED}),
    _block(2, {"type": "tool_use", "id": "toolu_1", "name": "list_dir", "input": {}},
           {"type": "input_json_delta", "partial_json": '{"path": "."}'}),
    reason="tool_use",
)  # fmt: skip
#: The assistant turn as Anthropic must get it back: its thinking blocks unchanged, first.
REPLAYED = {"role": "assistant", "content": [
    {"type": "thinking", "thinking": "The folder first.", "signature": SIGNATURE},
    {"type": "redacted_thinking", "data": REDACTED},
    {"type": "tool_use", "id": "toolu_1", "name": "list_dir", "input": {"path": "."}},
]}  # fmt: skip


def _text_answer(text: str) -> Answer:
    return _anthropic_events(_block(0, {"type": "text", "text": ""}, {"type": "text_delta", "text": text}),
                             reason="end_turn")  # fmt: skip


async def test_anthropic_thinking_blocks_go_back_with_the_tool_use_and_after_a_resume(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    answers = [THINKING_AND_TOOL, _text_answer("one file"), _text_answer("still one")]
    options = {"provider": "anthropic", "model": "claude-x", "cwd": str(tmp_path)}
    async with trio.open_nursery() as nursery:
        server = await FakeOpenAI(answers).start(nursery)
        config = {"providers": {"anthropic": {"baseUrl": f"http://127.0.0.1:{server.port}"}}}
        env = {"ANTHROPIC_API_KEY": "sk-ant"}
        with trio.fail_after(30):
            async with Runtime.open(tmp_path / "home", config=config, env=env) as rt:
                handle = await rt.create_agent(session_id="thinker", agent_options=options)
                handle.agent.followup("what is here?")
                await handle.agent.wait_idle()
            # A fresh runtime on the same home: the transcript comes back from the session log.
            async with Runtime.open(tmp_path / "home", config=config, env=env) as rt:
                handle = await rt.resume_agent(resume_session_id="thinker", agent_options=options)
                handle.agent.followup("and now?")
                await handle.agent.wait_idle()
                events = await handle.agent.session.read_events()
        nursery.cancel_scope.cancel()

    first, second, third = (request.body["messages"] for request in server.requests)
    assert first == [{"role": "user", "content": [{"type": "text", "text": "what is here?"}]}]
    # The same turn's next request: thinking, redacted thinking, then the tool_use.
    assert second[1] == REPLAYED
    assert second[2]["role"] == "user" and second[2]["content"][0]["tool_use_id"] == "toolu_1"
    # The resumed agent's request replays them from the log, unchanged.
    assert third[1] == REPLAYED
    assert third[:3] == second
    # What the log keeps: the reasoning blocks with their signature and data.
    replies = [e.data for e in events if e.type == "assistant/message"]
    assert replies[0]["content"][:2] == [
        {"type": "reasoning", "text": "The folder first.", "signature": SIGNATURE},
        {"type": "reasoning", "text": "", "redactedData": REDACTED},
    ]

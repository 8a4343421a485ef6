"""One target resolution for every door: the ``target`` setting > what the door declares > an engine the
endpoint answers as > the provider of the request's API; engine names have one spelling and accept aliases."""

from __future__ import annotations

import asyncio

import pytest

from agentcache import ConfigError, Sessions, Settings, audit
from agentcache.loaders import Record
from agentcache.model._types import Api, Engine, parse_engine
from agentcache.proxy import ProxyConfig, create_app
from agentcache.targets import AnthropicTarget, EngineTarget, OpenAITarget, is_provider_host, probe, resolve_target

from .test_wrap_upstream import FakeUpstream


def test_precedence() -> None:
    assert isinstance(resolve_target(Api.ANTHROPIC_MESSAGES), AnthropicTarget)
    assert isinstance(resolve_target("openai.chat"), OpenAITarget)
    assert isinstance(resolve_target("openai.chat", detected=Engine.SGLANG), EngineTarget)
    assert resolve_target("openai.chat", declared="anthropic", detected=Engine.SGLANG).name == "anthropic"
    assert resolve_target("openai.chat", setting="engine", declared="anthropic").name == "engine"
    assert resolve_target("openai.chat", setting="auto", declared="openai").name == "openai"
    assert resolve_target("openai.chat", declared="llama").engine == Engine.LLAMA_CPP
    assert resolve_target("openai.chat", declared="engine", detected=Engine.VLLM).engine == Engine.VLLM
    with pytest.raises(ConfigError, match=r"sglang, llama\.cpp"):
        resolve_target("openai.chat", declared="tgi")


def test_engine_names_and_aliases() -> None:
    assert [parse_engine(n) for n in ("llama", "LlamaCpp", "llama.cpp", "sglang")] == [
        Engine.LLAMA_CPP,
        Engine.LLAMA_CPP,
        Engine.LLAMA_CPP,
        Engine.SGLANG,
    ]
    assert ProxyConfig(engine="llama").engine == ProxyConfig(engine="llama.cpp").engine == "llama.cpp"
    with pytest.raises(ValueError, match="unknown engine"):
        ProxyConfig(engine="tgi")
    with pytest.raises(ValueError):
        Settings(target="tgi")


def test_detection_asks_engines_and_never_providers() -> None:
    assert is_provider_host("https://api.anthropic.com") and is_provider_host(None)
    assert is_provider_host("https://my-resource.openai.azure.com/openai")
    assert not is_provider_host("http://127.0.0.1:8080")
    assert probe("https://api.openai.com/v1").engine is None  # never asked: no network here
    for owner, engine in (("llamacpp", Engine.LLAMA_CPP), ("sglang", Engine.SGLANG), ("vllm", Engine.VLLM)):
        up = FakeUpstream(engine=owner)
        try:
            assert probe(up.url + "/v1").engine == engine
        finally:
            up.close()
    plain = FakeUpstream()  # a gateway: answers neither /v1/models nor /props as an engine
    try:
        assert probe(plain.url).engine is None
    finally:
        plain.close()


def test_the_setting_beats_every_door() -> None:
    forced = Settings(target="engine")
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    turn = Sessions(provider="openai", settings=forced).session("s").begin("openai.chat", body)
    assert turn.session.provider == "engine" and "prompt_cache_key" not in turn.body
    report = audit([Record("s", "openai.chat", body)], provider="openai", settings=forced)
    assert report.provider == "engine"

    async def proxied() -> str:
        app = create_app(ProxyConfig(upstream="openai"), settings=forced)
        return app.state.proxy.target_for(Api.OPENAI_CHAT).name  # type: ignore[no-any-return]

    assert asyncio.run(proxied()) == "engine"


def test_the_proxy_recognises_an_engine_upstream_at_start() -> None:
    up = FakeUpstream(engine="llamacpp")

    async def run() -> tuple[str, str]:
        app = create_app(ProxyConfig(upstream=up.url))
        state = app.state.proxy
        async with state.running():
            return state.target_for(Api.OPENAI_CHAT).name, str(state.detected)

    try:
        assert asyncio.run(run()) == ("engine", "llama.cpp")
    finally:
        up.close()


def test_an_engine_started_after_the_client_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    import agentcache.targets._detect as detect

    answers: list[object] = [None, None, {"data": [{"owned_by": "llamacpp"}]}, None]
    monkeypatch.setattr(detect, "_get_json", lambda url, timeout: answers.pop(0))
    assert probe("http://127.0.0.1:9/v1").engine is None  # nothing listening yet: remembered a while
    assert probe("http://127.0.0.1:9/v1").engine is None and len(answers) == 2  # not asked again
    monkeypatch.setattr(detect, "UNKNOWN_TTL", 0.0)
    assert probe("http://127.0.0.1:9/v1").engine is Engine.LLAMA_CPP  # asked again once the answer expired
    assert probe("http://127.0.0.1:9/v1").engine is Engine.LLAMA_CPP and answers == []  # remembered

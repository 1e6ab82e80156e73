"""AdapterRegistry and the default set of providers."""

from __future__ import annotations

import pytest

from loopdock.runtime._errors import LoopdockError, UnknownAdapterError
from loopdock.runtime.models import (
    DEEPSEEK_BASE_URL,
    DEEPSEEK_MODELS,
    AdapterRegistry,
    DuplicateAdapterError,
    OpenAICompatibleAdapter,
    PingAdapter,
    ScriptedAdapter,
    deepseek_adapter,
    default_adapters,
)


def test_register_get_and_names():
    registry = AdapterRegistry()
    ping, scripted = PingAdapter(), ScriptedAdapter([])
    registry.register("zeta", ping)
    registry.register("alpha", scripted)

    assert registry.get("zeta") is ping
    assert registry.get("alpha") is scripted
    assert registry.names() == ("alpha", "zeta")
    assert "alpha" in registry
    assert "beta" not in registry


def test_duplicate_name_is_refused():
    registry = AdapterRegistry()
    first = PingAdapter()
    registry.register("ping", first)

    with pytest.raises(DuplicateAdapterError, match="'ping'") as info:
        registry.register("ping", PingAdapter())
    assert isinstance(info.value, LoopdockError)
    assert info.value.code == "DUPLICATE_ADAPTER"
    assert registry.get("ping") is first


def test_unknown_name_error_names_it_and_lists_registered_names_sorted():
    registry = AdapterRegistry()
    registry.register("ping", PingAdapter())
    registry.register("deepseek", PingAdapter())

    with pytest.raises(UnknownAdapterError) as info:
        registry.get("openai")
    message = str(info.value)
    assert "'openai'" in message
    assert message.index("'deepseek'") < message.index("'ping'")
    assert info.value.code == "UNKNOWN_ADAPTER"


def test_unknown_name_in_an_empty_registry():
    with pytest.raises(UnknownAdapterError, match="registered: none"):
        AdapterRegistry().get("ping")


def test_disposer_is_idempotent_and_removes_only_its_own_adapter():
    registry = AdapterRegistry()
    old = PingAdapter()
    dispose_old = registry.register("ping", old)
    dispose_old()
    assert registry.names() == ()

    new = PingAdapter()
    registry.register("ping", new)
    # A late second call of the old disposer must not remove the newer registration.
    dispose_old()
    assert registry.get("ping") is new


def test_empty_name_is_refused():
    with pytest.raises(ValueError):
        AdapterRegistry().register("", PingAdapter())


def test_default_adapters_without_a_key_has_ping_only():
    registry = default_adapters({})
    assert registry.names() == ("ping",)
    assert isinstance(registry.get("ping"), PingAdapter)


def test_default_adapters_with_a_deepseek_key():
    registry = default_adapters({"DEEPSEEK_API_KEY": "sk-test"})
    assert registry.names() == ("deepseek", "ping")
    deepseek = registry.get("deepseek")
    assert isinstance(deepseek, OpenAICompatibleAdapter)
    assert deepseek.base_url == DEEPSEEK_BASE_URL


def test_deepseek_adapter_from_env():
    assert deepseek_adapter({}) is None
    assert deepseek_adapter({"DEEPSEEK_API_KEY": "  "}) is None

    adapter = deepseek_adapter(
        {"DEEPSEEK_API_KEY": "sk-secret", "DEEPSEEK_BASE_URL": "http://127.0.0.1:9/v1/"}
    )
    assert adapter is not None
    assert adapter.base_url == "http://127.0.0.1:9/v1"
    assert adapter.models == DEEPSEEK_MODELS == ("deepseek-v4-flash", "deepseek-v4-pro")
    # The key must not leak through the adapter's repr (it ends up in logs).
    assert "sk-secret" not in repr(adapter)

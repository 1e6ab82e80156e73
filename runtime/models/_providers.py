"""Providers from configuration: a name, a wire format and where to reach it.

The dock config's ``providers:`` section holds one ``ProviderSpec`` per name; an agent
then says ``provider: <name>``. A spec never holds a key, only the name of the
environment variable that does (``apiKeyEnv``), read at each call.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

import attrs

from ._adapter import ModelAdapter
from ._anthropic import ANTHROPIC_BASE_URL, AnthropicAdapter
from ._http import DEFAULT_RETRY, ApiKey, Price, RetryPolicy
from ._openai import OpenAICompatibleAdapter

ProviderType = Literal["openai-compatible", "anthropic"]
#: The wire formats a provider can speak.
PROVIDER_TYPES: tuple[str, ...] = ("openai-compatible", "anthropic")
#: What an ``anthropic`` provider uses when the config does not say.
ANTHROPIC_DEFAULTS = {"base_url": ANTHROPIC_BASE_URL, "api_key_env": "ANTHROPIC_API_KEY"}


def _frozen_prices(value: Mapping[str, Price]) -> Mapping[str, Price]:
    return MappingProxyType(dict(value))


@attrs.frozen
class ProviderSpec:
    """One configured provider. ``api_key_env`` None: the server wants no key (a local
    vLLM, Ollama or llama.cpp server). ``prices`` are per model name. An ``anthropic``
    provider's URL and variable default to ``ANTHROPIC_DEFAULTS``."""

    type: ProviderType
    base_url: str
    api_key_env: str | None = None
    prices: Mapping[str, Price] = attrs.field(factory=dict, converter=_frozen_prices)
    max_attempts: int = DEFAULT_RETRY.max_attempts


def build_adapter(spec: ProviderSpec, env: Mapping[str, str]) -> ModelAdapter:
    """The adapter ``spec`` describes, reading its key from ``env`` at each call."""
    key = ApiKey(env_name=spec.api_key_env, env=env) if spec.api_key_env else None
    retry = RetryPolicy(max_attempts=spec.max_attempts)
    if spec.type == "anthropic":
        # The Messages API always wants a key: with none configured, a call says so.
        anthropic_key = key or ApiKey(env_name=ANTHROPIC_DEFAULTS["api_key_env"], env=env)
        return AnthropicAdapter(anthropic_key, spec.base_url, retry=retry, prices=spec.prices)
    return OpenAICompatibleAdapter(spec.base_url, key, retry=retry, prices=spec.prices)

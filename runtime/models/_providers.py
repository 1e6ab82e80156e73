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
from ._http import DEFAULT_RETRY, ApiKey, Price, RetryPolicy
from ._openai import OpenAICompatibleAdapter

ProviderType = Literal["openai-compatible"]
#: The wire formats a provider can speak.
PROVIDER_TYPES: tuple[str, ...] = ("openai-compatible",)


def _frozen_prices(value: Mapping[str, Price]) -> Mapping[str, Price]:
    return MappingProxyType(dict(value))


@attrs.frozen
class ProviderSpec:
    """One configured provider. ``api_key_env`` None: the server wants no key (a local
    vLLM, Ollama or llama.cpp server). ``prices`` are per model name."""

    type: ProviderType
    base_url: str
    api_key_env: str | None = None
    prices: Mapping[str, Price] = attrs.field(factory=dict, converter=_frozen_prices)
    max_attempts: int = DEFAULT_RETRY.max_attempts


def build_adapter(spec: ProviderSpec, env: Mapping[str, str]) -> ModelAdapter:
    """The adapter ``spec`` describes, reading its key from ``env`` at each call."""
    key = ApiKey(env_name=spec.api_key_env, env=env) if spec.api_key_env else None
    return OpenAICompatibleAdapter(
        spec.base_url, key, retry=RetryPolicy(max_attempts=spec.max_attempts), prices=spec.prices
    )

"""Model adapters by provider name (``ping``, ``deepseek``, ...)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .._errors import LoopdockError, UnknownAdapterError
from ._adapter import ModelAdapter
from ._openai import deepseek_adapter
from ._ping import PingAdapter
from ._providers import ProviderSpec, build_adapter


class DuplicateAdapterError(LoopdockError):
    """Raised when a provider name is registered while another adapter holds it."""

    code = "DUPLICATE_ADAPTER"


class AdapterRegistry:
    """Provider name -> adapter. Registration returns its own undo."""

    def __init__(self) -> None:
        self._adapters: dict[str, ModelAdapter] = {}

    def register(self, name: str, adapter: ModelAdapter) -> Callable[[], None]:
        """Register ``adapter`` as ``name``; the returned disposer unregisters it.

        The disposer is idempotent and removes only this very adapter, so a late call
        cannot take out an adapter registered under the same name afterwards.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"adapter name must be a non-empty string, got {name!r}")
        if name in self._adapters:
            raise DuplicateAdapterError(f"a model adapter named {name!r} is already registered")
        self._adapters[name] = adapter

        def dispose() -> None:
            if self._adapters.get(name) is adapter:
                del self._adapters[name]

        return dispose

    def get(self, name: str) -> ModelAdapter:
        try:
            return self._adapters[name]
        except KeyError:
            known = ", ".join(repr(n) for n in self.names()) or "none"
            # the one adapter that exists but needs a key: say which
            hint = "; set DEEPSEEK_API_KEY to register it" if name == DEEPSEEK else ""
            raise UnknownAdapterError(
                f"no model adapter named {name!r}; registered: {known}{hint}"
            ) from None

    def names(self) -> tuple[str, ...]:
        """The registered provider names, sorted."""
        return tuple(sorted(self._adapters))

    def __contains__(self, name: object) -> bool:
        return name in self._adapters


DEEPSEEK = "deepseek"


def default_adapters(env: Mapping[str, str], providers: Mapping[str, ProviderSpec] | None = None) -> AdapterRegistry:
    """``ping`` always; each configured provider (keys read from ``env``); ``deepseek``
    when ``env`` has a DeepSeek key and no configured provider takes the name."""
    registry = AdapterRegistry()
    registry.register("ping", PingAdapter())
    for name, spec in (providers or {}).items():
        registry.register(name, build_adapter(spec, env))
    deepseek = deepseek_adapter(env)
    if deepseek is not None and DEEPSEEK not in registry:
        registry.register(DEEPSEEK, deepseek)
    return registry

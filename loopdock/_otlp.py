"""``loopdock serve --otlp URL``: the runtime's spans, exported over OTLP/HTTP.

The OpenTelemetry SDK and its exporter are an optional extra (``pip install
'loopdock[otel]'``): imported here only when serve is asked to export.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import trio

from loopdock.runtime import InvalidOptionsError, get_logger

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

log = get_logger(__name__)

#: serve's ``--otlp`` when it is not given.
OTLP_ENV = "LOOPDOCK_OTLP_ENDPOINT"
#: Where an OTLP/HTTP collector takes traces, under its base URL.
TRACES_PATH = "/v1/traces"


def traces_url(url: str) -> str:
    """The traces endpoint of a collector's base URL (``http://host:4318``, as
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` is written); a URL naming ``/v1/traces`` is kept."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InvalidOptionsError(f"--otlp must be an http(s) URL such as http://127.0.0.1:4318, got {url!r}")
    return url if parts.path.endswith(TRACES_PATH) else url.rstrip("/") + TRACES_PATH


@asynccontextmanager
async def otlp_tracing(url: str | None) -> AsyncIterator[TracerProvider | None]:
    """An SDK tracer provider whose spans a batch processor exports to ``url``'s traces
    endpoint; on exit, what is still queued is exported (in a worker thread: it blocks)
    and the provider shut down. No URL: None, and nothing is imported."""
    if url is None:
        yield None
        return
    endpoint = traces_url(url)
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ModuleNotFoundError as exc:
        raise InvalidOptionsError(
            f"--otlp needs OpenTelemetry's SDK and exporter ({exc.name} is missing): pip install 'loopdock[otel]'"
        ) from None
    provider = TracerProvider(resource=Resource.create({"service.name": "loopdock"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    log.info("exporting traces", endpoint=endpoint)
    try:
        yield provider
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(provider.shutdown)

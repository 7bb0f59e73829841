"""Which tracer episodes are traced into, decided when a host is made (:func:`current_tracing`).

In order: the provider given to :func:`use_tracer_provider`; else the application's global
TracerProvider, if it has set one; else, when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set, an SDK provider exporting over OTLP/HTTP, set up
once from the standard ``OTEL_*`` variables (exporter endpoint, headers, timeout; batch
processor; sampler; ``OTEL_SERVICE_NAME``/``OTEL_RESOURCE_ATTRIBUTES``) and made the global one;
else no tracing. Without ``opentelemetry-api`` installed it is always no tracing.
"""

from __future__ import annotations

import logging
import os
import threading
from importlib import metadata
from typing import Any

from softprobe.gym.tracing.facade import NO_TRACING, Tracing

log = logging.getLogger(__name__)

OTLP_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
SCOPE = "softprobe.gym"

_override: Any = None
_lock = threading.Lock()


def use_tracer_provider(provider: Any) -> None:
    """Trace the episodes of hosts made from now on into ``provider`` (an OpenTelemetry
    TracerProvider), whatever the global one is; ``False``: trace nothing; ``None``: back to the
    default choice. For tests and for applications that keep their provider out of the global
    slot."""
    global _override
    _override = provider


def discarding_provider() -> Any:
    """An SDK TracerProvider that records every span and exports it nowhere (None without
    ``opentelemetry-sdk``): what tracing costs the host, without a collector's share."""
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
    except ImportError:
        return None

    class Discard(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Discard()))
    return provider


def current_tracing() -> Tracing:
    """The tracing hosts made now use (see the module docstring); never raises."""
    try:
        from softprobe.gym.tracing.otel import OtelTracing
    except ImportError:  # opentelemetry-api is not installed: tracing is off
        return NO_TRACING
    provider = _override if _override is not None else _global_or_otlp()
    if provider is None or provider is False:
        return NO_TRACING
    from opentelemetry.trace import NoOpTracer

    tracer = provider.get_tracer(SCOPE, _version())
    return NO_TRACING if isinstance(tracer, NoOpTracer) else OtelTracing(tracer)


def _global_or_otlp() -> Any:
    from opentelemetry import trace

    with _lock:
        current = trace.get_tracer_provider()
        if not isinstance(current, trace.ProxyTracerProvider):
            return None if isinstance(current, trace.NoOpTracerProvider) else current
        if not any(os.environ.get(name) for name in OTLP_VARIABLES):
            return None
        provider = _otlp_provider()
        if provider is not None:
            trace.set_tracer_provider(provider)
        return provider


def _otlp_provider() -> Any:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "%s is set but opentelemetry-sdk or opentelemetry-exporter-otlp-proto-http is not installed: "
            "episodes are not traced (pip install 'softprobe-gym[otel]')", " or ".join(OTLP_VARIABLES),
        )
        return None
    named = "OTEL_SERVICE_NAME" in os.environ or "service.name" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    provider = TracerProvider(resource=Resource.create({} if named else {"service.name": "softprobe-gym"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def _version() -> str:
    try:
        return metadata.version("softprobe-gym")
    except metadata.PackageNotFoundError:
        return "0"


__all__ = ["OTLP_VARIABLES", "SCOPE", "current_tracing", "discarding_provider", "use_tracer_provider"]

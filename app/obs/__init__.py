"""Observability: Prometheus metrics (multiprocess mode), JSON logs, trace context."""

"""Observability: readiness probes (health), Prometheus metrics, structured logs."""

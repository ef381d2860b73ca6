"""The policy layer's one shared exception, below every module that raises it (no import cycle
between the sidecar and what it reads: revision refuses a policy tree the sidecar would load)."""

from __future__ import annotations


class OPAUnavailable(Exception):
    """OPA could not be found, started, or did not become healthy; or the policy tree it would
    load is refused before it starts."""

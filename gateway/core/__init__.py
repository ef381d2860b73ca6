"""Lowest layer: configuration, canonical JSON and the types every layer shares (call, principal)."""

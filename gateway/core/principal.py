"""Who is calling: the authenticated identity every layer above auth passes along."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Principal:
    sub: str
    iss: str
    roles: tuple[str, ...]
    groups: tuple[str, ...]
    scopes: tuple[str, ...]
    client_id: str | None
    kind: str  # agent | human | service

    def as_input(self) -> dict[str, Any]:
        return {
            "sub": self.sub,
            "iss": self.iss,
            "client_id": self.client_id,
            "roles": list(self.roles),
            "groups": list(self.groups),
            "scopes": list(self.scopes),
            "kind": self.kind,
        }

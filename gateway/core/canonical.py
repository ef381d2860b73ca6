"""Canonical JSON and its digest: what the audit records about an OPA input."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def digest_json(doc: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(doc).encode()).hexdigest()

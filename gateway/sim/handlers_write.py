"""Mutating endpoints: each returns a UPID and changes state when its task finishes."""

from __future__ import annotations

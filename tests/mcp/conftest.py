"""The approvals gateway (its own simulator, policy data with deterministic approval rules) for the hand-off tests."""

from tests.approvals.conftest import aenv, agw, api, asim  # noqa: F401 - re-exported fixtures

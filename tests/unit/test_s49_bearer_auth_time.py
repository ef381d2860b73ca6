"""The sign-in time a vote by bearer token gives the approver policy's step-up (admin/api.py
`bearer_auth_time`, used by the admin API and `pvegate approvals approve`).

An `auth_time` in the future (a provider's clock ahead, a token minted so) passed every step-up limit for
the token's whole life, and one no float holds (10**400) raised OverflowError: a 500 at the vote. The
console refuses both in an ID token (test_s47_auth_time.py); a bearer token's is now no known sign-in
time, which the policy takes as too old (approver.rego): the step-up fails closed."""

from __future__ import annotations

import time
from typing import Any

import jwt

from gateway.admin.api import AUTH_TIME_LEEWAY, bearer_auth_time


def _token(**claims: Any) -> str:
    return jwt.encode({"sub": "carol", **claims}, "k" * 32, algorithm="HS256")


def test_a_sign_in_time_in_the_future_or_beyond_a_float_is_unknown() -> None:
    now = time.time()
    assert bearer_auth_time(_token(auth_time=int(now) + 3600, iat=int(now))) is None
    assert bearer_auth_time(_token(auth_time=10**400, iat=int(now))) is None
    # within the leeway, and a sign-in a minute ago, are what they say
    soon = int(now) + AUTH_TIME_LEEWAY // 2
    assert bearer_auth_time(_token(auth_time=soon)) == soon
    assert bearer_auth_time(_token(auth_time=int(now) - 60)) == int(now) - 60
    assert bearer_auth_time(_token(iat=int(now) - 5)) == int(now) - 5

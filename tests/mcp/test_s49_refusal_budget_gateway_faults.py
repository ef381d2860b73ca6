"""A call denied because the gateway had no usable policy answer (OPA down, paused, slow) is the
gateway's fault, not its principal's: it does not count against the principal's refusal budget.

It was counted (outcome `denied`), so while OPA was paused every agent used up its budget, and once OPA
was back the well-behaved ones were refused at the door with a 429 telling them to fix what got them
refused. Real gateway, real OPA (paused with SIGSTOP), the simulator."""

from __future__ import annotations

import signal

import httpx

from gateway.dev.devenv import DevEnv
from gateway.store.principal_limits import PrincipalLimits
from tests.mcp.test_principal_limits import BUDGET, call_doc, http, lenv, lgw, limits, lsim, outcome, post
from tests.support import GatewayThread

__all__ = ["http", "lenv", "lgw", "limits", "lsim"]  # fixtures, used by name


def test_denials_for_want_of_a_policy_answer_do_not_spend_the_budget(
    lgw: GatewayThread, lenv: DevEnv, http: httpx.Client, limits: PrincipalLimits
) -> None:
    who = "opa-outage-agent"
    assert lgw.components.sidecar is not None and lgw.components.sidecar.process is not None
    opa = lgw.components.sidecar.process
    opa.send_signal(signal.SIGSTOP)
    try:
        for _ in range(BUDGET + 1):
            r = post(lenv, http, who, ["operator"], call_doc("list_nodes"))
            assert outcome(r) == "denied", r.text[:300]
            assert "policy.unavailable" in r.json()["result"]["structuredContent"]["codes"], r.text[:300]
    finally:
        opa.send_signal(signal.SIGCONT)
    r = post(lenv, http, who, ["operator"], call_doc("list_nodes"))
    assert r.status_code == 200, (r.status_code, r.text[:300])
    assert outcome(r) == "allowed", r.text[:300]

"""A what-if whose decision failed closed (OPA gave no usable answer: an evaluation error, a timeout)
answered 500 with an internal error: the failed-closed decision has no risk (`{}`), and the page
wrote `decision.risk.level` unconditionally, which the console's strict templates refuse. That is
exactly the case an operator asks a what-if about (why is this call refused?), and the page must
show the failed-closed denial and its reason, not an error.

Its own gateway on the package's simulator, with the real OPA: a policy file beside the test data
makes the risk score conflict (an evaluation error) for one principal only, so the console's
sections (asked for the signed-in person) are still answered."""

from __future__ import annotations

import html
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv
from tests.console.conftest import Browsers, console_env, console_policy, human
from tests.support import GatewayThread

ERIN = human("erin", ["auditor"], [])  # every console section is open to an auditor
PROBE = "conflict-probe"  # the principal whose decision OPA cannot evaluate

CONFLICT = f"""package pvegate.risk

# a second value of a complete rule for one principal: OPA's evaluation fails (conflict)
score := -1 if input.principal.sub == "{PROBE}"
"""


@pytest.fixture(scope="module")
def fc_env(csim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    policy = console_policy(tmp_path_factory.mktemp("fcpolicy"))
    (Path(policy) / "conflict.rego").write_text(CONFLICT)
    return console_env(tmp_path_factory, csim, "fc", policy)


@pytest.fixture(scope="module")
def fc_gw(fc_env: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(fc_env.config).start()
    yield gw
    gw.stop()


def test_a_what_if_that_failed_closed_shows_the_denial(
    fc_gw: GatewayThread, fc_env: DevEnv, browsers: Browsers
) -> None:
    erin = browsers(fc_env, ERIN)
    form = {"csrf": erin.csrf, "sub": PROBE, "kind": "agent", "roles": "operator", "tool": "vm_shutdown"}
    r = erin.post("/admin/whatif", data={**form, "arguments": '{"vmid": 100}'})
    assert r.status_code == 200, (r.status_code, r.text[:500])
    text = html.unescape(r.text)
    assert 'id="decision"' in r.text and ">deny</span>" in r.text, text
    assert "policy decision unavailable" in text, text
    # anyone else's what-if is decided as before
    r = erin.post("/admin/whatif", data={**form, "sub": "someone-else", "arguments": '{"vmid": 100}'})
    assert r.status_code == 200 and 'id="decision"' in r.text, r.text[:500]
    assert "policy decision unavailable" not in html.unescape(r.text)

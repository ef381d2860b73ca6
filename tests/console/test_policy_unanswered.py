"""While the policy cannot say which console sections are open (its data invalid), a signed-in
person is told that, with a 503: not "the policy does not open this section to you", which reads as
a matter of their roles and sends them to ask for access instead of to the operators.

Its own gateway on the package's simulator, with data the data check refuses; sessions are cookies
signed with the session key, as in test_pages.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv
from tests.console.conftest import Browsers, console_env, console_policy, human
from tests.support import GatewayThread

ERIN = human("erin", ["auditor"], [])  # every section is open to an auditor on valid data


def _capitalised_levels(data: dict[str, Any]) -> None:
    """Unknown risk levels (`Critical`): the data check refuses the data."""
    levels = data["approval"]["step_up_max_age_seconds_by_level"]
    data["approval"]["step_up_max_age_seconds_by_level"] = {k.capitalize(): v for k, v in levels.items()}


@pytest.fixture(scope="module")
def bad_env(csim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    policy = console_policy(tmp_path_factory.mktemp("badpolicy"), edit=_capitalised_levels)
    return console_env(tmp_path_factory, csim, "bad", policy)


@pytest.fixture(scope="module")
def bad_gw(bad_env: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(bad_env.config).start()
    yield gw
    gw.stop()


def test_invalid_policy_data_is_said_not_blamed_on_the_persons_roles(
    bad_gw: GatewayThread, bad_env: DevEnv, browsers: Browsers
) -> None:
    erin = browsers(bad_env, ERIN)
    for path in ("/admin/approvals", "/admin/audit", "/admin/status", "/admin/"):
        r = erin.get(path)
        assert r.status_code == 503, (path, r.status_code, r.text[:300])
        assert "the policy data is invalid" in r.text, r.text
        assert "does not open" not in r.text and "roles:" not in r.text

"""A vote reaches the approver policy with the address it came from, as the console's "may you
vote" question does: a security team's rule on `input.request.source_ip` (only from the office
network, say) must see the same fact in both, or the page and the vote disagree."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv
from tests.approvals.conftest import Api, approvals_env, write_policy_data
from tests.approvals.test_flow import pending, shutdown_args
from tests.support import GatewayThread

# a team's rule, beside the shipped approver package: a vote must say where it came from
SOURCE_RULE = """package pvegate.approver

import data.pvegate.lib

denials contains lib.reason("approver.source_unknown", "test.source_ip", "a vote must come from a known address") if {
	input.request.source_ip == null
}
"""


@pytest.fixture(scope="module")
def senv(asim: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevEnv]:
    policy = write_policy_data(tmp_path_factory.mktemp("spolicy"))
    (policy / "source_rule.rego").write_text(SOURCE_RULE)
    env = approvals_env(asim, policy, tmp_path_factory.mktemp("sgw"))
    gw = GatewayThread(env.config).start()
    yield env
    gw.stop()


async def test_a_vote_carries_its_source_address_to_the_approver_policy(senv: DevEnv) -> None:
    api = Api(senv)
    aid, _ = await pending(api, "vm_shutdown", shutdown_args())
    vote = await api.vote(aid, api.human("alice", ["sre-leads"]))
    assert vote.status_code == 200, vote.text
    assert vote.json()["state"] == "approved", vote.json()  # 127.0.0.1 reached the rule: not refused for null

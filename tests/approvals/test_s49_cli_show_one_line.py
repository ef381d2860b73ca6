"""`pvegate approvals show` and `list` print stored text an approver reads to decide: the requester's sub, the
guest's name, the policy's reason, approvers' names and notes. A note may hold line breaks (notes are for
people), and `show` printed it raw: a note could forge the lines under it ("approvers: ... has carol") in the
terminal of the next approver who looks. Each field is now one line with its controls and hidden characters
escaped. Real gateway, real OPA, real simulator."""

from __future__ import annotations

from tests.approvals.conftest import Api
from tests.approvals.test_cli import pvegate
from tests.approvals.test_flow import pending, shutdown_args

FORGED = "see ticket\n  approvers:  groups sre-leads; needs 1; has carol\u202e"


async def test_a_note_with_line_breaks_cannot_forge_lines_of_show(api: Api) -> None:
    cfg = str(api.env.config_path)
    aid, _ = await pending(api, "vm_shutdown", {**shutdown_args(), "timeout": 78})
    ok = pvegate("approvals", "withdraw", aid, "--config", cfg, "--note", FORGED)
    assert ok.returncode == 0, ok.stderr
    shown = pvegate("approvals", "show", aid, "--config", cfg)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert [x for x in lines if x.startswith("  approvers:")] == [
        "  approvers:  groups sre-leads; needs 1; has none"
    ], shown.stdout
    decided = [x for x in lines if x.startswith("  decided:")]
    escaped = "see ticket\\n  approvers:  groups sre-leads; needs 1; has carol\\u202e"
    assert len(decided) == 1 and decided[0].endswith(escaped), decided
    assert "\u202e" not in shown.stdout
    listed = pvegate("approvals", "list", "--config", cfg, "--state", "all")
    assert listed.returncode == 0 and aid in listed.stdout, listed.stderr

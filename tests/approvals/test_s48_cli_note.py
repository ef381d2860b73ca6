"""`pvegate approvals deny|approve|withdraw --note` takes the same notes the admin API and the console take:
control characters (a terminal escape sequence, a NUL, a bell) and a note over the limit are refused before
anything is changed (exit 2, one line), not stored to be printed raw by `approvals show` and the console later.
The CLI stored them silently. Real gateway, real OPA, real simulator."""

from __future__ import annotations

from tests.approvals.conftest import Api
from tests.approvals.test_cli import pvegate
from tests.approvals.test_flow import pending, shutdown_args


async def test_cli_note_with_control_characters_or_too_long_is_refused(api: Api) -> None:
    cfg = str(api.env.config_path)
    aid, _ = await pending(api, "vm_shutdown", {**shutdown_args(), "timeout": 77})
    for note in ("esc \x1b[2J\x1b]0;owned\x07", "bell\x07", "x" * 1001):
        out = pvegate("approvals", "withdraw", aid, "--config", cfg, "--note", note)
        assert out.returncode == 2 and "--note" in out.stderr, (repr(note[:20]), out.stdout, out.stderr)
        assert "Traceback" not in out.stderr
        deny = pvegate(
            "approvals", "deny", aid, "--config", cfg, "--note", note, "--token", api.human("alice", ["sre-leads"])
        )
        assert deny.returncode == 2 and "--note" in deny.stderr, (repr(note[:20]), deny.stdout, deny.stderr)
    shown = pvegate("approvals", "show", aid, "--config", cfg, "--json")
    assert shown.returncode == 0 and '"state": "pending"' in shown.stdout, shown.stdout
    # a note for people (line breaks, a tab) is still taken
    ok = pvegate("approvals", "withdraw", aid, "--config", cfg, "--note", "line one\nline two\tend")
    assert ok.returncode == 0, ok.stderr


def test_cli_note_rule_names_the_admin_apis_limit() -> None:
    from gateway.admin.api import NOTE_MAX_CHARS
    from gateway.cli.commands.approvals import NOTE_RULE

    assert f"at most {NOTE_MAX_CHARS} characters" in NOTE_RULE

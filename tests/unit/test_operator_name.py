"""Who ran an operator command, for its audit record, when the process has no login name."""

from __future__ import annotations

import getpass
import os

import pytest

from gateway.cli.commands.console import operator_name


def test_a_uid_without_a_passwd_entry_is_named_by_its_number(monkeypatch: pytest.MonkeyPatch) -> None:
    """A container run under an arbitrary uid: no USER or LOGNAME, no passwd entry; getpass raises
    (KeyError on Python 3.11, OSError on 3.13). The sign-out still names who did it."""

    def no_passwd_entry() -> str:
        raise KeyError(f"getpwuid(): uid not found: {os.getuid()}")

    monkeypatch.setattr(getpass, "getuser", no_passwd_entry)
    assert operator_name() == f"uid {os.getuid()}"


def test_a_login_name_is_used_when_there_is_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOGNAME", "sre-on-call")
    assert operator_name() == "sre-on-call"

"""A refusal's or failure's reply carries no secret value of its call (gateway/pipeline.py).

Error texts quote what Proxmox, a proxy or a node's shell answered, and any of them may echo what
it was sent (a cloud-init password, a new user's password). The audit scrubs those values from
the call's records; the reply, which reaches the model's context, is scrubbed of them too.
"""

from __future__ import annotations

import contextvars

from gateway.core.calls import CallResult
from gateway.pipeline import _without_call_secrets
from gateway.store.audit import CALL_SECRETS, REDACTED

SECRET = 'Sup3r-Secret"pass'


def scrubbed(result: CallResult, secrets: tuple[str, ...] = (SECRET,)) -> CallResult:
    def run() -> CallResult:
        CALL_SECRETS.set(secrets)
        return _without_call_secrets(result)

    return contextvars.copy_context().run(run)


def test_an_error_reply_is_scrubbed_of_the_calls_secret_values() -> None:
    echoed = f"vm_cloudinit_set failed: 400 Parameter verification failed: cipassword: '{SECRET}' rejected"
    structured = {"error": echoed, "nested": [{"why": f"got {SECRET}"}], "task_id": None}
    out = scrubbed(CallResult("failed", echoed, structured=structured, is_error=True, meta={"k": "v"}))
    assert SECRET not in out.text and REDACTED in out.text
    assert out.text.startswith("vm_cloudinit_set failed: 400 Parameter verification failed")
    assert SECRET not in str(out.structured) and out.structured is not None
    assert out.structured["nested"][0]["why"] == f"got {REDACTED}" and out.structured["task_id"] is None
    assert (out.outcome, out.is_error, out.meta) == ("failed", True, {"k": "v"})


def test_other_replies_are_left_as_they_are() -> None:
    ok = CallResult("allowed", f"shaped output {SECRET}", structured={"x": 1})  # shaping drops sensitive keys
    assert scrubbed(ok) is ok
    failed = CallResult("failed", "nothing secret here", is_error=True)
    assert scrubbed(failed, ()) is failed  # no secret values in the call

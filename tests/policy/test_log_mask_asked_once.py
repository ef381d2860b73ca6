"""With decision logs on, a revision the decision client has not seen has the log mask asked before the
next input goes out (bundle_status.LogMaskGuard): once per revision, however many calls meet it at once.

Found in review: every call waiting on the check asked it again (one after another, under one lock), so
N calls in flight at a start or a bundle activation made N mask requests and the last waited N of them.
The real OPA's own decision log is the witness: each mask request is one entry for system/log/mask."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from gateway.policy.decisions import DecisionClient, PolicyError
from gateway.policy.opa_sidecar import REPO_ROOT, OPASidecar


def _mask_queries(log_file: Path) -> int:
    count = 0
    for line in log_file.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("msg") == "Decision Log" and entry.get("path") == "system/log/mask":
            count += 1
    return count


def _settled(log_file: Path) -> int:
    """The count once OPA has written what it answered (an entry follows its answer)."""
    last, deadline = -1, time.monotonic() + 5
    while time.monotonic() < deadline:
        now = _mask_queries(log_file)
        if now == last:
            return now
        last = now
        time.sleep(0.5)
    return last


def test_a_new_revision_has_the_mask_asked_once_for_all_the_calls_that_meet_it(tmp_path: Path) -> None:
    log_file = tmp_path / "opa.log"
    opa = OPASidecar(policies=(REPO_ROOT / "policies",), decision_logs=True, log_file=log_file)
    opa.start(timeout=60)  # its start asks the mask once (check_log_mask)
    client = DecisionClient(opa.url, 5000)
    loop = asyncio.new_event_loop()

    async def meet(revision: str, n: int) -> None:
        async def one() -> None:
            try:
                await client.checked_data(revision)
            except PolicyError:
                pass

        await asyncio.gather(*(one() for _ in range(n)))

    try:
        before = _settled(log_file)
        loop.run_until_complete(meet("rev-a", 40))
        first = _settled(log_file) - before
        loop.run_until_complete(meet("rev-a", 40))
        again = _settled(log_file) - before - first
        loop.run_until_complete(meet("rev-b", 40))
        other = _settled(log_file) - before - first - again
        assert (first, again, other) == (1, 0, 1)
        assert client.log_mask_refusal is None  # the shipped policy masks the arguments
    finally:
        loop.run_until_complete(client.close())
        loop.close()
        opa.stop()

"""What an approval retry needs, whichever replica it reaches.

A `requestState` is sealed with the key every replica shares (store/shared_keys.py) and is
single-use: its nonce is recorded here, so a replay is refused on every replica, not only on
the one that saw it first; its expiry is checked on the database's clock there too, so a replica
whose clock lags cannot take a token whose nonce was already swept. A 2025-11-25 client has
no requestState: after the URL elicitation it retries the identical call, and the binding
(principal + request digest -> approval id, short-lived, single-use) is kept here instead of
in one process's memory. Expiry is on the database's clock.

Console sign-outs live here too: the console's session is a signed cookie any replica reads,
so signing out must be known to every replica, or a copy of the cookie would stay usable
until its idle timeout. A signed-out session id is kept until the session could not have
lasted anyway (its start + console.max_session_seconds). A person can be signed out everywhere
at once (`pvegate console sign-out`, or "Sign out everywhere" in the console): every session
of theirs that began before that moment is refused, kept as long.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.store.db import Database

_V1 = """
CREATE TABLE IF NOT EXISTS request_state_uses (nonce TEXT PRIMARY KEY, expires_at {real} NOT NULL);
CREATE TABLE IF NOT EXISTS request_handoffs (
    principal   TEXT NOT NULL,
    digest      TEXT NOT NULL,
    approval_id TEXT NOT NULL,
    expires_at  {real} NOT NULL,
    PRIMARY KEY (principal, digest)
)
"""
_V2 = "CREATE TABLE IF NOT EXISTS console_signouts (sid TEXT PRIMARY KEY, until {real} NOT NULL)"
# a person's sessions that began at or before `before` are over (kept until `until`)
_V3 = (
    "CREATE TABLE IF NOT EXISTS console_person_signouts "
    "(sub TEXT PRIMARY KEY, before {real} NOT NULL, until {real} NOT NULL)"
)
MIGRATIONS: dict[str, Sequence[str]] = {
    kind: [v.format(real=real) for v in (_V1, _V2, _V3)]
    for kind, real in (("sqlite", "REAL"), ("postgresql", "DOUBLE PRECISION"))
}


class SharedStates:
    """Single-use requestState nonces and legacy-era handoffs, in the shared database."""

    def __init__(self, database: Database) -> None:
        self.database = database

    async def now(self) -> float:
        """The database's clock, the one sign-outs are stamped with (a session's start is compared with it)."""
        return await self.database.now()

    async def use_once(self, nonce: str, expires_at: float) -> bool:
        """True the first time `nonce` is presented (on any replica), False ever after; False too once its
        token expired (`expires_at`) on the database's clock, whatever the asking replica's own clock says."""
        async with self.database.transaction() as tx:
            now = await tx.now()
            # a nonce is kept only until a minute after its token expired, on this clock: a replica whose clock
            # lags more than that would take the token as live after its nonce was swept, and redeem it again
            if expires_at < now:
                return False
            # lapsed nonces can go: their requestState is refused as expired (here, at the latest) from now on
            await tx.execute("DELETE FROM request_state_uses WHERE expires_at < ?", now - 60)
            added = await tx.execute(
                "INSERT INTO request_state_uses (nonce, expires_at) VALUES (?, ?) ON CONFLICT (nonce) DO NOTHING",
                nonce,
                expires_at,
            )
        return added == 1

    async def unuse(self, nonce: str) -> None:
        """`nonce` may be presented again (its retry gave its approval back: RequestStates.give_back)."""
        async with self.database.transaction() as tx:
            await tx.execute("DELETE FROM request_state_uses WHERE nonce = ?", nonce)

    async def remember(self, principal: str, digest: str, approval_id: str, ttl: float) -> None:
        async with self.database.transaction() as tx:
            now = await tx.now()
            await tx.execute("DELETE FROM request_handoffs WHERE expires_at < ?", now)
            await tx.execute(
                "INSERT INTO request_handoffs (principal, digest, approval_id, expires_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (principal, digest) DO UPDATE SET approval_id = excluded.approval_id, "
                "expires_at = excluded.expires_at",
                principal,
                digest,
                approval_id,
                now + ttl,
            )

    async def recall(self, principal: str, digest: str) -> str | None:
        """The approval id remembered for this principal's identical call, taken (single-use)."""
        async with self.database.transaction() as tx:
            now = await tx.now()
            rows = await tx.fetch(
                "DELETE FROM request_handoffs WHERE principal = ? AND digest = ? RETURNING approval_id, expires_at",
                principal,
                digest,
            )
        if not rows or float(rows[0]["expires_at"]) < now:
            return None
        return str(rows[0]["approval_id"])

    async def sign_out(self, sid: str, until: float) -> None:
        """The console session `sid` is over on every replica (kept until `until`, epoch seconds)."""
        async with self.database.transaction() as tx:
            await tx.execute("DELETE FROM console_signouts WHERE until < ?", await tx.now())
            await tx.execute(
                "INSERT INTO console_signouts (sid, until) VALUES (?, ?) ON CONFLICT (sid) DO NOTHING", sid, until
            )

    async def sign_out_person(self, sub: str, keep: float) -> float:
        """Every session of `sub` that began until now (the database's clock, returned) is over on
        every replica; remembered for `keep` seconds (console.max_session_seconds: none lasts longer)."""
        async with self.database.transaction() as tx:
            now = await tx.now()
            await tx.execute("DELETE FROM console_person_signouts WHERE until < ?", now)
            # never moved back: of two sign-outs committing out of order, the later line stands
            await tx.execute(
                "INSERT INTO console_person_signouts (sub, before, until) VALUES (?, ?, ?) "
                "ON CONFLICT (sub) DO UPDATE SET "
                "before = CASE WHEN excluded.before > console_person_signouts.before "
                "THEN excluded.before ELSE console_person_signouts.before END, "
                "until = CASE WHEN excluded.until > console_person_signouts.until "
                "THEN excluded.until ELSE console_person_signouts.until END",
                sub,
                now,
                now + keep,
            )
        return now

    async def signed_out(self, sid: str, sub: str, started: float) -> bool:
        """The session `sid` of `sub`, begun at `started` (epoch seconds on the database's clock, now()), was
        signed out, by itself or with all of its person's sessions."""
        rows = await self.database.fetch(
            "SELECT 1 AS gone FROM console_signouts WHERE sid = ? "
            "UNION ALL SELECT 1 AS gone FROM console_person_signouts WHERE sub = ? AND before >= ?",
            sid,
            sub,
            started,
        )
        return bool(rows)

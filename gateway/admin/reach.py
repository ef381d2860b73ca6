"""What a held call reaches beyond its target, as an approver reads it (console, approval page, CLI show).

The approval token is bound to these facts (store/approvals.py target_key) and the policy decided on them:
the guests a pool move, HA rule, backup job, ACL, task stop or node reboot reaches (target.members), the
guests whose backups a prune deletes (target.prune_removes), the guest a backup was taken of
(target.backup_of), the guest a volume belongs to (target.volume_of), and where the call puts a guest
(target.destination). A page that showed only the call's own target ("pool_members_add on cluster
default") left the approver blind to the guests it moves. Plain text only: each page escapes it.
"""

from __future__ import annotations

from typing import Any

# (target field, what the approver reads before the guests)
_LISTS = (
    ("members", "reaches"),
    ("prune_removes", "deletes backups of"),
)
_OWNERS = (
    ("backup_of", "backup of"),
    ("volume_of", "volume of"),
)


def guest_text(guest: dict[str, Any]) -> str:
    """One guest as the cluster knew it when the call was held: id, node, pool, tags."""
    vmid = guest.get("vmid")
    head = f"guest {vmid}" if vmid is not None else "a guest not named"
    if guest.get("exists") is False:
        return f"{head} (no such guest in the cluster)"
    if guest.get("exists") is None and "exists" in guest:
        return f"{head} (hidden from the gateway's token: pool and tags not known)"
    parts = [f"node {guest['node']}"] if guest.get("node") else []
    if guest.get("pool") is not None:
        parts.append(f"pool {guest['pool']}")
    elif guest.get("pool_known") is False:
        parts.append("pool not known")
    else:
        parts.append("no pool")
    tags = guest.get("tags")
    parts.append(f"tags {', '.join(str(t) for t in tags)}" if isinstance(tags, list) and tags else "no tags")
    return f"{head} ({'; '.join(parts)})"


def reached(target: dict[str, Any]) -> list[tuple[str, str]]:
    """(what, text) for each fact of the target beyond its own guest, node and storage; none for a call
    that reaches nothing else."""
    out: list[tuple[str, str]] = []
    for name, what in _LISTS:
        facts = target.get(name)
        if not isinstance(facts, dict):
            continue
        guests = [g for g in facts.get("guests") or [] if isinstance(g, dict)]
        if facts.get("known") is not True:
            out.append((what, "not known: the gateway could not tell which guests"))
        elif not guests:
            out.append((what, "none"))
        else:
            out.extend((what, guest_text(g)) for g in guests)
    for name, what in _OWNERS:
        owner = target.get(name)
        if isinstance(owner, dict):
            text = guest_text(owner) if owner.get("vmid") is not None else "not known (the name does not tell)"
            volume = owner.get("volume")
            out.append((what, f"{text}, volume {volume}" if volume else text))
    dest = target.get("destination")
    if isinstance(dest, dict):
        parts = [f"guest {dest['vmid']}"] if dest.get("vmid") is not None else []
        if dest.get("node"):
            parts.append(f"node {dest['node']}")
        if dest.get("pool") is not None:
            parts.append(f"pool {dest['pool']}")
        else:
            parts.append("no pool" if dest.get("pool_known", True) else "pool not known")
        out.append(("destination", "; ".join(parts)))
    return out

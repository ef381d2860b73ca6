"""Guest tags as Proxmox VE handles them.

A guest's `tags` option is a pve-tag-list: PVE::Tools::split_list splits it on `;`, `,` and
whitespace alike. Set through the API (create, PUT/POST config), Proxmox stores it as
GuestHelpers::get_unique_tags makes it: with the datacenter's default tag style
(`case-sensitive` off, no `ordering: config`), lower-cased, each tag once, sorted, joined by
`;`. A config written by an older release or by hand keeps what it holds, and
/cluster/resources and status/current return it as written (so a scenario may plant
`tags: "prod Protected"`).
"""

from __future__ import annotations

import re
from typing import Any

_SPLIT = re.compile(r"[;,\s]+")


def split_tags(value: Any) -> list[str]:
    """The tags of a raw `tags` value, as written (PVE::Tools::split_list)."""
    return [t for t in _SPLIT.split(str(value or "")) if t]


def unique_tags(value: Any) -> str:
    """What Proxmox stores for a `tags` value set through the API (get_unique_tags, default tag style)."""
    return ";".join(sorted({t.lower() for t in split_tags(value)}))

"""The policy data's references to tools, checked against the tool catalog the gateway serves.

The data (policies/data/data.yaml, the security team's) names tools, tool tags and arguments as
plain strings: a misspelled one (`node_rebot`, `arguments.cipasword`) matches no call, so the
control it carries silently stops applying, and neither the data's JSON Schema nor the policy's
own `problems` can tell, as neither knows the catalog (connectors/*.yaml, the gateway's). The
policy answers it, `data.pvegate.config.catalog_problems` (policies/pvegate/config/catalog.rego),
with the catalog's names, parameters and tags as its input: the same glob matching as the
decisions use, and one query per policy revision, nothing per call.

These problems refuse no call: a bundle may serve gateways whose catalogs differ. `pvegate policy
check` and `pvegate bundle build` fail on them; a gateway reports them (catalog_problems below).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gateway.policy.opa_sidecar import REPO_ROOT

if TYPE_CHECKING:
    from gateway.policy.decisions import DecisionClient

CATALOG_PROBLEMS_PATH = "pvegate/config/catalog_problems"
# what `pvegate policy check` checks against unless given --connectors: the gateway's connector
# directory (`pvegate bundle build --connectors` hands its own to the checks it runs this way)
CONNECTORS_ENV = "PVEGATE_CONNECTORS"


def default_connectors() -> Path:
    return Path(os.environ.get(CONNECTORS_ENV) or REPO_ROOT / "connectors")


class CatalogTool(Protocol):
    """What the check reads of a tool (gateway.tools.tool.Tool; the policy layer does not import it)."""

    @property
    def name(self) -> str: ...
    @property
    def parameters(self) -> dict[str, Any]: ...
    @property
    def tags(self) -> tuple[str, ...]: ...


def catalog_input(catalog: Iterable[CatalogTool]) -> dict[str, Any]:
    """The policy input of catalog_problems: each tool's parameter names and tags."""
    tools = {
        t.name: {"parameters": sorted(t.parameters.get("properties", {})), "tags": sorted(set(t.tags))} for t in catalog
    }
    return {"catalog": tools}


async def catalog_problems(client: DecisionClient, catalog: Iterable[CatalogTool]) -> tuple[str, ...] | None:
    """The data's references the catalog does not know, one line each, from the OPA behind client
    (ask once per policy revision); None when the policy has no such check (older than it).

    Raises PolicyError when OPA gives no usable answer."""
    from gateway.policy.decisions import PolicyError

    try:
        result, _ = await client.query(CATALOG_PROBLEMS_PATH, catalog_input(catalog))
    except PolicyError as exc:
        if "undefined" in str(exc):
            return None
        raise
    if not isinstance(result, list) or not all(isinstance(p, str) for p in result):
        raise PolicyError("catalog check does not match the contract")
    return tuple(sorted(result))

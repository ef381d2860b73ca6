"""The policy data's references to tools, checked against the tool catalog the gateway serves.

The data (policies/data/data.yaml, the security team's) names tools, tool tags and arguments as
plain strings: a misspelled one (`node_rebot`, `arguments.cipasword`) matches no call, so the
control it carries silently stops applying, and neither the data's JSON Schema nor the policy's
own `problems` can tell, as neither knows the catalog (connectors/*.yaml, the gateway's). Nor
can they tell an argument value of another type than its parameter's (`firewall: [0]` for a
boolean), which matches no call either. The policy answers both,
`data.pvegate.config.catalog_problems` (policies/pvegate/config/catalog.rego), with the
catalog's names, parameters (with their types) and tags as its input: the same glob matching as
the decisions use, and one query per policy revision, nothing per call.

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


def parameter_type(schema: Any) -> dict[str, Any]:
    """What the check reads of one parameter's JSON Schema: its `type` and its `enum` (a `const`
    as an enum of one), for the argument values the data lists (risk.critical_calls): the call's
    arguments are validated against this schema before the policy sees them, so a value of
    another type (`firewall: [0]` for a boolean) matches no call."""
    if not isinstance(schema, dict):
        return {}
    out: dict[str, Any] = {}
    if "type" in schema:
        out["type"] = schema["type"]
    if isinstance(schema.get("enum"), list):
        out["enum"] = schema["enum"]
    elif "const" in schema:
        out["enum"] = [schema["const"]]
    return out


def catalog_input(catalog: Iterable[CatalogTool]) -> dict[str, Any]:
    """The policy input of catalog_problems: each tool's parameter names, their types, and tags.

    (`parameters` stays the list of names a policy older than the type check reads.)"""
    tools: dict[str, Any] = {}
    for t in catalog:
        props: dict[str, Any] = t.parameters.get("properties", {})
        tools[t.name] = {
            "parameters": sorted(props),
            "parameter_types": {name: parameter_type(schema) for name, schema in props.items()},
            "tags": sorted(set(t.tags)),
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

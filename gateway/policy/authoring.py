"""Policy-author checks run before a bundle is built: the data against its schema, and explain.

`check_data` validates a policy data file (policies/data/data.yaml) twice: against its JSON
Schema here (jsonschema), and through a real `opa eval` of `data.pvegate.config.problems`, which
is what the running policy denies every call for. Given the gateway's connector directory, the
same evaluation asks `data.pvegate.config.catalog_problems` with the tool catalog as its input:
a tool, tool tag or argument the data names that the catalog does not know (gateway/policy/
catalog_refs.py). `explain` evaluates the decision and the
rules that produce its reasons for one input. Both run the real OPA binary on a private copy
of the policy tree, so the data under test never touches the directory OPA serves.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from gateway.core import yamlread
from gateway.policy.catalog_refs import CatalogTool, catalog_input
from gateway.policy.decisions import Decision, DecisionClient, PolicyError, read_data_check
from gateway.policy.opa_sidecar import find_opa

# the JSON Schema of the policy data (the policy holds the same schema as the constant
# data.pvegate.config.data_schema, generated from this file)
DATA_SCHEMA = Path("pvegate") / "config" / "schema" / "data.json"
DATA_FILE = Path("data") / "data.yaml"
OPA_TIMEOUT = 120


class AuthoringError(Exception):
    """The check could not run (no OPA, unreadable policy tree); the message says why."""


@dataclass
class DataReport:
    data_file: Path
    schema_problems: list[str] = field(default_factory=list)  # jsonschema, by path
    policy_problems: list[str] = field(default_factory=list)  # data.pvegate.config.problems
    connectors: Path | None = None  # the catalog the references were checked against (None: not checked)
    catalog_problems: list[str] = field(default_factory=list)  # data.pvegate.config.catalog_problems

    @property
    def ok(self) -> bool:
        return not self.schema_problems and not self.policy_problems and not self.catalog_problems


def _path_text(path: Any) -> str:
    return ".".join(str(p) for p in path) or "(root)"


def schema_problems(doc: Any, schema: dict[str, Any]) -> list[str]:
    """Where doc breaks the data schema, one line per error, named by its path from the root."""
    validator = jsonschema.validators.validator_for(schema)(schema)
    out = []
    for err in validator.iter_errors(doc):
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            # name each unknown key by its own path (a misspelling is what a reader looks for)
            known = err.schema.get("properties", {}) if isinstance(err.schema, dict) else {}
            for key in sorted(set(err.instance) - set(known)):
                out.append(
                    f"{_path_text([*err.absolute_path, key])}: unknown key (not in the data schema; misspelled?)"
                )
        else:
            out.append(f"{_path_text(err.absolute_path)}: {err.message}")
    return sorted(out)


@contextmanager
def _policy_copy(policies: Path, data_file: Path | None) -> Iterator[Path]:
    """The policy tree without tests, golden cases and dot-files; data_file (if given) as its data."""
    if not (policies / "pvegate").is_dir():
        raise AuthoringError(f"{policies} is not a policy directory (no pvegate/)")
    with tempfile.TemporaryDirectory(prefix="pvegate-policy-") as tmp:
        root = Path(tmp) / "policies"
        try:
            shutil.copytree(
                policies, root, ignore=shutil.ignore_patterns("*_test.rego", "golden", ".*", "*.md")
            )  # fmt: skip
        except shutil.Error as exc:  # (an OSError) one per file: a link to nothing, a file that cannot be read
            errors = exc.args[0] if exc.args and isinstance(exc.args[0], list) else []
            why = f"{errors[0][0]}: {errors[0][2]}" if errors and len(errors[0]) == 3 else str(exc)
            raise AuthoringError(f"cannot copy the policy tree {policies}: {why}") from None
        except OSError as exc:
            raise AuthoringError(f"cannot copy the policy tree {policies}: {exc.strerror or exc}") from None
        if data_file is not None:
            shutil.rmtree(root / "data", ignore_errors=True)
            (root / "data").mkdir()
            try:
                shutil.copy(data_file, root / DATA_FILE)
            except OSError as exc:  # named as the data file, not taken for the input
                raise AuthoringError(f"cannot read the data file {data_file}: {exc.strerror or exc}") from None
        yield root


def _opa_eval(root: Path, query: str, input_doc: Any = None, extra: list[str] | None = None) -> Any:
    cmd = [str(find_opa()), "eval", "--data", str(root), "--format", "json", *(extra or [])]
    if input_doc is not None:
        cmd.append("--stdin-input")
    cmd.append(query)
    done = subprocess.run(
        cmd,
        input=json.dumps(input_doc) if input_doc is not None else None,
        capture_output=True,
        text=True,
        timeout=OPA_TIMEOUT,
    )
    if done.returncode != 0:
        raise AuthoringError(f"opa eval failed: {(done.stderr or done.stdout).strip()}")
    return json.loads(done.stdout)


# The data's problems, and (with a catalog in the input) its references the catalog does not know.
# `catalog_checked` is false for a policy tree without the catalog check (older than it).
CHECK_QUERY = """{
  "problems": [p | some p in data.pvegate.config.problems],
  "catalog_problems": [p | some p in data.pvegate.config.catalog_problems],
  "catalog_checked": [x | x := data.pvegate.config.catalog_problems] != []
}"""


def check_data(
    policies: Path,
    data_file: Path | None = None,
    connectors: Path | None = None,
    catalog: Iterable[CatalogTool] | None = None,
) -> DataReport:
    """Validate a policy data file (default: the policy tree's own data/data.yaml); with `catalog`
    (the tools of the connector directory `connectors`, loaded by the caller: the tools layer is above
    this one), also its references to tools, tool tags and arguments against that catalog."""
    path = data_file or policies / DATA_FILE
    report = DataReport(path, connectors=connectors)
    try:
        # strictly: OPA keeps the last of a key given twice without a word, so a second `roles:`
        # or a binding's second `scope:` would quietly replace the first in the running policy
        doc = yamlread.load(path.read_text())
    except (yamlread.TooDeep, RecursionError):  # neither a problem in the data nor a traceback: the check cannot run
        raise AuthoringError(f"cannot read the data file {path}: it is nested too deeply to be read") from None
    except yamlread.YamlProblems as exc:
        report.schema_problems.extend(f"{path}: {problem}" for problem in exc.problems)
        return report
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        report.schema_problems.append(f"cannot read {path}: {exc}")
        return report
    try:
        schema = json.loads((policies / DATA_SCHEMA).read_text())
    except (OSError, ValueError) as exc:
        raise AuthoringError(f"cannot read the data schema {policies / DATA_SCHEMA}: {exc}") from exc
    report.schema_problems = schema_problems(doc, schema)
    with _policy_copy(policies, path) as root:
        out = _opa_eval(root, CHECK_QUERY, catalog_input(catalog) if catalog is not None else {})
    value = out["result"][0]["expressions"][0]["value"]
    report.policy_problems = sorted(value["problems"])
    if catalog is not None:
        report.catalog_problems = sorted(value["catalog_problems"])
        if not value["catalog_checked"]:
            report.catalog_problems.append(
                "the policy has no data.pvegate.config.catalog_problems (older than this gateway): "
                "the data's tool and argument names could not be checked against the catalog"
            )
    return report


# What `explain` asks OPA: the decision and the data check (read as the gateway reads them), and the
# facts and reason-producing rules behind it.
# Each fact is a comprehension, so a rule that is undefined for this input shows as [] instead
# of making the whole answer undefined.
EXPLAIN_QUERY = """{
  "decision": [d | d := data.pvegate.decision],
  "data_check": [c | c := data.pvegate.data_check],
  "input_problems": [p | some p in data.pvegate.call_problems],
  "data_problems": [p | some p in data.pvegate.config.problems],
  "bindings_of_principal": sort([b.name | some b in data.pvegate.rbac.bindings_for(input.principal)]),
  "bindings_applying_to_target": sort([b.name | some b in data.pvegate.rbac.applicable_bindings]),
  "roles_granting": sort([r | some r in data.pvegate.rbac.granting_roles]),
  "roles_denying": sort([r | some r in data.pvegate.rbac.roles_denying_tool]),
  "break_glass": [x | x := data.pvegate.rbac.break_glass] != [],
  "in_maintenance_window": [x | x := data.pvegate.guardrails.in_maintenance_window] != [],
  "quotas_matching": sort([{"name": s.quota.name, "used": s.used, "limit": s.quota.limit} |
    some s in data.pvegate.quotas.states]),
  "deny_rules_matching": sort([r.name | some r in data.pvegate.config.deny_rules;
    data.pvegate.lib.call_matches(r, input.principal, input.tool, input.target)]),
  "approval_rules_matching": sort([r.name | some r in data.pvegate.approval.matching_rules]),
  "denials": sort({r | some r in data.pvegate.denials} | {r | some r in data.pvegate.data_denials}),
  "approval_requirements": sort([r | some r in data.pvegate.approval.requirements])
}"""


def _as_the_gateway_acts(answers: list[Any], checks: list[Any]) -> dict[str, Any]:
    """The decision the gateway would act on (DecisionClient.decide), given the policy's decision and
    data check (each [] when undefined): one outside the contract, or an unusable data check, is the
    gateway's fail-closed deny (the policy's own answer kept as `policy_answer`); the data check's
    refusal answers while the data is invalid (no check: a policy from before it, checking its data in
    the decision); `allow` is read as the gateway reads it (a deny reason or an unmet approval wins)."""
    answer = answers[0] if answers else None
    problem = "policy result undefined" if answer is None else _contract().contract_problem(answer)
    if problem is None and checks:
        try:
            _, refusal = read_data_check(checks[0], _contract().contract_problem)
        except PolicyError as exc:
            problem = f"policy data check unavailable: {exc}"
        else:
            answer = refusal if refusal is not None else answer
    if problem is None and isinstance(answer, dict):  # (a contract-valid answer is an object)
        return {**answer, "allow": Decision.from_result(answer, {}).allow}
    problem = problem or "decision does not match the contract"
    closed = Decision.fail_closed(problem)
    return {
        "allow": False,
        "deny": list(closed.deny),
        "deny_reasons": list(closed.deny_reasons),
        "risk": {"score": 100, "level": "critical", "factors": []},
        "approval": {"required": False, "satisfied": False, "reasons": []},
        "obligations": {},
        "quota": None,
        "failed_closed": True,
        "policy_answer": answer,
    }


@functools.cache
def _contract() -> DecisionClient:
    """A decision client whose schema validators alone are used: it never connects."""
    return DecisionClient("http://127.0.0.1:1")


def explain(
    policies: Path, input_doc: Any, data_file: Path | None = None, opa_explain: str | None = None
) -> dict[str, Any]:
    """The decision for input_doc and which rules fired; with opa_explain (notes, fails, full)
    also OPA's own evaluation trace of data.pvegate.decision."""
    with _policy_copy(policies, data_file) as root:
        out = _opa_eval(root, EXPLAIN_QUERY, input_doc)
        result: dict[str, Any] = out["result"][0]["expressions"][0]["value"]
        result["decision"] = _as_the_gateway_acts(result["decision"], result.pop("data_check"))
        if opa_explain is not None:
            cmd = [str(find_opa()), "eval", "--data", str(root), "--stdin-input", "--format", "pretty"]
            done = subprocess.run(
                [*cmd, f"--explain={opa_explain}", "data.pvegate.decision"],
                input=json.dumps(input_doc), capture_output=True, text=True, timeout=OPA_TIMEOUT,
            )  # fmt: skip
            result["opa_explain"] = done.stdout if done.returncode == 0 else done.stderr
    return result

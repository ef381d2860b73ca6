#!/usr/bin/env bash
# All policy checks, as `make test` runs them. Exits non-zero on the first
# failing check (after running all of them, so one run shows every problem).
#
#   1. opa check --strict      compile with strict mode
#   1b. opa check --schema     type-check every input reference against the contract's
#                              JSON Schemas (gateway/schemas/, via the policies' `schemas:`
#                              annotations), and prove it catches a misspelled input field
#   1c. pvegate policy check   the policy data against its JSON Schema and the policy's
#                              own data problems (unknown keys, wrong types, ...); the
#                              schema's Rego copy (data_schema.rego) is current
#   2. opa fmt --list --fail   every .rego file is opa-fmt formatted
#   3. opa test --coverage     unit tests + golden cases, coverage >= threshold
#   4. regal lint              Regal (provisioned by scripts/provision-regal.sh)
#   5. opa build (bundle)      policies/ builds as a bundle without test files, and every data
#                              file is one a bundle loads (named data.json/data.yaml/data.yml)
#
# Usage: scripts/policy-checks.sh [POLICY_DIR ...]
#   Without arguments: policies/ plus the gateway's OPA API authorization policy.
#   With arguments: those directories (the first is the one built as a bundle);
#   `pvegate bundle build` runs this script on the tree it is about to sign.
#
# Env: OPA (default .tools/bin/opa), REGAL (default .tools/bin/regal),
#      PYTHON (default .venv/bin/python: the environment `pvegate` is installed in),
#      COVERAGE_THRESHOLD (default 95), SKIP_REGAL=1 to skip the lint when
#      Regal cannot be provisioned (reported as a failure unless set).
set -uo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
given=()
for d in "$@"; do
	[[ -d "${d}" ]] || {
		echo "not a policy directory: ${d}" >&2
		exit 2
	}
	given+=("$(cd "${d}" && pwd)")
done
cd "${REPO_ROOT}"

OPA="${OPA:-.tools/bin/opa}"
REGAL="${REGAL:-.tools/bin/regal}"
THRESHOLD="${COVERAGE_THRESHOLD:-95}"
if ((${#given[@]})); then
	POLICIES="${given[0]}"
	POLICY_DIRS=("${given[@]}")
else
	POLICIES="policies"
	# plus the gateway's own OPA API authorization policy (loaded next to a policy directory)
	POLICY_DIRS=("${POLICIES}" gateway/policy/opa_authz)
fi
failed=()

step() { printf '\n== %s\n' "$*"; }
fail() {
	printf 'FAILED: %s\n' "$1"
	failed+=("$1")
}

if [[ ! -x "${OPA}" ]]; then
	echo "no OPA binary at ${OPA}: run scripts/provision-tools.sh (make tools)" >&2
	exit 1
fi

step "opa check --strict ${POLICY_DIRS[*]}"
"${OPA}" check --strict "${POLICY_DIRS[@]}" || fail "opa check --strict"

step "opa check --strict --schema (gateway/schemas/*.schema.json) ${POLICY_DIRS[*]}"
python3 scripts/policy-input-schema.py --check || fail "gateway/schemas/policy_input.schema.json is stale"
# only the JSON Schemas: opa check --schema reads every file of the folder it is given, and the
# package folder also holds __init__.py and, once Python imported it, __pycache__/*.pyc
schemas="$(mktemp -d)"
trap 'rm -rf "${schemas}"' EXIT
cp gateway/schemas/*.schema.json "${schemas}/"
"${OPA}" check --strict --schema "${schemas}" "${POLICY_DIRS[@]}" || fail "opa check --schema"
# the type check must be able to fail: the same policies with one input field misspelled.
# The probe plants it in pvegate's own guard rails, so it runs on this repository's tree only
# (a security team's own tree, given to `pvegate bundle build --policies`, has other files).
if [[ "$(realpath "${POLICIES}")" == "$(realpath policies)" ]]; then
	probe="$(mktemp -d)"
	cp -r "${POLICIES}" "${probe}/policies"
	sed -i 's/input\.tool\.effect == "destroy"/input.tool.efect == "destroy"/' "${probe}/policies/pvegate/guardrails/guardrails.rego"
	if ! grep -q 'input.tool.efect' "${probe}/policies/pvegate/guardrails/guardrails.rego"; then
		fail "opa check --schema probe (could not plant the misspelled field)"
	elif probe_out="$("${OPA}" check --strict --schema "${schemas}" "${probe}/policies" 2>&1)" ||
		[[ "${probe_out}" != *"undefined ref: input.tool.efect"* ]]; then
		printf '%s\n' "${probe_out}"
		fail "opa check --schema did not catch a misspelled input field"
	else
		echo "a misspelled input field (input.tool.efect) is caught"
	fi
	rm -rf "${probe}"
else
	echo "schema probe skipped: ${POLICIES} is not this repository's policies/"
fi

step "pvegate policy check --policies ${POLICIES}"
OPA="${OPA}" python3 scripts/policy-data-schema.py --check "${POLICIES}" ||
	fail "pvegate/config/data_schema.rego is stale (run python3 scripts/policy-data-schema.py)"
PYTHON="${PYTHON:-.venv/bin/python}"
if [[ ! -x "${PYTHON}" ]]; then
	fail "policy data check (no Python environment with pvegate at ${PYTHON}: set PYTHON)"
else
	"${PYTHON}" -m gateway.cli policy check --policies "${POLICIES}" || fail "policy data check (pvegate policy check)"
fi

step "opa fmt --list --fail ${POLICY_DIRS[*]}"
"${OPA}" fmt --list --fail "${POLICY_DIRS[@]}" || fail "opa fmt (run: ${OPA} fmt -w ${POLICIES})"

step "opa test ${POLICY_DIRS[*]} --coverage --threshold ${THRESHOLD}"
# the pretty run shows each failing test; the coverage run enforces the threshold. A generous
# per-test timeout: OPA's default 5 s cancels tests on a busy 2-core host (CI beside other work)
if "${OPA}" test --timeout 60s "${POLICY_DIRS[@]}"; then
	cov_json="$(mktemp)"
	"${OPA}" test --timeout 60s "${POLICY_DIRS[@]}" --coverage --threshold "${THRESHOLD}" --format json >"${cov_json}"
	cov_rc=$?
	python3 - "${cov_json}" "${THRESHOLD}" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
total = report.get("coverage", 0.0)
print(f"coverage: {total:.2f}% (threshold {sys.argv[2]}%)")
for name, f in sorted(report.get("files", {}).items()):
    if name.endswith("_test.rego"):
        continue
    rows = sorted({r["start"]["row"] for r in f.get("not_covered", [])})
    if rows:
        print(f"  {name}: {f.get('coverage', 0):.1f}%  not covered: lines {rows}")
PY
	rm -f "${cov_json}"
	[[ ${cov_rc} -eq 0 ]] || fail "coverage below ${THRESHOLD}%"
else
	fail "opa test"
fi

step "regal lint ${POLICY_DIRS[*]}"
if [[ ! -x "${REGAL}" ]]; then
	bash scripts/provision-regal.sh || true
fi
if [[ -x "${REGAL}" ]]; then
	"${REGAL}" lint "${POLICY_DIRS[@]}" || fail "regal lint"
elif [[ "${SKIP_REGAL:-0}" == "1" ]]; then
	echo "regal not available; skipped (SKIP_REGAL=1)"
else
	fail "regal lint (regal could not be provisioned; see scripts/provision-regal.sh)"
fi

step "opa build -b ${POLICIES} (production bundle, tests excluded)"
# every file OPA loads from the directory must be one a bundle loads too: OPA's bundle reader
# skips data files not named data.json/data.yaml/data.yml without a word (loaded as a directory,
# OPA reads them), and a bundle archive inside the tree is loaded by neither the bundle nor the
# checks' view of it (gateway/policy/revision.py; `pvegate bundle build` refuses both)
if [[ ! -x "${PYTHON}" ]]; then
	fail "bundle layout (no Python environment with pvegate at ${PYTHON}: set PYTHON)"
elif ! "${PYTHON}" - "${POLICIES}" <<'PY'; then
import sys
from pathlib import Path

from gateway.policy.opa_sidecar import OPAUnavailable
from gateway.policy.revision import not_in_bundle, policy_files

try:
    dropped = not_in_bundle(policy_files(Path(sys.argv[1])))
except OPAUnavailable as exc:
    sys.exit(f"{exc}")
for f in dropped:
    print(f"{f}: a bundle would not load it (only data.json/data.yaml/data.yml): name it data.yaml in its own directory")
sys.exit(1 if dropped else 0)
PY
	fail "bundle layout (data a bundle would not load)"
fi
bundle="$(mktemp -d)/bundle.tar.gz"
if "${OPA}" build -b "${POLICIES}" --ignore '*_test.rego' -o "${bundle}"; then
	if tar -tzf "${bundle}" 2>/dev/null | grep -E '_test\.rego$|/golden/'; then
		fail "bundle contains test files or golden cases"
	else
		echo "bundle ok: $(tar -tzf "${bundle}" 2>/dev/null | grep -c '\.rego$') policy files, data: $(tar -tzf "${bundle}" 2>/dev/null | grep -E 'data\.(json|yaml)$' | tr '\n' ' ')"
	fi
else
	fail "opa build"
fi
rm -rf "$(dirname "${bundle}")"

echo
if ((${#failed[@]})); then
	printf 'policy checks FAILED: %s\n' "${failed[*]}"
	exit 1
fi
echo "policy checks passed"

#!/usr/bin/env bash
# What a policy repository's CI runs before a policy change may merge (docs/policy-lifecycle.md;
# docs/examples/policy-ci.yml is the same as a GitHub Actions workflow):
#
#   1. every policy check (scripts/policy-checks.sh: opa check --strict, opa fmt, opa test with
#      the coverage threshold, Regal, bundle build)
#   2. a replay of recorded decisions against the candidate policy: the run fails when a decision
#      would move between allow and deny, or an approval would be waived or weakened (FAIL_ON), and leaves a Markdown report
#
# Usage: scripts/policy-ci.sh [POLICY_DIR]          (default: policies/)
# Env:   AUDIT_EXPORT  a `pvegate audit export --jsonl` file of recent production decisions;
#                      without it a small synthetic sample is generated with the real audit writer
#        FAIL_ON       change kinds that fail the run (default: allow-to-deny,deny-to-allow,approval-waived,approval-weakened)
#        OUT           where the report goes (default: .state/policy-ci/)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
POLICIES="$(cd "${1:-${REPO_ROOT}/policies}" && pwd)"
cd "${REPO_ROOT}"
PY="${PY:-.venv/bin/python}"
OUT="${OUT:-.state/policy-ci}"
FAIL_ON="${FAIL_ON:-allow-to-deny,deny-to-allow,approval-waived,approval-weakened}"
mkdir -p "${OUT}"

echo "== policy checks (${POLICIES})"
bash scripts/policy-checks.sh "${POLICIES}"

export_file="${AUDIT_EXPORT:-}"
if [[ -z "${export_file}" ]]; then
	echo
	echo "== no AUDIT_EXPORT given: generating a sample audit (300 calls, real audit writer, shipped policies)"
	rm -rf "${OUT}/sample"
	mkdir -p "${OUT}/sample"
	"${PY}" bench/replay_audit.py --calls 300 --db "${OUT}/sample/audit.db"
	"${PY}" -m gateway.cli audit verify --db "${OUT}/sample/audit.db"
	"${PY}" -m gateway.cli audit export --db "${OUT}/sample/audit.db" --kind decision --jsonl -o "${OUT}/sample/export.jsonl"
	export_file="${OUT}/sample/export.jsonl"
fi

echo
echo "== replay ${export_file} against ${POLICIES} (fail on: ${FAIL_ON})"
"${PY}" -m gateway.cli policy replay --export "${export_file}" --policies "${POLICIES}" \
	--fail-on "${FAIL_ON}" --format markdown -o "${OUT}/replay.md"
echo "report: ${OUT}/replay.md"

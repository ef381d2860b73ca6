"""Asking OPA: the decision client, the managed OPA sidecar, bundles and the tools/list cache."""

"""Throw-away CA + server certificate for the simulated API (SAN 127.0.0.1, localhost),
named the way a PVE node's self-signed certificate is."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import hashes

from gateway.dev.devcerts import common_name, issue_ca, issue_server_cert, write_key, write_pem

PVE_CA_ORG = "PVE Cluster Manager CA (pvegate sim)"


@dataclass(frozen=True)
class TlsFiles:
    ca_file: Path
    cert_file: Path
    key_file: Path
    fingerprint: str  # SHA-256 of the server cert, "AA:BB:..."


def make_tls(workdir: Path, cluster: str) -> TlsFiles:
    workdir.mkdir(parents=True, exist_ok=True)
    ca, ca_key = issue_ca(common_name(f"Proxmox Virtual Environment {cluster}", PVE_CA_ORG))
    cert, key = issue_server_cert(ca, ca_key, ("localhost", "127.0.0.1"), common_name("localhost", PVE_CA_ORG))
    ca_file, cert_file, key_file = workdir / "sim-ca.pem", workdir / "sim-api.pem", workdir / "sim-api.key"
    write_pem(ca_file, ca)
    write_pem(cert_file, cert)
    write_key(key_file, key)
    fp = cert.fingerprint(hashes.SHA256()).hex().upper()
    return TlsFiles(ca_file, cert_file, key_file, ":".join(fp[i : i + 2] for i in range(0, len(fp), 2)))

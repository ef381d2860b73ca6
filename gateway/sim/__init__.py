"""Proxmox VE simulator (HTTPS API + SSH) for tests, the demo and benchmarks. See docs/simulator.md."""

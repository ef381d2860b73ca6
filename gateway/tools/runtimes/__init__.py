"""Connector runtimes: how a declared tool reaches Proxmox (API, SSH, composite)."""

"""pvegate: a policy-as-code MCP gateway for Proxmox VE."""

__version__ = "0.1.0"

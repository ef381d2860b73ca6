"""What the gateway keeps: the hash-chained audit log, approvals and usage counters."""

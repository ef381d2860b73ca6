"""The admin/approver HTTP API."""

"""The MCP protocol edge: HTTP transport, JSON-RPC, method handlers, URL-elicitation handoff."""

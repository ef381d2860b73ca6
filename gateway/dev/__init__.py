"""The dev/test harness shared by tests, bench, the demo and the simulator: dev env, dev TLS, MCP client."""

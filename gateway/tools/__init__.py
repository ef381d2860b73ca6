"""What a call can do: the Tool type, the YAML catalog, target facts, output shaping, the runtimes."""

"""What a user declares: tools, agents, prompts, variables, hooks and the sources of tools.

Importing a definition does no I/O: agents and tools are values a worker resolves by name."""

"""What a user declares: tools, agents (with their subagents), agent tools, prompts, variables,
hooks and the sources of tools (MCP servers, a Pydantic AI agent).

Importing a definition does no I/O and loads neither the store nor the runtime: agents and tools
are values a worker resolves by name. Carrying them out is the runtime's part (for example
:mod:`threads_celery.runtime.hooks`, :mod:`threads_celery.runtime.subagents`,
:mod:`threads_celery.runtime.variables`)."""

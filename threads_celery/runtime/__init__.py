"""The step machine and what it drives: model turns, tool calls, child runs, delivery, recovery."""

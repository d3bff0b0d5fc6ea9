"""The run transitions the client and the workers share: one transaction each on the store.

Submitting a run, an agent-tool child, cancelling, and what a person decides for a parked call."""

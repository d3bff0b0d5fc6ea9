"""Pure decisions: functions from plain records to a decision value; no database, broker or network.

- :mod:`.next_step`: whether a delivered step or call runs, and what runs after a commit;
- :mod:`.effects`: what an interrupted tool call may do again, by its effect;
- :mod:`.retry`: the one retry policy (how long to wait, when to give up);
- :mod:`.budgets`: when an agent-tool run is out of time, and what it is sealed as;
- :mod:`.permissions`, :mod:`.usage`, :mod:`.provider_limits`: what a call or step may do;
- :mod:`.backbone`: which queue a task takes, and the outbox's pacing.

Nothing here imports the store, the runtime, the transitions or any I/O library (import-linter's
"decisions import no I/O" contract); the shells in :mod:`threads_celery.runtime` load, ask, apply.
"""

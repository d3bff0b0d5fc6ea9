"""Pure decisions: recovery by effect, permissions, what runs next, routing and limits.

Functions from plain records to a decision value; no database, broker or network here."""

"""What a tool works in, through its context: the thread's file area and the code sandbox.

``ctx.files`` is :class:`~threads_celery.workspace.files.ThreadFiles` and ``ctx.run_code`` is
:func:`~threads_celery.workspace.sandbox.run_code` (bubblewrap, set up by
:mod:`~threads_celery.workspace.isolation`). They need only the standard library and the
exceptions, so the definitions can hand them out without loading the runtime.
"""

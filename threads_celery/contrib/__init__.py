"""Integrations with the frameworks a project already runs (``threads_celery.contrib.django``).

Each lives in a package of its own and imports its framework only when the project uses it, so
that the runtime installs and imports without any of them.
"""

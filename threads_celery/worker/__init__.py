"""The Celery side: the application, its tasks, the outbox publisher and the embedded worker."""

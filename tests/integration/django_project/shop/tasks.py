from celery import shared_task


@shared_task(name="shop.ping")
def ping() -> str:
    """The shop's own task, served by the same workers as the agents."""
    return "pong"

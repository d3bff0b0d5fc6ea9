import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")
django_app = get_asgi_application()

from threads_celery.contrib.django.asgi import with_threads  # noqa: E402 - after Django's set-up

# /agents/api/v1/... and /agents/console/ behind Django's sign-in; the rest is Django's.
application = with_threads(django_app)

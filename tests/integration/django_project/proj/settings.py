"""The shop project's settings: the ORM on PostgreSQL, Celery's under CELERY_, the runtime's under THREADS_."""

import os

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "only-for-the-tests")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
USE_TZ = True

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "threads_celery.contrib.django",
    "shop",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
ROOT_URLCONF = "proj.urls"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("SHOP_DATABASE", "shop"),
        "HOST": os.environ.get("SHOP_DATABASE_HOST", "127.0.0.1"),
        "PORT": os.environ.get("SHOP_DATABASE_PORT", "5432"),
        "USER": os.environ.get("SHOP_DATABASE_USER", "postgres"),
    }
}

# The project's Celery app (proj/celery.py) reads these; the runtime uses the same broker.
CELERY_BROKER_URL = os.environ.get("SHOP_BROKER_URL", "redis://127.0.0.1:6379/0")
CELERY_TASK_DEFAULT_QUEUE = "shop"

# The agents the workers load. The ledger lives in the default database (THREADS_DATABASE_URL
# unset), in tables of its own beside the shop's.
THREADS_AGENTS = ["shop.agents"]

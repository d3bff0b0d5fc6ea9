import os

from celery import Celery

import threads_celery.contrib.django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

app = Celery("proj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
threads_celery.contrib.django.install(app)

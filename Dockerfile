# The threads-celery image: one image for every role (migrate, worker, beat, flower, api).
# docker-compose.yml builds it; each service picks its command.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app

WORKDIR /app

# bubblewrap isolates ctx.run_code (without it run_code refuses to run code).
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap && rm -rf /var/lib/apt/lists/*

# Workers start through this (docker-compose.yml): it prepares the delegated cgroup v2 parent
# that caps each run_code call's memory and tasks, then drops to the user `threads`. setpriv is
# util-linux's, already in the image.
COPY docker/sandbox-cgroup-entrypoint.sh /usr/local/bin/sandbox-cgroup-entrypoint.sh

# The package first (its layer is reused while only the examples change).
COPY pyproject.toml README.md ./
COPY threads_celery ./threads_celery
# `celery -A tasks worker|beat` (docker-compose.yml) imports these from /app (PYTHONPATH): the
# package does not install them, since a top-level `tasks` in site-packages would shadow a user's
# own. Installed, the same app is `celery -A threads_celery.worker`.
COPY tasks ./tasks
COPY beat ./beat
# `alembic upgrade head` works from /app as from a checkout (THREADS_DATABASE_URL names the database).
COPY alembic.ini ./
# Extras: flower, plus the model providers your agents use (openai, anthropic): an agent whose
# provider package is missing stops every service at start-up with one line.
ARG THREADS_EXTRAS=flower,openai
RUN pip install ".[${THREADS_EXTRAS}]"

# Your agents go here too: THREADS_AGENTS names their modules (importable from /app).
COPY examples ./examples

# Thread files and Beat's state live on volumes mounted here; a fresh named volume takes the
# ownership of the directory it is mounted on, so the unprivileged user can write to it.
RUN useradd --create-home --uid 10001 threads && chown threads /app \
    && mkdir -p /var/lib/threads/files /var/lib/threads/beat && chown -R threads /var/lib/threads
USER threads

EXPOSE 8000 5555
CMD ["threads-celery", "--help"]

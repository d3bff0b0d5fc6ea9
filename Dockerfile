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

# The package first (its layer is reused while only the examples change).
COPY pyproject.toml README.md ./
COPY threads_celery ./threads_celery
COPY tasks ./tasks
COPY beat ./beat
RUN pip install ".[flower]"

# Your agents go here too: THREADS_AGENTS names their modules (importable from /app).
COPY examples ./examples

RUN useradd --create-home --uid 10001 threads && chown threads /app
USER threads

EXPOSE 8000 5555
CMD ["threads-celery", "--help"]

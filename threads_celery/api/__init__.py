"""The HTTP API for web apps (FastAPI)."""

"""Examples for threads-celery: the demo agent (``examples/demo.py``) and friends."""

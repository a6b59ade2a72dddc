"""Speech code only, no Celery, Flask or Redis: the text frontend, the neural and classic voices,
books and audio (docs/architecture.md)."""

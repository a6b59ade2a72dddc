"""gunicorn entry point: `gunicorn -c ops/gunicorn.conf.py web.wsgi:app`."""

from web import create_app

app = create_app()

"""gunicorn entry point: `gunicorn -c ops/gunicorn.conf.py web.wsgi:app`."""

from app.settings import Settings
from web import create_app

# The web's one read of the environment: everything below is handed these settings.
app = create_app(Settings.from_env())

"""The web front-end: a Flask app factory. Dependencies come in as arguments."""

from __future__ import annotations

from flask import Flask

from app.farm import Farm
from app.settings import Settings
from web.errors import register_error_handlers
from web.headers import register_security_headers


def create_app(settings: Settings, farm: Farm | None = None) -> Flask:
    """The web app for `settings` (read by the entry point: web/wsgi.py), serving `farm`
    (default: a new `Farm(settings)`)."""
    app = Flask(__name__)
    # A JSON body holds at most max_text_chars characters of up to 4 UTF-8 bytes each,
    # plus the other fields; anything bigger is refused before it is read.
    app.config["MAX_CONTENT_LENGTH"] = settings.max_text_chars * 4 + 64 * 1024
    app.json.sort_keys = False  # type: ignore[attr-defined]  # Flask's default provider's
    app.extensions["voxfarm"] = farm or Farm(settings)
    register_error_handlers(app, settings.retry_after_s)
    # Every answer, errors included: nosniff, no framing, the page's script-only policy.
    register_security_headers(app)
    # The voice list comes from libespeak-ng once per process: read it now, so no request
    # handler on the hub ever calls into the library (the frontend thread alone does).
    from models.voices import backend_for, list_voices, use_voices_dir

    use_voices_dir(settings.voices_dir)
    # An engine's G2P that loads on its first call (hibari's lexicons, about a second) is
    # paid at start, before the web answers /readyz, not in the first request that speaks
    # with it (models/voices/: each engine says what it warms; no torch, no eSpeak).
    engines = {backend_for(voice).name: backend_for(voice) for voice in list_voices()}
    for backend in engines.values():
        backend.warm_g2p()

    # First, so its request hooks (request id, HTTP metrics) wrap every other blueprint.
    from web.observability import observability

    app.register_blueprint(observability)
    # Next, so no other blueprint's hook runs for a request without a valid key.
    from web.auth import auth

    app.register_blueprint(auth)

    # the views load with the app: importing web.schemas alone stays light
    from web.api import api
    from web.books import books_api
    from web.captioned import captioned
    from web.idempotency import idempotency_api
    from web.models_admin import models_admin
    from web.openai_compat import openai_compat
    from web.openapi import openapi
    from web.page import page
    from web.streams import streams
    from web.voices import voices_api
    from web.ws import ws_bp

    app.register_blueprint(api)
    app.register_blueprint(books_api)
    app.register_blueprint(idempotency_api)
    app.register_blueprint(models_admin)
    app.register_blueprint(voices_api)
    app.register_blueprint(streams)
    app.register_blueprint(openai_compat)
    app.register_blueprint(captioned)
    app.register_blueprint(ws_bp)
    app.register_blueprint(openapi)
    app.register_blueprint(page)
    # Last: its read hook runs after the door applied the tenant's key (web/zones.py).
    from web.zones import register_zones

    register_zones(app)
    return app

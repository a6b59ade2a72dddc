"""The browser page at `/`: type text, pick a voice and speed, press play.

Plain HTML, CSS and JavaScript served by this app (no framework, nothing from a CDN). The
page plays `/v1/jobs/{id}/stream?format=wav` in an `<audio>` element, so playback starts with
the first segment while the rest renders; it lists the jobs it started with their progress,
and shows the book section when the server has the books API.
"""

from __future__ import annotations

from flask import Blueprint, current_app, render_template

from web.helpers import farm
from web.schemas import SPEED_MAX, SPEED_MIN

page = Blueprint("page", __name__)


@page.get("/")
def index():
    settings = farm().settings
    # The book section shows only where the books API is served (it lands separately).
    books = any(rule.rule == "/v1/books" for rule in current_app.url_map.iter_rules())
    return render_template("index.html", default_voice=settings.default_voice,
                           max_chars=settings.max_text_chars, speed_min=SPEED_MIN,
                           speed_max=SPEED_MAX, books=books)

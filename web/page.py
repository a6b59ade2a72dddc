"""The browser page at `/`: type text, pick a voice and speed, press play.

Plain HTML, CSS and JavaScript served by this app (no framework, nothing from a CDN). The
page plays `/v1/jobs/{id}/stream?format=wav` in an `<audio>` element, so playback starts with
the first segment while the rest renders; it lists the jobs it started with their progress,
and shows the book section when the server has the books API.

With API keys on, the page (and its static files) stay open and the page asks for a key,
which it keeps for the tab (sessionStorage) and sends as a header with every call. An
`<audio src>` cannot send a header, so the page then fetches the stream itself (MP3, fed to
a MediaSource as it arrives) and plays that; downloads go through a fetch as well.
"""

from __future__ import annotations

from flask import Blueprint, current_app, render_template

from models.books.parse import EXTENSIONS
from models.text.ssml import SPEED_MAX, SPEED_MIN
from web import apidoc as doc
from web.auth import keys_enabled
from web.helpers import farm

page = Blueprint("page", __name__)


@doc.route(page, "/", "get", doc.op(
    "docs", "page", "The browser page: type, pick a voice, play", {
        "200": {"description": "HTML", "content": {"text/html": {"schema": {"type": "string"}}}}}))
def index():
    f = farm()
    settings = f.settings
    # The book section shows only where the books API is served (it lands separately).
    books = any(rule.rule == "/v1/books" for rule in current_app.url_map.iter_rules())
    # Whether the page should ask for a key before its first call (a 401 would say so too,
    # but as an error in the browser's console).
    return render_template("index.html", default_voice=settings.default_voice,
                           max_chars=settings.max_text_chars, speed_min=SPEED_MIN,
                           speed_max=SPEED_MAX, books=books, keys=keys_enabled(f.apikeys),
                           # The picker offers what the upload takes, and nothing else (JSON
                           # chapters are a JSON body, not a file: docs/books.md).
                           book_extensions=",".join(EXTENSIONS))

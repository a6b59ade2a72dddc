"""Security headers on every answer: JSON, the page, its static files, errors, streams.

The page keeps an API key in the tab's sessionStorage, so a script that is not the farm's own
must never run on it, and no other site may frame it (a click-jacked page acts with the key).
One policy for every response: the API's JSON gains nothing from a looser one, and a single
place keeps the page's and the errors' headers from drifting apart.
"""

from __future__ import annotations

from flask import Flask, Response

# What the page needs and nothing more (web/templates, web/static: no inline script or style,
# nothing from another origin): its own script, style sheet, calls (fetch: the API, the
# streams) and audio (the stream itself, or a MediaSource/Blob URL the script made of it).
CONTENT_SECURITY_POLICY = "; ".join((
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "media-src 'self' blob:",
    "connect-src 'self'",
    "form-action 'self'",
    "base-uri 'none'",
    "frame-ancestors 'none'",
))

SECURITY_HEADERS = {
    # A body is what its Content-Type says: a WAV, or a JSON error echoing a field, is never
    # sniffed into HTML.
    "X-Content-Type-Options": "nosniff",
    # frame-ancestors 'none' for browsers that read CSP, this for those that predate it.
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    # Job and book ids are in the farm's URLs; another site has no need to learn them.
    "Referrer-Policy": "no-referrer",
}


def add_security_headers(resp: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        resp.headers.setdefault(name, value)
    return resp


def register_security_headers(app: Flask) -> None:
    """Every response of `app` carries SECURITY_HEADERS (a view's own value of one wins)."""
    app.after_request(add_security_headers)

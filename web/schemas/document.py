"""The settings a schema is written or checked with, and the API's refusal from a validator.

A bound or default that is a setting (`max_text_chars`, `max_wait_s`, `default_voice`) is read
at validation from the context (`{"settings": ...}`) and, in the document, from the settings it
is built for: `document_for(settings)` sets them in a ContextVar for the block that writes the
JSON schemas (web/openapi.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from pydantic import ValidationInfo
from pydantic_core import PydanticCustomError

from app.settings import Settings

_DOCUMENT_SETTINGS: ContextVar[Settings] = ContextVar("voxfarm_document_settings")


@contextmanager
def document_for(settings: Settings) -> Iterator[None]:
    """Build JSON schemas inside this block: bounds and defaults that are settings are
    these settings' values."""
    token = _DOCUMENT_SETTINGS.set(settings)
    try:
        yield
    finally:
        _DOCUMENT_SETTINGS.reset(token)


def document_setting(name: str | float) -> Any:
    """The setting called `name` (a number stands for itself)."""
    return getattr(_DOCUMENT_SETTINGS.get(), name) if isinstance(name, str) else name


def settings_of(info: ValidationInfo) -> Settings:
    return (info.context or {})["settings"]


def from_settings(**keywords: str | float) -> Callable[[dict], None]:
    """A field's `json_schema_extra` whose keywords are settings (`default="default_voice"`)
    or numbers."""
    def extra(schema: dict) -> None:
        schema.update({k: document_setting(name) for k, name in keywords.items()})
    return extra


def refusal(code: str, message: str, status: int = 422, **extra: Any) -> PydanticCustomError:
    """A validation error that leaves as exactly this API error (web.helpers.parse)."""
    return PydanticCustomError(code, message, {"status": status, **extra})

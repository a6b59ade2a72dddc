"""The farm's refusals: one base, `FarmError`, that says how the API answers each.

A refusal is not a fault: the farm works, and declines what it was asked, for a reason the
caller can act on (come back later, ask for less, fix a request). Each kind carries its HTTP
status, its error code and, when coming back later helps, a Retry-After; `web/errors.py` maps
the base once into the API's one error shape, so a new kind needs no new handler. The kinds
live beside the code that raises them (`Overloaded` in app/services/admission.py, `LimitExceeded` in
app/security/apikeys.py, ...); this module imports nothing of the farm, so any of them can
derive from it. models/errors.py is the same idea for the speech side (`SpeechError`).
"""

from __future__ import annotations


class FarmError(Exception):
    """A refusal of the farm's: `status` and `code` of the API's answer, `retry_after_s` when
    trying again later helps (None: the web's default `retry_after_s`, where `retry` is set).

    `public` is the message the API shows when it is not `str(self)` (what the log keeps);
    `extra()` adds fields to the error body (`limit`, `key_id`)."""

    status: int = 503
    code: str = "unavailable"
    # Whether the answer carries Retry-After, and whether its body repeats it (`retry_after`).
    retry: bool = True
    retry_in_body: bool = True
    public: str | None = None
    retry_after_s: int | None = None

    def message(self) -> str:
        return self.public if self.public is not None else str(self)

    def extra(self) -> dict:
        return {}

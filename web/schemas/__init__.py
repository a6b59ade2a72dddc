"""The API declared once: a pydantic model for every request body, query and JSON response.

The request models validate (`web.helpers.parse` turns their errors into the API's one error
shape) and every model writes its part of `/openapi.json` (web/openapi.py). Nothing here
restates a fact: states come from `app.stores.states`, formats and limits from the modules that
own them, and a bound or default that is a setting is read from the app's settings.

- `constants.py`: the values the API takes (formats, text types, OpenAI's names and speeds)
- `document.py`: the settings a schema is written or checked with, and the API's refusal
- `fields.py`: the field types (bounds, choices, texts, names, lexicons, phonemes)
- `requests.py`: the request models; `responses.py`: the answers and socket events

Callers import from the module that declares a name; this package re-exports nothing.
"""

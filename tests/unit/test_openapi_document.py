"""The OpenAPI document is the API's contract: moving where its paths are declared must not
change it. tests/fixtures/openapi.json is the document as it stands (written before the paths moved
beside their views, then with the hibari voice); any difference but ordering fails here: a
change to the contract is made on purpose, with the fixture."""

from __future__ import annotations

import json
from pathlib import Path

from app.settings import Settings
from web.openapi import build_spec

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "openapi.json"


def _unordered(node):
    """The document with every list sorted by its items' JSON: order carries no meaning in
    `required`, `tags`, `enum` or a path's statuses."""
    if isinstance(node, dict):
        return {k: _unordered(v) for k, v in node.items()}
    if isinstance(node, list):
        return sorted((_unordered(v) for v in node), key=lambda v: json.dumps(v, sort_keys=True))
    return node


def _differences(a, b, where="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{where}/{k}: only in {'fixture' if k in a else 'now'}")
            else:
                out += _differences(a[k], b[k], f"{where}/{k}")
        return out
    return [] if a == b else [f"{where}: {json.dumps(a)[:120]} != {json.dumps(b)[:120]}"]


def test_the_document_is_the_one_main_wrote(monkeypatch):
    for name in [n for names in Settings.env_names().values() for n in names]:
        monkeypatch.delenv(name, raising=False)
    expected = _unordered(json.loads(FIXTURE.read_text(encoding="utf-8")))
    now = _unordered(json.loads(json.dumps(build_spec(Settings.from_env()))))
    diff = _differences(expected, now)
    assert not diff, "the OpenAPI document changed:\n" + "\n".join(diff[:40])


def test_the_comparison_sees_a_change():
    doc = json.loads(FIXTURE.read_text(encoding="utf-8"))
    changed = json.loads(json.dumps(doc))
    next(iter(changed["paths"].values()))["x-changed"] = True
    assert _differences(_unordered(doc), _unordered(changed))

"""The docs give each voice's sample rate as the farm's voice list does: the table in
docs/models.md row by row, and every place in the docs that names a voice (or "the default",
"the Piper voice") right beside a rate. A reader who sets up a player or sizes storage from the
docs gets the rate `GET /v1/voices` answers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
TABLE_HEADING = "## The voices and their rates"
# 24 kHz, 24,000 Hz, 22,050 Hz, 22.05 kHz
RATE = r"(\d{1,3}(?:,\d{3})?(?:\.\d+)?) ?(kHz|Hz)\b"
# Names the docs use for a voice in prose, and the voice each stands for.
ALIASES = {"the default": "en_us-hibari-heart", "the Piper voice": "en_us-joe-medium"}


def _hz(number: str, unit: str) -> int:
    value = float(number.replace(",", ""))
    return round(value * 1000) if unit == "kHz" else round(value)


@pytest.fixture(scope="module")
def voices(client) -> dict[str, dict]:
    answer = client.get("/v1/voices")
    assert answer.status_code == 200, answer.get_data(as_text=True)
    return {v["name"]: v for v in answer.get_json()["voices"] if not v["custom"]}


def _table() -> list[tuple[list[str], str, int]]:
    """(names in the first column, engine, rate) for each row of the rates table."""
    text = (ROOT / "docs" / "models.md").read_text()
    assert TABLE_HEADING in text, "docs/models.md has lost its table of rates"
    rows = []
    for line in text.split(TABLE_HEADING, 1)[1].splitlines():
        if rows and not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != 3 or cells[1] in ("engine", "---"):
            continue
        rate = re.fullmatch(RATE, cells[2])
        assert rate, f"the rate cell {cells[2]!r} of docs/models.md's table is no rate"
        rows.append((re.findall(r"`([^`]+)`", cells[0]), cells[1], _hz(*rate.groups())))
    assert rows, "docs/models.md's table of rates has no rows"
    return rows


def test_the_table_of_rates_is_the_voice_list(voices) -> None:
    rows = _table()
    by_engine = {engine: rate for _, engine, rate in rows}
    for name, voice in voices.items():
        assert voice["engine"] in by_engine, f"no row for {name}'s engine {voice['engine']}"
        assert voice["sample_rate"] == by_engine[voice["engine"]], (
            f"{name}: the table says {by_engine[voice['engine']]} Hz, the farm "
            f"{voice['sample_rate']} Hz")
    for names, engine, rate in rows:
        for name in names:
            assert name in voices, f"the table names {name}, which the farm does not list"
            assert (voices[name]["engine"], voices[name]["sample_rate"]) == (engine, rate), name


def test_every_voice_named_beside_a_rate_in_the_docs_has_that_rate(voices) -> None:
    # A voice's name in backticks, then its rate ("`en_us-joe-medium` (Piper, 22,050 Hz)");
    # or a rate, then "for" a name in prose ("24 kHz for the default").
    names = {f"`{n}`": n for n in voices}
    near = re.compile("(" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
                      + r")[^`|\n.;]{0,40}?" + RATE)
    before = re.compile(RATE + r" for (" + "|".join(re.escape(a) for a in ALIASES) + ")")
    seen, wrong = 0, []
    for path in DOCS:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            found = [(m.group(1), m.group(2), m.group(3)) for m in near.finditer(line)]
            found += [(m.group(3), m.group(1), m.group(2)) for m in before.finditer(line)]
            for said, value, unit in found:
                seen += 1
                voice = names.get(said) or ALIASES[said]
                if _hz(value, unit) != voices[voice]["sample_rate"]:
                    wrong.append(f"{path.name}:{number}: {said} at {value} {unit}, the farm "
                                 f"says {voices[voice]['sample_rate']} Hz")
    assert seen >= 4, "the pattern finds no voice beside a rate: it has stopped matching"
    assert not wrong, "\n".join(wrong)

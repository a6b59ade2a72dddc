"""What `say` and `book render` show while the farm works, off a terminal: plain lines, one at
the start, one every few seconds and one at the end, each with one estimate of the time left
(the farm's). tests/e2e/test_newcomer.py and test_first_steps.py run the real commands."""

from __future__ import annotations

from app.cli import client
from app.cli.book import book_progress_note


def book(state: str, chapters: list[tuple[int, int]], eta_s: float | None = None) -> dict:
    return {"state": state, "eta_s": eta_s,
            "chapters": [{"segments": {"done": d, "total": t}} for d, t in chapters]}


def test_off_a_terminal_a_plain_line_every_few_seconds(monkeypatch, capsys):
    now = [1000.0]
    monkeypatch.setattr(client.time, "monotonic", lambda: now[0])
    progress = client.Progress(0)
    steps = [(0.0, 0, 0, "preparing"), (1.0, 3, 40, "rendering, ETA 30 s"),
             (4.5, 10, 40, "rendering, ETA 25 s"), (2.0, 12, 40, "rendering, ETA 24 s"),
             (3.0, 14, 40, "rendering, ETA 22 s"), (60.0, 40, 40, "done")]
    for dt, done, total, note in steps:
        now[0] += dt
        progress.update(done, total, note)
    progress.close()
    # At 0 s, 5.5 s (the first update 5 s after the last line), 10.5 s and at the end; the
    # end is not printed twice.
    assert capsys.readouterr().out.splitlines() == [
        "segments 0/?, preparing", "segments 10/40, rendering, ETA 25 s",
        "segments 14/40, rendering, ETA 22 s", "segments 40/40, done"]


def test_close_prints_the_last_figures_when_they_were_not_shown(monkeypatch, capsys):
    now = [0.0]
    monkeypatch.setattr(client.time, "monotonic", lambda: now[0])
    progress = client.Progress(3)
    progress.update(0)
    now[0] += 1
    progress.update(3)  # the job ended a second in: too soon for a line of its own
    progress.close()
    assert capsys.readouterr().out.splitlines() == ["segments 0/3", "segments 3/3"]


def test_a_books_note_has_one_estimate_and_counts_only_finished_chapters():
    # Chapters not split yet (total 0) are not done, whatever 0 == 0 says.
    assert book_progress_note(book("rendering", [(2, 2), (0, 0), (1, 5), (0, 0)], 89)) \
        == "rendering, chapters done 1/4, ETA 1:29"
    assert book_progress_note(book("rendering", [(0, 3)], 42.4)) == \
        "rendering, chapters done 0/1, ETA 42 s"
    assert book_progress_note(book("queued", [])) == "queued"
    # Rendered: no time left to estimate.
    assert book_progress_note(book("assembling", [(3, 3)], 0.5)) == \
        "assembling, chapters done 1/1"

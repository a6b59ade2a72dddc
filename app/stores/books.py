"""The book store: book records and progress in Redis, book files in the artifact store.

Redis holds only small things: the record (state, per-chapter counts, the feed cursor) and a
bitmap with one bit per segment; audio never goes through Redis, so its memory stays bounded
(the broker's too: tasks/books.py, the feeder).

A chapter is packaged (encoded) in pieces of PIECE_SEGMENTS segments, each as soon as its
segments are stored: `store_segment` says so, and `packaged` records the encodings made
(`c{n}_p{k}_packed` for a piece, `c{n}_packed` for the chapter once its pieces are joined),
so nothing is packaged twice for the same formats, even across a crash.

States: queued -> preparing -> rendering -> assembling -> done, and failed (a segment failed
its retries; `retry` goes back to rendering) or canceled (DELETE; files removed).

While a book is preparing, its record also holds the planner's checkpoint (`plan_gen`, the
planner that owns it; `plan_next`, `planned`, `plan_total`; each planned chapter's counts), so
a prepare that hands over, or is redelivered, carries on from the last planned chapter.

Each segment is counted once: storing it sets its bit, and only a bit that was 0 advances the
counters (one Lua script), so a redelivered or duplicated segment task never counts twice.

The artifact layout under `books/{id}/`: app/stores/book_files.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import NamedTuple

import redis

from app.stores.artifacts import ArtifactStore
from app.stores.book_files import (  # noqa: F401  (where the book's files are: imported from here)
    PIECE_SEGMENTS,
    book_download_name,
    book_id_for,
    captions_download_name,
    captions_file,
    chapter_download_name,
    chapter_file,
    encodings_for,
    file_stem,
    output_key,
    packaging,
    packed_list,
    part_key,
    piece_mp3_key,
    pieces_of,
    plan_key,
    prefix,
    segment_key,
    segment_words_key,
)
from app.stores.keys import Keys
from app.stores.states import BOOK_ACTIVE, BookState, Transition, lua

BOOK_FORMATS = ("m4b", "mp3", "chapters")
DEFAULT_FORMATS = ("m4b", "chapters")

# Create unless a live record exists; a canceled book is created afresh (its files are gone).
_CREATE = lua("""
local state = redis.call('HGET', KEYS[1], 'state')
if state and state ~= '$CANCELED' then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
""", BookState)

# KEYS: the book, its done bitmap, the books' progress zset. ARGV: seq, chapter, samples,
# now, the book's id, the segment's index in its chapter, PIECE_SEGMENTS. A stored segment is
# progress for the stall sweeper too, in the same round trip (BookStore.progressed says what
# that means). Returns {done, total, state, 1 when the segment's piece of its chapter has every
# segment stored, the piece}: said again by a redelivered segment, so a piece whose packaging
# message was lost is sent it again (packaging is idempotent).
_STORE_SEGMENT = lua("""
local seq = ARGV[1]
local chapter = ARGV[2]
local samples = ARGV[3]
local now = ARGV[4]
local book_id = ARGV[5]
local piece = math.floor(tonumber(ARGV[6]) / tonumber(ARGV[7]))
local piece_field = 'c' .. chapter .. '_p' .. piece .. '_done'
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {-2, 0, '', 0, 0} end
if state ~= '$RENDERING' and state ~= '$ASSEMBLING' and state ~= '$FAILED' then
  return {-1, 0, state, 0, 0}
end
if redis.call('SETBIT', KEYS[2], seq, 1) == 0 then
  redis.call('HINCRBY', KEYS[1], 'done', 1)
  redis.call('HINCRBY', KEYS[1], 'c' .. chapter .. '_done', 1)
  redis.call('HINCRBY', KEYS[1], piece_field, 1)
  redis.call('HINCRBY', KEYS[1], 'audio_samples', samples)
end
redis.call('ZADD', KEYS[3], 'XX', now, book_id)
redis.call('HDEL', KEYS[1], 'stall_resumes')
local done = tonumber(redis.call('HGET', KEYS[1], 'done'))
local total = tonumber(redis.call('HGET', KEYS[1], 'total'))
if done >= total and state == '$RENDERING' then
  redis.call('HSET', KEYS[1], 'state', '$ASSEMBLING', 'rendered_at', now)
  state = '$ASSEMBLING'
end
local chapter_total = tonumber(redis.call('HGET', KEYS[1], 'c' .. chapter .. '_total') or '0')
local piece_total = math.min(tonumber(ARGV[7]), chapter_total - piece * tonumber(ARGV[7]))
local piece_done = tonumber(redis.call('HGET', KEYS[1], piece_field) or '0')
return {done, total, state, piece_done >= piece_total and 1 or 0, piece}
""", BookState)

# A re-submit asking for formats the record lacks. ARGV: the formats asked for. The record's
# formats become the union (files already made stay valid); a done book goes back to
# assembling to package its stored segments again. Returns {repackage (0/1), state}.
_ADD_FORMATS = lua("""
local state = redis.call('HGET', KEYS[1], 'state')
if not state or state == '$CANCELED' then return {0, state or ''} end
local have, list = {}, {}
for f in string.gmatch(redis.call('HGET', KEYS[1], 'formats') or '', '[^,]+') do
  have[f] = true
  table.insert(list, f)
end
local added = false
for i = 1, #ARGV do
  if not have[ARGV[i]] then
    have[ARGV[i]] = true
    table.insert(list, ARGV[i])
    added = true
  end
end
if not added then return {0, state} end
table.sort(list)
redis.call('HSET', KEYS[1], 'formats', table.concat(list, ','))
if state == '$DONE' then
  redis.call('HSET', KEYS[1], 'state', '$ASSEMBLING')
  return {1, '$ASSEMBLING'}
end
return {0, state}
""", BookState)

# The assembly finished, having packaged ARGV[1] (the formats it read). ARGV: formats, now,
# duration. Done only if nobody added a format meanwhile; else {2, ...}: package again.
_ASSEMBLED = lua("""
local formats = ARGV[1]
local now = ARGV[2]
local duration_s = ARGV[3]
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= '$ASSEMBLING' then return {0, state or ''} end
if (redis.call('HGET', KEYS[1], 'formats') or '') ~= formats then return {2, state} end
redis.call('HSET', KEYS[1], 'state', '$DONE', 'finished_at', now, 'duration_s', duration_s)
return {1, '$DONE'}
""", BookState)

# A piece's or a chapter's packaging is stored (tasks/books.py). KEYS: the book, the books'
# progress zset. ARGV: its field (`c{n}_p{k}_packed`, `c{n}_packed`), the encodings made (comma
# separated), seconds it took (-1: not timed), now, the book's id. The field becomes the union
# (a re-submit adding formats packages only what it lacks), and a piece's time goes into the
# packaging estimate. Returns the book's state; a book that left rendering and assembling
# (canceled, failed) keeps nothing.
_PACKAGED = lua("""
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= '$RENDERING' and state ~= '$ASSEMBLING' then return state or '' end
local field = ARGV[1]
local have, list = {}, {}
for f in string.gmatch((redis.call('HGET', KEYS[1], field) or '') .. ',' .. ARGV[2], '[^,]+') do
  if not have[f] then
    have[f] = true
    table.insert(list, f)
  end
end
table.sort(list)
redis.call('HSET', KEYS[1], field, table.concat(list, ','))
if tonumber(ARGV[3]) >= 0 then
  redis.call('HINCRBYFLOAT', KEYS[1], 'pack_s', ARGV[3])
  redis.call('HINCRBY', KEYS[1], 'packs', 1)
end
redis.call('ZADD', KEYS[2], 'XX', ARGV[4], ARGV[5])
return state
""", BookState)

# A planner's checkpoint (tasks/book_planning.py), written after each of its turns. KEYS:
# the book, the books' progress zset. ARGV: the planner's generation, now, the book's id, then
# field/value pairs: the chapters planned since the last checkpoint (c{n}_title, c{n}_total,
# c{n}_offset) and where planning stands (plan_next, planned, plan_total). Written only while
# the book is preparing and this planner is its latest: a canceled or failed book, or one
# another planner took over, takes nothing and answers 0 (stop). A checkpoint is progress for
# the stall sweeper, in the same round trip.
_PLANNING = lua("""
if redis.call('HGET', KEYS[1], 'state') ~= '$PREPARING' then return 0 end
if redis.call('HGET', KEYS[1], 'plan_gen') ~= ARGV[1] then return 0 end
for i = 4, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('ZADD', KEYS[2], 'XX', ARGV[2], ARGV[3])
redis.call('HDEL', KEYS[1], 'stall_resumes')
return 1
""", BookState)

# The planner of generation ARGV[1] planned the last chapter: the book starts rendering with
# the chapters its checkpoints recorded (their titles gathered into `chapter_titles`, as
# `get` reads them). ARGV: generation, now, the book's id. Returns 1, or 0 as _PLANNING does.
_PLANNED = lua("""
if redis.call('HGET', KEYS[1], 'state') ~= '$PREPARING' then return 0 end
if redis.call('HGET', KEYS[1], 'plan_gen') ~= ARGV[1] then return 0 end
local planned = tonumber(redis.call('HGET', KEYS[1], 'planned') or '0')
local titles = {}
for c = 0, planned - 1 do
  local field = 'c' .. c .. '_title'
  titles[c + 1] = redis.call('HGET', KEYS[1], field) or ''
  redis.call('HDEL', KEYS[1], field)
end
redis.call('HSET', KEYS[1], 'state', '$RENDERING', 'chapters', planned,
           'total', redis.call('HGET', KEYS[1], 'plan_total') or '0',
           'chapter_titles', planned > 0 and cjson.encode(titles) or '[]',
           'rendering_at', ARGV[2])
redis.call('ZADD', KEYS[2], 'XX', ARGV[2], ARGV[3])
redis.call('HDEL', KEYS[1], 'stall_resumes')
return 1
""", BookState)


class PlanCheckpoint(NamedTuple):
    """Where a book's planning stands: the next chapter of book.json to plan, how many
    chapters were planned (plan files 0..planned-1; a chapter with nothing speakable has
    none) and their segments in all."""

    next_chapter: int
    planned: int
    total: int


class BookStore:
    """Book records in Redis (`r`: a bytes-mode client) and files in `store`."""

    def __init__(self, r: redis.Redis, keys: Keys, store: ArtifactStore) -> None:
        self.r = r
        self.keys = keys
        self.store = store
        self._create = r.register_script(_CREATE)
        self._store_segment = r.register_script(_STORE_SEGMENT)
        self._transition = Transition(r)
        self._add_formats = r.register_script(_ADD_FORMATS)
        self._assembled = r.register_script(_ASSEMBLED)
        self._planning = r.register_script(_PLANNING)
        self._planned = r.register_script(_PLANNED)
        self._packaged = r.register_script(_PACKAGED)

    def _keys(self, book_id: str) -> list[str]:
        return [self.keys.book(book_id), self.keys.book_done(book_id)]

    # -- writing -----------------------------------------------------------------------------

    def create(self, book_id: str, *, title: str, author: str, voice: str, speed: float,
               formats: tuple[str, ...], chapters: int, words: int, sample_rate: int,
               source_format: str, owner: str = "") -> bool:
        """Write a new record; False when a live one exists already (a re-submit). `owner`:
        the API key that made it (web/auth.py), "" while the farm has no keys."""
        fields = {"id": book_id, "state": BookState.QUEUED, "title": title, "author": author,
                  "voice": voice, "speed": speed, "formats": ",".join(formats),
                  "chapters": chapters, "words": words, "sample_rate": sample_rate,
                  "source_format": source_format, "total": 0, "done": 0, "audio_samples": 0,
                  "cursor": 0, "feed_gen": 0, "created_at": time.time(), "owner": owner,
                  # The at-rest key sealing its files when it was made ("" for none): they
                  # may be plaintext only if this is empty (`written_before_keys`).
                  "sealed_by": self.store.sealing_key_id or ""}
        args = [x for k, v in fields.items() for x in (k, str(v))]
        created = bool(self._create(keys=self._keys(book_id), args=args))
        if created:
            self.r.zadd(self.keys.books_progress, {book_id: fields["created_at"]})
        return created

    def set_plan(self, book_id: str, chapters: list[tuple[str, int]]) -> bool:
        """Record the segment counts the prepare task found and start rendering."""
        fields: dict[str, object] = {"chapters": len(chapters),
                                     "total": sum(n for _, n in chapters),
                                     "chapter_titles": json.dumps([t for t, _ in chapters]),
                                     "rendering_at": time.time()}
        offset = 0
        for c, (_, n) in enumerate(chapters):
            fields[f"c{c}_total"], fields[f"c{c}_offset"] = n, offset
            fields.setdefault(f"c{c}_done", 0)
            offset += n
        moved, _ = self.move(book_id, (BookState.PREPARING,), BookState.RENDERING, **fields)
        if moved:
            self.progressed(book_id)
        return moved

    def begin_plan(self, book_id: str) -> tuple[int, PlanCheckpoint]:
        """Take over the book's planning: (a new planner generation, where the last checkpoint
        left planning), read in one step. Any older planner of the book (a redelivered or
        superseded prepare) stops at its next checkpoint."""
        key = self.keys.book(book_id)
        with self.r.pipeline() as p:  # MULTI: no older planner's checkpoint in between
            p.hincrby(key, "plan_gen", 1)
            p.hmget(key, "plan_next", "planned", "plan_total")
            gen, (nxt, planned, total) = p.execute()
        return int(gen), PlanCheckpoint(int(nxt or 0), int(planned or 0), int(total or 0))

    def plan_checkpoint(self, book_id: str, gen: int, point: PlanCheckpoint,
                        chapters: list[tuple[str, int]]) -> bool:
        """Record `chapters` (title, segments), planned since the last checkpoint and stored as
        plan files numbered from where it left off, and `point`, where planning stands after
        them. False: stop planning (the book left `preparing`, or a newer planner has it)."""
        fields: list[str | int] = []
        first = point.planned - len(chapters)
        offset = point.total - sum(n for _, n in chapters)
        for c, (title, n) in enumerate(chapters, first):
            fields += [f"c{c}_title", title, f"c{c}_total", n, f"c{c}_offset", offset]
            offset += n
        fields += ["plan_next", point.next_chapter, "planned", point.planned,
                   "plan_total", point.total]
        return bool(self._planning(keys=[self.keys.book(book_id), self.keys.books_progress],
                                   args=[gen, repr(time.time()), book_id, *fields]))

    def plan_done(self, book_id: str, gen: int) -> bool:
        """The planner of `gen` planned every chapter: start rendering (False: it no longer
        owns the book, which it leaves as it is)."""
        return bool(self._planned(keys=[self.keys.book(book_id), self.keys.books_progress],
                                  args=[gen, repr(time.time()), book_id]))

    def move(self, book_id: str, from_states: Iterable[str], to: BookState,
             **fields: object) -> tuple[bool, str | None]:
        """Transition atomically; returns (moved, state afterwards), state None if unknown."""
        return self._transition(self.keys.book(book_id), from_states, to, **fields)

    def store_segment(self, book_id: str, seq: int, chapter: int, index: int,
                      pcm: bytes, words: list[dict] | None = None
                      ) -> tuple[int, str, int | None]:
        """Write segment audio (and its timed words), then count it once. Returns (done,
        state, the segment's piece of its chapter when that piece has every segment stored
        now, else None): done -1 when the book is canceled or gone (the files written are
        removed again)."""
        key = segment_key(book_id, chapter, index)
        words_key = segment_words_key(book_id, chapter, index)
        if words is not None:  # before the audio: a counted segment always has both
            self.store.put(words_key, json.dumps(words, ensure_ascii=False).encode())
        self.store.put(key, pcm)
        done, _total, state, piece_stored, piece = self._store_segment(
            keys=[*self._keys(book_id), self.keys.books_progress],
            args=[seq, chapter, len(pcm) // 2, repr(time.time()), book_id, index,
                  PIECE_SEGMENTS])
        if done < 0:
            self.store.delete(key)
            if words is not None:
                self.store.delete(words_key)
        return (int(done), state.decode() if isinstance(state, bytes) else str(state),
                int(piece) if piece_stored else None)

    def packaged(self, book_id: str, n: int, piece: int | None, encodings: Iterable[str],
                 seconds: float | None = None) -> str:
        """Piece `piece` of chapter n (None: the chapter, its pieces joined) is stored in
        `encodings`, a piece made in `seconds`; the book's state (see _PACKAGED)."""
        field = f"c{n}_packed" if piece is None else f"c{n}_p{piece}_packed"
        state = self._packaged(keys=[self.keys.book(book_id), self.keys.books_progress],
                               args=[field, ",".join(sorted(encodings)),
                                     -1 if seconds is None else round(seconds, 3),
                                     repr(time.time()), book_id])
        return state.decode() if isinstance(state, bytes) else str(state)

    def progressed(self, book_id: str, *, resumed: bool = False) -> None:
        """The book moved on: the stall sweeper leaves it a while longer. `resumed`: it is
        live again (a retry of a failed book, which the sweeper had forgotten). Progress
        also clears the sweeper's count of resumes: it fails only a book that keeps
        stalling with no progress between."""
        with self.r.pipeline(transaction=False) as p:
            p.zadd(self.keys.books_progress, {book_id: time.time()}, xx=not resumed)
            if not resumed:
                p.hdel(self.keys.book(book_id), "stall_resumes")
            p.execute()

    def idle_since(self, before: float) -> list[str]:
        """The books whose last progress is older than `before` (a Unix time)."""
        return [b.decode() for b in self.r.zrangebyscore(self.keys.books_progress, "-inf",
                                                          before)]

    def forget_progress(self, book_id: str) -> None:
        self.r.zrem(self.keys.books_progress, book_id)

    def claim_resume(self, book_id: str, hold_s: float) -> int | None:
        """The stall sweeper's claim on resuming a book: each book pool worker sweeps, and
        only one may resume it per `hold_s`. Returns how many resumes the sweepers have made
        with this one, or None when another sweeper has the claim."""
        if not self.r.set(self.keys.book_sweep(book_id), 1, nx=True, px=int(hold_s * 1000)):
            return None
        return int(self.r.hincrby(self.keys.book(book_id), "stall_resumes", 1))

    def cancel(self, book_id: str) -> tuple[bool, str | None]:
        """Cancel a book, or delete a finished one: the same one transition also clears an
        earlier failure's error, which would otherwise still say why a canceled book failed."""
        return self.move(book_id, (*BOOK_ACTIVE, BookState.DONE, BookState.FAILED),
                         BookState.CANCELED,
                         finished_at=time.time(), error="", error_chapter="", error_text="")

    def add_formats(self, book_id: str, formats: tuple[str, ...]) -> bool:
        """Add formats to a book (a re-submit with other `formats`): the audio is the same, so
        nothing is rendered again. True when the book was done and went back to assembling:
        the caller sends the assembly, which packages the stored segments in every format."""
        out = self._add_formats(keys=self._keys(book_id), args=list(formats))
        return bool(out[0])

    def assembled(self, book_id: str, formats: list[str], duration_s: float) -> tuple[int, str]:
        """The assembly of `formats` is written: (1, "done"); (2, "assembling") when formats
        were added while it ran (assemble again); (0, state) when the book left assembling."""
        out = self._assembled(keys=self._keys(book_id),
                              args=[",".join(formats), repr(time.time()), duration_s])
        return int(out[0]), out[1].decode() if isinstance(out[1], bytes) else str(out[1])

    def fail(self, book_id: str, chapter: int | None, text: str, message: str) -> bool:
        """Fail an active book; `chapter`: where it failed, None for the book as a whole."""
        moved, _ = self.move(book_id, BOOK_ACTIVE, BookState.FAILED,
                             finished_at=time.time(), error=message,
                             error_chapter="" if chapter is None else chapter,
                             error_text=text[:500])
        return moved

    def new_feed_gen(self, book_id: str) -> int:
        """A new feeder generation: every older feeder of the book stops at its next look."""
        return int(self.r.hincrby(self.keys.book(book_id), "feed_gen", 1))

    def set_cursor(self, book_id: str, cursor: int) -> None:
        self.r.hset(self.keys.book(book_id), "cursor", cursor)

    def done_bits(self, book_id: str, seqs: range) -> list[bool]:
        with self.r.pipeline(transaction=False) as p:
            for s in seqs:
                p.getbit(self.keys.book_done(book_id), s)
            return [bool(b) for b in p.execute()]

    def piece_stored(self, book_id: str, rec: dict, n: int, k: int) -> bool:
        """Whether piece k of chapter n has every segment stored (its bits)."""
        ch, first = rec["chapter_list"][n], rec["chapter_list"][n]["offset"] + k * PIECE_SEGMENTS
        seqs = range(first, min(first + PIECE_SEGMENTS, ch["offset"] + ch["total"]))
        return bool(seqs) and all(self.done_bits(book_id, seqs))

    def is_done(self, book_id: str, seq: int) -> bool:
        return bool(self.r.getbit(self.keys.book_done(book_id), seq))

    def remove(self, book_id: str) -> int:
        """Remove the book's files (cancel); the record stays, saying canceled."""
        return self.store.delete_prefix(prefix(book_id))

    # -- reading -----------------------------------------------------------------------------

    def state(self, book_id: str) -> str | None:
        s = self.r.hget(self.keys.book(book_id), "state")
        return s.decode() if s else None

    def owner(self, book_id: str) -> str | None:
        """The id of the key that made the book ("" for none); None for an unknown book."""
        exists, owner = self.r.hmget(self.keys.book(book_id), "id", "owner")
        return None if exists is None else (owner or b"").decode()

    def get(self, book_id: str) -> dict | None:
        raw = self.r.hgetall(self.keys.book(book_id))
        if not raw:
            return None
        rec = {k.decode(): v.decode() for k, v in raw.items()}
        out: dict = {k: rec.get(k, "") for k in ("id", "state", "title", "author", "voice",
                                                  "source_format")}
        for k in ("total", "done", "chapters", "words", "sample_rate", "audio_samples",
                  "cursor", "feed_gen"):
            out[k] = int(rec.get(k) or 0)
        # While preparing: the chapters of the upload planned so far (the plan's checkpoint).
        out["chapters_planned"] = int(rec.get("plan_next") or 0)
        for k in ("created_at", "started_at", "rendering_at", "rendered_at", "finished_at"):
            out[k] = float(rec[k]) if rec.get(k) else None
        out["speed"] = float(rec.get("speed") or 1.0)
        out["formats"] = [f for f in rec.get("formats", "").split(",") if f]
        titles = json.loads(rec["chapter_titles"]) if rec.get("chapter_titles") else []
        out["chapter_list"] = [{
            "index": c, "title": t,
            "done": int(rec.get(f"c{c}_done") or 0), "total": int(rec.get(f"c{c}_total") or 0),
            "offset": int(rec.get(f"c{c}_offset") or 0),
            "packed": packed_list(rec.get(f"c{c}_packed")),
            "pieces_packed": [packed_list(rec.get(f"c{c}_p{k}_packed")) for k in range(
                pieces_of(int(rec.get(f"c{c}_total") or 0)))],
        } for c, t in enumerate(titles)]
        out["pack_s"], out["packs"] = float(rec.get("pack_s") or 0), int(rec.get("packs") or 0)
        out["audio_seconds"] = (round(out["audio_samples"] / out["sample_rate"], 3)
                                if out["sample_rate"] else 0.0)
        out["error"] = None
        if rec.get("error"):
            out["error"] = {"message": rec["error"],
                            "chapter": int(rec["error_chapter"]) if rec.get(
                                "error_chapter") not in (None, "") else None,
                            "text": rec.get("error_text") or None}
        out["duration_s"] = float(rec["duration_s"]) if rec.get("duration_s") else None
        return out

    def written_before_keys(self, key: str) -> bool:
        """Whether store object `key` belongs to a book made while the farm had no at-rest
        keys, whose files may then be plaintext (the sealed store asks, for an object that
        is not sealed). An object of no book, or of a book made with keys, is not."""
        parts = key.split("/")
        if len(parts) < 3 or parts[0] != "books":
            return False
        exists, sealed_by = self.r.hmget(self.keys.book(parts[1]), "id", "sealed_by")
        return exists is not None and not sealed_by

    def manifest(self, book_id: str) -> dict | None:
        try:
            return json.loads(self.store.get(output_key(book_id, "manifest.json")))
        except KeyError:
            return None

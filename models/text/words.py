"""Words in time: which phonemes say which word, where each word came from, and when it is said.

Three pure steps, no torch (the web runs the first two in its frontend thread):

1. :func:`align_words`: the phonemes of a segment are espeak's for the whole phrase, which is
   what the model must hear (stress, reduced function words, linking), and espeak writes a
   phrase's words as space-separated groups -- mostly one group a word, but it glues unstressed
   words to their neighbour (``in the house`` -> ``ɪnðə hˈaʊs``, ``would have to`` ->
   ``wʊdhˌævtə``) and may spell one word as two groups. Each word is phonemized alone as
   well, and a small dynamic programme pairs words with groups (one to one, several words to
   one group, one word to several groups) by phoneme counts; a group shared by several words
   is cut between them where their own phonemes line up with it. The phrase's phonemes are
   never changed, so the audio is the same as without timestamps.
2. :func:`source_spans`: normalisation turns ``$12.50`` into ``twelve dollars and fifty
   cents``. The normalised tokens are matched against the submitted text's tokens; a token
   that survived is its own span, and every word normalisation produced points at the whole
   stretch of text it came from (all five words above point at ``$12.50``).
3. :func:`word_times`: the acoustic model's durations (latent frames per phoneme id, see
   ``models.neural.vits.VitsAcoustic.infer``) summed over each word's phoneme ids give its start and
   end in the segment's audio. Spaces and clause punctuation between words belong to no word,
   so a pause at a comma is a gap between two words, not part of either.
"""

from __future__ import annotations

import difflib
import functools
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# Marks that carry no sound of their own inside a group: stress and length. Combining
# characters (NFD diacritics) are not counted either.
_MARKS = frozenset("ˈˌːˑ")
# Punctuation espeak/Piper leave at a group's edges (clause marks) and quotes or brackets.
_EDGE_PUNCTUATION = ".,;:!?¡¿…—–-\"'«»“”‘’()[]{}"
# Words per group, or groups per word, that one step of the alignment may pair.
MAX_SPAN = 4
# The same for Japanese, whose G2P writes a number with its counter as a group a digit's
# place (``1234円``: ``seɴ ɲi çakɯ saɴ ʥɨː jo eɴ``, seven groups for one word).
JAPANESE_MAX_SPAN = 16
# Price of pairing more than one with one: a one-to-one pairing wins unless the lengths say
# otherwise by more than this per extra word or group.
_SPAN_COST = 0.75
_TOKEN_KEY = re.compile(r"\W+")
# Original tokens one normalised group may span when a replaced run is split (a date is 3).
_MAX_GROUP = 8


@dataclass(frozen=True)
class WordSpan:
    """One spoken word of a segment.

    ``word`` is the token of the normalised text as spoken (punctuation it carries kept, for
    captions); ``start``/``end`` index the segment's phoneme string (NFD), covering the
    word's phonemes without the punctuation around them; ``source_start``/``source_end`` are
    the characters of the submitted text it was read from (-1 when unknown).
    """

    word: str
    start: int
    end: int
    source_start: int = -1
    source_end: int = -1

    def to_list(self) -> list:
        """Compact and JSON-safe, for the segment's task message."""
        return [self.word, self.start, self.end, self.source_start, self.source_end]

    @classmethod
    def from_list(cls, item: Sequence) -> WordSpan:
        word, start, end, source_start, source_end = item
        return cls(str(word), int(start), int(end), int(source_start), int(source_end))


@functools.lru_cache(maxsize=8192)  # words recur (the, and, each digit), and their groups
def _core(text: str) -> str:
    """The sounding characters of phonemes: no spaces, punctuation, stress or length marks."""
    return "".join(
        c for c in unicodedata.normalize("NFD", text)
        if not (c.isspace() or c in _MARKS or c in _EDGE_PUNCTUATION or unicodedata.combining(c))
    )


def phoneme_groups(phonemes: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each space-separated group of ``phonemes``, punctuation at its
    edges left out; groups of punctuation alone are dropped."""
    groups = []
    for match in re.finditer(r"\S+", phonemes):
        start, end = match.start(), match.end()
        while start < end and phonemes[start] in _EDGE_PUNCTUATION:
            start += 1
        while end > start and phonemes[end - 1] in _EDGE_PUNCTUATION:
            end -= 1
        if start < end and _core(phonemes[start:end]):
            groups.append((start, end))
    return groups


def _pair(word_cores: list[str], group_cores: list[str],
          max_span: int = MAX_SPAN) -> list[tuple[int, int, int, int]]:
    """Monotone blocks ``(first word, words, first group, groups)`` pairing every word and
    every group, cheapest by phoneme counts (a word with no phonemes takes no group)."""
    n, m = len(word_cores), len(group_cores)
    wl = [len(c) for c in word_cores]
    gl = [len(c) for c in group_cores]
    inf = float("inf")
    cost = [[inf] * (m + 1) for _ in range(n + 1)]
    back: list[list[tuple[int, int, int, int] | None]] = [[None] * (m + 1) for _ in range(n + 1)]
    cost[0][0] = 0.0
    band = 8 + abs(n - m)  # groups drift from words by at most the merges and splits

    firsts_w = [c[:1] for c in word_cores]
    firsts_g = [c[:1] for c in group_cores]

    def relax(i: int, j: int, value: float, step: tuple[int, int, int, int]) -> None:
        if value < cost[i][j]:
            cost[i][j] = value
            back[i][j] = step

    for i in range(n + 1):
        centre = int(i * m / n) if n else 0
        row = cost[i]
        for j in range(max(0, centre - band), min(m, centre + band) + 1):
            here = row[j]
            if here == inf:
                continue
            if i < n:
                # A word espeak says nothing for (punctuation alone) is free to skip; a word
                # that should sound but finds no group is possible, at a price.
                relax(i + 1, j, here + (0 if wl[i] == 0 else wl[i] + 2), (i, 1, j, 0))
            if j < m:  # a group no word claims (espeak's own insertion)
                relax(i, j + 1, here + gl[j] + 2, (i, 0, j, 1))
            if i >= n or j >= m or wl[i] == 0:
                continue
            here += firsts_w[i] != firsts_g[j]  # both start with the same sound, usually
            total = 0
            for k in range(1, min(max_span, n - i) + 1):  # k words said as one group
                total += wl[i + k - 1]
                relax(i + k, j + 1, here + abs(total - gl[j]) + _SPAN_COST * (k - 1),
                      (i, k, j, 1))
            total = gl[j]
            for k in range(2, min(max_span, m - j) + 1):  # one word said as k groups
                total += gl[j + k - 1]
                relax(i + 1, j + k, here + abs(wl[i] - total) + _SPAN_COST * (k - 1),
                      (i, 1, j, k))
    blocks = []
    i, j = n, m
    while i or j:
        step = back[i][j]
        if step is None:  # outside the band: cannot happen with the band above, but be safe
            raise ValueError("no alignment")
        blocks.append(step)
        i, j = step[0], step[2]
    blocks.reverse()
    return blocks


def _cut_group(phonemes: str, start: int, end: int, word_cores: list[str]) -> list[int]:
    """Where one group shared by several words changes word: ``len(word_cores) - 1``
    increasing positions in ``phonemes[start:end]``, found by lining the words' own phonemes
    up with the group's."""
    raw = phonemes[start:end]
    core_at = [k for k, c in enumerate(raw) if _core(c)]  # raw index of each core character
    group_core = "".join(raw[k] for k in core_at)
    joined = "".join(word_cores)
    opcodes = difflib.SequenceMatcher(None, joined, group_core, autojunk=False).get_opcodes()

    def to_group(p: int) -> int:
        for _, i1, i2, j1, j2 in opcodes:
            if i1 <= p < i2 or (p == i2 and i2 == len(joined)):
                if i2 == i1:
                    return j1
                return j1 + round((p - i1) * (j2 - j1) / (i2 - i1))
        return len(group_core)

    cuts, boundary, previous = [], 0, 0
    for core in word_cores[:-1]:
        boundary += len(core)
        at = min(max(to_group(boundary), previous + 1), len(group_core) - 1)
        at = max(at, previous)
        cuts.append(start + (core_at[at] if at < len(core_at) else len(raw)))
        previous = at
    return cuts


def _said_as_alone(word_cores: list[str], group_cores: list[str]) -> bool:
    """Each word is one group of the phrase and sounds as it does alone (stress aside): a run
    of digits, and much plain text."""
    return word_cores == group_cores


def align_words(words: Sequence[str], phonemes: str, word_phonemes: Callable[[str], str],
                max_span: int = MAX_SPAN) -> list[tuple[int, int] | None]:
    """Each word's ``(start, end)`` in ``phonemes`` (None for a word with no phonemes there).

    ``words`` are the segment's tokens in order, ``phonemes`` the segment's (NFD) phrase
    phonemes, ``word_phonemes(word)`` a word's phonemes said alone (same phonemizer);
    ``max_span`` the most groups one word may take, or words one group.
    """
    phonemes = unicodedata.normalize("NFD", phonemes)
    groups = phoneme_groups(phonemes)
    word_cores = [_core(word_phonemes(w)) for w in words]
    group_cores = [_core(phonemes[a:b]) for a, b in groups]
    if _said_as_alone(word_cores, group_cores):
        # The programme below would pair them one to one, every other pairing costing
        # more, and it takes 40 us a word.
        return [*groups]
    spans: list[tuple[int, int] | None] = [None] * len(words)
    if not words or not groups:
        return spans
    for first_word, count, first_group, group_count in _pair(word_cores, group_cores,
                                                             max_span):
        if count == 0 or group_count == 0:
            continue
        start, end = groups[first_group][0], groups[first_group + group_count - 1][1]
        if count == 1:
            spans[first_word] = (start, end)
            continue
        cuts = _cut_group(phonemes, start, end, word_cores[first_word:first_word + count])
        edges = [start, *cuts, end]
        for k in range(count):
            spans[first_word + k] = (edges[k], edges[k + 1]) if edges[k + 1] > edges[k] else None
    return spans


# `_opcodes` walks two token lists in step and, past a difference, takes them up again at
# the nearest place where this many tokens in a row are equal (or the rest is), looking at
# most this far ahead in each.
_ANCHOR = 3
_REACH = 64


def _opcodes(a: Sequence[str], b: Sequence[str]) -> list[tuple[str, int, int, int, int]]:
    """``difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()`` for two token
    lists that are mostly equal (a text and its normalisation), in time linear in their
    length: difflib itself is quadratic or worse on long lists of common words (4 s for the
    first segment of a 15,000-character text). Equal stretches are walked in step; each
    difference, up to the next anchor (see ``_ANCHOR``), is aligned by difflib alone, so
    within it the opcodes are difflib's. A difference with no anchor in reach runs to the
    end as one block."""
    ops: list[tuple[str, int, int, int, int]] = []
    i = j = 0
    n, m = len(a), len(b)
    while i < n and j < m:
        if a[i] == b[j]:
            i0, j0 = i, j
            while i < n and j < m and a[i] == b[j]:
                i, j = i + 1, j + 1
            ops.append(("equal", i0, i, j0, j))
            continue
        di, dj = _resync(a, b, i, j)
        block = difflib.SequenceMatcher(None, a[i:i + di], b[j:j + dj], autojunk=False)
        ops += [(tag, i + i1, i + i2, j + j1, j + j2)
                for tag, i1, i2, j1, j2 in block.get_opcodes()]
        i, j = i + di, j + dj
    if i < n or j < m:
        ops.append(("delete" if j == m else "insert" if i == n else "replace", i, n, j, m))
    return ops


def _resync(a: Sequence[str], b: Sequence[str], i: int, j: int) -> tuple[int, int]:
    """How far past ``a[i]`` and ``b[j]`` (which differ) the lists are equal again: the
    nearest offsets (fewest tokens skipped in all) where ``_ANCHOR`` tokens in a row, or all
    that are left of a list, are equal."""
    n, m = len(a), len(b)
    for total in range(1, 2 * _REACH + 1):
        for di in range(max(0, total - _REACH), min(total, _REACH) + 1):
            x, y = i + di, j + total - di
            k = 0
            while k < _ANCHOR and x + k < n and y + k < m and a[x + k] == b[y + k]:
                k += 1
            if k == _ANCHOR or (k and (x + k == n or y + k == m)):
                return di, total - di
    return n - i, m - j


def source_spans(original: str, normalized: str,
                 normalize: Callable[[str], str] | None = None) -> list[tuple[int, int]]:
    """For each whitespace token of ``normalized``, the characters of ``original`` it was read
    from: the token itself where normalisation kept it, else the run of original tokens that
    normalisation replaced (``$12.50`` for each of ``twelve dollars and fifty cents``).

    Within a longer replaced run, ``normalize`` (the normaliser that made ``normalized``)
    splits it further: original tokens are taken left to right in the longest groups (short
    of the whole run) that normalise, alone, to the next normalised tokens (``Jan. 5, 2024.``
    -> ``January fifth, twenty twenty-four.``); what is left of the run maps to the rest of
    it as a whole.
    """
    originals = [(m.start(), m.end()) for m in re.finditer(r"\S+", original)]
    tokens = normalized.split()
    spans = [(-1, -1)] * len(tokens)
    if not originals:
        return spans

    def key(token: str) -> str:
        return _TOKEN_KEY.sub("", token.lower())

    token_keys = [key(t) for t in tokens]
    for tag, i1, i2, j1, j2 in _opcodes([key(original[a:b]) for a, b in originals],
                                         token_keys):
        if tag == "equal":
            for k in range(j2 - j1):
                spans[j1 + k] = originals[i1 + k]
            continue
        if j2 == j1:
            continue
        if i2 == i1:  # a word normalisation added ("and"): it belongs to the token before it
            span = originals[max(0, min(i1 - 1, len(originals) - 1))]
            spans[j1:j2] = [span] * (j2 - j1)
            continue
        while normalize is not None and i1 < i2 - 1 and j1 < j2:
            for end in range(min(i2 - 1, i1 + _MAX_GROUP), i1, -1):
                said = [key(t) for t in normalize(original[originals[i1][0]:
                                                          originals[end - 1][1]]).split()]
                if said and token_keys[j1:j1 + len(said)] == said:
                    span = (originals[i1][0], originals[end - 1][1])
                    spans[j1:j1 + len(said)] = [span] * len(said)
                    i1, j1 = end, j1 + len(said)
                    break
            else:
                break
        if j1 < j2:
            span = (originals[i1][0], originals[i2 - 1][1])
            spans[j1:j2] = [span] * (j2 - j1)
    return spans


def word_times(words: Sequence[WordSpan], phonemes: str, id_positions: Sequence[int],
               durations: Sequence[int], seconds_per_frame: float) -> list[dict]:
    """Each word's ``start`` and ``end`` in seconds of the segment's audio.

    ``id_positions[k]`` is the index in ``phonemes`` (NFD) of the symbol phoneme id ``k``
    stands for (the pad after a symbol counts as that symbol; -1 for the start and end
    markers, see ``models.neural.voice_file.ids_and_positions``), ``durations[k]`` its frames.

    A word ends with its last phoneme's frames. It starts where its lead-in starts: the
    space before it (and its pad), or for a segment's first word the pad after the start
    marker. Measured against pocketsphinx's forced alignment, that is where the listener
    hears the word begin (docs/benchmarks.md, "Word timestamps"; from the first phoneme itself
    the words came out late: VITS spends the space's frames on the transition into the next
    word).
    Punctuation before a word (the pause at a comma) stays a gap between words.
    """
    phonemes = unicodedata.normalize("NFD", phonemes)
    count = min(len(durations), len(id_positions))
    frame_at = [0] * (count + 1)
    for k in range(count):
        frame_at[k + 1] = frame_at[k] + int(durations[k])
    first_id: dict[int, int] = {}  # phoneme index -> its first id
    last_id: dict[int, int] = {}
    for k in range(count):
        position = id_positions[k]
        if position >= 0:
            first_id.setdefault(position, k)
            last_id[position] = k

    def lead_in(k: int) -> int:
        while k > 1:  # id 0 is the start marker itself: silence, not the word
            position = id_positions[k - 1]
            if position == -1 or (position >= 0 and phonemes[position].isspace()):
                k -= 1
            else:
                break
        return k

    out = []
    for span in words:
        inside = [p for p in range(span.start, span.end) if p in first_id]
        if not inside:
            continue
        first, last = lead_in(first_id[inside[0]]), last_id[inside[-1]]
        item = {"word": span.word,
                "start": round(frame_at[first] * seconds_per_frame, 3),
                "end": round(frame_at[last + 1] * seconds_per_frame, 3)}
        if span.source_start >= 0:
            item["text_start"], item["text_end"] = span.source_start, span.source_end
        out.append(item)
    return out


def espeak_word_times(words: Sequence[WordSpan], starts: Sequence[int], phoneme_count: int,
                      end_s: float) -> list[dict]:
    """Word times for an eSpeak segment: ``starts`` is espeak's own word starts, flat
    ``[phoneme index, ms, ...]`` (``models.classic.acoustic.EspeakAcoustic.synthesize_timed``), one
    per group of the phonemes it read; ``end_s`` is the audio's length. Between two starts,
    time runs in proportion to the phoneme characters, which splits a group espeak read as
    one word ("InD@2", in the) between the words it holds."""
    points = sorted({(int(starts[k]), int(starts[k + 1]) / 1000)
                     for k in range(0, len(starts) - 1, 2)})
    if not points:
        return []
    points.append((max(phoneme_count, points[-1][0] + 1), max(end_s, points[-1][1])))

    def at(index: int) -> float:
        if index <= points[0][0]:
            return points[0][1]
        for (p0, t0), (p1, t1) in zip(points, points[1:], strict=False):
            if index <= p1:
                return t0 + (t1 - t0) * (index - p0) / max(1, p1 - p0)
        return points[-1][1]

    out = []
    for span in words:
        item: dict[str, Any] = {"word": span.word, "start": round(at(span.start), 3),
                "end": round(at(span.end), 3)}
        if item["end"] <= item["start"]:
            continue
        if span.source_start >= 0:
            item["text_start"], item["text_end"] = span.source_start, span.source_end
        out.append(item)
    return out

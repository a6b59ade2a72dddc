"""The SSML subset: markup in, the frontend's runs out (``models.text.runs.TextRun``).

Elements (SSML 1.1 names and meanings):

* ``<speak>`` the root (``version``, ``xml:lang``, ``xmlns`` and ``xmlns:*`` accepted);
* ``<p>``, ``<s>`` a paragraph, a sentence: a segment ends where each begins and ends;
* ``<break time="300ms|1.5s" strength="none|x-weak|weak|medium|strong|x-strong">`` silence,
  at most 10 s like a ``[break]`` tag;
* ``<prosody rate="x-slow|slow|medium|fast|x-fast|default|N%|+N%|-N%">`` a multiple of the
  request's speed (nested ones multiply; the result must stay within the farm's 0.5-2.0);
* ``<say-as interpret-as="characters|cardinal|ordinal|date|telephone" format?>`` (``format``
  for dates: ``mdy dmy ymd md dm ym my y m d``);
* ``<sub alias>`` the alias is spoken, the content shown;
* ``<phoneme alphabet="ipa" ph>`` spoken as ``ph`` (a neural voice's IPA; an eSpeak voice takes
  ``alphabet="x-espeak"`` mnemonics instead);
* ``<voice name>`` another voice of the farm for what it holds (dialogue), at the request
  voice's sample rate (a job has one rate).

``xml:lang`` is accepted where SSML allows it, if it names the language of the voice speaking.
Anything else is refused, never dropped: an element, an attribute or an attribute value
outside the subset is a :class:`SsmlError` that names the element and where it starts (line,
column, character offset), and so is markup that is not well-formed, a DTD or an entity
declaration (defusedxml refuses those: no entity expansion, no external resources), a
``say-as`` whose content does not read as what it claims, and a voice the farm lacks.

Parsing is SAX through defusedxml, so every piece of text knows its place in the markup: a
word's ``text_start``/``text_end`` point into the submitted SSML (a ``<sub>`` or ``<say-as>``
word at the element's content, a ``<phoneme>`` word at its text).

No torch here: the web parses SSML before anything is queued.
"""

from __future__ import annotations

import io
import re
import traceback
from dataclasses import dataclass, field
from xml.sax import SAXException
from xml.sax.handler import ContentHandler
from xml.sax.xmlreader import InputSource

from defusedxml.common import DefusedXmlException
from defusedxml.expatreader import DefusedExpatParser

from models.errors import SsmlError, UnknownSpeaker, UnknownVoice
from models.text.frontend import MAX_SEGMENT_PHONEMES, symbol_count
from models.text.lexicon import PLACEHOLDER_BASE, PLACEHOLDER_COUNT, unsayable
from models.text.runs import SourceSpans, TextRun
from models.text.say_as import DATE_FORMATS, SAY_AS, say_as
from models.text.segmenting import BREAK_TAG, MAX_BREAK_MS
from models.voices import Voice, backend_for, get_voice

SPEED_MIN, SPEED_MAX = 0.5, 2.0
# The longest SSML document parsed, in characters: a long book chapter (about 150,000
# words). Parsing takes time and memory linear in the document (tests/unit/test_ssml.py);
# past the cap the text is refused (413 on the API), not parsed. A job's text has a smaller
# bound of its own (the setting `max_text_chars`).
MAX_SSML_CHARS = 1_000_000
# Placeholder characters one run may give <phoneme> elements; the rest of the private-use
# block is left to lexicon words (models.text.lexicon.mark). A run that would need more ends
# there (a segment boundary), and the next run counts from the top again.
_PHONEMES_PER_RUN = PLACEHOLDER_COUNT // 2
STRENGTH_MS = {"none": 0, "x-weak": 100, "weak": 250, "medium": 400, "strong": 750,
               "x-strong": 1200}
RATE_LABELS = {"x-slow": 0.5, "slow": 0.75, "medium": 1.0, "default": 1.0, "fast": 1.25,
               "x-fast": 1.5}
_COMMON = {"xml:lang"}
ATTRIBUTES = {
    "speak": {"version", "xmlns", "xml:lang", "xml:base"},
    "p": _COMMON, "s": _COMMON,
    "break": {"time", "strength"},
    "prosody": {"rate"},
    "say-as": {"interpret-as", "format"},
    "sub": {"alias"},
    "phoneme": {"alphabet", "ph"},
    "voice": {"name"},
}
# Elements whose content is one piece of text, replaced by what they say.
_LEAVES = frozenset({"say-as", "sub", "phoneme"})
# Elements that are empty: no text, no elements inside.
_EMPTY = frozenset({"break"})
_TIME = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*")
_RATE = re.compile(r"\s*([+-]?)(\d+(?:\.\d+)?)%\s*")
_TOP_PLACEHOLDER = PLACEHOLDER_BASE + PLACEHOLDER_COUNT - 1


def looks_like_ssml(text: str) -> bool:
    """True for text whose root is ``<speak>`` (an XML declaration may come first)."""
    return re.match(r"\s*(<\?xml[^>]*\?>\s*)?<speak[\s>/]", text) is not None


def _is_document(text: str) -> bool:
    """A whole XML document (declaration, DTD or the root first), not a fragment."""
    return looks_like_ssml(text) or re.match(r"\s*<[?!]", text) is not None


@dataclass
class _Frame:
    """An open element: its name, where it starts, and the voice and rate inside it."""

    name: str
    offset: int
    voice: Voice
    rate: float
    attrs: dict[str, str] = field(default_factory=dict)
    content: list[tuple[str, int]] = field(default_factory=list)  # leaf text: (text, offset)


class _Handler(ContentHandler):
    def __init__(self, parser, source: str, voice: Voice, speed: float, wrapped: int) -> None:
        super().__init__()
        self.parser = parser
        self.source = source
        self.encoded = source.encode("utf-8")
        self.wrapped = wrapped  # characters of "<speak>" added in front of the user's text
        self.request_voice = voice
        self.speed = speed
        self.stack: list[_Frame] = []
        self.runs: list[TextRun] = []
        # The run being read: its text, where each character came from, and its <phoneme>
        # placeholders. Each run gets its own (placeholders count from the top again), so
        # what a run carries is its own: a document of N sentences is N runs, linear.
        self.text: list[str] = []
        self.sources = SourceSpans()
        self.fixed: dict[str, str] = {}
        self.surfaces: dict[str, str] = {}
        self.next_placeholder = _TOP_PLACEHOLDER
        self._at_byte = self._at_char = 0  # where char_offset counted to

    # -- positions ---------------------------------------------------------------------------

    def char_offset(self, byte_index: int) -> int:
        """The user's character offset of a byte of the (maybe wrapped) document.

        SAX events come in document order, so the count moves on from the last one: each
        byte is decoded once, no table is kept (an error's place may go back: then it
        counts from the start, once)."""
        byte_index = min(max(byte_index, 0), len(self.encoded))
        if len(self.encoded) == len(self.source):  # ASCII: a byte is a character
            return byte_index - self.wrapped
        while 0 < byte_index < len(self.encoded) and self.encoded[byte_index] & 0xC0 == 0x80:
            byte_index -= 1  # inside a character: its first byte
        if byte_index < self._at_byte:
            self._at_byte = self._at_char = 0
        self._at_char += len(self.encoded[self._at_byte:byte_index].decode("utf-8"))
        self._at_byte = byte_index
        return self._at_char - self.wrapped

    def here(self) -> int:
        return self.char_offset(self.parser._parser.CurrentByteIndex)

    def error(self, code: str, message: str, element: str | None, offset: int,
              **extra) -> SsmlError:
        return located(self.source, self.wrapped, code, message, element, offset, extra)

    # -- state -------------------------------------------------------------------------------

    @property
    def voice(self) -> Voice:
        return self.stack[-1].voice if self.stack else self.request_voice

    @property
    def rate(self) -> float:
        return self.stack[-1].rate if self.stack else 1.0

    def close_run(self, pause_ms: int = 0) -> None:
        """End the run so far (a segment boundary), with ``pause_ms`` of silence after it."""
        if not self.text and not pause_ms:
            return
        voice = self.voice
        text = "".join(self.text)
        self.check_break_tags(text)
        self.runs.append(TextRun(
            text, pause_ms, voice=None if voice.name == self.request_voice.name else voice.name,
            rate=self.rate, sources=self.sources, fixed=self.fixed, surfaces=self.surfaces))
        self.text = []
        self.sources = SourceSpans()
        self.fixed, self.surfaces = {}, {}
        self.next_placeholder = _TOP_PLACEHOLDER

    def check_break_tags(self, text: str) -> None:
        """A ``[break]`` tag in the text works as in plain text (models.text.frontend): one over
        the cap is refused here, with its place, like ``<break>``."""
        if "[" not in text:
            return
        for match in BREAK_TAG.finditer(text):
            value, unit = match.group("value"), (match.group("unit") or "ms").lower()
            if value is not None and float(value) * (1000 if unit == "s" else 1) > MAX_BREAK_MS:
                shown = match.group(0) if len(match.group(0)) <= 40 else match.group(0)[:36]
                raise self.error("invalid_break", f"{shown} is too long: a break lasts at most "
                                 f"{MAX_BREAK_MS // 1000} s", None,
                                 self.sources[match.start()][0], limit=MAX_BREAK_MS)

    def add(self, text: str, span: tuple[int, int] | None = None, offset: int = 0) -> None:
        """Text to speak: its characters from ``offset`` on, or all from ``span``."""
        self.text.append(text)
        if span is not None:
            self.sources.add_span(span[0], span[1], len(text))
        else:
            self.sources.add_each(offset, len(text))

    # -- SAX ---------------------------------------------------------------------------------

    def startElement(self, name: str, attrs) -> None:  # noqa: N802 (SAX's name)
        offset = self.here()
        attrs = dict(attrs.items())
        if self.stack and self.stack[-1].name in _LEAVES:
            raise self.error("unsupported_ssml", f"<{self.stack[-1].name}> holds text only, "
                             f"not <{name}>", name, offset)
        if self.stack and self.stack[-1].name in _EMPTY:
            outer = self.stack[-1]
            raise self.error("unsupported_ssml", f"<{outer.name}> is empty (<{outer.name} "
                             f".../>): it cannot hold <{name}>", outer.name, outer.offset)
        if name not in ATTRIBUTES:
            raise self.error("unsupported_ssml", f"<{name}> is not in the supported SSML "
                             f"subset ({', '.join(f'<{n}>' for n in ATTRIBUTES)})", name, offset)
        if name == "speak" and self.stack:
            raise self.error("unsupported_ssml", "<speak> is the root only", name, offset)
        if name != "speak" and not self.stack:
            raise self.error("unsupported_ssml", "the root element must be <speak>", name,
                             offset)
        for attr in attrs:
            if attr not in ATTRIBUTES[name] and not (name == "speak"
                                                    and attr.startswith("xmlns:")):
                raise self.error("unsupported_ssml", f"<{name}> has no attribute '{attr}' in "
                                 f"the supported subset (it takes "
                                 f"{', '.join(sorted(ATTRIBUTES[name])) or 'none'})",
                                 name, offset, attribute=attr)
        voice, rate = self.voice, self.rate
        if "xml:lang" in attrs:
            self.check_lang(attrs["xml:lang"], voice, name, offset)
        if name in ("p", "s"):
            self.close_run()
        elif name == "break":
            self.close_run(self.break_ms(attrs, offset))
        elif name == "prosody":
            rate = self.prosody_rate(attrs, offset)
            self.close_run()
        elif name == "voice":
            voice = self.voice_named(attrs, offset)
            self.close_run()
        elif name == "say-as":
            kind = attrs.get("interpret-as")
            if kind not in SAY_AS:
                raise self.error("unsupported_ssml", f"<say-as interpret-as=\"{kind}\"> is not "
                                 f"supported (one of {', '.join(SAY_AS)})", name, offset,
                                 attribute="interpret-as", valid=list(SAY_AS))
            if "format" in attrs and (kind != "date" or attrs["format"] not in DATE_FORMATS):
                raise self.error("unsupported_ssml", f"format=\"{attrs['format']}\" is not "
                                 f"supported here (dates: {', '.join(DATE_FORMATS)})", name,
                                 offset, attribute="format")
        elif name == "sub":
            if not attrs.get("alias", "").strip():
                raise self.error("unsupported_ssml", "<sub> needs a non-empty alias", name,
                                 offset, attribute="alias")
        elif name == "phoneme":
            self.check_phoneme(attrs, voice, offset)
        self.stack.append(_Frame(name, offset, voice, rate, attrs))

    def endElement(self, name: str) -> None:  # noqa: N802 (SAX's name)
        frame = self.stack.pop()
        if name in ("p", "s", "prosody", "voice"):
            # The run inside ends with the element (its voice and rate are the frame's).
            self.stack.append(frame)
            self.close_run()
            self.stack.pop()
        elif name in _LEAVES:
            self.leaf(frame)

    def characters(self, content: str) -> None:
        offset = self.here()
        raw = self.source[offset + self.wrapped:offset + self.wrapped + len(content)]
        if self.stack and self.stack[-1].name in _EMPTY:
            if not content.strip():
                return  # whitespace inside <break></break> says nothing
            outer = self.stack[-1]
            # Refused, not spoken or dropped: text inside a <break> is a mistake either way.
            raise self.error("unsupported_ssml", f"<{outer.name}> is empty (<{outer.name} "
                             f".../>): it cannot hold text ({content.strip()[:20]!r})",
                             outer.name, outer.offset)
        if self.stack and self.stack[-1].name in _LEAVES:
            self.stack[-1].content.append((content, offset))
        elif raw.startswith("&"):  # an entity or character reference: all of it is the source
            end = self.source.find(";", offset + self.wrapped)
            span = (offset, (end + 1 - self.wrapped) if end >= 0 else offset + 1)
            self.add(content, span=span)
        elif raw == content:
            self.add(content, offset=offset)
        else:  # a line end expat normalised ("\r\n" -> "\n"): the text from here
            self.add(content, span=(offset, offset + len(content)))

    # -- elements ----------------------------------------------------------------------------

    def check_lang(self, lang: str, voice: Voice, name: str, offset: int) -> None:
        head = lang.strip().lower().replace("_", "-").split("-", 1)[0]
        voice_head = voice.base.split("-", 1)[0]
        same = head == voice_head or (head == "zh" and voice.language == "zh")
        if not same:
            raise self.error("unsupported_ssml", f"xml:lang=\"{lang}\" is not the language of "
                             f"voice {voice.name} ({voice.base}); switch voices with <voice "
                             "name>", name, offset, attribute="xml:lang")

    def break_ms(self, attrs: dict[str, str], offset: int) -> int:
        if "time" in attrs:
            match = _TIME.fullmatch(attrs["time"])
            if not match:
                raise self.error("unsupported_ssml", f"<break time=\"{attrs['time']}\">: a "
                                 "time is a number with ms or s (300ms, 1.5s)", "break", offset,
                                 attribute="time")
            ms = float(match.group(1)) * (1000 if match.group(2) == "s" else 1)
            if ms > MAX_BREAK_MS:
                raise self.error("invalid_break", f"<break time=\"{attrs['time']}\"> is too "
                                 f"long: a break lasts at most {MAX_BREAK_MS // 1000} s",
                                 "break", offset, limit=MAX_BREAK_MS)
            return int(round(ms))
        strength = attrs.get("strength", "medium")
        if strength not in STRENGTH_MS:
            raise self.error("unsupported_ssml", f"<break strength=\"{strength}\"> is not one "
                             f"of {', '.join(STRENGTH_MS)}", "break", offset,
                             attribute="strength", valid=list(STRENGTH_MS))
        return STRENGTH_MS[strength]

    def prosody_rate(self, attrs: dict[str, str], offset: int) -> float:
        value = attrs.get("rate")
        if value is None:
            raise self.error("unsupported_ssml", "<prosody> needs rate (the one prosody "
                             "attribute supported)", "prosody", offset, attribute="rate")
        if value.strip() in RATE_LABELS:
            factor = RATE_LABELS[value.strip()]
        else:
            match = _RATE.fullmatch(value)
            if not match:
                raise self.error("unsupported_ssml", f"<prosody rate=\"{value}\"> is not a rate "
                                 f"(N%, +N%, -N% or {', '.join(RATE_LABELS)})", "prosody",
                                 offset, attribute="rate")
            number = float(match.group(2)) / 100
            factor = number if not match.group(1) else 1 + (number if match.group(1) == "+"
                                                            else -number)
        rate = self.rate * factor
        if not SPEED_MIN <= self.speed * rate <= SPEED_MAX:
            raise self.error("out_of_range", f"<prosody rate=\"{value}\"> makes the speed "
                             f"{self.speed * rate:.2f}; the farm speaks {SPEED_MIN} to "
                             f"{SPEED_MAX}", "prosody", offset, attribute="rate")
        return rate

    def voice_named(self, attrs: dict[str, str], offset: int) -> Voice:
        name = attrs.get("name", "")
        try:
            voice = get_voice(name)
        except UnknownVoice as exc:
            raise self.error("unknown_voice", f"<voice name=\"{name}\">: no such voice",
                             "voice", offset, attribute="name", valid=exc.valid) from None
        except UnknownSpeaker as exc:
            raise self.error("unknown_speaker", f"<voice name=\"{name}\">: {exc}", "voice",
                             offset, attribute="name", valid=exc.valid) from None
        if voice.sample_rate != self.request_voice.sample_rate:
            raise self.error("unsupported_ssml", f"<voice name=\"{name}\"> speaks at "
                             f"{voice.sample_rate} Hz and the job's voice at "
                             f"{self.request_voice.sample_rate} Hz; a job has one rate",
                             "voice", offset, attribute="name")
        return voice

    def check_phoneme(self, attrs: dict[str, str], voice: Voice, offset: int) -> None:
        alphabet = attrs.get("alphabet", "ipa")
        wanted = backend_for(voice).ssml_alphabet
        if alphabet != wanted:
            raise self.error("unsupported_ssml", f"<phoneme alphabet=\"{alphabet}\">: voice "
                             f"{voice.name} takes alphabet=\"{wanted}\"", "phoneme", offset,
                             attribute="alphabet", valid=[wanted])
        ph = attrs.get("ph", "").strip()
        shown = ph if len(ph) <= 40 else ph[:36] + "..."
        bad = unsayable(ph, voice) if ph else (0, [])
        if not ph or bad is not None:
            symbols = bad[1] if bad else []
            raise self.error("invalid_phonemes", f"<phoneme ph=\"{shown}\">: voice "
                             f"{voice.name} "
                             + (f"has no phoneme {', '.join(map(repr, symbols))}" if symbols
                                else "needs phonemes in ph"), "phoneme", offset,
                             attribute="ph", symbols=symbols, position=bad[0] if bad else 0)
        # One <phoneme> is one word, spoken within one segment: it cannot be cut.
        count = symbol_count(ph, voice)
        if count > MAX_SEGMENT_PHONEMES:
            raise self.error("invalid_phonemes", f"<phoneme ph=\"{shown}\"> has {count} "
                             f"phoneme symbols; one word has at most {MAX_SEGMENT_PHONEMES} "
                             "(a segment's bound)", "phoneme", offset, attribute="ph",
                             limit=MAX_SEGMENT_PHONEMES)

    def leaf(self, frame: _Frame) -> None:
        """A ``say-as``, ``sub`` or ``phoneme``: what it says, in place of its content."""
        content = "".join(text for text, _ in frame.content)
        if frame.content:
            first, last = frame.content[0], frame.content[-1]
            span = (first[1], last[1] + len(last[0]))
        else:
            span = (frame.offset, frame.offset + 1)
        if frame.name == "sub":
            said = frame.attrs["alias"]
        elif frame.name == "phoneme":
            if self.next_placeholder <= _TOP_PLACEHOLDER - _PHONEMES_PER_RUN:
                self.close_run()  # this run has all the placeholders it may take
            char = chr(self.next_placeholder)
            self.next_placeholder -= 1
            ph = frame.attrs["ph"].strip()
            self.fixed[char] = backend_for(frame.voice).given_phonemes(ph)
            self.surfaces[char] = " ".join(content.split()) or ph
            said = char
        else:
            try:
                said = say_as(frame.attrs["interpret-as"], content, frame.attrs.get("format"))
            except ValueError as exc:
                raise self.error("invalid_say_as", f"<say-as interpret-as=\""
                                 f"{frame.attrs['interpret-as']}\">{content}</say-as>: {exc}",
                                 "say-as", frame.offset) from None
        self.add(f" {said}", span=span)


def located(source: str, wrapped: int, code: str, message: str, element: str | None,
            offset: int, extra: dict | None = None) -> SsmlError:
    """An error at character ``offset`` of the user's text, with its line and column."""
    user = source[wrapped:len(source) - len("</speak>")] if wrapped else source
    offset = max(0, min(offset, len(user)))
    line = user.count("\n", 0, offset) + 1
    column = offset - (user.rfind("\n", 0, offset) + 1) + 1
    return SsmlError(code, message, element, offset, line, column, extra)


def parse(text: str, voice: Voice, speed: float = 1.0) -> list[TextRun]:
    """The runs of an SSML document for ``voice`` at ``speed`` (the request's).

    A document without a ``<speak>`` root (``text_type: ssml`` on a fragment) is read as if
    wrapped in one.

    Raises:
        SsmlError: see the module docstring.
    """
    if len(text) > MAX_SSML_CHARS:
        raise SsmlError("text_too_long", f"the SSML has {len(text)} characters; the most "
                        f"parsed is {MAX_SSML_CHARS}", extra={"limit": MAX_SSML_CHARS})
    wrapped = 0
    source = text
    if not _is_document(text):
        source, wrapped = f"<speak>{text}</speak>", len("<speak>")
    # No DTD at all (defusedxml's default refuses only entity declarations in one), no
    # entity declarations, nothing external.
    parser = DefusedExpatParser(forbid_dtd=True, forbid_entities=True, forbid_external=True)
    handler = _Handler(parser, source, voice, speed, wrapped)
    parser.setContentHandler(handler)
    document = InputSource()
    document.setByteStream(io.BytesIO(handler.encoded))
    # The text is characters already: an XML declaration's encoding="ISO-8859-1" must not
    # decode it again (it read "café" as "cafÃ©"). Given here, UTF-8 overrides it.
    document.setEncoding("utf-8")
    try:
        parser.parse(document)
    except DefusedXmlException as exc:
        traceback.clear_frames(exc.__traceback__)  # see below
        doctype = text.find("<!DOCTYPE")
        raise located(source, wrapped, "invalid_ssml", f"forbidden markup: "
                      f"{type(exc).__name__} (no DTDs, entity declarations or external "
                      "references)", None, doctype if doctype >= 0 else handler.here()
                      ) from None
    except SAXException as exc:
        # Its traceback holds the frame of expatreader's feed(), whose local holds the
        # exception (and expat's, whose traceback holds that frame again): a cycle, and this
        # frame (the document, the handler) hangs from it. The finished frames are emptied.
        traceback.clear_frames(exc.__traceback__)
        index = getattr(parser._parser, "ErrorByteIndex", -1) if parser._parser else -1
        offset = handler.char_offset(index) if index >= 0 else 0
        # expat points into a tag (at its name); the tag's '<' is where a reader looks.
        user = offset + wrapped
        tag = source.rfind("<", 0, user + 1)
        if tag >= 0 and ">" not in source[tag:user]:
            offset = tag - wrapped
        message = exc.getMessage() if hasattr(exc, "getMessage") else str(exc)
        element = handler.stack[-1].name if handler.stack else None
        raise located(source, wrapped, "invalid_ssml", f"the SSML is not well-formed XML: "
                      f"{message}", element, offset) from None
    finally:
        # The parser, expat and the handler point at each other: a cycle that only the
        # garbage collector frees, holding the document and its tables (about 1 MB for
        # 10,000 characters), for every request, refused ones included (their traceback
        # holds the handler). Cut, they go when the call returns.
        handler.parser = None
        parser.setContentHandler(ContentHandler())
        parser._parser = None
    handler.close_run()
    return handler.runs

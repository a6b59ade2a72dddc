"""ctypes binding to libespeak-ng, as shipped by the ``espeakng-loader`` wheel.

libespeak-ng keeps its voice, rate and output callback in process-wide globals, so the module
holds exactly one :class:`Espeak` per process (:func:`get_engine`) and runs every library call
under one lock: two threads must never be inside the library at once.

That lock is a real OS lock even where gevent has monkey-patched ``threading``: the callers
are native threads (a frontend thread pool), and a gevent lock waited on by one native thread
and released by another can hang for good. No greenlet switch happens while it is held (the
library calls do no I/O), so a greenlet that takes it never blocks the hub for long.

No torch here: the web process imports this module.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
from typing import NamedTuple

import espeakng_loader
import numpy as np

SAMPLE_RATE = 22050
DEFAULT_WPM = 175  # espeak's own default rate; speed 1.0 means this
MIN_WPM = 80  # espeak clamps below this anyway; clamping here keeps the maths honest
MAX_WPM = 450  # espeakRATE_MAXIMUM in speak_lib.h
# How far a render at a speed other than 1.0 may miss (its length at 1.0) / speed before the
# rate is corrected, and how many corrections at most (Espeak.synthesize_timed): a rate is a
# whole number of words a minute and the length moves in steps, so 1 % is not always reached;
# the figures per speed are in docs/models.md, "Speaking speed".
SPEED_TOLERANCE = 0.01
RATE_CORRECTIONS = 3

# speak_lib.h constants
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_ESPEAK_INITIALIZE_DONT_EXIT = 0x8000
_POS_CHARACTER = 1
_ESPEAK_CHARS_UTF8 = 1
_ESPEAK_PHONEMES = 0x100  # honour [[...]] phoneme mnemonics in the input text
_ESPEAK_RATE = 1
_EE_OK = 0
_PHONEMES_IPA = 0x02

# int SynthCallback(short *wav, int numsamples, espeak_EVENT *events)
_SYNTH_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p
)


def _clamped_wpm(wpm: float) -> int:
    """``wpm`` as the whole words a minute eSpeak takes, within its range."""
    return int(round(min(max(wpm, MIN_WPM), MAX_WPM)))


class _EspeakEvent(ctypes.Structure):
    """``espeak_EVENT`` from speak_lib.h (the id union as its 8 bytes)."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),  # 1-based character of the input the event is at
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),  # ms
        ("sample", ctypes.c_int),  # the sample of the output the event is at
        ("user_data", ctypes.c_void_p),
        ("id", ctypes.c_char * 8),
    ]


_EVENT_LIST_TERMINATED = 0
_EVENT_WORD = 1
_WORD_EVENT = struct.Struct("<ii")  # (character index of the input, sample)


class _EspeakVoice(ctypes.Structure):
    """``espeak_VOICE`` from speak_lib.h."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        # Pairs of (priority byte, NUL-terminated language), ending with a zero byte; a plain
        # c_char_p would stop at the first language, which is all we need.
        ("languages", ctypes.c_char_p),
        ("identifier", ctypes.c_char_p),
        ("gender", ctypes.c_ubyte),
        ("age", ctypes.c_ubyte),
        ("variant", ctypes.c_ubyte),
        ("xx1", ctypes.c_ubyte),
        ("score", ctypes.c_int),
        ("spare", ctypes.c_void_p),
    ]


_GENDERS = {0: "none", 1: "male", 2: "female"}


class RawVoice(NamedTuple):
    """One entry of espeak's own voice list: a plain 3-tuple with names."""

    name: str  # espeak's display name, e.g. "English_(America)"
    language: str  # the language code espeak_SetVoiceByName accepts, e.g. "en-us"
    gender: str  # "male", "female" or "none"


class VoiceFile(NamedTuple):
    """A voice as :meth:`Espeak.list_voice_files` reports it, with its file identifier."""

    identifier: str  # path under espeak-ng-data/voices or lang, e.g. "gmw/en-US"
    name: str
    language: str
    gender: str


class EspeakError(RuntimeError):
    """The library refused a call (bad voice name, failed synthesis)."""


def _os_lock():
    """A lock of the OS, whether or not gevent has patched ``threading``."""
    try:
        # gevent only where the hub runs (a plain process has no patching)
        from gevent.monkey import get_original
    except ImportError:
        return threading.Lock()
    return get_original("_thread", "allocate_lock")()


class Espeak:
    """The process's libespeak-ng engine; every public method takes the one lock."""

    def __init__(self) -> None:
        self._lock = _os_lock()
        self._lib = ctypes.CDLL(espeakng_loader.get_library_path())
        self._declare_signatures()
        data_path = espeakng_loader.get_data_path().encode()
        rate = self._lib.espeak_Initialize(
            _AUDIO_OUTPUT_SYNCHRONOUS, 0, data_path, _ESPEAK_INITIALIZE_DONT_EXIT
        )
        if rate != SAMPLE_RATE:
            raise EspeakError(f"espeak_Initialize returned {rate}, expected {SAMPLE_RATE}")
        self._chunks: list[np.ndarray] = []
        self._words: list[tuple[int, int]] = []
        # The library only holds a raw pointer: keep the ctypes callback object alive here.
        self._callback = _SYNTH_CALLBACK(self._on_audio)
        self._lib.espeak_SetSynthCallback(self._callback)
        self._voice: str | None = None

    def _declare_signatures(self) -> None:
        lib = self._lib
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_SetSynthCallback.argtypes = [_SYNTH_CALLBACK]
        lib.espeak_SetSynthCallback.restype = None
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_SetParameter.restype = ctypes.c_int
        lib.espeak_Synth.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        lib.espeak_Synth.restype = ctypes.c_int
        lib.espeak_Synchronize.argtypes = []
        lib.espeak_Synchronize.restype = ctypes.c_int
        lib.espeak_TextToPhonemes.argtypes = [
            ctypes.POINTER(ctypes.c_char_p),
            ctypes.c_int,
            ctypes.c_int,
        ]
        lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
        lib.espeak_ListVoices.argtypes = [ctypes.c_void_p]
        lib.espeak_ListVoices.restype = ctypes.POINTER(ctypes.POINTER(_EspeakVoice))

    def _on_audio(self, wav, numsamples: int, events) -> int:
        if wav and numsamples > 0:
            # Copy now: the buffer is reused by the library after we return.
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(numsamples,)).copy())
        if events:
            # Word events: where each word of the input starts in the output (for word
            # timestamps). The array ends with a LIST_TERMINATED event.
            array = ctypes.cast(events, ctypes.POINTER(_EspeakEvent))
            i = 0
            while array[i].type != _EVENT_LIST_TERMINATED:
                if array[i].type == _EVENT_WORD:
                    self._words.append((array[i].text_position - 1, array[i].sample))
                i += 1
        return 0  # 0 = carry on synthesising

    def _set_voice(self, voice: str) -> None:
        if voice == self._voice:
            return
        if self._lib.espeak_SetVoiceByName(voice.encode()) != _EE_OK:
            self._voice = None
            raise EspeakError(f"espeak has no voice {voice!r}")
        self._voice = voice

    def phonemize(self, text: str, voice: str, ipa: bool = False) -> str:
        """Phonemes of the whole text, clauses joined by a space.

        ``ipa=False`` gives espeak's mnemonics, which :meth:`synthesize` renders back when they
        are wrapped as ``[[...]]``; ``ipa=True`` gives IPA for display.
        """
        mode = _PHONEMES_IPA if ipa else 0
        clauses: list[str] = []
        with self._lock:
            self._set_voice(voice)
            buffer = ctypes.create_string_buffer(text.encode("utf-8"))
            pointer = ctypes.c_char_p(ctypes.addressof(buffer))
            # One clause per call; the library advances the pointer and sets it NULL at the end.
            while pointer.value:
                result = self._lib.espeak_TextToPhonemes(
                    ctypes.byref(pointer), _ESPEAK_CHARS_UTF8, mode
                )
                if result:
                    clause = result.decode("utf-8", errors="replace").strip()
                    if clause:
                        clauses.append(clause)
        return " ".join(clauses)

    def phonemize_clauses(self, text: str, voice: str) -> list[tuple[str, str]]:
        """IPA of each clause as espeak splits the text, with the punctuation that ended it.

        Returns ``(ipa, terminator)`` pairs; ``terminator`` is one of ``. , ? ! : ;`` or ``""``
        (end of text, a dash, a paragraph break...). Piper's phonemizer puts that punctuation
        back into the phonemes (from ``espeak_TextToPhonemesWithTerminator``); the 1.52 build in
        espeakng-loader does not export that call, so the terminator is read from the text each
        ``espeak_TextToPhonemes`` call consumed: the clause, its punctuation, then at most the
        first characters of the next clause, which espeak reads ahead and still speaks next.
        """
        encoded = text.encode("utf-8")
        pairs: list[tuple[str, str]] = []
        with self._lock:
            self._set_voice(voice)
            buffer = ctypes.create_string_buffer(encoded)
            base = ctypes.addressof(buffer)
            pointer = ctypes.c_char_p(base)
            start = 0
            while pointer.value:
                result = self._lib.espeak_TextToPhonemes(
                    ctypes.byref(pointer), _ESPEAK_CHARS_UTF8, _PHONEMES_IPA
                )
                address = ctypes.cast(pointer, ctypes.c_void_p).value
                end = address - base if address else len(encoded)
                consumed = encoded[start:end].decode("utf-8", errors="replace")
                start = end
                ipa = result.decode("utf-8", errors="replace").strip() if result else ""
                pairs.append((ipa, _clause_terminator(consumed, last=not address)))
        return pairs

    def synthesize(self, text: str, voice: str, speed: float = 1.0) -> np.ndarray:
        """:meth:`synthesize_timed` without the word starts."""
        return self.synthesize_timed(text, voice, speed)[0]

    def synthesize_timed(self, text: str, voice: str, speed: float = 1.0
                         ) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """Mono int16 audio at :data:`SAMPLE_RATE`, lasting its length at speed 1.0 over
        ``speed`` (within :data:`SPEED_TOLERANCE` where the rates allow). With it, espeak's
        word events: ``(character index in text, sample)`` where each word it reads starts
        (for ``[[phonemes]]``, each space-separated group).

        Text may hold ``[[mnemonics]]`` from :meth:`phonemize`, rendered exactly.

        eSpeak's rate (words a minute, 175 at 1.0) is not a factor of the length: its
        pauses and its shortest sounds shrink less than the rest, by an amount that depends
        on the sentence (175 x 1.5 words a minute gave one sentence with two commas 5.3 %
        more than 1/1.5 of its length, 175 x 0.5 gave 3.3 % less). So a speed other than 1.0
        renders at 1.0 first, then at ``175 x speed``, and corrects the rate by the length
        it missed by, up to :data:`RATE_CORRECTIONS` times, keeping the closest render: a
        few renders of eSpeak (milliseconds each) for a length the listener asked for. The
        search is a function of the text, voice and speed alone, so it is as deterministic
        as one render.
        """
        if speed <= 0:
            raise ValueError(f"speed must be positive, got {speed}")
        if speed == 1.0:
            return self._synthesize_at(text, voice, DEFAULT_WPM)
        target = len(self._synthesize_at(text, voice, DEFAULT_WPM)[0]) / speed
        wpm = _clamped_wpm(DEFAULT_WPM * speed)
        best = self._synthesize_at(text, voice, wpm)
        got = len(best[0])
        for _ in range(RATE_CORRECTIONS):
            if target <= 0 or abs(got / target - 1.0) <= SPEED_TOLERANCE:
                break
            corrected = _clamped_wpm(wpm * got / target)
            if corrected == wpm:
                break
            wpm = corrected
            render = self._synthesize_at(text, voice, wpm)
            if abs(len(render[0]) - target) < abs(len(best[0]) - target):
                best = render
            got = len(render[0])
        return best

    def _synthesize_at(self, text: str, voice: str, wpm: int
                       ) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """:meth:`synthesize_timed` at ``wpm`` words a minute, one render.

        The same input always gives the same samples. libespeak-ng's wave generator keeps
        state across calls that no API resets (the pitch-flutter phase is a function-static
        in ``AdvanceParameters``, untouched even by ``espeak_Terminate``/``Initialize``), so
        a render depended on everything the process rendered before: the same sentence came
        out a few samples longer or shorter, and a book rendered twice differed.
        So this process never synthesises itself: each call runs in a forked child, which
        starts from the state of an engine that has never spoken and exits after one render.
        A fork costs about a millisecond next to the render itself.
        """
        data = text.encode("utf-8")
        with self._lock:
            self._set_voice(voice)
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: render once, send the samples, exit without cleanup
                os.close(read_end)
                code = 1
                try:
                    pcm = self._render(data, wpm)
                    with os.fdopen(write_end, "wb") as out:
                        out.write(struct.pack("<i", len(self._words)))
                        out.write(b"".join(_WORD_EVENT.pack(*w) for w in self._words))
                        out.write(pcm.tobytes())
                    code = 0
                finally:
                    os._exit(code)
            os.close(write_end)
            with os.fdopen(read_end, "rb") as source:
                raw = source.read()
            _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0 or len(raw) < 4:
            raise EspeakError(f"espeak could not render {text[:60]!r}")
        (count,) = struct.unpack_from("<i", raw)
        head = 4 + count * _WORD_EVENT.size
        words = [_WORD_EVENT.unpack_from(raw, 4 + k * _WORD_EVENT.size) for k in range(count)]
        return np.frombuffer(raw[head:], dtype=np.int16).copy(), words

    def _render(self, data: bytes, wpm: int) -> np.ndarray:
        """Synthesise ``data`` in this process (the forked child of :meth:`synthesize`)."""
        self._lib.espeak_SetParameter(_ESPEAK_RATE, wpm, 0)
        self._chunks = []
        self._words = []
        status = self._lib.espeak_Synth(
            data, len(data) + 1, 0, _POS_CHARACTER, 0, _ESPEAK_CHARS_UTF8 | _ESPEAK_PHONEMES,
            None, None,
        )
        if status != _EE_OK:
            raise EspeakError(f"espeak_Synth failed with status {status}")
        self._lib.espeak_Synchronize()
        if not self._chunks:
            return np.zeros(0, dtype=np.int16)
        return np.concatenate(self._chunks).astype(np.int16, copy=False)

    def list_voices(self) -> list[RawVoice]:
        """espeak's own voice list (variants excluded), as (name, language, gender)."""
        return [RawVoice(v.name, v.language, v.gender) for v in self.list_voice_files()]

    def list_voice_files(self) -> list[VoiceFile]:
        """Like :meth:`list_voices`, plus each voice's file identifier.

        The identifier's file name is what ``espeak_SetVoiceByName`` accepts; the language code
        is not always (``en-gb`` is the language of the voice file ``en``).
        """
        voices: list[VoiceFile] = []
        with self._lock:
            array = self._lib.espeak_ListVoices(None)
            i = 0
            while array[i]:
                entry = array[i].contents
                # languages starts with a priority byte; the language name follows.
                raw = entry.languages or b"\x05"
                language = raw[1:].decode("utf-8", errors="replace")
                voices.append(
                    VoiceFile(
                        identifier=(entry.identifier or b"").decode("utf-8", errors="replace"),
                        name=(entry.name or b"").decode("utf-8", errors="replace"),
                        language=language,
                        gender=_GENDERS.get(entry.gender, "none"),
                    )
                )
                i += 1
        return voices


_TERMINATORS = ".,?!:;"
# Closing (and opening) quotes and brackets may sit between a clause's punctuation and the
# next clause: `"Stop," he said` ends its first clause at the comma.
_CLAUSE_WRAPPERS = "\"'”’“‘»«)]}([{"


def _clause_terminator(consumed: str, last: bool) -> str:
    """The punctuation that ended a clause, from the text espeak consumed for it ("" if none).

    Unless ``last``, espeak has also read ahead into the next clause (a space and the first
    letter or two of the next word): that trailing word fragment is dropped first.
    """
    tail = consumed
    if not last:
        tail = tail.rstrip("".join(c for c in tail if c.isalnum()))
    tail = tail.rstrip().rstrip(_CLAUSE_WRAPPERS).rstrip()
    # In a run such as "?!" or "...", the first mark sets the clause's tune.
    marks = tail[len(tail.rstrip(_TERMINATORS)) :]
    return marks[0] if marks else ""


_engine: Espeak | None = None
_engine_lock = _os_lock()


def get_engine() -> Espeak:
    """The process's one engine, created on first use (never at import)."""
    global _engine
    if _engine is None:
        with _engine_lock:
            if _engine is None:
                _engine = Espeak()
    return _engine


def phonemize(text: str, voice: str, ipa: bool = False) -> str:
    """Shortcut for ``get_engine().phonemize``."""
    return get_engine().phonemize(text, voice, ipa)


def synthesize(text: str, voice: str, speed: float = 1.0) -> np.ndarray:
    """Shortcut for ``get_engine().synthesize``."""
    return get_engine().synthesize(text, voice, speed)

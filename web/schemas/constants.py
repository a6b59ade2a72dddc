"""The values the API takes and the limits it states: formats, text types, the OpenAI names
and speeds. The facts they restate come from the modules that own them (the encoders, the
captions, the book formats)."""

from __future__ import annotations

from models.audio.encode import FORMAT_NAMES
from models.audio.encode import STREAM_FORMATS as AUDIO_STREAM_FORMATS
from models.text.captions import CAPTION_FORMATS

# A job's `format`: what `/audio` encodes; the table is models/audio/encode.py's FORMATS.
AUDIO_FORMATS = FORMAT_NAMES
# The formats a stream carries: every one but those written whole (`m4a`); `wav` (open
# length) plays in any browser's <audio>.
JOB_STREAM_FORMATS = AUDIO_STREAM_FORMATS
TEXT_TYPES = ("text", "ssml")
# Chunks returned by one long-poll answer, at most; the client asks again for the rest.
MAX_CHUNKS_PER_POLL = 32
# A whole book's audio, by format; and its captions, files only.
BOOK_AUDIO_TYPES = {"m4b": "audio/mp4", "mp3": "audio/mpeg"}
BOOK_CAPTION_FORMATS = tuple(f for f in CAPTION_FORMATS if f != "json")

# OpenAI's speech API (web/openai_compat.py has the reasons).
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage",
                 "shimmer", "verse", "marin", "cedar")
# response_format -> (the format of models/audio/encode.py, output rate or None for the
# voice's own): OpenAI's names first (its default, mp3), then the farm's other streamable
# ones (ogg). OpenAI's `pcm` is 24 kHz whatever the voice, as its clients hard-code the rate.
OPENAI_PCM_RATE = 24_000
RESPONSE_FORMATS: dict[str, tuple[str, int | None]] = {
    name: (name, OPENAI_PCM_RATE if name == "pcm" else None)
    for name in dict.fromkeys(("mp3", "opus", "aac", "flac", "wav", "pcm",
                               *AUDIO_STREAM_FORMATS))}
OPENAI_SPEED_MIN, OPENAI_SPEED_MAX = 0.25, 4.0
STREAM_FORMATS = ("audio", "sse")  # raw audio bytes (OpenAI's default) or server-sent events
OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "voxfarm")
# What a voice is made of (models.voices.Voice.kind): a model as installed, a shaped base, a mix.
VOICE_KINDS = ("model", "shaped", "mix")
VOICE_GENDERS = ("female", "male")

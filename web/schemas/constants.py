"""The values the API takes and the limits it states: formats, text types, the OpenAI names
and speeds. The facts they restate come from the modules that own them (the encoders, the
captions, the book formats)."""

from __future__ import annotations

from models.audio.encode import CONTENT_TYPES as AUDIO_CONTENT_TYPES
from models.text.captions import CAPTION_FORMATS

# A job's `format`: what `/audio` encodes (models/audio/encode.py can write each).
AUDIO_FORMATS = tuple(AUDIO_CONTENT_TYPES)
# The formats a job stream offers; `wav` (open length) plays in any browser's <audio>.
JOB_STREAM_FORMATS = ("wav", "pcm", "ogg", "mp3", "aac", "flac")
TEXT_TYPES = ("text", "ssml")
# Chunks returned by one long-poll answer, at most; the client asks again for the rest.
MAX_CHUNKS_PER_POLL = 32
# A whole book's audio, by format; and its captions, files only.
BOOK_AUDIO_TYPES = {"m4b": "audio/mp4", "mp3": "audio/mpeg"}
BOOK_CAPTION_FORMATS = tuple(f for f in CAPTION_FORMATS if f != "json")

# OpenAI's speech API (web/openai_compat.py has the reasons).
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage",
                 "shimmer", "verse", "marin", "cedar")
# response_format -> (stream encoder format, output rate or None for the voice's own)
RESPONSE_FORMATS: dict[str, tuple[str, int | None]] = {
    "mp3": ("mp3", None), "opus": ("ogg", None), "aac": ("aac", None),
    "flac": ("flac", None), "wav": ("wav", None), "pcm": ("pcm", 24_000)}
OPENAI_SPEED_MIN, OPENAI_SPEED_MAX = 0.25, 4.0
STREAM_FORMATS = ("audio", "sse")  # raw audio bytes (OpenAI's default) or server-sent events
OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "voxfarm")
# What a voice is made of (models.voices.Voice.kind): a model as installed, a shaped base, a mix.
VOICE_KINDS = ("model", "shaped", "mix")
VOICE_GENDERS = ("female", "male")

"""The monolith baseline for bench_load.py: the same voice called inline in a Flask view.

`POST /v1/audio/speech` (OpenAI's shape, `pcm` only) runs the farm's own frontend, the VITS
acoustic half and the HiFi-GAN decoder in the request, segment by segment, streaming each
segment's audio as soon as it exists: what a single-process TTS server does. Served by
gunicorn with the same gevent workers as the farm's web (`ops/gunicorn.conf.py`); each
worker process loads the voice once. The model calls block the worker's hub while they run,
which is the point of the comparison.

    gunicorn -c ops/gunicorn.conf.py --bind 127.0.0.1:PORT tests.bench.monolith:app
"""

from __future__ import annotations

import functools

import numpy as np
from flask import Flask, Response, request

app = Flask(__name__)


@functools.cache
def _voice():
    import torch

    from app.settings import Settings
    from models.neural.piper import PiperAcoustic, PiperVocoder
    from models.voices import get_voice

    torch.set_num_threads(1)  # as the farm's pools run
    voice = get_voice(Settings().default_voice)
    return voice, PiperAcoustic(model_path=voice.model_path), \
        PiperVocoder(model_path=voice.model_path)


@app.post("/v1/audio/speech")
def speech():
    from models.audio.encode import pcm16
    from models.text.frontend import iter_segments

    text = (request.get_json(silent=True) or {}).get("input") or ""
    voice, acoustic, vocoder = _voice()

    def body():
        for seg in iter_segments(text, voice.name):
            z = acoustic.synthesize(seg.phonemes, speed=1.0, seed=seg.index)
            audio = vocoder.vocode([z])[0].numpy()
            pause = np.zeros(int(voice.sample_rate * seg.pause_ms / 1000), dtype=np.float32)
            yield pcm16(np.concatenate([audio, pause])).tobytes()

    return Response(body(), content_type=f"audio/L16;rate={voice.sample_rate}")


@app.get("/healthz")
def healthz():
    _voice()  # load before the bench starts timing
    return {"status": "ok"}

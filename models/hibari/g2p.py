"""Text -> the hibari voice's phonemes (misaki's English conventions), with the wheel's own G2P.

``hibari.g2p`` is pure Python (lexicons, a tagger, number and symbol rules) and runs in the web's
frontend thread like eSpeak. Words in neither lexicon go to the wheel's small OOV network
(``assets/oov.onnx``), which the wheel runs with onnxruntime: it is imported on the first such
word only, so a process whose texts stay in the lexicons never loads it. No torch here.
"""

from __future__ import annotations

import functools
import threading

# The wheel's G2P speaks American English (heart's) and British (misaki's GB lexicon and
# suffix rules: the voices emma and fable, dropped into the voices directory).
LANGUAGES = ("en-us", "en-gb")

_LOCK = threading.Lock()  # one G2P object per process; its OOV session is not shared safely


@functools.lru_cache(maxsize=2)
def _g2p(british: bool):
    # the wheel's G2P loads its lexicons (0.5 s) on first use, not at import
    from hibari.g2p import G2P

    return G2P(british=british)


def phonemize(text: str, lang: str = "en-us") -> str:
    """The phonemes of ``text`` (sentence punctuation kept, words separated by spaces)."""
    if lang.lower() not in LANGUAGES:
        raise ValueError(f"the hibari voice speaks {', '.join(LANGUAGES)}, not {lang!r}")
    with _LOCK:
        return _g2p(lang.lower() == "en-gb")(text)

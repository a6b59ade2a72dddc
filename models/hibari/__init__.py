"""The hibari voice (hibari-tts 0.2.1, voice ``heart``): its acoustic half, ConvNeXt decoder and
source-filter DSP as torch modules written here, weights read from the wheel's ONNX.

``voice.load_voice`` is the entry point; ``g2p.phonemize`` is the text side (no torch).
"""

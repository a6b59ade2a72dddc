"""The hibari voice (hibari-tts 0.2.1, voice ``heart``): its acoustic half and ConvNeXt decoder
as torch modules written here, weights read from the wheel's ONNX, and its source-filter DSP
(numpy on the host, FFTs in torch).

``voice.load_voice`` is the entry point; ``g2p.phonemize`` is the text side (no torch).
"""

"""The classic path: eSpeak NG's phonemes and audio, the log-mel, Griffin-Lim, and
the registries of acoustic models and vocoders."""

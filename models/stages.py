"""The two stages that run a model, spelled as app.broker.stages.Stage spells them (its members
compare equal to these strings). models/ imports nothing of app/, so the models name them
here, once: the voice backends (models/voices/) and the engine's per-stage precision."""

ACOUSTIC, VOCODER = "acoustic", "vocoder"
STAGES = (ACOUSTIC, VOCODER)

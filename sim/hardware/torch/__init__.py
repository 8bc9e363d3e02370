"""The torch engine: a transformers model, its target for the round loop, and recording, measuring and confirming
with it. Every module here imports torch (the torch extra); the command lines import them only once it is there."""

import os

# Set before any module of this package imports transformers: never reach for the hub, whatever the caller forgot.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

"""The vLLM engine: an in-process engine adapter, a real `vllm serve` with a load generator, and recording, measuring
and confirming with them. vLLM itself is imported only inside the functions that run it, so every module here imports
without it."""

import os

# Never reach for the hub, whatever the caller forgot (as the torch engine's package does): the engines this package
# starts in child processes inherit it.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

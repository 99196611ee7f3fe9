import os

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(min(2, torch.get_num_threads()))

SHARED_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")


@pytest.fixture(scope="session")
def tiny():
    """A seeded random Llama of SmolLM2's family and tokenizer (float32)."""
    from sparserl.models.loading import load_model

    return load_model("tiny", dtype="float32", seed=0)

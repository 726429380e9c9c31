import pytest
import torch


def pytest_collection_modifyitems(config, items):
    """`@pytest.mark.gpu` tests skip cleanly (with the reason) on a machine without CUDA."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: run `pytest -m gpu` on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

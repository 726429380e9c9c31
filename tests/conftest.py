import os

import pytest
import torch

if not torch.cuda.is_available():
    # Level 4 runs in Triton's interpreter here. It must be on before anything imports
    # triton: triton.language builds its own @jit helpers (tl.max's combine, ...) at import.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    """`@pytest.mark.gpu` tests skip cleanly (with the reason) on a machine without CUDA."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: run `pytest -m gpu` on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def settings_read_anew():
    """A test that sets LEVELS_CACHE_DIR (monkeypatch.setenv) gets it: the harness reads its
    settings from the environment once per process, so each test starts without them."""
    from equivalence import settings

    settings.use(None)
    yield
    settings.use(None)


# One assignment built per session, shared by the grading tests (a build copies the repo:
# a few seconds): layer_norm and attention at Levels 1 and 4, with the instructor's bundle.
ROUND_TRIP = {"components": ("layer_norm", "attention"), "levels": ("native", "triton")}


@pytest.fixture(scope="session")
def assignment_build(tmp_path_factory):
    from equivalence.commands import assignment

    root = tmp_path_factory.mktemp("assignment")
    copy = assignment.build(ROUND_TRIP["components"], ROUND_TRIP["levels"], root / "student",
                            instructor_dir=root / "instructor")
    return copy

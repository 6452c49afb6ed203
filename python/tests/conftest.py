"""Driver tests: plain pytest (not under railrun). They start railrun jobs and other launches
of the railring package and check what the ranks print. `tests/ranks/` is the suite each rank
of such a job runs; it is collected only through test_launch.py."""

import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
collect_ignore = ["ranks"]


def find_bin(name):
    """A railring binary: $RAILRING_BIN_DIR, then PATH, then the repository's target folder."""
    d = os.environ.get("RAILRING_BIN_DIR")
    if d and (Path(d) / name).exists():
        return str(Path(d) / name)
    for sub in ("debug", "release"):  # what scripts/test builds first
        p = REPO / "target" / sub / name
        if p.exists():
            return str(p)
    w = shutil.which(name)
    if w:
        return w
    pytest.skip(f"{name} is not built (cargo build --workspace) and not on PATH")


@pytest.fixture(scope="session")
def railrun():
    return find_bin("railrun")


@pytest.fixture(scope="session")
def python():
    return sys.executable


@pytest.fixture(scope="session")
def repo():
    return REPO

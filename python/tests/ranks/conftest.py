"""The rank suite runs on every rank of one railrun job (`railrun -np N python -m pytest
python/tests/ranks`); test_launch.py starts it. Every rank runs the same tests in the same
order, so the collectives inside them match up."""

import pytest

import railring


@pytest.fixture(scope="session")
def comm():
    return railring.init()

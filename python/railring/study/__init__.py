"""The study runner: ``python -m railring.study STUDY.toml`` runs a matrix of railperf
measurements (collectives × node counts × ranks per node × algorithms × rails × repetitions),
with a progress line, one row per measurement (JSON lines and CSV), resume after an
interruption, and the plots researchers put in papers (busbw vs size, scaling efficiency vs
nodes, measured vs ``railrun plan``). See docs/python.md.
"""

from .spec import Study, StudyError, load
from .runner import run_study

__all__ = ["Study", "StudyError", "load", "run_study"]

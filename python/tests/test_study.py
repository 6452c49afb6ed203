"""The study runner end to end on this machine: a real matrix of railrun + railperf jobs
(nodes emulated with RAILRING_HOST_ID), the progress line, rows, Ctrl-C and resume, failures
that are reported and not retried, and the plots."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from railring.study import StudyError, load
from railring.study.predict import _rows

STUDY = """
name = "t"
emulate_nodes = true
ranks_per_node = [2]
collectives = ["allreduce"]
sizes = {{ min = "1K", max = "64K", factor = 8 }}
iters = 3
warmup = 1
railrun = "{railrun}"
railperf = "{railperf}"
{extra}
"""
MATRIX = 'nodes = [1, 2]\nalgorithms = ["auto", "ring"]\nrepetitions = 2\n'  # 8 points


@pytest.fixture
def study(tmp_path, railrun):
    from conftest import find_bin

    def make(extra=MATRIX, railperf=None):
        p = tmp_path / "study.toml"
        p.write_text(STUDY.format(railrun=railrun, railperf=railperf or find_bin("railperf"), extra=extra))
        return p

    return make


def runner(args, **kw):
    return subprocess.Popen([sys.executable, "-m", "railring.study", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)


def points_in(path):
    if not path.exists():
        return []
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def test_bad_study_files_name_file_and_key(tmp_path):
    p = tmp_path / "s.toml"
    for text, want in [
        ('nodez = [1]', "unknown key(s) nodez"),
        ('nodes = [1, 2]', "needs a hostfile"),
        ('sizes = { min = "8X" }', "'8X' is not a size"),
        ('algorithms = ["fastest"]', "algorithms: unknown 'fastest'"),
        ('rails = [1, 2]', "rails [1, 2] needs rail_ifnames"),
        ('hostfile = "nope"', "does not exist"),
        ('nodes = [', "s.toml"),
    ]:
        p.write_text(text)
        with pytest.raises(StudyError, match=want.replace("[", "\\[").replace("]", "\\]").replace("(", "\\(").replace(")", "\\)")) as e:
            load(p)
        assert str(p) in str(e.value)


def test_hostfile_subsets(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("# cluster\nn1 slots=4\nn2:4\nn3 slots=4\nn4\n")
    p = tmp_path / "s.toml"
    p.write_text('hostfile = "hosts"\nnodes = [1, 2, 4]\nranks_per_node = [1, 2]\nrails = [1, 2]\nrail_ifnames = ["rail0", "rail1"]\n')
    st = load(p)
    assert st.hosts == ["n1", "n2", "n3", "n4"]
    assert len(st.points()) == 3 * 2 * 2
    p.write_text('hostfile = "hosts"\nnodes = [8]\n')
    with pytest.raises(StudyError, match="asks for 8 hosts but .* lists 4"):
        load(p)


def test_run_interrupt_resume_and_plots(study, tmp_path):
    s = study()
    out = tmp_path / "out"
    # Ctrl-C mid-study: the terminal sends SIGINT to the runner's process group
    p = runner([s, "-o", out])
    t0 = time.monotonic()
    while len({r["point"] for r in points_in(out / "results.jsonl")}) < 2:
        assert p.poll() is None, p.communicate()
        assert time.monotonic() - t0 < 120, "no progress"
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "interrupted:" in err and "run the same command again to resume" in err, err
    first = points_in(out / "results.jsonl")
    done = {r["point"] for r in first}
    assert 2 <= len(done) < 8
    assert len(first) == 3 * len(done)  # every recorded point is whole: 3 sizes
    # the progress line says what runs, how many are left and when it ends
    assert "running allreduce nodes=" in err and " left · " in err and "ETA" in err, err

    p = runner([s, "-o", out])
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert f"resuming t: {len(done)} of 8 points already done" in err, err
    rows = points_in(out / "results.jsonl")
    assert rows[:len(first)] == first  # finished points were not redone
    ids = [r["point"] for r in rows]
    assert len(set(ids)) == 8 and len(rows) == 24
    for r in rows:
        assert r["wrong"] == 0 and r["ip_busbw"] > 0 and r["oop_time_us"] > 0
        assert r["commit"] and r["started"] <= r["finished"]
        assert r["hosts"] == ("localhost(emunode0)" if r["nodes"] == 1 else "localhost(emunode0) localhost(emunode1)")
        assert (r["env"].get("RAILRING_ALGO") == "ring") == (r["algorithm"] == "ring")
    with (out / "results.csv").open() as f:
        table = list(csv.DictReader(f))
    assert len(table) == 24 and {"commit", "hosts", "env", "started", "finished", "command"} <= set(table[0])

    pytest.importorskip("matplotlib", reason="the plots need matplotlib")
    for name in ("busbw_allreduce", "scaling_allreduce"):
        svg = (out / "plots" / f"{name}.svg").read_text()
        ET.fromstring(svg)  # well-formed
        png = (out / "plots" / f"{name}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10000
    svg = (out / "plots" / "busbw_allreduce.svg").read_text()
    for text in ("bus bandwidth (GB/s)", "message size (bytes, log scale)", "2 nodes × 2 ranks",
                 "1 node × 2 ranks", ">ring<", ">auto<", "64 KiB"):
        assert text in svg, text
    svg = (out / "plots" / "scaling_allreduce.svg").read_text()
    assert "scaling efficiency (%)" in svg and "ideal (constant busbw)" in svg and "2 ranks/node, ring" in svg


def test_failures_are_reported_not_retried(study, tmp_path):
    bad = tmp_path / "failing-perf"
    bad.write_text("#!/bin/sh\necho 'railperf: oops' >&2\nexit 3\n")
    bad.chmod(0o755)
    s = study(railperf=bad)
    out = tmp_path / "out"
    p = runner([s, "-o", out, "--no-plots"])
    _, err = p.communicate(timeout=300)
    assert p.returncode == 1, err
    assert err.count("FAILED allreduce") == 8 and "not retried" in err, err
    fails = points_in(out / "failures.jsonl")
    assert len(fails) == 8 and all("exit status" in f["why"] and "oops" in f["output_tail"] for f in fails)
    p = runner([s, "-o", out, "--no-plots"])
    _, err = p.communicate(timeout=300)
    assert p.returncode == 1 and "8 point(s) failed before and are not retried" in err, err
    assert len(points_in(out / "failures.jsonl")) == 8  # nothing ran
    p = runner([s, "-o", out, "--no-plots", "--retry-failed"])
    _, err = p.communicate(timeout=300)
    assert len(points_in(out / "failures.jsonl")) == 16, err


def test_prediction_plot_is_optional(study, tmp_path, repo):
    """With a fabric file and railrun's `plan` command, the measured-vs-predicted plot is drawn
    from `railrun plan --json`; without the command the study says so and draws the others."""
    pytest.importorskip("matplotlib", reason="the plots need matplotlib")
    fabric = repo / "fabrics" / "emu-4n-1to1.json"
    s = study(extra=f'fabric = "{fabric}"\n')  # one point: 1 node x 2 ranks
    out = tmp_path / "out"
    p = runner([s, "-o", out])
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    from railring.study.predict import plan_available
    from conftest import find_bin
    if plan_available(find_bin("railrun")):
        assert (out / "plots" / "predicted_allreduce.svg").exists(), err
        assert "no prediction" not in err, err
    else:
        assert "has no `plan` command: no measured-vs-predicted plot" in err, err
        assert (out / "plots" / "busbw_allreduce.svg").exists()


def test_plan_json_reader():
    # the shape of `railrun plan --json` (rows, each algorithm's prediction, the planner's choice)
    doc = {"fabric": {"name": "x"}, "rows": [
        {"size": 1024, "count": 256, "choice": "two_level",
         "algos": {"ring": {"busbw_gbs": 1.5}, "two_level": {"busbw_gbs": 2.5}}},
        {"size": 2048, "count": 512, "choice": "ring",
         "algos": {"ring": {"busbw_gbs": 3.0}, "two_level": {"busbw_gbs": 2.0}}},
    ]}
    assert sorted(_rows(doc, "ring")) == [(1024, 1.5), (2048, 3.0)]
    assert sorted(_rows(doc, "auto")) == [(1024, 2.5), (2048, 3.0)]
    assert list(_rows(doc, "tree")) == []
    assert list(_rows({"rows": "garbage"}, "ring")) == []


def test_dry_run_lists_points_and_commands(study, tmp_path):
    s = study()
    p = subprocess.run([sys.executable, "-m", "railring.study", str(s), "-o", str(tmp_path / "o"), "--dry-run"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[-1] == "8 points × 3 sizes"
    assert "RAILRING_HOST_ID=emunode$((RAILRING_RANK / 2))" in p.stdout
    assert "-x RAILRING_ALGO=ring" in p.stdout


def test_example_studies_load(repo):
    files = sorted((repo / "examples/studies").glob("*.toml")) + sorted((repo / "examples/studies").glob("*.json"))
    assert len(files) >= 3
    for f in files:
        st = load(f)
        assert st.points(), f

"""python -m railring.study STUDY.toml [-o DIR] [--hostfile F] [--ssh CMD] [--fabric F]
[--retry-failed] [--dry-run] [--no-plots] [--plot-only]

Runs the study's matrix with a progress line, writes one row per measurement, resumes where an
interrupted run stopped, and draws the plots. Exit status: 0 all points measured, 1 some failed
(listed; never retried silently), 2 a bad study file or missing tool, 130 interrupted.
"""

import argparse
import sys
from pathlib import Path

from . import plots, predict
from .runner import Interrupted, find_tool, load_rows, run_study
from .spec import StudyError, load, read_hostfile


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m railring.study", description=__doc__.split("\n\n")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("study", help="study file (TOML or JSON; see examples/studies/)")
    ap.add_argument("-o", "--out", help="output folder (default: <study name>-results next to the study file)")
    ap.add_argument("--hostfile", help="use this hostfile instead of the study's (e.g. an emulated cluster's)")
    ap.add_argument("--ssh", help="remote shell command for railrun (instead of the study's)")
    ap.add_argument("--fabric", help="a fabric file for `railrun plan`: adds the measured-vs-predicted plot")
    ap.add_argument("--retry-failed", action="store_true", help="run points that failed in an earlier run again")
    ap.add_argument("--dry-run", action="store_true", help="print the points and their commands; run nothing")
    ap.add_argument("--no-plots", action="store_true", help="write the results only")
    ap.add_argument("--plot-only", action="store_true", help="draw the plots from the results already in the output folder")
    a = ap.parse_args(argv)
    try:
        st = load(a.study)
        if a.hostfile:
            st.hostfile = Path(a.hostfile).resolve()
            st.hosts = read_hostfile(st.hostfile)
            st.emulate_nodes = False
            if max(st.nodes) > len(st.hosts):
                raise StudyError(f"--hostfile {a.hostfile}: lists {len(st.hosts)} hosts, the study needs {max(st.nodes)}")
        if a.ssh:
            st.ssh = a.ssh
        if a.fabric:
            st.fabric = Path(a.fabric).resolve()
            if not st.fabric.exists():
                raise StudyError(f"--fabric {a.fabric}: no such file")
    except StudyError as e:
        print(f"railring.study: {e}", file=sys.stderr)
        return 2
    out = Path(a.out) if a.out else st.path.parent / f"{st.name}-results"
    if a.dry_run:
        from .runner import Runner
        r = Runner(st, out)
        try:
            r.tools()
        except StudyError as e:
            print(f"railring.study: {e}", file=sys.stderr)
            return 2
        out.mkdir(parents=True, exist_ok=True)
        pts = st.points()
        for p in pts:
            print(f"{st.point_id(p)}  {p.label(st)} rep {p.rep}:  {' '.join(r.command(p))}")
        print(f"{len(pts)} points × {len(st.size_list())} sizes")
        return 0
    status = 0
    if not a.plot_only:
        try:
            rows, failures, skipped = run_study(st, out, a.retry_failed)
        except StudyError as e:
            print(f"railring.study: {e}", file=sys.stderr)
            return 2
        except Interrupted:
            return 130
        bad = len(failures) + len(skipped)
        print(f"railring.study: {len(rows)} rows in {out / 'results.csv'} and {out / 'results.jsonl'}",
              file=sys.stderr)
        if bad:
            print(f"railring.study: {bad} point(s) failed (see {out / 'failures.jsonl'}); "
                  f"rerun with --retry-failed to measure them again", file=sys.stderr)
            status = 1
    if a.no_plots:
        return status
    ids = {st.point_id(p) for p in st.points()}
    rows = [r for r in load_rows(out / "results.jsonl") if r.get("point") in ids]
    if not rows:
        print("railring.study: no results to plot", file=sys.stderr)
        return status or 1
    pdir = out / "plots"
    pdir.mkdir(parents=True, exist_ok=True)
    warn = lambda m: print(f"railring.study: {m}", file=sys.stderr)  # noqa: E731
    try:
        made = plots.plot_busbw(st, rows, pdir) + plots.plot_scaling(st, rows, pdir)
        if st.fabric:
            railrun = find_tool("railrun", st.railrun, st.path.parent.resolve())
            if predict.plan_available(railrun):
                configs = sorted({(r["collective"], r["nodes"], r["ranks_per_node"], r["algorithm"], r["rails"]) for r in rows})
                made += plots.plot_predicted(st, rows, predict.predict(st, railrun, configs, warn), pdir)
            else:
                warn(f"this railrun ({railrun}) has no `plan` command: no measured-vs-predicted plot")
    except plots.NoMatplotlib as e:
        warn(str(e))
        return status or 1
    for p in made:
        print(f"railring.study: plot {p}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())

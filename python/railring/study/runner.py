"""Running a study: one railrun job per point, a progress line, one row per measurement,
resume after an interruption, nothing retried behind the user's back.

Files in the output folder:
  results.jsonl   one JSON object per measurement (point × size), appended as points finish
  results.csv     the same rows as CSV (rewritten after every point)
  failures.jsonl  one object per failed point (exit status, the end of its output); not retried
                  unless --retry-failed
  logs/           each point's full railrun output
  hostfile-N      the first N hosts of the study's hostfile, N slots each
  plots/          the figures (SVG and PNG)
"""

import csv
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from .spec import Point, StudyError

BUS_FACTOR = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}

CSV_FIELDS = [
    "study", "point", "collective", "nodes", "ranks_per_node", "nranks", "algorithm", "rails",
    "rep", "size", "count", "dtype", "op", "oop_time_us", "oop_busbw", "ip_time_us", "ip_busbw",
    "wrong", "hosts", "rail_ifnames", "env", "commit", "started", "finished", "command",
]


class Interrupted(Exception):
    pass


def find_tool(name, configured, study_dir):
    """railrun / railperf: the study's setting, $RAILRING_BIN_DIR, PATH, or a railring checkout's
    target folder above the study file."""
    if configured:
        p = Path(configured)
        if not p.is_absolute() and (study_dir / p).exists():
            return str((study_dir / p).resolve())
        w = shutil.which(configured)
        if w:
            return w
        raise StudyError(f"{name}: {configured!r} not found")
    d = os.environ.get("RAILRING_BIN_DIR")
    if d and (Path(d) / name).exists():
        return str(Path(d) / name)
    w = shutil.which(name)
    if w:
        return w
    for parent in [study_dir, *study_dir.parents, Path.cwd(), *Path.cwd().parents]:
        for sub in ("release", "debug"):
            p = parent / "target" / sub / name
            if p.exists():
                return str(p)
    raise StudyError(f"{name} not found: build railring (cargo build --release) and put target/release "
                     f"on PATH, or set RAILRING_BIN_DIR")


def git_commit(where):
    try:
        r = subprocess.run(["git", "-C", str(where), "describe", "--always", "--dirty", "--abbrev=12"],
                           capture_output=True, text=True, timeout=10)
        return r.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def parse_railperf(out):
    """railperf's table rows: (size, count, dtype, oop µs, oop wrong, ip µs, ip wrong)."""
    rows = []
    for line in out.splitlines():
        f = line.split()
        if len(f) != 13 or line.lstrip().startswith("#") or not f[0].isdigit():
            continue
        try:
            rows.append((int(f[0]), int(f[1]), f[2], float(f[5]), int(f[8]), float(f[9]), int(f[12])))
        except ValueError:
            continue
    return rows


def fmt_duration(s):
    s = int(round(s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Progress:
    """One progress line on stderr: bar, points done / total, what runs, elapsed, ETA. On a
    terminal it redraws in place; otherwise it prints one line per event."""

    def __init__(self, total, done, out=sys.stderr):
        self.total, self.done, self.out = total, done, out
        self.tty = out.isatty()
        self.t0 = time.monotonic()
        self.durations = []

    def eta(self):
        left = self.total - self.done
        if not self.durations:
            return "ETA ?"
        return f"ETA {fmt_duration(left * sum(self.durations) / len(self.durations))}"

    def line(self, what):
        width = 24
        fill = int(width * self.done / max(self.total, 1))
        bar = "#" * fill + "-" * (width - fill)
        return (f"[{bar}] {self.done}/{self.total} points, {self.total - self.done} left · {what} · "
                f"elapsed {fmt_duration(time.monotonic() - self.t0)} · {self.eta()}")

    def show(self, what):
        text = self.line(what)
        if self.tty:
            cols = shutil.get_terminal_size((120, 20)).columns
            self.out.write("\r\x1b[K" + text[:cols - 1])
        else:
            self.out.write(text + "\n")
        self.out.flush()

    def message(self, text):
        if self.tty:
            self.out.write("\r\x1b[K")
        self.out.write(text + "\n")
        self.out.flush()

    def finished(self, seconds):
        self.done += 1
        self.durations.append(seconds)


def load_rows(path):
    rows = []
    if path.exists():
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                # a line cut by a crash mid-write: everything before it is kept, the point reruns
                print(f"railring.study: {path}:{i}: incomplete row ignored (its point runs again)",
                      file=sys.stderr)
    return rows


def write_csv(rows, path):
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (json.dumps(v) if isinstance(v, (dict, list)) else v) for k, v in r.items()})
    tmp.replace(path)


def append_jsonl(path, rows):
    """Append a point's rows in one write (a point is recorded whole or not at all)."""
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
    with path.open("a") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


class Runner:
    def __init__(self, study, out, retry_failed=False, progress_out=sys.stderr):
        self.st = study
        self.out = Path(out)
        self.retry_failed = retry_failed
        self.progress_out = progress_out
        self.child = None
        self.interrupted = False

    def on_sigint(self, signum, frame):
        """Ctrl-C: end the running job (railrun ends every rank) and stop after it; the point
        it was measuring is not recorded and runs again on resume."""
        if self.interrupted and frame is not None:  # a second Ctrl-C: do not wait for the job's grace period
            if self.child is not None and self.child.poll() is None:
                os.killpg(self.child.pid, signal.SIGKILL)
            return
        self.interrupted = True
        if self.child is not None and self.child.poll() is None:
            try:
                os.killpg(self.child.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def tools(self):
        d = self.st.path.parent.resolve()
        self.railrun = find_tool("railrun", self.st.railrun, d)
        self.railperf = find_tool("railperf", self.st.railperf, d)
        self.commit = git_commit(Path(self.railperf).resolve().parent)

    def point_env(self, p):
        env = dict(self.st.env)
        if p.algorithm != "auto":
            env["RAILRING_ALGO"] = p.algorithm
        if self.st.rail_ifnames:
            env["RAILRING_SOCKET_IFNAME"] = "=" + ",".join(self.st.rail_ifnames[:p.rails])
        return env

    def command(self, p):
        st = self.st
        lo, hi, f = st.sizes
        cmd = [self.railrun, "-np", str(p.nranks)]
        if st.hostfile:
            hf = self.out / f"hostfile-{p.nodes}x{p.ranks_per_node}"
            hf.write_text("".join(f"{h} slots={p.ranks_per_node}\n" for h in st.hosts[:p.nodes]))
            cmd += ["--hostfile", str(hf), "--ppn", str(p.ranks_per_node)]
            if st.ssh:
                cmd += ["--ssh", st.ssh]
        for k, v in sorted(self.point_env(p).items()):
            cmd += ["-x", f"{k}={v}"]
        perf = [self.railperf, p.collective, "-b", str(lo), "-e", str(hi), "-f", str(f),
                "-n", str(st.iters), "-w", str(st.warmup), "-d", st.dtype, "-o", st.op,
                "-z", "1" if st.blocking else "0", "-c", "1"]
        if st.emulate_nodes and p.nodes > 1:
            # node i = ranks i*rpn .. (i+1)*rpn-1, told apart by RAILRING_HOST_ID: TCP between them
            rpn = p.ranks_per_node
            perf = ["sh", "-c", f'RAILRING_HOST_ID=emunode$((RAILRING_RANK / {rpn})) exec "$@"', "sh", *perf]
        return cmd + perf

    def hosts_of(self, p):
        if self.st.hostfile:
            return self.st.hosts[:p.nodes]
        if self.st.emulate_nodes:
            return [f"localhost(emunode{i})" for i in range(p.nodes)]
        return ["localhost"]

    def knobs(self, p):
        env = {k: v for k, v in os.environ.items() if k.startswith(("RAILRING_", "RAILRUN_"))}
        env.update(self.point_env(p))
        return env

    def run_point(self, p, pid, progress):
        cmd = self.command(p)
        log = self.out / "logs" / f"{pid}.log"
        started = now()
        t0 = time.monotonic()
        with log.open("w") as lf:
            lf.write("$ " + " ".join(cmd) + "\n")
            lf.flush()
            # its own session: a Ctrl-C reaches the runner, which ends the job cleanly itself
            self.child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True, start_new_session=True)
            if self.interrupted:  # Ctrl-C came while the job was being started
                self.on_sigint(signal.SIGINT, None)
                self.interrupted = True
            try:
                out, _ = self.child.communicate(timeout=self.st.timeout)
                timed_out = False
            except subprocess.TimeoutExpired:
                self.stop_child()
                out, _ = self.child.communicate()
                timed_out = True
            code = self.child.returncode
            self.child = None
            lf.write(out)
        secs = time.monotonic() - t0
        if self.interrupted:
            return None, "interrupted", secs
        rows = parse_railperf(out)
        wrong = sum(r[4] + r[6] for r in rows)
        expected = len(self.st.size_list())
        if timed_out or code != 0 or wrong or len(rows) != expected:
            why = (f"timed out after {self.st.timeout:g} s" if timed_out else
                   f"exit status {code}" if code != 0 else
                   f"{wrong} wrong elements" if wrong else
                   f"{len(rows)} result rows, expected {expected}")
            append_jsonl(self.out / "failures.jsonl", [{
                "point": pid, "label": p.label(self.st), "rep": p.rep, "why": why, "started": started,
                "finished": now(), "command": " ".join(cmd), "log": str(log),
                "output_tail": out[-2000:]}])
            return None, why, secs
        n = p.nranks
        factor = BUS_FACTOR[p.collective](n)
        base = {
            "study": self.st.name, "point": pid, "collective": p.collective, "nodes": p.nodes,
            "ranks_per_node": p.ranks_per_node, "nranks": n, "algorithm": p.algorithm,
            "rails": p.rails, "rep": p.rep, "dtype": self.st.dtype, "op": self.st.op,
            "hosts": " ".join(self.hosts_of(p)), "rail_ifnames": ",".join(self.st.rail_ifnames[:p.rails]),
            "env": self.knobs(p), "commit": self.commit, "started": started, "finished": now(),
            "command": " ".join(cmd),
        }
        out_rows = []
        for size, count, dtype, t_oop, w_oop, t_ip, w_ip in rows:
            bw = lambda t: size / t / 1e3 * factor if t > 0 else 0.0  # noqa: E731
            out_rows.append(dict(base, size=size, count=count, oop_time_us=t_oop, oop_busbw=bw(t_oop),
                                 ip_time_us=t_ip, ip_busbw=bw(t_ip), wrong=w_oop + w_ip))
        return out_rows, None, secs

    def stop_child(self):
        c = self.child
        if c is None or c.poll() is not None:
            return
        # railrun ends the whole job (every rank on every host) on SIGTERM
        try:
            os.killpg(c.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            c.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(c.pid, signal.SIGKILL)
            c.wait()

    def run(self):
        st = self.st
        self.tools()
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "logs").mkdir(exist_ok=True)
        (self.out / "study.json").write_text(json.dumps({
            "study_file": str(st.path), "name": st.name, "hostfile": str(st.hostfile or ""),
            "hosts": st.hosts, "railrun": self.railrun, "railperf": self.railperf, "commit": self.commit,
        }, indent=2) + "\n")
        results = self.out / "results.jsonl"
        rows = load_rows(results)
        done = {r["point"] for r in rows}
        failed = {r["point"]: r["why"] for r in load_rows(self.out / "failures.jsonl")}
        points = [(p, st.point_id(p)) for p in st.points()]
        skip_failed = {} if self.retry_failed else {pid: failed[pid] for _, pid in points
                                                    if pid in failed and pid not in done}
        todo = [(p, pid) for p, pid in points if pid not in done and pid not in skip_failed]
        prog = Progress(len(points), len(points) - len(todo), self.progress_out)
        already = sum(1 for _, pid in points if pid in done)
        if already:
            prog.message(f"railring.study: resuming {st.name}: {already} of {len(points)} points "
                         f"already done in {results}; running the {len(todo)} left")
        if skip_failed:
            prog.message(f"railring.study: {len(skip_failed)} point(s) failed before and are not "
                         f"retried (--retry-failed runs them again); see {self.out / 'failures.jsonl'}")
        failures = []
        previous = signal.signal(signal.SIGINT, self.on_sigint)
        try:
            for p, pid in todo:
                if self.interrupted:
                    break
                prog.show(f"running {p.label(st)} rep {p.rep}/{st.repetitions}")
                new, why, secs = self.run_point(p, pid, prog)
                if self.interrupted:
                    break
                prog.finished(secs)
                if new is None:
                    failures.append((p, why))
                    prog.message(f"railring.study: FAILED {p.label(st)} rep {p.rep}: {why} "
                                 f"(log: {self.out / 'logs' / (pid + '.log')}); not retried")
                    continue
                append_jsonl(results, new)
                rows.extend(new)
                write_csv(rows, self.out / "results.csv")
        finally:
            signal.signal(signal.SIGINT, previous)
        if self.interrupted:
            prog.message(f"railring.study: interrupted: {prog.done} of {len(points)} points done "
                         f"(in {results}); run the same command again to resume")
            raise Interrupted()
        prog.show("done")
        prog.message("")
        write_csv(rows, self.out / "results.csv")
        return rows, failures, skip_failed


def run_study(study, out, retry_failed=False, progress_out=sys.stderr):
    """Run (or resume) `study` into folder `out`; returns (rows, failures this run, failures
    skipped from an earlier run). Raises Interrupted on Ctrl-C after ending the running job."""
    return Runner(study, out, retry_failed, progress_out).run()

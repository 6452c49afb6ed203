"""Study files: what to measure, read from TOML (Python >= 3.11, or the tomli package) or JSON.

Every key and its meaning is in docs/python.md; ``examples/studies/`` has complete files.
Errors name the file and the key (``StudyError``); nothing is guessed.
"""

import itertools
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

COLLECTIVES = ["allreduce", "reducescatter", "allgather", "broadcast", "reduce", "alltoall", "sendrecv"]
ALGORITHMS = ["auto", "two_level", "ring", "recursive_doubling", "tree", "pairwise", "bruck"]
DTYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "bfloat16", "float", "double"]
KNOWN = {
    "name", "hostfile", "ssh", "nodes", "ranks_per_node", "emulate_nodes", "collectives", "sizes",
    "algorithms", "rails", "rail_ifnames", "repetitions", "iters", "warmup", "dtype", "op", "env",
    "fabric", "railrun", "railperf", "timeout", "scaling_size", "blocking",
}


class StudyError(Exception):
    """A study file that cannot be run; the message names the file and the key."""


def parse_size(s, where):
    if isinstance(s, int) and s >= 0:
        return s
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", str(s), re.IGNORECASE)
    if not m:
        raise StudyError(f"{where}: {s!r} is not a size (e.g. 8, 64K, 256M)")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


def human_size(b):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift} {unit}"
    return f"{b} B"


@dataclass(frozen=True)
class Point:
    """One railrun job of the matrix: one configuration, one repetition; it measures every size."""

    collective: str
    nodes: int
    ranks_per_node: int
    algorithm: str
    rails: int
    rep: int

    @property
    def nranks(self):
        return self.nodes * self.ranks_per_node

    def config(self):
        """The configuration (everything but the repetition), as a label for plots."""
        return (self.collective, self.nodes, self.ranks_per_node, self.algorithm, self.rails)

    def label(self, study):
        rails = f" rails={self.rails}" if study.rail_ifnames else ""
        return (f"{self.collective} nodes={self.nodes} rpn={self.ranks_per_node} "
                f"algo={self.algorithm}{rails}")


@dataclass
class Study:
    path: Path
    name: str
    nodes: list
    ranks_per_node: list
    collectives: list
    sizes: tuple  # (min, max, factor)
    algorithms: list
    rails: list
    rail_ifnames: list
    repetitions: int
    iters: int
    warmup: int
    dtype: str
    op: str
    env: dict
    hostfile: Path = None
    hosts: list = field(default_factory=list)
    ssh: str = None
    emulate_nodes: bool = False
    fabric: Path = None
    railrun: str = None
    railperf: str = None
    timeout: float = 600.0
    scaling_size: int = None
    blocking: bool = False

    def points(self):
        """The matrix, in the order it runs: repetitions innermost-last so a partial study has
        every configuration once before any has twice."""
        out = []
        for rep, coll, n, rpn, algo, rails in itertools.product(
                range(1, self.repetitions + 1), self.collectives, self.nodes, self.ranks_per_node,
                self.algorithms, self.rails):
            out.append(Point(coll, n, rpn, algo, rails, rep))
        return out

    def size_list(self):
        lo, hi, f = self.sizes
        s, out = lo, []
        while s <= hi:
            out.append(s)
            s *= f
        return out

    def point_id(self, p):
        """Stable identity of a point: the same study file gives the same ids, so a rerun skips
        what is done. Changing what a point measures (sizes, iterations, knobs) changes its id."""
        key = json.dumps([p.collective, p.nodes, p.ranks_per_node, p.algorithm, p.rails, p.rep,
                          list(self.sizes), self.iters, self.warmup, self.dtype, self.op,
                          sorted(self.env.items()), self.hosts[:p.nodes] if not self.emulate_nodes else "local",
                          self.rail_ifnames[:p.rails], self.blocking])
        import hashlib
        return hashlib.sha256(key.encode()).hexdigest()[:16]


def _read(path):
    text = path.read_text()
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise StudyError(f"{path}:{e.lineno}: {e.msg}") from None
    try:
        import tomllib
    except ImportError:
        try:
            import tomli as tomllib
        except ImportError:
            raise StudyError(f"{path}: TOML study files need Python >= 3.11 or the tomli package; "
                             f"or write the study as JSON") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise StudyError(f"{path}: {e}") from None


def read_hostfile(path):
    """Host names in order from an Open MPI (`host slots=N`) or Hydra (`host:N`) hostfile."""
    hosts = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        h = line.split()[0].split(":")[0]
        if not re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+", h):
            raise StudyError(f"{path}:{i}: {h!r} is not a host name")
        if h not in hosts:
            hosts.append(h)
    return hosts


def load(path):
    """Read and check a study file."""
    path = Path(path)
    if not path.exists():
        raise StudyError(f"{path}: no such study file")
    d = _read(path)
    if not isinstance(d, dict):
        raise StudyError(f"{path}: the study must be a table of keys")
    unknown = set(d) - KNOWN
    if unknown:
        raise StudyError(f"{path}: unknown key(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(KNOWN))})")
    base = path.parent

    def ints(key, default, lo=1):
        v = d.get(key, default)
        v = [v] if isinstance(v, int) else v
        if not isinstance(v, list) or not v or not all(isinstance(x, int) and x >= lo for x in v):
            raise StudyError(f"{path}: {key} must be a list of integers >= {lo}, not {v!r}")
        return v

    def strs(key, default, allowed):
        v = d.get(key, default)
        v = [v] if isinstance(v, str) else v
        if not isinstance(v, list) or not v:
            raise StudyError(f"{path}: {key} must be a list, not {v!r}")
        out = []
        for x in v:
            x = str(x).lower().replace("-", "_") if key == "algorithms" else str(x).lower().replace("_", "")
            if x not in allowed:
                raise StudyError(f"{path}: {key}: unknown {x!r} (expected one of {', '.join(allowed)})")
            out.append(x)
        return out

    sizes = d.get("sizes", {"min": "8", "max": "64M", "factor": 4})
    if isinstance(sizes, list):
        raise StudyError(f"{path}: sizes must be a table {{min, max, factor}} (railperf's -b/-e/-f)")
    try:
        lo = parse_size(sizes.get("min", 8), f"{path}: sizes.min")
        hi = parse_size(sizes.get("max", lo), f"{path}: sizes.max")
        f = int(sizes.get("factor", 2))
    except (AttributeError, ValueError):
        raise StudyError(f"{path}: sizes must be {{min = \"8\", max = \"64M\", factor = 4}}") from None
    if f < 2 or lo < 1 or hi < lo:
        raise StudyError(f"{path}: sizes: need 1 <= min <= max and factor >= 2")

    env = d.get("env", {})
    if not isinstance(env, dict) or not all(re.fullmatch(r"[A-Z_][A-Z0-9_]*", k) for k in env):
        raise StudyError(f"{path}: env must be a table of VARIABLE = \"value\"")
    env = {k: str(v) for k, v in env.items()}

    st = Study(
        path=path,
        name=str(d.get("name", path.stem)),
        nodes=ints("nodes", [1]),
        ranks_per_node=ints("ranks_per_node", [1]),
        collectives=strs("collectives", ["allreduce"], COLLECTIVES),
        sizes=(lo, hi, f),
        algorithms=strs("algorithms", ["auto"], ALGORITHMS),
        rails=ints("rails", [1]),
        rail_ifnames=[str(x) for x in d.get("rail_ifnames", [])],
        repetitions=ints("repetitions", 1)[0],
        iters=ints("iters", 20)[0],
        warmup=ints("warmup", 5, lo=0)[0],
        dtype=strs("dtype", "float", DTYPES)[0],
        op=str(d.get("op", "sum")),
        env=env,
        ssh=d.get("ssh"),
        emulate_nodes=bool(d.get("emulate_nodes", False)),
        railrun=d.get("railrun"),
        railperf=d.get("railperf"),
        timeout=float(d.get("timeout", 600)),
        blocking=bool(d.get("blocking", False)),
    )
    if st.op not in ("sum", "prod", "min", "max", "avg"):
        raise StudyError(f"{path}: op: unknown {st.op!r} (expected sum, prod, min, max or avg)")
    if "scaling_size" in d:
        st.scaling_size = parse_size(d["scaling_size"], f"{path}: scaling_size")
        if st.scaling_size not in st.size_list():
            raise StudyError(f"{path}: scaling_size {d['scaling_size']} is not one of the measured sizes")
    if "hostfile" in d:
        if st.emulate_nodes:
            raise StudyError(f"{path}: hostfile and emulate_nodes exclude each other")
        hf = (base / os.path.expandvars(d["hostfile"])).resolve()
        if not hf.exists():
            raise StudyError(f"{path}: hostfile {hf} does not exist")
        st.hostfile = hf
        st.hosts = read_hostfile(hf)
        if max(st.nodes) > len(st.hosts):
            raise StudyError(f"{path}: nodes asks for {max(st.nodes)} hosts but {hf} lists {len(st.hosts)}")
    elif not st.emulate_nodes and st.nodes != [1]:
        raise StudyError(f"{path}: nodes {st.nodes} needs a hostfile (or emulate_nodes = true to make "
                         f"nodes out of local ranks with RAILRING_HOST_ID)")
    if st.rail_ifnames and max(st.rails) > len(st.rail_ifnames):
        raise StudyError(f"{path}: rails asks for {max(st.rails)} but rail_ifnames lists {len(st.rail_ifnames)}")
    if not st.rail_ifnames and st.rails != [1]:
        raise StudyError(f"{path}: rails {st.rails} needs rail_ifnames (the interfaces, in order)")
    if "fabric" in d:
        st.fabric = (base / d["fabric"]).resolve()
        if not st.fabric.exists():
            raise StudyError(f"{path}: fabric file {st.fabric} does not exist")
    return st

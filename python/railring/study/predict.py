"""Predictions from ``railrun plan`` (built separately; optional): for each configuration of a
study with a ``fabric`` file, the predicted busbw per size, to plot against the measurement.

Keyed on the command existing: when this railrun has no ``plan`` sub-command, or its JSON has
no rows this reader understands, the study says so and draws the other plots.
"""

import json
import subprocess


def plan_available(railrun):
    try:
        r = subprocess.run([railrun, "plan", "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0 and "--fabric" in (r.stdout + r.stderr)


SIZE_KEYS = ("size", "bytes", "size_bytes")
BUSBW_KEYS = ("busbw", "busbw_gbps", "predicted_busbw", "bus_bw", "busbw_gb_s")
ALGO_KEYS = ("algo", "algorithm")


def _rows(doc):
    """Every dict in the JSON document with a size and a busbw."""
    stack = [doc]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            size = next((x[k] for k in SIZE_KEYS if isinstance(x.get(k), (int, float))), None)
            bw = next((x[k] for k in BUSBW_KEYS if isinstance(x.get(k), (int, float))), None)
            if size is not None and bw is not None:
                algo = next((str(x[k]) for k in ALGO_KEYS if k in x), None)
                yield int(size), float(bw), algo
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)


def predict(study, railrun, configs, warn):
    """{config: {size: busbw}} for `configs` (collective, nodes, rpn, algorithm, rails)."""
    lo, hi, f = study.sizes
    out = {}
    for c in configs:
        coll, nodes, rpn, algo, _rails = c
        cmd = [railrun, "plan", "--fabric", str(study.fabric), "--ranks", str(nodes * rpn),
               "-b", str(lo), "-e", str(hi), "-f", str(f), "--collective", coll, "--json"]
        if algo != "auto":
            cmd += ["--algo", algo]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as e:
            warn(f"railrun plan failed ({e}); no prediction for {c}")
            continue
        if r.returncode != 0:
            warn(f"`{' '.join(cmd)}` exited {r.returncode}: {r.stderr.strip()[-300:]}; no prediction for {c}")
            continue
        try:
            doc = json.loads(r.stdout)
        except json.JSONDecodeError:
            warn(f"`{' '.join(cmd)}` did not print JSON; no prediction for {c}")
            continue
        got = {}
        for size, bw, a in _rows(doc):
            if algo == "auto" or a is None or a.replace("-", "_") == algo:
                got.setdefault(size, bw)
        if got:
            out[c] = got
        else:
            warn(f"`{' '.join(cmd)}`: no rows with a size and a busbw in its JSON; no prediction for {c}")
    return out

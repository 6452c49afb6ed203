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


def _rows(doc, algo):
    """(size, predicted busbw in GB/s) per row of `railrun plan --json`: the named algorithm's,
    or with `auto` the one the planner chose."""
    rows = doc.get("rows") if isinstance(doc, dict) else None
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, dict):
            continue
        algos = row.get("algos") if isinstance(row.get("algos"), dict) else {}
        name = row.get("choice") if algo == "auto" else algo
        got = algos.get(name) if name else None
        if isinstance(row.get("size"), int) and isinstance(got, dict):
            bw = got.get("busbw_gbs")
            if isinstance(bw, (int, float)):
                yield row["size"], float(bw)


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
        got = dict(_rows(doc, algo.replace("-", "_")))
        if got:
            out[c] = got
        else:
            warn(f"`{' '.join(cmd)}`: no predicted busbw for algorithm {algo} in its JSON; no prediction for {c}")
    return out

"""The figures of a study, as SVG and PNG (matplotlib, headless):

- ``busbw_<collective>``: bus bandwidth vs message size, one line per configuration (nodes,
  ranks per node, algorithm, rails); the median over repetitions, bars from min to max;
- ``scaling_<collective>``: scaling efficiency vs node count at one size — busbw on N nodes
  divided by busbw on the fewest nodes measured (busbw is normalised so that a perfect
  fabric keeps it constant as nodes are added: 100 % is ideal);
- ``predicted_<collective>``: measured busbw (markers) vs ``railrun plan``'s prediction
  (lines), when the study names a fabric file and this railrun has the ``plan`` command.

Every plot uses in-place busbw (railperf's "in-place" columns).
"""

import statistics
from collections import defaultdict

from .spec import human_size


class NoMatplotlib(Exception):
    pass


def _plt():
    try:
        import matplotlib
    except ImportError:
        raise NoMatplotlib("plots need matplotlib (pip install matplotlib, or "
                           "pip install 'railring[study]'); the CSV and JSON results are complete "
                           "without it") from None
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"  # real, editable text in the SVG
    import matplotlib.pyplot as plt

    return plt


def config_label(c, study):
    coll, nodes, rpn, algo, rails = c
    s = f"{nodes} node{'s' if nodes != 1 else ''} × {rpn} rank{'s' if rpn != 1 else ''}, {algo.replace('_', '-')}"
    if study.rail_ifnames:
        s += f", {rails} rail{'s' if rails != 1 else ''}"
    return s


def panel_label(c, study, with_rpn):
    """A configuration inside its node count's panel: algorithm (rails, ranks per node)."""
    _, _, rpn, algo, rails = c
    s = algo.replace("_", "-")
    if study.rail_ifnames:
        s += f", {rails} rail{'s' if rails != 1 else ''}"
    if with_rpn:
        s += f", {rpn} rank{'s' if rpn != 1 else ''}/node"
    return s


def aggregate(rows, metric="ip_busbw"):
    """{config: {size: [values over repetitions]}}. A one-rank job moves no bytes between ranks
    (its busbw is 0 by definition): left out."""
    agg = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r["nranks"] < 2:
            continue
        c = (r["collective"], r["nodes"], r["ranks_per_node"], r["algorithm"], r["rails"])
        agg[c][r["size"]].append(r[metric])
    return agg


def _size_axis(ax, sizes):
    ax.set_xscale("log", base=2)
    ticks = sorted(sizes)
    if len(ticks) > 10:
        step = (len(ticks) + 9) // 10
        ticks = ticks[::step]
    ax.set_xticks(ticks)
    ax.set_xticklabels([human_size(s) for s in ticks], rotation=45, ha="right")
    ax.minorticks_off()
    ax.set_xlabel("message size (bytes, log scale)")


def _save(fig, out, stem):
    paths = []
    for ext in ("svg", "png"):
        p = out / f"{stem}.{ext}"
        fig.savefig(p, dpi=110, bbox_inches="tight")
        paths.append(p)
    return paths


def _note(study):
    where = ("nodes emulated on one machine (RAILRING_HOST_ID)" if study.emulate_nodes else
             f"hosts from {study.hostfile.name}" if study.hostfile else "one machine")
    return f"{study.dtype} {study.op}, railperf -n {study.iters} -w {study.warmup}; {where}"


def plot_busbw(study, rows, out):
    """One figure per collective, one panel per node count (each with its own y scale: a node's
    shared memory and a network differ by orders of magnitude), one line per configuration."""
    plt = _plt()
    agg = aggregate(rows)
    paths = []
    for coll in study.collectives:
        configs = sorted(c for c in agg if c[0] == coll)
        if not configs:
            continue
        nodes = sorted({c[1] for c in configs})
        fig, axes = plt.subplots(1, len(nodes), figsize=(4.6 * len(nodes) + 1.5, 5.2), squeeze=False)
        sizes = set()
        many_rpn = len({c[2] for c in configs}) > 1
        for ax, nn in zip(axes[0], nodes):
            for c in (c for c in configs if c[1] == nn):
                xs = sorted(agg[c])
                sizes.update(xs)
                med = [statistics.median(agg[c][s]) for s in xs]
                lo = [m - min(agg[c][s]) for m, s in zip(med, xs)]
                hi = [max(agg[c][s]) - m for m, s in zip(med, xs)]
                ax.errorbar(xs, med, yerr=[lo, hi], marker="o", markersize=3.5, capsize=2.5,
                            linewidth=1.4, label=panel_label(c, study, many_rpn))
            _size_axis(ax, sizes)
            ax.set_ylabel("bus bandwidth (GB/s)")
            ax.set_ylim(bottom=0)
            rpn = sorted({c[2] for c in configs if c[1] == nn})
            ax.set_title(f"{nn} node{'s' if nn != 1 else ''} × {'/'.join(map(str, rpn))} rank{'s' if rpn != [1] else ''}",
                         fontsize=10)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8, loc="best")
        reps = study.repetitions
        fig.suptitle(f"{study.name}: {coll} bus bandwidth vs size — median of {reps} run{'s' if reps != 1 else ''} "
                     f"(bars: min–max)\n{_note(study)}", fontsize=10)
        fig.tight_layout()
        paths += _save(fig, out, f"busbw_{coll}")
        plt.close(fig)
    return paths


def plot_scaling(study, rows, out):
    if len(study.nodes) < 2:
        return []
    plt = _plt()
    agg = aggregate(rows)
    size = study.scaling_size or max(study.size_list())
    paths = []
    for coll in study.collectives:
        groups = defaultdict(dict)  # (rpn, algo, rails) -> {nodes: median busbw}
        for c, by_size in agg.items():
            if c[0] == coll and size in by_size:
                groups[(c[2], c[3], c[4])][c[1]] = statistics.median(by_size[size])
        groups = {g: v for g, v in groups.items() if len(v) >= 2}
        if not groups:
            continue
        fig, ax = plt.subplots(figsize=(8, 5))
        allnodes = sorted({n for v in groups.values() for n in v})
        ax.axhline(100, color="grey", linestyle="--", linewidth=1, label="ideal (constant busbw)")
        for (rpn, algo, rails), v in sorted(groups.items()):
            ns = sorted(v)
            base = v[ns[0]]
            eff = [100 * v[n] / base if base > 0 else 0 for n in ns]
            lab = config_label((coll, 0, rpn, algo, rails), study).split(", ", 1)
            lab = f"{rpn} rank{'s' if rpn != 1 else ''}/node, {lab[1]}"
            ax.plot(ns, eff, marker="o", linewidth=1.6, label=lab)
            for n, e, in zip(ns, eff):
                ax.annotate(f"{v[n]:.2f}", (n, e), textcoords="offset points", xytext=(0, 6),
                            ha="center", fontsize=7)
        ax.set_xscale("log", base=2)
        ax.set_xticks(allnodes)
        ax.set_xticklabels([str(n) for n in allnodes])
        ax.minorticks_off()
        ax.set_xlabel("nodes")
        ax.set_ylabel(f"scaling efficiency (%): busbw / busbw on {allnodes[0]} node{'s' if allnodes[0] != 1 else ''}")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{study.name}: {coll} scaling at {human_size(size)} (labels: busbw in GB/s)\n{_note(study)}",
                     fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        paths += _save(fig, out, f"scaling_{coll}")
        plt.close(fig)
    return paths


def plot_predicted(study, rows, predictions, out):
    """`predictions`: {config: {size: predicted busbw}} (from predict.py)."""
    if not predictions:
        return []
    plt = _plt()
    agg = aggregate(rows)
    paths = []
    for coll in study.collectives:
        configs = sorted(c for c in agg if c[0] == coll and c in predictions)
        if not configs:
            continue
        fig, ax = plt.subplots(figsize=(9, 5.2))
        sizes = set()
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for i, c in enumerate(configs):
            col = colors[i % len(colors)]
            xs = sorted(agg[c])
            sizes.update(xs)
            ax.plot(xs, [statistics.median(agg[c][s]) for s in xs], "o", color=col, markersize=4,
                    label=f"measured: {config_label(c, study)}")
            px = sorted(predictions[c])
            ax.plot(px, [predictions[c][s] for s in px], "--", color=col, linewidth=1.4,
                    label=f"railrun plan: {config_label(c, study)}")
        _size_axis(ax, sizes)
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{study.name}: {coll} measured vs predicted (fabric {study.fabric.name})", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        paths += _save(fig, out, f"predicted_{coll}")
        plt.close(fig)
    return paths

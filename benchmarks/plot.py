#!/usr/bin/env python3
"""Plots from a weft benchmark run.

Reads Google Benchmark JSON (--benchmark_out=FILE --benchmark_out_format=json) and weft-perf's
--json output, in any mix (the format is detected from the content), and writes into OUTDIR, per
(operation, transport + ranks + topology) group:

  busbw_<op>_<group>.png  bus bandwidth vs message size, one line per algorithm; peers (the
                          libraries weft is compared with) dashed, the run's memcpy bandwidth
                          as a horizontal reference
  model_<op>_<group>.png  measured time vs the cost model's prediction, log-log, with y = x and
                          the +-25% band the suite must stay inside at >= 1 MiB
  summary.md              the same figures as markdown tables

A peer is a row with a true `peer` counter (weft_peer_suite writes one on MPI's and Gloo's
rows), or, in files written before that counter, an MPI_* algorithm or a gloo transport. weft's
own rows that the model does not price stay weft's: solid, outside the model check.

Repetitions of one case are collapsed to their median only within one file. The same case in
two files (comm_collectives_bench's and weft_peer_suite's local4 rows, say) comes from two runs,
so it becomes two series, each labelled with its file, and a warning says so.

Usage: python3 benchmarks/plot.py RUN.json [MORE.json ...] -o OUTDIR
Needs python3-matplotlib (Debian); nothing else outside the standard library.
"""

import argparse
import json
import math
import os
import re
import statistics
import sys
import textwrap
from collections import defaultdict

MIB = 1 << 20
TOLERANCE = 0.25  # measured/model must lie in [1 - TOLERANCE, 1 + TOLERANCE] at >= 1 MiB
PROG = "plot.py"

# Google Benchmark appends these to a name; they say how it ran, not what ran.
RUN_SUFFIX = re.compile(r"^(iterations|repeats|min_time|min_warmup_time|threads):.*$|^(manual|real|process)_time$")
GROUP_NAME = re.compile(r"^([A-Za-z_]+?)(\d+)(?:@(.+))?$")


class InputError(Exception):
  """Bad input: reported on one line, exit status 2."""


def warn(message):
  print(f"{PROG}: warning: {message}", file=sys.stderr)


def size_label(n):
  """4 -> 4B, 4096 -> 4KiB, 1048576 -> 1MiB; non-round sizes keep a decimal."""
  for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
    if n >= scale:
      value = n / scale
      return f"{value:g}{unit}" if value == int(value) else f"{value:.1f}{unit}"
  return f"{int(n)}B"


def sanitize(text):
  """File-name-safe: only letters, digits, '.', '-', '_' survive (no <, >, spaces, @ or /)."""
  return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")


def number(value):
  """A counter as float, or None when absent, null or not a finite number."""
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return None
  return float(value) if math.isfinite(value) else None


def group_parts(group):
  """'local8@2x4' -> ('local', 8, '2x4'); ranks None when the name carries none."""
  m = GROUP_NAME.match(group)
  return (m.group(1), int(m.group(2)), m.group(3) or "") if m else (group, None, "")


def is_peer_name(group, algorithm):
  """Peers of files written before the `peer` counter: MPI's own collectives and Gloo's."""
  return algorithm.startswith("MPI_") or group_parts(group)[0] == "gloo"


def gbench_rows(doc, path, memcpy):
  rows = []
  to_us = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
  for b in doc.get("benchmarks", []):
    name = b.get("name", "?")
    if b.get("run_type") == "aggregate":
      continue
    if b.get("error_occurred"):
      warn(f"{path}: skipping {name}: {b.get('error_message', 'error_occurred')}")
      continue
    parts = name.split("/")
    while parts and RUN_SUFFIX.match(parts[-1]):
      parts.pop()
    if len(parts) == 2 and parts[0] == "memcpy" and parts[1].isdigit():
      if number(b.get("GBps")) is not None:
        memcpy[int(parts[1])].append(number(b["GBps"]))
      continue
    if parts == ["stream_add"]:  # the suites' streaming-bandwidth reference: no curve of its own
      continue
    if len(parts) < 4 or not parts[-1].isdigit():
      warn(f"{path}: skipping {name}: not <op>/<transport><ranks>[@topology]/<algorithm>/<bytes>")
      continue
    time_us = number(b.get("time_us"))
    if time_us is None and number(b.get("real_time")) is not None:
      time_us = number(b["real_time"]) * to_us.get(b.get("time_unit", "ns"), 1e-3)
    algorithm = "/".join(parts[2:-1])
    peer = bool(number(b.get("peer"))) or is_peer_name(parts[1], algorithm)
    rows.append({"op": parts[0], "group": parts[1], "algorithm": algorithm, "variant": "",
                 "bytes": int(parts[-1]), "time_us": time_us, "busbw": number(b.get("busbw_GBps")),
                 "model_us": number(b.get("model_us")), "chosen": "", "peer": peer, "source": path})
  return rows


def perf_rows(doc, path):
  rows = []
  for i, r in enumerate(doc["rows"]):
    try:
      group = f"{r['transport']}{r['ranks']}" + (f"@{r['topology']}" if r.get("topology") else "")
      row = {"op": r["op"], "group": group, "algorithm": r["algorithm"],
             "variant": " ".join(str(r[k]) for k in ("dtype", "redop") if r.get(k)), "bytes": int(r["bytes"]),
             "time_us": number(r.get("time_us")), "busbw": number(r.get("busbw_GBps")),
             "model_us": number(r.get("model_us")), "chosen": r.get("chosen") or "", "peer": False,
             "source": path}
    except (KeyError, TypeError, ValueError) as e:
      raise InputError(f"{path}: rows[{i}] lacks or mangles field {e}") from None
    if (number(r.get("wrong")) or 0) > 0:  # -1: not checked (weft-perf -c 0)
      warn(f"{path}: {r['op']} {group} {r['algorithm']} {size_label(row['bytes'])}: {r['wrong']} wrong elements")
    rows.append(row)
  return rows


def load(paths):
  """All rows of all files, and the memcpy GB/s by size."""
  rows, memcpy = [], defaultdict(list)
  for path in paths:
    try:
      with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    except OSError as e:
      raise InputError(f"cannot read {path}: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise InputError(f"{path} is not valid JSON: {e}") from None
    if isinstance(doc, dict) and isinstance(doc.get("benchmarks"), list):
      rows += gbench_rows(doc, path, memcpy)
    elif isinstance(doc, dict) and isinstance(doc.get("rows"), list):
      rows += perf_rows(doc, path)
    else:
      raise InputError(f"{path}: neither Google Benchmark JSON ('benchmarks') nor weft-perf JSON ('rows')")
  if not rows:
    raise InputError("no benchmark rows in " + ", ".join(paths))
  return rows, memcpy


def source_names(rows):
  """Each input file's name for a series label: its base name, or the path where two share one."""
  paths = sorted({r["source"] for r in rows})
  short = {p: os.path.basename(p) for p in paths}
  return short if len(set(short.values())) == len(paths) else {p: p for p in paths}


def collate(rows):
  """{(op, group): {(algorithm, variant, source): {bytes: row}}}. Repetitions of one case collapse
  to the median-time row, but only within one file: a series found in several files is kept once
  per file (source: the file's name; "" where only one file has the series)."""
  cases = defaultdict(list)
  for r in rows:
    cases[(r["op"], r["group"], r["algorithm"], r["variant"], r["source"], r["bytes"])].append(r)
  files = defaultdict(set)
  for op, group, algorithm, variant, source, _ in cases:
    files[(op, group, algorithm, variant)].add(source)
  names = source_names(rows)
  for (op, group, algorithm, variant), sources in sorted(files.items()):
    if len(sources) > 1:
      warn(f"{op} {group} {series_label(algorithm, variant, True)} is in " + " and ".join(names[s] for s in sorted(sources))
           + ": separate runs, drawn as one series per file")
  groups = defaultdict(lambda: defaultdict(dict))
  for (op, group, algorithm, variant, source, nbytes), reps in cases.items():
    reps.sort(key=lambda r: r["time_us"] if r["time_us"] is not None else math.inf)
    label = names[source] if len(files[(op, group, algorithm, variant)]) > 1 else ""
    groups[(op, group)][(algorithm, variant, label)][nbytes] = reps[(len(reps) - 1) // 2]
  return groups


def plot_title(op, group, what):
  """Two or more lines: a topology spec can be longer than the figure is wide."""
  return "\n".join(textwrap.wrap(f"{op} on {group.replace(',', ', ')}", 64) + [what])


def series_label(algorithm, variant, show_variant, source=""):
  label = f"{algorithm} [{variant}]" if show_variant and variant else algorithm
  return f"{label} ({source})" if source else label


def is_peer(points):
  return any(r["peer"] for r in points.values())


def peers_from_elsewhere(groups, op, group):
  """Peers run by another transport on the same ranks and topology (e.g. gloo4 beside local4):
  shown in this group's plot so weft and the libraries it is compared with share one figure."""
  _, ranks, topo = group_parts(group)
  found = {}
  for (other_op, other), series in sorted(groups.items()):
    if other_op != op or other == group or ranks is None or group_parts(other)[1:] != (ranks, topo):
      continue
    for (algorithm, variant, source), points in sorted(series.items()):
      if is_peer(points):
        found[(f"{other}/{algorithm}", variant, source)] = points
  return found


def size_axis(ax, sizes):
  ax.set_xscale("log", base=2)
  lo, hi = int(math.floor(math.log2(min(sizes)))), int(math.ceil(math.log2(max(sizes))))
  # Label every power of 2, 4 or 1024 (4B 16B .. 1KiB .. 1MiB), whichever keeps it to 14 labels or fewer.
  step = next((s for s in (1, 2, 4) if (hi - lo) // s < 14), 10)
  ticks = [1 << e for e in range(lo, hi + 1) if e % step == 0]
  ax.set_xticks(ticks)
  ax.set_xticklabels([size_label(t) for t in ticks], rotation=45 if len(ticks) > 6 else 0)
  ax.minorticks_off()
  ax.set_xlabel("message size")


def plot_busbw(figure_cls, path, title, series, memcpy_ref):
  fig = figure_cls(figsize=(9, 5.5))
  ax = fig.add_subplot()
  sizes = []
  for (label, peer), points in series:
    xs = [b for b in sorted(points) if b > 0 and points[b]["busbw"] is not None]
    sizes += xs
    ax.plot(xs, [points[b]["busbw"] for b in xs], "--" if peer else "-", marker="o", markersize=3,
            label=label + (" (peer)" if peer else ""))
  top = max(r["busbw"] for _, points in series for r in points.values() if r["busbw"] is not None)
  if memcpy_ref:
    label = f"memcpy {memcpy_ref[1]:.3g} GB/s ({size_label(memcpy_ref[0])})"
    # Emulated slow links sit far below the copy bandwidth; drawn to scale, the curves would be flat.
    if memcpy_ref[1] > 3 * top:
      ax.plot([], [], color="black", linestyle=":", label=label + ", off scale")
    else:
      ax.axhline(memcpy_ref[1], color="black", linestyle=":", linewidth=1.2, label=label)
  size_axis(ax, sizes)
  ax.set_ylabel("busbw (GB/s)")
  ax.set_ylim(0, max(top, memcpy_ref[1] if memcpy_ref and memcpy_ref[1] <= 3 * top else 0) * 1.08 or 1)
  ax.set_title(title, fontsize="medium")
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize="small")
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def plot_model(figure_cls, path, title, series):
  fig = figure_cls(figsize=(7, 6.5))
  ax = fig.add_subplot()
  values = []
  for index, (label, points) in enumerate(series):
    pts = [points[b] for b in sorted(points) if (points[b]["model_us"] or 0) > 0 and (points[b]["time_us"] or 0) > 0]
    color = f"C{index % 10}"
    ax.plot([r["model_us"] for r in pts], [r["time_us"] for r in pts], "-", color=color, alpha=0.4, linewidth=0.8)
    for r in pts:  # filled where the 25% target applies (>= 1 MiB), hollow below
      ax.plot(r["model_us"], r["time_us"], "o", color=color, markerfacecolor=color if r["bytes"] >= MIB else "none")
    ax.plot([], [], "o", color=color, label=label)
    values += [v for r in pts for v in (r["model_us"], r["time_us"])]
  lo, hi = min(values) / 2, max(values) * 2
  ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, label="measured = model")
  ax.fill_between([lo, hi], [lo * (1 - TOLERANCE), hi * (1 - TOLERANCE)], [lo * (1 + TOLERANCE), hi * (1 + TOLERANCE)],
                  color="gray", alpha=0.2, label=f"±{TOLERANCE:.0%}")
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlim(lo, hi)
  ax.set_ylim(lo, hi)
  ax.set_xlabel("cost model time (us)")
  ax.set_ylabel("measured time (us)")
  ax.set_title(title, fontsize="medium")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize="small")
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def summary_section(op, group, series):
  """Markdown for one group: busbw per size and series, then measured/model at >= 1 MiB."""
  labels = [label for (label, _), _ in series]
  sizes = sorted({b for _, points in series for b in points})
  out = [f"## {op} on `{group}`", "", "busbw (GB/s); peers marked *", "",
         # Names in backticks: a bare hierarchical<ring> would be read as an HTML tag.
         "| size | " + " | ".join(f"`{label}`" + ("*" if peer else "") for (label, peer), _ in series) + " |",
         "|---" * (len(labels) + 1) + "|"]
  for b in sizes:
    cells = []
    for _, points in series:
      r = points.get(b)
      cells.append(f"{r['busbw']:.3g}" if r and r["busbw"] is not None else "")
    out.append(f"| {size_label(b)} | " + " | ".join(cells) + " |")
  checks = [(label, r) for (label, peer), points in series if not peer
            for b, r in sorted(points.items()) if b >= MIB and r["model_us"] and r["time_us"] is not None]
  if checks:
    out += ["", f"measured vs cost model at >= 1 MiB (inside: ratio within 1 ± {TOLERANCE:g})", "",
            f"| algorithm | size | measured us | model us | measured/model | inside {TOLERANCE:.0%} |",
            "|---" * 6 + "|"]
    for label, r in checks:
      ratio = r["time_us"] / r["model_us"]
      name = f"`{label}`" + (f" (chose `{r['chosen']}`)" if r["chosen"] and r["chosen"] != r["algorithm"] else "")
      inside = "yes" if abs(ratio - 1) <= TOLERANCE else "**no**"
      out.append(f"| {name} | {size_label(r['bytes'])} | {r['time_us']:.1f} | {r['model_us']:.1f} | {ratio:.2f} "
                 f"| {inside} |")
  return out + [""]


def main(argv=None):
  parser = argparse.ArgumentParser(
      prog=PROG, description="Plot busbw vs size and measured vs predicted time from weft benchmark JSON "
      "(Google Benchmark --benchmark_out or weft-perf --json; several files are merged).")
  parser.add_argument("inputs", nargs="+", metavar="RUN.json", help="benchmark JSON files of one run")
  parser.add_argument("-o", "--outdir", required=True, help="folder for the PNGs and summary.md (created)")
  args = parser.parse_args(argv)
  try:
    rows, memcpy = load(args.inputs)
  except InputError as e:
    print(f"{PROG}: error: {e}", file=sys.stderr)
    return 2
  try:
    import matplotlib
    matplotlib.use("Agg")  # files only, never a display
    from matplotlib.figure import Figure
  except ImportError:
    print(f"{PROG}: error: matplotlib is missing for {sys.executable} (Debian: apt-get install python3-matplotlib, "
          "which serves /usr/bin/python3)", file=sys.stderr)
    return 2
  try:
    os.makedirs(args.outdir, exist_ok=True)
  except OSError as e:
    print(f"{PROG}: error: cannot create {args.outdir}: {e.strerror}", file=sys.stderr)
    return 2

  # The copy bandwidth at the largest size copied: the streaming (DRAM) figure, not a cache hit.
  memcpy_ref = (max(memcpy), statistics.median(memcpy[max(memcpy)])) if memcpy else None
  groups = collate(rows)
  summary = ["# weft benchmark summary", "", "Inputs: " + ", ".join(f"`{p}`" for p in args.inputs), ""]
  if memcpy_ref:
    summary += [f"memcpy: {memcpy_ref[1]:.3g} GB/s at {size_label(memcpy_ref[0])}", ""]
  written = []
  for (op, group), own in sorted(groups.items()):
    show_variant = len({variant for _, variant, _ in own}) > 1
    series = [((series_label(a, v, show_variant, s), is_peer(p)), p) for (a, v, s), p in sorted(own.items())]
    if any(not peer for (_, peer), _ in series):
      series += [((series_label(a, v, show_variant, s), True), p)
                 for (a, v, s), p in peers_from_elsewhere(groups, op, group).items()]
    stem = sanitize(f"{op}_{group}")
    if any(r["busbw"] is not None and r["bytes"] > 0 for _, p in series for r in p.values()):
      written.append(os.path.join(args.outdir, f"busbw_{stem}.png"))
      plot_busbw(Figure, written[-1], plot_title(op, group, "bus bandwidth"), series, memcpy_ref)
    # weft's rows the model prices (two_level's rank-block path, for one, it does not).
    modelled = [(label, p) for (label, peer), p in series
                if not peer and any((r["model_us"] or 0) > 0 and (r["time_us"] or 0) > 0 for r in p.values())]
    if modelled:
      written.append(os.path.join(args.outdir, f"model_{stem}.png"))
      plot_model(Figure, written[-1], plot_title(op, group, "measured vs cost model (filled: >= 1 MiB)"), modelled)
    summary += summary_section(op, group, series)
  written.append(os.path.join(args.outdir, "summary.md"))
  with open(written[-1], "w", encoding="utf-8") as f:
    f.write("\n".join(summary))
  for path in written:
    print(path)
  return 0


if __name__ == "__main__":
  sys.exit(main())

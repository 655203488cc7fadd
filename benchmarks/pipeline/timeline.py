#!/usr/bin/env python3
"""Draws pipeline schedules as timelines, one panel each, idle time shown, on one time axis.

  # run weft-schedule for 1F1B, interleaved (V=2) and ZB-H1 at the same p and m:
  python3 benchmarks/pipeline/timeline.py --tool build/benchmarks/schedule/weft-schedule \\
      --stages 4 --microbatches 8 -o docs/img/pipeline_timeline.png

  # or draw traces written before (weft-schedule --format trace), with the statistics of
  # --format json runs of the same schedules if given:
  python3 benchmarks/pipeline/timeline.py 1f1b.trace.json 1f1b.json zb.trace.json -o out.png

A trace holds the simulated times (one event per compute action and per idle gap); the json
output holds the orders and statistics but no times, so each json file must come with the
trace of the same schedule, and gives its panel the bubble over the ideal compute time.
Exit status: 0, 2 for bad input (the message says which file and why). Needs matplotlib
(Debian: python3-matplotlib), which is loaded only once the input has been read.
"""

import argparse
import json
import os
import re
import subprocess
import sys

SCHEDULES = [("1f1b", []), ("interleaved", ["--chunks", "2"]), ("zb-h1", [])]
TITLES = {"1f1b": "1F1B", "gpipe": "GPipe", "zb-h1": "ZB-H1"}
COLOURS = {"forward": "#4C72B0", "backward": "#55A868", "weight": "#C44E52"}


class BadInput(Exception):
  pass


def read_json(path):
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except OSError as e:
    raise BadInput(f"{path}: cannot read: {e.strerror}") from e
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise BadInput(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from e


def parse_trace(doc, path):
  """The schedule's name, p, m and each rank's events (name, category, start, duration)."""
  header = None
  ranks = {}
  for i, e in enumerate(doc.get("traceEvents", [])):
    if not isinstance(e, dict):
      raise BadInput(f"{path}: traceEvents[{i}] is not an object")
    if e.get("ph") == "M":
      if e.get("name") == "process_name":
        header = str(e.get("args", {}).get("name", ""))
      continue
    if e.get("ph") != "X":
      continue
    try:
      ranks.setdefault(int(e["tid"]), []).append((str(e["name"]), str(e["cat"]), float(e["ts"]), float(e["dur"])))
    except (KeyError, TypeError, ValueError) as err:
      raise BadInput(f"{path}: traceEvents[{i}] lacks a tid, name, cat, ts or dur") from err
  m = re.fullmatch(r"weft-schedule (\S+) p=(\d+) m=(\d+)", header or "")
  if m is None:
    raise BadInput(f"{path}: no 'weft-schedule NAME p=P m=M' process name: not weft-schedule's trace")
  if not ranks:
    raise BadInput(f"{path}: the trace has no events")
  if max(start + dur for events in ranks.values() for _, _, start, dur in events) <= 0:
    # weft-schedule accepts --costs 0,0,0, but a step of no time has no idle share and nothing to draw.
    raise BadInput(f"{path}: the step takes no time (every action costs 0?): nothing to draw")
  return {"name": m.group(1), "stages": int(m.group(2)), "microbatches": int(m.group(3)), "ranks": ranks,
          "path": path}


def load(paths):
  """Panels, in the order of their traces, with the statistics of matching json files."""
  panels, stats = [], []
  for path in paths:
    doc = read_json(path)
    if isinstance(doc, dict) and "traceEvents" in doc:
      panels.append(parse_trace(doc, path))
    elif isinstance(doc, dict) and "statistics" in doc and "schedule" in doc:
      stats.append((path, doc))
    else:
      raise BadInput(f"{path}: neither weft-schedule's --format trace nor its --format json")
  if not panels:
    raise BadInput("no trace given: the timeline needs --format trace output (json has no times)")
  for path, doc in stats:
    key = (doc["schedule"], doc.get("stages"), doc.get("microbatches"))
    match = [p for p in panels if (p["name"], p["stages"], p["microbatches"]) == key]
    if not match:
      raise BadInput(f"{path}: statistics of {key[0]} p={key[1]} m={key[2]}, but no trace of that schedule "
                     "is given (json has no times)")
    for p in match:
      p["statistics"] = doc["statistics"]
  return panels


def run_tool(tool, stages, microbatches, costs, workdir):
  """Runs weft-schedule for each of SCHEDULES in both formats; returns the files written."""
  paths = []
  for name, extra in SCHEDULES:
    args = [tool, "--schedule", name, "--stages", str(stages), "--microbatches", str(microbatches),
            "--costs", costs, *extra]
    for fmt in ("trace", "json"):
      try:
        out = subprocess.run([*args, "--format", fmt], capture_output=True, text=True, timeout=60)
      except OSError as e:
        raise BadInput(f"{tool}: cannot run: {e.strerror}") from e
      if out.returncode != 0:
        raise BadInput(f"{' '.join(args)} --format {fmt} failed: {out.stderr.strip()}")
      path = os.path.join(workdir, f"{name}.{fmt}.json")
      with open(path, "w", encoding="utf-8") as f:
        f.write(out.stdout)
      paths.append(path)
  return paths


def title(panel):
  name = panel["name"]
  m = re.fullmatch(r"interleaved<(\d+)>", name)
  label = f"interleaved, V={m.group(1)}" if m else TITLES.get(name, name)
  events = [e for r in panel["ranks"].values() for e in r]
  step = max(start + dur for _, _, start, dur in events)
  idle = sum(dur for _, cat, _, dur in events if cat == "idle")
  text = f"{label}: p={panel['stages']}, m={panel['microbatches']}, step {step:g}, idle {idle / (step * len(panel['ranks'])):.1%}"
  if "statistics" in panel:
    text += f", bubble {panel['statistics']['bubble_over_ideal']:.1%} of the ideal"
  return text


def draw(panels, out):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.patches import Patch

  end = max(s + d for p in panels for r in p["ranks"].values() for _, _, s, d in r)
  fig, axes = plt.subplots(len(panels), 1, figsize=(12, 1.0 + 0.55 * sum(len(p["ranks"]) for p in panels) +
                                                    0.6 * len(panels)), sharex=True, squeeze=False)
  for ax, panel in zip(axes[:, 0], panels):
    for rank, events in sorted(panel["ranks"].items()):
      for name, cat, start, dur in events:
        if cat == "idle":
          ax.barh(rank, dur, left=start, height=0.8, color="#EEEEEE", edgecolor="#BBBBBB", hatch="///", lw=0.5)
          continue
        chunk = int(name.split(".")[1]) if "." in name else 0
        ax.barh(rank, dur, left=start, height=0.8, color=COLOURS.get(cat, "#888888"), alpha=1.0 - 0.35 * chunk,
                edgecolor="white", lw=0.8)
        ax.text(start + dur / 2, rank, name[1:].split(".")[0], ha="center", va="center", fontsize=7, color="white")
    ranks = sorted(panel["ranks"])
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_ylim(max(ranks) + 0.6, min(ranks) - 0.6)
    ax.set_xlim(0, end)
    ax.set_title(title(panel), fontsize=10, loc="left")
    ax.tick_params(axis="y", length=0)
  axes[-1, 0].set_xlabel("simulated time (the unit of --costs; label: microbatch; lighter: chunk 1)")
  handles = [Patch(color=c, label=k) for k, c in COLOURS.items()]
  handles.append(Patch(facecolor="#EEEEEE", edgecolor="#BBBBBB", hatch="///", label="idle"))
  fig.legend(handles=handles, loc="upper center", ncol=4, fontsize=9, frameon=False)
  fig.tight_layout(rect=(0, 0, 1, 0.97))
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  fig.savefig(out, dpi=110)
  plt.close(fig)


def main(argv):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("files", nargs="*", help="weft-schedule --format trace (and json) outputs")
  ap.add_argument("-o", "--output", required=True, help="the PNG to write")
  ap.add_argument("--tool", help="weft-schedule to run for 1F1B, interleaved (V=2) and ZB-H1 instead of files")
  ap.add_argument("--stages", type=int, default=4)
  ap.add_argument("--microbatches", type=int, default=8)
  ap.add_argument("--costs", default="1,1,1", help="F,B,W as weft-schedule takes them")
  args = ap.parse_args(argv)
  try:
    if args.tool and args.files:
      raise BadInput("give --tool or files, not both")
    if args.tool:
      import tempfile
      with tempfile.TemporaryDirectory() as tmp:
        panels = load(run_tool(args.tool, args.stages, args.microbatches, args.costs, tmp))
    elif args.files:
      panels = load(args.files)
    else:
      raise BadInput("nothing to draw: give trace files or --tool")
  except BadInput as e:
    print(f"timeline.py: {e}", file=sys.stderr)
    return 2
  draw(panels, args.output)
  for p in panels:
    print(title(p))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))

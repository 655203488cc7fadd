#!/usr/bin/env python3
"""Tests for benchmarks/pipeline/timeline.py: python3 benchmarks/pipeline/timeline_test.py

Runs timeline.py as a user would on a trace and a json file written here, in weft-schedule's
formats: a two-rank GPipe step with its idle time. The drawing tests skip when no interpreter
with matplotlib is found; the bad-input tests need none.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TIMELINE = os.path.join(HERE, "timeline.py")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def python_with_matplotlib():
  """This interpreter if it has matplotlib, else Debian's (a pyenv or venv python3 may shadow it)."""
  for exe in dict.fromkeys((sys.executable, "/usr/bin/python3")):
    if os.path.exists(exe) and subprocess.run([exe, "-c", "import matplotlib"], capture_output=True).returncode == 0:
      return exe
  return None


def run_timeline(args, exe=sys.executable):
  return subprocess.run([exe, TIMELINE, *args], capture_output=True, text=True, timeout=300)


# GPipe, p = 2, m = 2, T_F = 1, T_B = 2, step 8: rank 0 idles 2 waiting for rank 1's first
# backward, rank 1 idles 1 before its first forward and 1 after its last backward.
EVENTS = {
    0: [("F0.0", "forward", 0, 1), ("F1.0", "forward", 1, 1), ("idle", "idle", 2, 2),
        ("B0.0", "backward", 4, 2), ("B1.0", "backward", 6, 2)],
    1: [("idle", "idle", 0, 1), ("F0.0", "forward", 1, 1), ("F1.0", "forward", 2, 1),
        ("B0.0", "backward", 3, 2), ("B1.0", "backward", 5, 2), ("idle", "idle", 7, 1)],
}


def trace_doc(name="gpipe", p=2, m=2):
  events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": f"weft-schedule {name} p={p} m={m}"}}]
  for rank, evs in EVENTS.items():
    events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": rank, "args": {"name": f"rank {rank}"}})
    for n, cat, ts, dur in evs:
      events.append({"name": n, "cat": cat, "cname": "good", "ph": "X", "pid": 0, "tid": rank, "ts": ts, "dur": dur})
  return {"displayTimeUnit": "ms", "traceEvents": events}


def json_doc(name="gpipe", p=2, m=2):
  return {"schedule": name, "stages": p, "microbatches": m, "chunks": 1,
          "statistics": {"step_time_us": 8, "ideal_time_us": 6, "bubble_over_ideal": 1 / 3, "idle_fraction": 0.25}}


class Fixture(unittest.TestCase):
  def setUp(self):
    self.tmp = tempfile.TemporaryDirectory()
    self.addCleanup(self.tmp.cleanup)

  def write(self, name, doc):
    path = os.path.join(self.tmp.name, name)
    with open(path, "w", encoding="utf-8") as f:
      f.write(doc if isinstance(doc, str) else json.dumps(doc))
    return path


class Drawing(Fixture):
  def setUp(self):
    super().setUp()
    self.exe = python_with_matplotlib()
    if self.exe is None:
      self.skipTest("matplotlib is missing (Debian: apt-get install python3-matplotlib)")

  def test_draws_a_png_with_each_panels_figures(self):
    out = os.path.join(self.tmp.name, "img", "timeline.png")  # the folder is created
    result = run_timeline([self.write("g.trace.json", trace_doc()), self.write("g.json", json_doc()), "-o", out],
                          self.exe)
    self.assertEqual(result.returncode, 0, result.stderr)
    with open(out, "rb") as f:
      self.assertEqual(f.read(8), PNG_MAGIC)
    # step 8; idle (2 + 1 + 1) / (2 ranks * 8) = 25%; the bubble from the json file.
    self.assertIn("GPipe: p=2, m=2, step 8, idle 25.0%, bubble 33.3% of the ideal", result.stdout)

  def test_panels_follow_the_traces_order(self):
    out = os.path.join(self.tmp.name, "two.png")
    a = self.write("a.json", trace_doc("zb-h1"))
    b = self.write("b.json", trace_doc("interleaved<2>"))
    result = run_timeline([a, b, "-o", out], self.exe)
    self.assertEqual(result.returncode, 0, result.stderr)
    lines = result.stdout.splitlines()
    self.assertTrue(lines[0].startswith("ZB-H1: p=2, m=2"), result.stdout)
    self.assertTrue(lines[1].startswith("interleaved, V=2: p=2, m=2"), result.stdout)
    self.assertNotIn("bubble", result.stdout)  # no json given


class WithTheTool(Fixture):
  """weft-schedule run by timeline.py itself; ctest gives its path in WEFT_SCHEDULE."""

  def test_the_three_schedules_at_the_papers_figures(self):
    tool = os.environ.get("WEFT_SCHEDULE")
    exe = python_with_matplotlib()
    if not tool or exe is None:
      self.skipTest("needs WEFT_SCHEDULE (the built weft-schedule) and matplotlib")
    out = os.path.join(self.tmp.name, "timeline.png")
    result = run_timeline(["--tool", tool, "--stages", "4", "--microbatches", "8", "-o", out], exe)
    self.assertEqual(result.returncode, 0, result.stderr)
    # Equal costs: bubbles (p-1)/m, (p-1)/(m V) and (p-1)(T_F + T_B - T_W) / (m (T_F + T_B + T_W)).
    lines = result.stdout.splitlines()
    self.assertEqual(len(lines), 3, result.stdout)
    self.assertTrue(lines[0].startswith("1F1B: p=4, m=8") and lines[0].endswith("bubble 37.5% of the ideal"))
    self.assertTrue(lines[1].startswith("interleaved, V=2") and lines[1].endswith("bubble 18.8% of the ideal"))
    self.assertTrue(lines[2].startswith("ZB-H1") and lines[2].endswith("bubble 12.5% of the ideal"))


class BadInput(Fixture):
  """Errors are found before matplotlib is loaded, so these run with any python3."""

  def assert_fails(self, args, message):
    out = os.path.join(self.tmp.name, "out.png")
    result = run_timeline([*args, "-o", out])
    self.assertEqual(result.returncode, 2, result.stderr)
    self.assertIn(message, result.stderr)
    self.assertFalse(os.path.exists(out))

  def test_missing_file(self):
    self.assert_fails([os.path.join(self.tmp.name, "absent.json")], "cannot read")

  def test_bad_json(self):
    self.assert_fails([self.write("bad.json", '{"traceEvents": [')], "not valid JSON")

  def test_json_without_its_trace(self):
    self.assert_fails([self.write("t.json", trace_doc("1f1b")), self.write("s.json", json_doc("gpipe"))],
                      "no trace of that schedule is given")

  def test_json_alone(self):
    self.assert_fails([self.write("s.json", json_doc())], "json has no times")

  def test_not_weft_schedule(self):
    self.assert_fails([self.write("x.json", {"traceEvents": []})], "not weft-schedule's trace")
    self.assert_fails([self.write("y.json", {"rows": []})], "neither weft-schedule's --format trace")

  def test_step_of_no_time(self):
    # As weft-schedule --costs 0,0,0 writes it: every action at time 0 for 0.
    doc = trace_doc()
    for e in doc["traceEvents"]:
      if e["ph"] == "X":
        e["ts"] = e["dur"] = 0
    self.assert_fails([self.write("zero.json", doc)], "the step takes no time")

  def test_nothing_to_draw(self):
    self.assert_fails([], "nothing to draw")

  def test_tool_that_does_not_run(self):
    self.assert_fails(["--tool", os.path.join(self.tmp.name, "absent")], "cannot run")
    self.assert_fails(["--tool", "x", self.write("t.json", trace_doc())], "not both")

  def test_help(self):
    result = run_timeline(["-h"])
    self.assertEqual(result.returncode, 0)
    self.assertIn("usage:", result.stdout)


if __name__ == "__main__":
  unittest.main(verbosity=2)

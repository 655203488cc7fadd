#!/usr/bin/env python3
"""Tests for benchmarks/plot.py: python3 benchmarks/plot_test.py

Runs plot.py as a user would, on the hand-written fixtures in benchmarks/testdata/, and checks
its files against figures computed here from the fixtures themselves. The plotting tests skip
when no interpreter with matplotlib is found; the bad-input tests need none.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PLOT = os.path.join(HERE, "plot.py")
DATA = os.path.join(HERE, "testdata")
FIXTURES = sorted(os.path.join(DATA, f) for f in os.listdir(DATA) if f.endswith(".json"))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MIB = 1 << 20


def python_with_matplotlib():
  """This interpreter if it has matplotlib, else Debian's (a pyenv or venv python3 may shadow it)."""
  for exe in dict.fromkeys((sys.executable, "/usr/bin/python3")):
    if os.path.exists(exe) and subprocess.run([exe, "-c", "import matplotlib"], capture_output=True).returncode == 0:
      return exe
  return None


def run_plot(args, exe=sys.executable):
  return subprocess.run([exe, PLOT, *args], capture_output=True, text=True, timeout=300)


def gbench_row(fixture, name_prefix):
  with open(os.path.join(DATA, fixture), encoding="utf-8") as f:
    rows = [b for b in json.load(f)["benchmarks"] if b["name"].startswith(name_prefix)]
  assert len(rows) == 1, f"fixture {fixture} should hold one {name_prefix}"
  return rows[0]


def summary_line(summary, *parts):
  return [line for line in summary.splitlines() if all(p in line for p in parts)]


def cells(line):
  return [c.strip() for c in line.strip().strip("|").split("|")]


class PlotRun:
  """A test class's one run of plot.py with matplotlib (the class skips without it): on the files
  cls.inputs(tmp) returns, tmp a temporary folder of the class's own, into tmp/plots. Sets cls.exe,
  cls.tmp, cls.out, cls.result and cls.summary (summary.md's text)."""

  @classmethod
  def inputs(cls, tmp):
    raise NotImplementedError

  @classmethod
  def setUpClass(cls):
    cls.exe = python_with_matplotlib()
    if cls.exe is None:
      raise unittest.SkipTest("matplotlib is missing (Debian: apt-get install python3-matplotlib)")
    cls.tmp = tempfile.TemporaryDirectory()
    cls.out = os.path.join(cls.tmp.name, "plots")  # not there yet: plot.py creates it
    cls.result = run_plot([*cls.inputs(cls.tmp.name), "-o", cls.out], cls.exe)
    with open(os.path.join(cls.out, "summary.md"), encoding="utf-8") as f:
      cls.summary = f.read()

  @classmethod
  def tearDownClass(cls):
    cls.tmp.cleanup()


class PlotOutput(PlotRun, unittest.TestCase):
  @classmethod
  def inputs(cls, tmp):
    return FIXTURES

  def test_exits_zero(self):
    self.assertEqual(self.result.returncode, 0, self.result.stderr)

  def test_expected_pngs(self):
    stems = ["all_reduce_local4", "all_reduce_local8_2x4", "all_reduce_mpi4",
             "reduce_scatter_local4_2x2_intra_shm_8GB_s_2us_inter_net_0.5GB_s_20us"]
    expected = [f"{kind}_{stem}.png" for stem in stems for kind in ("busbw", "model")]
    expected.append("busbw_all_reduce_gloo4.png")  # peers only: no model plot
    for name in expected:
      path = os.path.join(self.out, name)
      self.assertTrue(os.path.isfile(path), f"{name} missing; have {sorted(os.listdir(self.out))}")
      with open(path, "rb") as f:
        self.assertEqual(f.read(8), PNG_MAGIC, name)
    self.assertFalse(os.path.exists(os.path.join(self.out, "model_all_reduce_gloo4.png")))

  def test_file_names_are_sanitized(self):
    for name in os.listdir(self.out):
      self.assertFalse(set(name) & set("<>@/ ,:="), name)

  def test_ratio_inside_band(self):
    # hierarchical on the emulated 2x4 topology at 16 MiB: measured / model, computed here.
    row = gbench_row("gbench_emulated8.json", "all_reduce/local8@2x4/hierarchical<ring, ring>/16777216/")
    ratio = row["time_us"] / row["model_us"]
    self.assertTrue(0.75 <= ratio <= 1.25)  # the fixture is meant to sit inside the band
    lines = summary_line(self.summary, "| `hierarchical<ring, ring>` |", "| 16MiB |")
    self.assertEqual(len(lines), 1, self.summary)
    self.assertIn(f"| {ratio:.2f} | yes |", lines[0])

  def test_ratio_outside_band(self):
    # weft-perf rows: automatic reduce_scatter at 16 MiB is meant to miss the band.
    with open(os.path.join(DATA, "perf_reduce_scatter4.json"), encoding="utf-8") as f:
      row = next(r for r in json.load(f)["rows"] if r["algorithm"] == "automatic" and r["bytes"] == 16 * MIB)
    ratio = row["time_us"] / row["model_us"]
    self.assertGreater(abs(ratio - 1), 0.25)
    lines = summary_line(self.summary, "| `automatic [float sum]`", "| 16MiB |")
    self.assertEqual(len(lines), 1, self.summary)
    self.assertIn(f"| {ratio:.2f} | **no** |", lines[0])
    self.assertIn(f"chose `{row['chosen']}`", lines[0])

  def test_busbw_table_and_peers(self):
    # MPI_Allreduce (a peer, no model_us) shows beside weft's local4 algorithms, marked with *.
    row = gbench_row("gbench_peers4.json", "all_reduce/mpi4/MPI_Allreduce/67108864/")
    section = self.summary.split("## all_reduce on `local4`")[1].split("## ")[0]
    header = cells(summary_line(section, "| size |")[0])
    self.assertIn("`mpi4/MPI_Allreduce`*", header)
    values = cells(summary_line(section, "| 64MiB |")[0])
    self.assertEqual(values[header.index("`mpi4/MPI_Allreduce`*")], f"{row['busbw_GBps']:.3g}")
    # Peers never enter the model table.
    self.assertFalse(summary_line(section, "MPI_Allreduce", "| yes |"))

  def test_repetitions_collapse_to_median(self):
    # direct at 1 MiB ran twice; of an even count the faster middle run stands for the case.
    with open(os.path.join(DATA, "gbench_local4.json"), encoding="utf-8") as f:
      reps = [b for b in json.load(f)["benchmarks"]
              if b["name"].startswith("all_reduce/local4/direct/1048576/") and b["run_type"] == "iteration"]
    self.assertEqual(len(reps), 2)
    fastest = min(reps, key=lambda b: b["time_us"])
    lines = summary_line(self.summary, "| `direct` |", "| 1MiB |")
    self.assertEqual(len(lines), 1, self.summary)
    self.assertEqual(cells(lines[0])[2], f"{fastest['time_us']:.1f}")

  def test_error_and_aggregate_rows_skipped(self):
    self.assertIn("warning", self.result.stderr)
    self.assertIn("recursive_doubling", self.result.stderr)
    self.assertNotIn("recursive_doubling", self.summary)
    self.assertNotIn("_mean", self.summary)
    self.assertNotIn("_mean", self.result.stderr)  # aggregates are ignored silently, not warned about

  def test_memcpy_reference(self):
    row = gbench_row("gbench_local4.json", "memcpy/67108864")
    self.assertIn(f"memcpy: {row['GBps']:.3g} GB/s at 64MiB", self.summary)


def gbench_doc(rows):
  """Google Benchmark JSON of (name, counters) rows, one iteration each, times in us."""
  return {"context": {}, "benchmarks": [
      {"name": f"{name}/iterations:1/manual_time", "run_type": "iteration", "iterations": 1,
       "real_time": counters.get("time_us", 1.0), "time_unit": "us", **counters} for name, counters in rows]}


def perf_row(nbytes, wrong):
  return {"op": "all_reduce", "dtype": "float", "redop": "sum", "algorithm": "ring", "chosen": "ring",
          "transport": "local", "ranks": 2, "topology": "", "bytes": nbytes, "count": nbytes // 4,
          "time_us": 10.0, "algbw_GBps": nbytes / 10e3, "busbw_GBps": nbytes / 10e3, "model_us": 9.0, "wrong": wrong}


class SeveralFilesAndPeers(PlotRun, unittest.TestCase):
  """Files written here: the same case in two files (as scripts/bench gives comm_collectives_bench's
  and weft_peer_suite's local4 rows), weft rows the model does not price, peers known by counter
  and by name, weft-perf rows checked and not, and the suites' stream_add row."""

  LOCAL = [("stream_add", {"stream_add_GBps": 40.0}),
           ("all_reduce/local4/direct/65536", {"time_us": 15.4, "busbw_GBps": 6.40, "model_us": 14.0}),
           ("all_reduce/local4/ring/65536", {"time_us": 16.0, "busbw_GBps": 6.10, "model_us": 15.0}),
           ("all_reduce/local4/otherlib/65536", {"time_us": 30.0, "busbw_GBps": 3.30, "peer": 1}),
           ("all_reduce/local8@2x4/ring/1048576", {"time_us": 900.0, "busbw_GBps": 2.04, "model_us": 850.0}),
           ("all_reduce/local8@2x4/two_level<ring, ring>/1048576", {"time_us": 700.0, "busbw_GBps": 2.62})]
  MPI = [("all_reduce/local4/direct/65536", {"time_us": 21.8, "busbw_GBps": 4.50, "model_us": 14.0}),
         ("all_reduce/mpi4/MPI_Allreduce/65536", {"time_us": 25.0, "busbw_GBps": 3.93})]

  @classmethod
  def inputs(cls, tmp):
    paths = []
    for name, doc in (("local.json", gbench_doc(cls.LOCAL)), ("mpi.json", gbench_doc(cls.MPI)),
                      ("perf.json", {"rows": [perf_row(1024, -1), perf_row(4096, 3)]})):
      paths.append(os.path.join(tmp, name))
      with open(paths[-1], "w", encoding="utf-8") as f:
        json.dump(doc, f)
    return paths

  def section(self, title):
    return self.summary.split(f"## {title}")[1].split("## ")[0]

  def test_exits_zero(self):
    self.assertEqual(self.result.returncode, 0, self.result.stderr)

  def test_same_case_in_two_files_stays_two_series(self):
    # Not one "direct" holding the faster file's figure: one column per file, each its own.
    section = self.section("all_reduce on `local4`")
    header = cells(summary_line(section, "| size |")[0])
    values = cells(summary_line(section, "| 64KiB |")[0])
    for label, rows in (("`direct (local.json)`", self.LOCAL), ("`direct (mpi.json)`", self.MPI)):
      busbw = dict(rows)["all_reduce/local4/direct/65536"]["busbw_GBps"]
      self.assertIn(label, header)
      self.assertEqual(values[header.index(label)], f"{busbw:.3g}")
    self.assertIn("`ring`", header)  # in one file only: no file name
    self.assertRegex(self.result.stderr, r"local4 direct is in \S*local.json and \S*mpi.json")

  def test_peers_by_counter_and_by_name(self):
    header = cells(summary_line(self.section("all_reduce on `local4`"), "| size |")[0])
    self.assertIn("`otherlib`*", header)
    self.assertIn("`mpi4/MPI_Allreduce`*", header)
    self.assertNotIn("`ring`*", header)

  def test_unpriced_weft_row_is_not_a_peer(self):
    section = self.section("all_reduce on `local8@2x4`")
    header = cells(summary_line(section, "| size |")[0])
    self.assertIn("`two_level<ring, ring>`", header)
    self.assertNotIn("`two_level<ring, ring>`*", header)
    self.assertTrue(summary_line(section, "| `ring` |", "| 1MiB |"))  # the priced row is checked
    self.assertFalse(summary_line(section, "| `two_level<ring, ring>` |", "| 1MiB |"))  # no price, no check

  def test_wrong_elements_warned_only_when_counted(self):
    self.assertIn("ring 4KiB: 3 wrong elements", self.result.stderr)
    self.assertNotIn("-1 wrong", self.result.stderr)

  def test_stream_add_row_is_not_warned_about(self):
    self.assertNotIn("stream_add", self.result.stderr)


class BadInput(unittest.TestCase):
  """Errors are found before matplotlib is loaded, so these run with any python3."""

  def setUp(self):
    self.tmp = tempfile.TemporaryDirectory()
    self.addCleanup(self.tmp.cleanup)

  def write(self, name, text):
    path = os.path.join(self.tmp.name, name)
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
    return path

  def assert_fails(self, args, message):
    result = run_plot([*args, "-o", os.path.join(self.tmp.name, "out")])
    self.assertEqual(result.returncode, 2, result.stderr)
    self.assertIn(message, result.stderr)
    self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "out")))
    return result

  def test_missing_file(self):
    self.assert_fails([os.path.join(self.tmp.name, "absent.json")], "cannot read")

  def test_bad_json(self):
    self.assert_fails([self.write("bad.json", '{"benchmarks": [')], "not valid JSON")

  def test_unknown_format(self):
    self.assert_fails([self.write("other.json", '{"results": []}')], "neither Google Benchmark")

  def test_no_rows(self):
    self.assert_fails([self.write("empty.json", '{"context": {}, "benchmarks": []}')], "no benchmark rows")

  def test_only_aggregates_is_no_rows(self):
    doc = {"benchmarks": [{"name": "all_reduce/local4/ring/4/manual_time_mean", "run_type": "aggregate",
                           "time_us": 10.0, "busbw_GBps": 0.1}]}
    result = self.assert_fails([self.write("agg.json", json.dumps(doc))], "no benchmark rows")
    self.assertNotIn("warning", result.stderr)

  def test_bad_perf_row(self):
    self.assert_fails([self.write("perf.json", '{"rows": [{"op": "all_reduce"}]}')], "rows[0]")

  def test_missing_outdir_argument(self):
    result = run_plot(FIXTURES[:1])
    self.assertEqual(result.returncode, 2)
    self.assertIn("-o", result.stderr)

  def test_help(self):
    result = run_plot(["-h"])
    self.assertEqual(result.returncode, 0)
    self.assertIn("usage:", result.stdout)


if __name__ == "__main__":
  unittest.main(verbosity=2)

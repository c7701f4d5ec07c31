"""Markdown summary of a self-test run: one row per suite with its result, the attention
backends vLLM selected, the throughput ratio AITER MLA / Triton MLA (bench) and this backend's
accuracy against each other backend on the same questions (accuracy: selftest.json's "accuracy").

Reads a results directory as ci/pipeline/amd-runner/selftest.sh leaves it: selftest.json (the
self-test report), selftest.xml (JUnit; the smoke suite prints the backends it saw, kept
with `-o junit_logging=system-out`), and bench.json (each run records what its server selected,
read from its log by the image's runtime).
"""
from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path

from rocm_vllm_runtime import files  # the one reader of JSON

# The line the smoke suite prints ("backends selected: ['X']; ...").
PRINTED_SELECTED = re.compile(r"backends selected: \[([^\]]*)\]")
AITER_RUNS = ("plugin", "vllm-aiter")
TRITON_RUN = "triton"
RATIO_METRIC = "total_token_throughput"
NONE = "—"


class SummaryError(Exception):
    pass


def _read_json(path: Path):
    try:
        return files.read_json(path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise SummaryError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except files.DataError as exc:
        why = {"utf8": "is not UTF-8 text: not a file the self-test wrote",
               "depth": "is nested too deeply to be a self-test file"}.get(exc.kind)
        if why:
            raise SummaryError(f"{path} {why}") from None
        if exc.kind == "json":
            raise SummaryError(f"{path} is not JSON, or truncated ({exc.detail})") from None
        raise SummaryError(str(exc)) from None


def load_report(results: Path) -> dict:
    path = results / "selftest.json"
    try:
        doc = _read_json(path)
    except FileNotFoundError:
        raise SummaryError(f"{path} not found: the self-test did not write its report "
                           "(see selftest.log; set RESULTS_DIR to the self-test's results directory)") from None
    if not isinstance(doc, dict) or "suites" not in doc or "result" not in doc:
        raise SummaryError(f"{path} is not a self-test report (no 'result'/'suites')")
    problem = report_problem(doc)
    if problem:
        raise SummaryError(f"{path}: {problem}: not a report the self-test wrote")
    return doc


def _is_text(value) -> bool:
    return isinstance(value, str)


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def report_problem(doc: Mapping) -> str:
    """'' when what the table shows of a self-test report (runtime report.to_json) has its types;
    else the field that is wrong. bench and accuracy are read apart, each cell on its own."""
    if not _is_text(doc["result"]):
        return "'result' must be a string"
    if doc.get("exit_code") is not None and not _is_count(doc["exit_code"]):
        return "'exit_code' must be a whole number"
    gpus = doc.get("gpus")
    if gpus is not None and not (isinstance(gpus, list) and all(isinstance(g, dict) for g in gpus)):
        return "'gpus' must be a list of objects"
    versions = doc.get("versions")
    if versions is not None and not (isinstance(versions, dict) and all(
            v is None or _is_text(v) for v in versions.values())):
        return "'versions' must be an object of names and versions (strings)"
    suites = doc["suites"]
    if not isinstance(suites, list) or not all(isinstance(x, dict) and _is_text(x.get("name")) for x in suites):
        return "'suites' must be a list of objects with a name"
    for suite in suites:
        where = f"suites[{suite['name']!r}]"
        if not _is_text(suite.get("status")):
            return f"{where}.status must be a string"
        if suite.get("reason") is not None and not _is_text(suite["reason"]):
            return f"{where}.reason must be a string or null"
        counts = suite.get("counts")
        if counts is not None and not (isinstance(counts, dict) and all(_is_count(n) for n in counts.values())):
            return f"{where}.counts must be an object of whole numbers"
    return ""


def printed_backends(results: Path) -> dict[str, list[str]]:
    """Suite name -> backends named in `backends selected: [...]` lines of the JUnit output."""
    path = results / "selftest.xml"
    if not path.is_file():
        return {}
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError, UnicodeDecodeError) as exc:
        raise SummaryError(f"{path} is not XML, or truncated ({exc}): the selected backends cannot be read") from None
    found: dict[str, list[str]] = {}
    for suite in root.iter("testsuite"):
        name = suite.get("name", "")
        for node in suite.iter("system-out"):
            for match in PRINTED_SELECTED.findall(node.text or ""):
                for item in match.split(","):
                    item = item.strip().strip("'\"")
                    if item and item not in found.setdefault(name, []):
                        found[name].append(item)
    return found


def _runs(bench: Mapping) -> Mapping:
    runs = bench.get("runs")
    return runs if isinstance(runs, Mapping) else {}


def bench_backends(bench: Mapping) -> str:
    cells = []
    for name, run in _runs(bench).items():
        selected = run.get("selected") if isinstance(run, Mapping) else None
        names = selected.get("attention_backends") if isinstance(selected, Mapping) else None
        if not isinstance(names, list):
            cells.append(f"{name}: (not recorded)")
            continue
        implementation = selected.get("implementation")
        suffix = f" ({implementation})" if implementation else ""
        cells.append(f"{name}: {', '.join(map(str, names)) or '(none logged)'}{suffix}")
    return " · ".join(cells) or NONE


def metric(run, name: str = RATIO_METRIC) -> tuple[float | None, str]:
    """(the run's metric, '') or (None, what is wrong with it: missing, not a number, NaN, ...)."""
    metrics = run.get("metrics") if isinstance(run, Mapping) else None
    if not isinstance(metrics, Mapping) or name not in metrics:
        return None, f"no {name}"
    value = metrics[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None, f"{name} {value!r} is not a number"
    if not math.isfinite(value):
        return None, f"{name} is {value}"
    if value < 0:
        return None, f"{name} is negative ({value:g})"
    return float(value), ""


def throughput_ratios(bench: Mapping) -> str:
    runs = _runs(bench)
    if TRITON_RUN not in runs:
        return f"{NONE} (no {TRITON_RUN} run)" if runs else NONE
    triton, why = metric(runs[TRITON_RUN])
    if triton is not None and triton == 0:
        why = f"{RATIO_METRIC} is 0 tok/s"
    cells = []
    for name in AITER_RUNS:
        if name not in runs:
            continue
        value, own = metric(runs[name])
        if why:
            cells.append(f"{name} n/a (Triton: {why})")
        elif own:
            cells.append(f"{name} n/a ({own})")
        else:
            cells.append(f"{name} {value / triton:.2f}x")
    return " · ".join(cells) or f"{NONE} (no AITER run)"


def passed(result: Mapping, number: str) -> bool:
    """Whether a comparison passed: recorded ok, and its number finite (a nan or inf compared with
    anything never passes, whatever ok says)."""
    try:
        return result.get("ok") is True and math.isfinite(float(result[number]))
    except (KeyError, TypeError, ValueError):
        return False


def accuracy_cell(acc: Mapping) -> str:
    """This backend against each other one on the same questions: right answers, discordant
    questions (lost / won), the paired test's p-value, and the log-likelihoods' largest difference."""
    if acc.get("error"):
        return f"{NONE} ({acc['error']})"
    comparisons = acc.get("comparisons")
    if not isinstance(comparisons, Mapping) or not comparisons:
        return f"{NONE} (no comparison)"
    ours, cells = acc.get("ours", "?"), []
    for other, entry in comparisons.items():
        if not isinstance(entry, Mapping):
            continue
        for task, filters in _items(entry.get("tasks")):
            for flt, r in _items(filters):
                try:
                    cells.append(f"{ours} vs {other} {task} {flt}: {r['ours_correct']}/{r['n']} vs "
                                 f"{r['reference_correct']}/{r['n']} right, {r['lost']} lost / {r['won']} won, "
                                 f"p {float(r['p_value']):.2g}{'' if passed(r, 'p_value') else ' FAILED'}")
                except (KeyError, TypeError, ValueError):
                    cells.append(f"{ours} vs {other} {task} {flt}: (not recorded)")
        for task, r in _items(entry.get("loglik")):
            try:
                cells.append(f"{task} max Δ log-likelihood {float(r['max_abs_diff']):.2g} "
                             f"(atol {r['tolerance'][0]:g}, rtol {r['tolerance'][1]:g})"
                             f"{'' if passed(r, 'max_abs_diff') else ' FAILED'}")
            except (KeyError, TypeError, ValueError, IndexError):
                cells.append(f"{task}: (not recorded)")
        if not entry.get("ok") and not cells:
            cells.append(f"{ours} vs {other}: a run failed")
    return " · ".join(cells) or NONE


def _items(value) -> list:
    """The items of a JSON object; none of anything else (a cell then says what is missing)."""
    return list(value.items()) if isinstance(value, Mapping) else []


def _counts(suite: Mapping) -> str:
    counts = suite.get("counts") or {}
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no checks"


def render(results: Path, title: str = "Self-test") -> str:
    doc = load_report(results)
    printed = printed_backends(results)
    bench = doc.get("bench")
    if not isinstance(bench, Mapping) and (results / "bench.json").is_file():
        bench = _read_json(results / "bench.json")
        if not isinstance(bench, Mapping):
            raise SummaryError(f"{results / 'bench.json'} is not a benchmark report (not an object)")
    lines = [f"### {title}: {str(doc['result']).upper()} (exit {doc.get('exit_code')})", ""]
    gpus = doc.get("gpus") or []
    archs = sorted({str(g.get("target")) for g in gpus})
    versions = doc.get("versions") or {}
    lines.append(f"GPUs: {len(gpus)} ({', '.join(archs) or 'none found'})  ·  "
                 + "  ·  ".join(f"{k} {v or '(not installed)'}" for k, v in versions.items()))
    lines += ["", "| suite | result | checks | selected backends | throughput AITER MLA / Triton MLA |",
              "|---|---|---|---|---|"]
    notes = []
    for suite in doc["suites"]:
        name = suite["name"]
        selected = ", ".join(printed.get(name, [])) or NONE
        ratio = NONE
        if name == "bench" and isinstance(bench, Mapping):
            selected = bench_backends(bench)
            ratio = throughput_ratios(bench)
            if bench.get("error"):
                notes.append(f"- **bench.json**: {bench['error']}")
        accuracy = doc.get("accuracy")
        if name == "accuracy" and isinstance(accuracy, Mapping):
            selected = bench_backends(accuracy)
            ratio = accuracy_cell(accuracy)
        lines.append(f"| {name} | {suite['status']} | {_counts(suite)} | {selected} | {ratio} |")
        if suite.get("reason"):
            notes.append(f"- **{name}**: {suite['reason']}")
    if notes:
        lines += ["", *notes]
    lines.append("")
    return "\n".join(lines)

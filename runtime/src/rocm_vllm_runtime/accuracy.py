"""Accuracy gate: attention backends side by side on the same questions, each scored by lm-eval.

For each backend in turn (the backends of the serving benchmark, `rocm_vllm_runtime.bench`): start
a server with the serve launcher on 127.0.0.1 (the selection in its log checked as the benchmark
checks it), run lm-eval (`local-completions` against its OpenAI-compatible API, the server's own
tokenizer) on the same tasks with the same settings, stop it. Then compare the first backend (this
project's) with each other one, question by question:

* generation tasks (default gsm8k, 5-shot, strict-match and flexible-extract): the questions one
  backend answers right and the other wrong (discordant pairs). The gate fails when this backend
  answers significantly fewer right: exact one-sided binomial (McNemar) test on the discordant
  pairs, p < ACCURACY_ALPHA. The differing questions are listed.
* loglikelihood tasks (default gsm8k_loglik: each reference solution's log-likelihood given its
  question): the numbers must agree within the dtype's tolerance, |a - b| <= atol + rtol * max(|a|, |b|)
  (numeric.agree: a nan or inf never agrees):
  float32 atol 1e-3, rtol 1e-5; bfloat16/float16 (and auto) atol 0.5, rtol 0.02 (docs/self-tests.md says why).

The task data is local: ACCURACY_DATA/<dataset>/<split>.jsonl, <dataset> the last part of the
task's dataset_path (gsm8k: ACCURACY_DATA/gsm8k/test.jsonl and train.jsonl); lm-eval runs with
HF_DATASETS_OFFLINE=1 and HF_HUB_OFFLINE=1 and never reaches the hub. Task definitions: lm-eval's
own and those in ACCURACY_TASKS_DIR (the suites' accuracy_tasks/).

    python3 -m rocm_vllm_runtime.accuracy --json accuracy.json -- --model deepseek-ai/DeepSeek-V2-Lite
    python3 -m rocm_vllm_runtime.accuracy --backends cpu-plugin,cpu-vllm --tasks tiny_mla_gen \\
        --loglik-tasks tiny_mla_loglik --num-fewshot 0 --concurrency 1 -- --model DIR --dtype float32

Exit status: 0 the gate passed, 1 it failed (or the data is missing: one line saying what to
mount), 2 a setting is wrong.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from . import bench, children, files, numeric, schema, web
from .selection import selection
from .selftest import suites_dir
from .secret_values import shown
from .serve import option_value

ENV_DEFAULTS = {  # setting: default, shared by the CLI and the accuracy suite
    "ACCURACY_BACKENDS": bench.ENV_DEFAULTS["BENCH_BACKENDS"], "ACCURACY_TASKS": "gsm8k",
    "ACCURACY_LOGLIK_TASKS": "gsm8k_loglik", "ACCURACY_NUM_FEWSHOT": "5", "ACCURACY_LIMIT": "400",
    "ACCURACY_CONCURRENCY": "32", "ACCURACY_ALPHA": "0.01", "ACCURACY_DATA": "/data/accuracy",
    "ACCURACY_LL_TOLERANCE": "", "ACCURACY_SERVE_ARGS": "--model deepseek-ai/DeepSeek-V2-Lite --max-model-len 4096",
    "ACCURACY_PORT": "8012", "ACCURACY_START_TIMEOUT": "1800", "ACCURACY_REFERENCE": "",
}
# (least, most) of each count setting
COUNT_RANGES = {"ACCURACY_LIMIT": (0, 1_000_000), "ACCURACY_NUM_FEWSHOT": (0, 100),
                "ACCURACY_CONCURRENCY": (1, 4096)}
TOLERANCES = {"float32": (1e-3, 1e-5), "low": (0.5, 0.02)}  # (atol, rtol) of a question's log-likelihood
SHOWN = 20  # differing questions listed per comparison


class AccuracyError(Exception):
    """A setting the gate cannot work with; the message names it."""


class DataMissing(AccuracyError):
    """The task data is not where ACCURACY_DATA says; the message says what to mount."""


@dataclass(frozen=True)
class Settings:
    tasks: tuple[str, ...] = ("gsm8k",)
    loglik_tasks: tuple[str, ...] = ("gsm8k_loglik",)
    num_fewshot: int = 5
    limit: int | None = 400
    concurrency: int = 32
    alpha: float = 0.01
    data: str = "/data/accuracy"
    tasks_dir: str = ""
    ll_tolerance: tuple[float, float] | None = None  # None: by the servers' dtype
    reference: str = ""  # a folder of an earlier run whose reference backends are taken, not served

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        def get(name: str) -> str:
            value = env.get(name)
            return ENV_DEFAULTS[name] if value is None or value == "" and ENV_DEFAULTS[name] else value

        def number(name: str) -> int:
            try:
                return numeric.whole(name, get(name), *COUNT_RANGES[name])
            except numeric.SettingError as exc:
                raise AccuracyError(str(exc)) from None

        try:
            alpha = numeric.real("ACCURACY_ALPHA", get("ACCURACY_ALPHA"), 0.0, 1.0,
                                 open_low=True, open_high=True)
            raw = get("ACCURACY_LL_TOLERANCE")
            tolerance = numeric.pair("ACCURACY_LL_TOLERANCE", raw, "ATOL,RTOL (e.g. 0.5,0.02)") if raw else None
        except numeric.SettingError as exc:
            raise AccuracyError(str(exc)) from None
        limit = number("ACCURACY_LIMIT")
        tasks, loglik = (tuple(t.strip() for t in get(name).split(",") if t.strip() not in ("", "none"))
                         for name in ("ACCURACY_TASKS", "ACCURACY_LOGLIK_TASKS"))
        if not tasks and not loglik:
            raise AccuracyError("ACCURACY_TASKS and ACCURACY_LOGLIK_TASKS name no task")
        return cls(tasks, loglik, number("ACCURACY_NUM_FEWSHOT"), limit or None,
                   number("ACCURACY_CONCURRENCY"), alpha, get("ACCURACY_DATA"),
                   # default: the suites' accuracy_tasks, wherever selftest finds the suites
                   env.get("ACCURACY_TASKS_DIR") or str(suites_dir(env) / "accuracy_tasks"), tolerance,
                   get("ACCURACY_REFERENCE"))


# ---------------------------------------------------------------- tasks and their local data

def _offline() -> None:
    """lm-eval and datasets read these at import: set them before either is imported."""
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"


def task_manager(settings: Settings):
    """lm-eval's task index, holding every task of the settings as lm-eval's whole index does.

    The whole index reads every task file lm-eval ships (about 14,000: seconds of CPU, once per
    preflight and once per backend). First tried: lm-eval's folders named like a task (its gsm8k is
    in tasks/gsm8k) and ACCURACY_TASKS_DIR, in the whole index's order (ACCURACY_TASKS_DIR last, so
    its tasks take precedence as there); the whole index where that does not hold every task."""
    import lm_eval.tasks  # noqa: PLC0415
    from lm_eval.tasks import TaskManager  # noqa: PLC0415

    ours = [settings.tasks_dir] if Path(settings.tasks_dir).is_dir() else []
    names = [*settings.tasks, *settings.loglik_tasks]
    builtin, folders = Path(lm_eval.tasks.__file__).parent, []
    for name in names:
        try:
            folder = files.inside(builtin, name, "a task name")
            if folder.is_dir():
                folders.append(folder)
        except (files.RefusedError, OSError):  # OSError: too long for a name
            continue  # not a folder's name: the whole index says what it is
    if folders or ours:
        manager = TaskManager(include_path=[*folders, *ours], include_defaults=False)
        if all(name in manager.task_index for name in names):
            return manager
    return TaskManager(include_path=ours[0] if ours else None)


def task_configs(settings: Settings) -> list[dict]:
    """lm-eval task configs of every task, their data pointed at ACCURACY_DATA (DataMissing if absent)."""
    _offline()
    try:
        from lm_eval.tasks._yaml_loader import load_yaml  # noqa: PLC0415
    except ImportError as exc:
        raise AccuracyError(f"lm-eval is not installed ({exc}): run the accuracy gate in the ci image") from None
    import datasets  # noqa: PLC0415

    if not datasets.config.HF_DATASETS_OFFLINE:
        raise AccuracyError("datasets was imported before HF_DATASETS_OFFLINE=1 was set: "
                            "set HF_DATASETS_OFFLINE=1 in the environment")
    manager = task_manager(settings)
    configs, missing = [], []
    for name, fewshot in [*((t, settings.num_fewshot) for t in settings.tasks),
                          *((t, 0) for t in settings.loglik_tasks)]:
        entry = manager.task_index.get(name)
        if entry is None or entry.yaml_path is None:
            raise AccuracyError(f"ACCURACY_TASKS / ACCURACY_LOGLIK_TASKS: {name!r} is not a single lm-eval task "
                                f"(lm-eval's own or one in ACCURACY_TASKS_DIR={settings.tasks_dir})")
        cfg = dict(load_yaml(entry.yaml_path, resolve_func=True))
        splits = sorted({cfg[k] for k in ("test_split", "validation_split", "training_split", "fewshot_split")
                         if cfg.get(k)})
        try:  # names from the task's definition: each a plain name inside ACCURACY_DATA
            folder = files.inside(settings.data, str(cfg.get("dataset_path", name)).rstrip("/").rsplit("/", 1)[-1],
                                  f"task {name}: the last part of its dataset_path")
            split_files = {s: files.inside(folder, f"{s}.jsonl", f"task {name}: a split") for s in splits}
        except files.RefusedError as exc:
            raise AccuracyError(str(exc)) from None
        absent = [str(p.relative_to(settings.data)) for p in split_files.values() if not p.is_file()]
        if absent:
            missing.append((name, absent))
        for key in ("tag", "group"):
            cfg.pop(key, None)
        cfg.update(dataset_path="json", dataset_name=None, num_fewshot=fewshot,
                   dataset_kwargs={"data_files": {s: str(p) for s, p in split_files.items()}})
        configs.append(cfg)
    if missing:
        wanted = ", ".join(dict.fromkeys(f for _, absent in missing for f in absent))  # each file once
        raise DataMissing(f"no data for {', '.join(n for n, _ in missing)} in {settings.data}: mount a directory "
                          f"holding {wanted} (JSON lines with the dataset's fields, e.g. GSM8K's question/answer) "
                          f"at {settings.data}, or set ACCURACY_DATA to one")
    return configs


def data_problem(env: Mapping[str, str]) -> str:
    """'' when the settings are usable and every task's data is there, else the one line that says why."""
    try:
        task_configs(Settings.from_env(env))
    except AccuracyError as exc:
        return str(exc)
    return ""


# ---------------------------------------------------------------- one backend: server + lm-eval

# The answer of /v1/models: what served_model takes from it.
MODELS_SCHEMA = {"type": "object", "required": ["data"], "properties": {"data": {
    "type": "array", "minItems": 1, "items": {"type": "object", "required": ["id"],
                                              "properties": {"id": {"type": "string", "maxLength": 4096}}}}}}


def served_model(base_url: str) -> str:
    url = f"{base_url}/v1/models"
    with web.request(url, timeout=30) as resp:
        answer = files.json_value(files.read_bounded(resp, url, 1 << 20), url)
    return schema.check(answer, MODELS_SCHEMA, url)["data"][0]["id"]  # type: ignore[index]


def run_lm_eval(base_url: str, configs: Sequence[dict], settings: Settings) -> dict:
    """lm-eval's results and samples for `configs` against the server at `base_url`."""
    _offline()
    from lm_eval import simple_evaluate  # noqa: PLC0415

    manager = task_manager(settings)
    model_args = {"base_url": f"{base_url}/v1/completions", "model": served_model(base_url),
                  "tokenizer_backend": "remote", "num_concurrent": settings.concurrency, "max_retries": 3,
                  "tokenized_requests": True}
    out = simple_evaluate(model="local-completions", model_args=model_args, tasks=[dict(c) for c in configs],
                          task_manager=manager, num_fewshot=None, limit=settings.limit, log_samples=True,
                          random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=1234)
    return {"results": out["results"], "samples": out["samples"]}


def per_question(samples: Mapping[str, Sequence[Mapping]], loglik_tasks: Sequence[str]) -> dict[str, dict]:
    """task -> filter -> doc_id -> {correct, response, target, prompt} (generation) or
    task -> "loglik" -> doc_id -> {loglik: [..], prompt} (loglikelihood tasks)."""
    out: dict[str, dict] = {}
    for task, rows in samples.items():
        for row in rows:
            doc = str(row["doc_id"])
            if task in loglik_tasks:
                values = row["filtered_resps"]  # [[log-likelihood, is greedy], ...] (samples_schema)
                out.setdefault(task, {}).setdefault("loglik", {})[doc] = {
                    "loglik": [float(v[0]) for v in values], "prompt": row.get("prompt_hash", "")}
                continue
            metric = next((m for m in row.get("metrics", []) if m in row), "exact_match")
            response = row["filtered_resps"][0] if row.get("filtered_resps") else ""
            out.setdefault(task, {}).setdefault(row.get("filter", "none"), {})[doc] = {
                "correct": bool(row.get(metric)), "response": str(response), "target": str(row.get("target", "")),
                "prompt": row.get("prompt_hash", "")}
    return out


def run_backend(backend: bench.Backend, serve_args: Sequence[str], configs: Sequence[dict], settings: Settings,
                port: int, out_dir: Path, start_timeout_s: float) -> dict[str, object]:
    log = files.inside(out_dir, f"server-accuracy-{backend.name}.log", "a backend's name")
    command = bench.server_command([*serve_args, "--enable-tokenizer-info-endpoint"], backend, port)
    base_url = f"http://127.0.0.1:{port}"
    print(f"== accuracy {backend.name}: {shown(command[1:])} (log {log})", flush=True)
    run: dict[str, object] = {"asked": {"attention_backend": backend.attention_backend,
                                        "implementation": backend.implementation}, "server_log": str(log)}
    problems: list[str] = []
    scores: dict[str, dict[str, float]] = {}
    questions: dict[str, dict] = {}
    t0 = time.monotonic()
    with children.started(command, log, bench.server_env(backend, os.environ),
                          grace_s=lambda: bench.grace(bool(questions), base_url)) as proc:
        problem = bench.start_problem(backend, proc, base_url, log, start_timeout_s)
        if problem:
            problems.append(problem)
        else:
            t1 = time.monotonic()
            try:
                with web.direct():  # lm-eval's requests reach the server on 127.0.0.1, never a proxy
                    result = run_lm_eval(base_url, configs, settings)
            except Exception as exc:  # noqa: BLE001 -- this run's failure; the next runs go on
                problems.append(f"{backend.name}: lm-eval failed: {exc.__class__.__name__}: {exc}")
            else:
                run["eval_s"] = round(time.monotonic() - t1, 1)
                scores = {task: {k: v for k, v in values.items() if isinstance(v, (int, float))
                                 and not isinstance(v, bool) and "," in k}
                          for task, values in result["results"].items()}
                questions = per_question(result["samples"], settings.loglik_tasks)
                samples_file = files.inside(out_dir, f"lm-eval-samples-{backend.name}.json", "a backend's name")
                files.write_text(samples_file, json.dumps(result["samples"], default=str) + "\n")
                run["samples_file"] = str(samples_file)
    selected = selection(log.read_text(errors="replace"))
    run["selected"] = {"attention_backends": list(selected.attention_backends),
                       "implementation": selected.implementation}
    if not problems and (why := bench.mismatch(backend, selected, complete=True)):
        problems.append(why)
    run.update(ok=not problems, problems=problems, scores=scores, questions=questions,
               total_s=round(time.monotonic() - t0, 1))
    return run


# ---------------------------------------------------------------- comparisons

def binomial_tail(k: int, n: int) -> float:
    """P(X >= k), X ~ Binomial(n, 1/2): the one-sided exact McNemar p-value of k losses in n discordant pairs."""
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2 ** n if n else 1.0


def _shared(ours: Mapping[str, Mapping], theirs: Mapping[str, Mapping]) -> tuple[list[str], list[str]]:
    """The questions both runs scored, in order, and what makes the two runs incomparable."""
    docs = sorted(set(ours) & set(theirs), key=lambda d: (len(d), d))
    problems = []
    if set(ours) != set(theirs):
        problems.append(f"the runs scored different questions ({len(ours)} vs {len(theirs)})")
    prompts_differ = [d for d in docs if ours[d].get("prompt") != theirs[d].get("prompt")]
    if prompts_differ:
        problems.append(f"the runs sent different prompts for {len(prompts_differ)} questions "
                        f"(e.g. {prompts_differ[0]}): same settings are needed")
    return docs, problems


def paired(ours: Mapping[str, Mapping], theirs: Mapping[str, Mapping], alpha: float) -> dict[str, object]:
    """One generation task and filter, question by question."""
    docs, problems = _shared(ours, theirs)
    lost = [d for d in docs if theirs[d]["correct"] and not ours[d]["correct"]]
    won = [d for d in docs if ours[d]["correct"] and not theirs[d]["correct"]]
    p = binomial_tail(len(lost), len(lost) + len(won))
    differ = [{"doc_id": d, "right": "reference" if d in lost else "ours", "target": ours[d]["target"][:200],
               "ours": ours[d]["response"][:200], "reference": theirs[d]["response"][:200]}
              for d in sorted(lost + won, key=lambda d: (len(d), d))]
    significant = p < alpha
    if significant:
        problems.append(f"answers {len(lost)} questions wrong that the reference answers right and {len(won)} "
                        f"the other way round: p = {p:.2g} < {alpha} (questions {', '.join(lost[:SHOWN])})")
    return {"n": len(docs), "ours_correct": sum(ours[d]["correct"] for d in docs),
            "reference_correct": sum(theirs[d]["correct"] for d in docs), "lost": len(lost), "won": len(won),
            "p_value": p, "significant": significant,
            "identical_responses": sum(ours[d]["response"] == theirs[d]["response"] for d in docs),
            "differing": differ[:SHOWN], "problems": problems, "ok": not problems}


def loglik_agreement(ours: Mapping[str, Mapping], theirs: Mapping[str, Mapping],
                     tolerance: tuple[float, float]) -> dict[str, object]:
    atol, rtol = tolerance
    docs, problems = _shared(ours, theirs)
    beyond, max_diff, max_rel = [], 0.0, 0.0
    for d in docs:
        a, b = ours[d]["loglik"], theirs[d]["loglik"]
        for x, y in zip(a, b):
            if math.isfinite(x) and math.isfinite(y):
                diff, scale = abs(x - y), max(abs(x), abs(y))
                rel = diff / scale if scale else 0.0
            else:
                diff = rel = math.inf
            max_diff, max_rel = max(max_diff, diff), max(max_rel, rel)
            if not numeric.agree(x, y, atol, rtol):  # a nan or inf never agrees
                beyond.append({"doc_id": d, "ours": x, "reference": y, "diff": diff})
    if beyond:
        worst = max(beyond, key=lambda r: r["diff"])
        problems.append(f"{len(beyond)} of {len(docs)} log-likelihoods differ beyond atol {atol:g} + rtol {rtol:g}"
                        f" (worst question {worst['doc_id']}: {worst['ours']:.6g} vs {worst['reference']:.6g})")
    return {"n": len(docs), "max_abs_diff": max_diff, "max_rel_diff": max_rel, "tolerance": [atol, rtol],
            "beyond": beyond[:SHOWN], "problems": problems, "ok": not problems}


def dtype_tolerance(serve_args: Sequence[str], settings: Settings) -> tuple[str, tuple[float, float]]:
    dtype = option_value(serve_args, "--dtype")
    dtype = "auto" if dtype is None else dtype
    if settings.ll_tolerance:
        return dtype, settings.ll_tolerance
    return dtype, TOLERANCES["float32" if dtype in ("float32", "float") else "low"]


# What a reference run must share with this one: the questions, how they are asked, the model.
SAME_AS_REFERENCE = ("tasks", "loglik_tasks", "num_fewshot", "limit", "dtype", "serve_args")

# A reference folder's files: what reference_runs, document and render take from them (JSON Schema,
# checked as they are read: rocm_vllm_runtime.schema), and how large they may be.
RESULTS_LIMIT = 16 << 20
SAMPLES_LIMIT = 256 << 20
_TEXT = {"type": "string", "maxLength": 100_000}
_TEXTS = {"type": "array", "maxItems": 10_000, "items": _TEXT}
RUN_SCHEMA = {"type": "object", "required": ["ok"], "properties": {
    "ok": {"type": "boolean"},
    "problems": _TEXTS,
    "samples_file": {"type": "string", "maxLength": 4096},
    "scores": {"type": "object", "additionalProperties": {"type": "object",
                                                          "additionalProperties": {"type": "number"}}},
    "selected": {"type": "object", "properties": {"attention_backends": _TEXTS,
                                                  "implementation": {"type": ["string", "null"], "maxLength": 200}}},
}}
RESULTS_SCHEMA = {"type": "object", "required": ["settings", "runs"], "properties": {
    "settings": {"type": "object"},
    "runs": {"type": "object", "maxProperties": 100, "additionalProperties": RUN_SCHEMA},
}}
_NAME = {"type": "string", "maxLength": 200}
_ROW = {"doc_id": {"type": ["integer", "string"], "maxLength": 200}, "filter": _NAME,
        "metrics": {"type": "array", "maxItems": 100, "items": _NAME}, "prompt_hash": _NAME}


def samples_schema(loglik_tasks: Sequence[str]) -> dict:
    """lm-eval's samples as per_question reads them: task -> rows; a generation row's filtered_resps a list
    (its first entry the answer), a log-likelihood row's a list of [log-likelihood, is greedy] pairs."""
    def task(filtered: dict) -> dict:
        return {"type": "array", "maxItems": 1_000_000, "items": {
            "type": "object", "required": ["doc_id", "filtered_resps"],
            "properties": {**_ROW, "filtered_resps": filtered}}}
    pair = {"type": "array", "minItems": 1, "maxItems": 16, "items": {"type": ["number", "boolean"]}}
    loglik = task({"type": "array", "minItems": 1, "maxItems": 1000, "items": pair})
    return {"type": "object", "maxProperties": 1000, "properties": {t: loglik for t in loglik_tasks},
            "additionalProperties": task({"type": "array", "maxItems": 1000})}


def reference_runs(folder: str, names: Sequence[str], settings: Settings,
                   serve_args: Sequence[str], dtype: str) -> dict[str, dict]:
    """The runs of `names` from an earlier gate's results folder (its accuracy.json and lm-eval
    samples), with their questions: taken instead of serving those backends again. An
    AccuracyError naming ACCURACY_REFERENCE when the folder does not hold them, or holds them from
    other settings."""
    where = f"ACCURACY_REFERENCE={folder}"
    path = Path(folder) / "accuracy.json"
    try:
        doc = schema.check(files.read_json(path, str(path), RESULTS_LIMIT), RESULTS_SCHEMA, str(path))
        recorded, runs = doc["settings"], doc["runs"]  # type: ignore[index]
    except files.DataError as exc:
        if exc.kind == "json":
            raise AccuracyError(f"{where}: cannot read {path}: not an accuracy gate's JSON ({exc.detail}); it must be "
                                "a folder an earlier gate wrote accuracy.json and its lm-eval samples to") from None
        raise AccuracyError(f"{where}: {exc}") from None
    except OSError as exc:
        raise AccuracyError(f"{where}: cannot read {path}: {exc.strerror or exc}; it must be a folder an earlier "
                            "gate wrote accuracy.json and its lm-eval samples to") from None
    ours = {**asdict(settings), "dtype": dtype, "serve_args": list(serve_args)}
    for key in SAME_AS_REFERENCE:
        theirs = recorded.get(key)  # the schema made recorded, runs and each run an object
        mine = list(ours[key]) if isinstance(ours[key], tuple) else ours[key]
        if theirs != mine:
            raise AccuracyError(f"{where}: that run had {key} {theirs!r}, this one {mine!r}: a reference must be "
                                "run with the same tasks, shots, limit, dtype and serve arguments")
    out = {}
    for name in names:
        run = runs.get(name)
        if run is None:
            raise AccuracyError(f"{where}: no run of {name} there (it holds {', '.join(runs)})")
        if not run.get("ok") or not run.get("samples_file"):
            raise AccuracyError(f"{where}: its run of {name} failed ({'; '.join(run.get('problems') or [])}): "
                                "not a reference")
        try:
            samples_path = files.inside(folder, Path(str(run["samples_file"])).name, "a reference's samples file")
            samples = schema.check(files.read_json(samples_path, str(samples_path), SAMPLES_LIMIT),
                                   samples_schema(settings.loglik_tasks), str(samples_path))
        except files.RefusedError as exc:
            raise AccuracyError(f"{where}: {exc}") from None
        except files.DataError as exc:
            if exc.kind not in ("json", "utf8"):
                raise AccuracyError(f"{where}: {exc}") from None
            raise AccuracyError(f"{where}: cannot read the lm-eval samples of {name} "
                                f"({samples_path.name}): {exc.detail}") from None
        except OSError as exc:
            raise AccuracyError(f"{where}: cannot read the lm-eval samples of {name} "
                                f"({Path(str(run['samples_file'])).name}): {getattr(exc, 'strerror', None) or exc}"
                                ) from None
        print(f"== accuracy {name}: taken from {folder} (an earlier run), not served", flush=True)
        out[name] = {**run, "questions": per_question(samples, settings.loglik_tasks), "reference": folder}  # type: ignore[arg-type]
    return out


def compare(chosen: Sequence[bench.Backend], serve_args: Sequence[str], settings: Settings, port: int,
            out_dir: Path, start_timeout_s: float) -> dict[str, object]:
    configs = task_configs(settings)  # DataMissing before any server starts
    dtype, tolerance = dtype_tolerance(serve_args, settings)
    taken = (reference_runs(settings.reference, [b.name for b in chosen[1:]], settings, serve_args, dtype)
             if settings.reference else {})  # refused before any server starts
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = {b.name: taken.get(b.name) or run_backend(b, serve_args, configs, settings, port, out_dir,
                                                     start_timeout_s) for b in chosen}
    return document(runs, settings, dtype, tolerance, serve_args)


def document(runs: Mapping[str, Mapping], settings: Settings, dtype: str,
             tolerance: tuple[float, float], serve_args: Sequence[str] = ()) -> dict[str, object]:
    ours_name, *others = runs
    ours, comparisons = runs[ours_name], {}
    for other in others:
        theirs = runs[other]
        entry: dict[str, object] = {"tasks": {}, "loglik": {}}
        if ours.get("ok") and theirs.get("ok"):
            for task, filters in ours["questions"].items():
                for flt, questions in filters.items():
                    other_q = theirs["questions"].get(task, {}).get(flt, {})
                    if flt == "loglik":
                        entry["loglik"][task] = loglik_agreement(questions, other_q, tolerance)  # type: ignore[index]
                    else:
                        entry["tasks"].setdefault(task, {})[flt] = paired(questions, other_q, settings.alpha)  # type: ignore[union-attr]
        entry["ok"] = bool(ours.get("ok") and theirs.get("ok")) and all(
            r["ok"] for t in entry["tasks"].values() for r in t.values()) and all(  # type: ignore[union-attr]
            r["ok"] for r in entry["loglik"].values())  # type: ignore[union-attr]
        comparisons[other] = entry
    slim = {n: {k: v for k, v in r.items() if k != "questions"} for n, r in runs.items()}
    return {"settings": {**asdict(settings), "dtype": dtype, "ll_tolerance": list(tolerance),
                         "serve_args": list(serve_args)},
            "ours": ours_name, "runs": slim, "comparisons": comparisons,
            "ok": all(r.get("ok") for r in runs.values()) and all(c["ok"] for c in comparisons.values())}


def score_line(doc: Mapping, name: str) -> str:
    scores = (doc["runs"][name].get("scores") or {})
    return ", ".join(f"{task} {key.partition(',')[2]} {value:.3f}" for task, values in scores.items()
                     for key, value in values.items() if not key.split(",")[0].endswith("_stderr")
                     and task not in doc["settings"]["loglik_tasks"])


def render(doc: Mapping[str, object]) -> str:
    runs: Mapping[str, Mapping] = doc["runs"]  # type: ignore[assignment]
    lines = []
    for name, run in runs.items():
        selected = run.get("selected", {})
        lines.append(f"{name}: selected {', '.join(selected.get('attention_backends') or []) or '(none logged)'} "
                     f"({selected.get('implementation', '?')}): {score_line(doc, name) or '-'}"
                     f" -> {'ok' if run.get('ok') else 'FAILED'}")
        lines += [f"  problem: {p}" for p in run.get("problems") or []]
    for other, entry in doc["comparisons"].items():  # type: ignore[union-attr]
        for task, filters in entry["tasks"].items():
            for flt, r in filters.items():
                lines.append(f"{doc['ours']} vs {other}, {task} {flt}: {r['ours_correct']} vs "
                             f"{r['reference_correct']} of {r['n']} right, {r['lost']} lost / {r['won']} won, "
                             f"p = {r['p_value']:.3g} -> {'ok' if r['ok'] else 'FAILED'}")
                lines += [f"  question {q['doc_id']}: target {q['target']!r}, ours {q['ours']!r}, "
                          f"reference {q['reference']!r}" for q in r["differing"]]
                lines += [f"  problem: {p}" for p in r["problems"]]
        for task, r in entry["loglik"].items():
            lines.append(f"{doc['ours']} vs {other}, {task} log-likelihoods: max |diff| {r['max_abs_diff']:.3g} "
                         f"over {r['n']} (tolerance {r['tolerance'][0]:g} + {r['tolerance'][1]:g}|ll|) "
                         f"-> {'ok' if r['ok'] else 'FAILED'}")
            lines += [f"  problem: {p}" for p in r["problems"]]
    lines.append(f"accuracy gate: {'passed' if doc['ok'] else 'FAILED'}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    env = os.environ
    parser = argparse.ArgumentParser(prog="python3 -m rocm_vllm_runtime.accuracy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    options = (("--backends", "ACCURACY_BACKENDS"), ("--tasks", "ACCURACY_TASKS"),
               ("--loglik-tasks", "ACCURACY_LOGLIK_TASKS"), ("--num-fewshot", "ACCURACY_NUM_FEWSHOT"),
               ("--limit", "ACCURACY_LIMIT"), ("--concurrency", "ACCURACY_CONCURRENCY"),
               ("--alpha", "ACCURACY_ALPHA"), ("--data", "ACCURACY_DATA"),
               ("--ll-tolerance", "ACCURACY_LL_TOLERANCE"), ("--port", "ACCURACY_PORT"),
               ("--start-timeout", "ACCURACY_START_TIMEOUT"))
    for option, name in options:
        parser.add_argument(option, dest=name, default=None, help=f"default ${name} or {ENV_DEFAULTS[name]!r}")
    parser.add_argument("--reference", dest="ACCURACY_REFERENCE", default=None, metavar="DIR",
                        help="an earlier run's results folder (its accuracy.json and lm-eval samples): the "
                        "backends after the first are taken from it, not served (ACCURACY_REFERENCE, default none)")
    parser.add_argument("--tasks-dir", dest="ACCURACY_TASKS_DIR", default=None,
                        help="further lm-eval task definitions "
                        "(ACCURACY_TASKS_DIR, default $SELFTEST_SUITES/accuracy_tasks)")
    parser.add_argument("--out-dir", default=env.get("ACCURACY_OUT_DIR") or ".",
                        help="server logs and lm-eval's samples (ACCURACY_OUT_DIR, default .)")
    parser.add_argument("--json", metavar="PATH", help="write the comparison as JSON")
    parser.add_argument("serve_args", nargs="*", help="after --: arguments for every server (ACCURACY_SERVE_ARGS)")
    args = parser.parse_args(argv)
    problem = files.outputs_problem({"--json": args.json}, {"--out-dir": args.out_dir})
    if problem:
        print(f"accuracy: error: {problem}", file=sys.stderr)
        return 2
    merged = {**env, **{k: v for k, v in vars(args).items() if k.startswith("ACCURACY_") and v is not None}}
    children.forward_signals()
    try:
        settings = Settings.from_env(merged)
        chosen = bench.choose([n.strip() for n in merged.get("ACCURACY_BACKENDS", ENV_DEFAULTS["ACCURACY_BACKENDS"])
                               .split(",") if n.strip()], bench.backends(bench.plugin_names()), "ACCURACY_BACKENDS")
        serve_args = args.serve_args or split_serve_args(merged)
        port = numeric.port("ACCURACY_PORT / --port", merged.get("ACCURACY_PORT") or ENV_DEFAULTS["ACCURACY_PORT"])
        timeout = numeric.duration("ACCURACY_START_TIMEOUT / --start-timeout",
                                   merged.get("ACCURACY_START_TIMEOUT") or ENV_DEFAULTS["ACCURACY_START_TIMEOUT"])
        doc = compare(chosen, serve_args, settings, port, Path(args.out_dir), timeout)
    except DataMissing as exc:
        print(f"accuracy: error: {exc}", file=sys.stderr)
        return 1
    except (AccuracyError, bench.BenchError, ValueError) as exc:
        print(f"accuracy: error: {exc}", file=sys.stderr)
        return 2
    print(render(doc), flush=True)
    if args.json and not files.write_result("accuracy", "--json", args.json, json.dumps(doc, indent=2) + "\n"):
        return 2
    return 0 if doc["ok"] else 1


def split_serve_args(env: Mapping[str, str]) -> list[str]:
    try:
        return shlex.split(env.get("ACCURACY_SERVE_ARGS") or ENV_DEFAULTS["ACCURACY_SERVE_ARGS"])
    except ValueError as exc:
        raise AccuracyError(f"ACCURACY_SERVE_ARGS cannot be split as shell words ({exc}): fix its quoting") from None


if __name__ == "__main__":
    sys.exit(main())

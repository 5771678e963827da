"""Every benchmark in one command: one table, a JSON file, a plot, and the README's results.

    .venv/bin/python -m benchmarks                 # every section: about 8 minutes on 2 cores
    .venv/bin/python -m benchmarks --quick         # a smoke run of about a minute
    .venv/bin/python -m benchmarks --only pipeline --only fingerprint
    .venv/bin/python -m benchmarks --write-readme  # also update the results in README.md

Sections that run TensorFlow in this process's place run in child processes (a fresh
process per configuration), so this process never imports TensorFlow. Progress goes to
stderr; the table to stdout. The exit status is 0 when every section ran, whether or not
its targets were met, and 1 when a section failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.machine import describe, machine
from benchmarks.readme import README, write_readme
from benchmarks.rounds import progress
from benchmarks.rows import Row, read_rows, render_table, target_summary, write_json
from benchmarks.servers import REPO, stop_on_sigterm

DEFAULT_PLOT = REPO / "benchmarks" / "results.png"


def run_child(module: str, *args: str) -> list[Row]:
    """Run `python -m module ... --out F` and read its rows; its progress lines are shown."""
    with tempfile.TemporaryDirectory(prefix="bench-child-") as tmp:
        out = Path(tmp) / "rows.json"
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        proc = subprocess.Popen(
            [sys.executable, "-m", module, *args, "--out", str(out)],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        tail: deque[str] = deque(maxlen=40)
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                if line.startswith("bench: "):
                    print(line, end="", file=sys.stderr, flush=True)
                else:
                    tail.append(line)  # TensorFlow's start-up chatter, or a traceback
            code = proc.wait()
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
        if code != 0:
            raise RuntimeError(f"{module} {' '.join(args)} exited {code}:\n{''.join(tail)}")
        return read_rows(out)


def _pipeline(quick: bool) -> list[Row]:
    flag = ["--quick"] if quick else []
    return run_child("benchmarks.pipeline", "--cores", "all", *flag) + run_child(
        "benchmarks.pipeline", "--cores", "1", *flag
    )


def _arrays(quick: bool) -> list[Row]:
    return run_child("benchmarks.arrays_pipeline", *(["--quick"] if quick else []))


def _fingerprint(quick: bool) -> list[Row]:
    return run_child("benchmarks.fingerprinting", *(["--quick"] if quick else []))


def _resnet(quick: bool) -> list[Row]:
    from benchmarks import keras_definitions

    return keras_definitions.measure(quick)


def _training(quick: bool) -> list[Row]:
    from benchmarks import training_cost

    return training_cost.measure(quick)


def _keras(quick: bool) -> list[Row]:
    from benchmarks import keras_baseline

    return keras_baseline.measure(quick)


def _replicas(quick: bool) -> list[Row]:
    from benchmarks import replicas

    return replicas.measure(quick)


def _service(quick: bool) -> list[Row]:
    from benchmarks import service_overhead

    return service_overhead.measure(quick)


def _api(quick: bool) -> list[Row]:
    from benchmarks import api_throughput

    return api_throughput.measure(quick)


def _scaling(quick: bool) -> list[Row]:
    from benchmarks import scaling

    return scaling.measure(quick)


def _compare(quick: bool) -> list[Row]:
    from benchmarks import bench_compare

    rows: list[Row] = bench_compare.table_rows(quick)
    return rows


def _dashboard(quick: bool) -> list[Row]:
    from benchmarks import compare_runs, dashboard_pages

    return dashboard_pages.measure(quick) + compare_runs.measure(quick)


def _waiting(quick: bool) -> list[Row]:
    from benchmarks import waiting_load

    return waiting_load.measure(quick)


def _fleet(quick: bool) -> list[Row]:
    from benchmarks import fleet

    return fleet.measure(quick)


def _spotcheck(quick: bool) -> list[Row]:
    from benchmarks import spot_checks

    return spot_checks.measure(quick)


def _script(quick: bool) -> list[Row]:
    from benchmarks import script_overhead

    return script_overhead.measure(quick)


def _executors(quick: bool) -> list[Row]:
    from benchmarks import executor_overhead

    return executor_overhead.measure(quick)


@dataclass(frozen=True)
class Section:
    title: str
    run: Callable[[bool], list[Row]]


SECTIONS = {
    "pipeline": Section("1. input pipeline (1 core and all cores)", _pipeline),
    "arrays": Section("the arrays generator vs tf.data shuffle + augmentation", _arrays),
    # keras before training: training reads the jobs the keras section ran (SHARED_JOBS).
    "keras": Section("a job's steps/s against plain Keras model.fit", _keras),
    "resnet": Section("ResNet-20 as a model definition against model.fit", _resnet),
    "script": Section("your own model.fit script with Reprotrain vs without", _script),
    "training": Section("2. op determinism on/off and 3b. trace share", _training),
    "fingerprint": Section("3a. fingerprinting, 1 MB to 1 GB", _fingerprint),
    "replicas": Section("2 replicas vs 1, 2 hosts vs 1, step checkpoints", _replicas),
    "service": Section("4. service overhead", _service),
    "api": Section("5. API throughput and claims", _api),
    "scaling": Section("6. scaling with 1k, 10k, 100k runs", _scaling),
    "waiting": Section("500 event streams and 100 waiting claims held", _waiting),
    "fleet": Section("heartbeats of a fleet: concurrent jobs per API process", _fleet),
    "compare": Section("the comparison report's server time", _compare),
    "dashboard": Section("the dashboard's pages at 1k, 10k, 100k runs", _dashboard),
    "executors": Section("container start-to-first-step: docker vs process executor", _executors),
    "spotcheck": Section("spot checks: replays' share of training, checkpoints kept", _spotcheck),
}
# The table's order: the numbering (3b comes from the training runs).
ROW_ORDER = (
    "pipeline",
    "arrays",
    "determinism",
    "fingerprint",
    "trace",
    "keras",
    "resnet",
    "script",
    "replicas",
    "service",
    "api",
    "scaling",
    "waiting",
    "fleet",
    "compare",
    "dashboard",
    "executors",
    "spotcheck",
)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run of about a minute")
    parser.add_argument(
        "--only",
        action="append",
        choices=list(SECTIONS),
        help="run this section only (repeat for several)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the rows here")
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="PATH",
        help="where to write the PNG (default: benchmarks/results.png for a full run; a run "
        "with --quick or --only writes one only to a path given here)",
    )
    parser.add_argument(
        "--write-readme",
        action="store_true",
        help="replace the results in benchmarks/README.md (full runs only)",
    )
    args = parser.parse_args(argv)
    if args.write_readme and (args.quick or args.only):
        parser.error("--write-readme publishes full runs only: drop --quick and --only")
    if args.plot is None and not (args.quick or args.only):
        # The README shows this file: a partial run would replace a full run's curves.
        args.plot = DEFAULT_PLOT
    return args


def command_line(args: argparse.Namespace) -> str:
    """The command as a user reruns it, with the options that change what is measured."""
    parts = [".venv/bin/python -m benchmarks"]
    if args.quick:
        parts.append("--quick")
    parts += [f"--only {name}" for name in args.only or []]
    if args.write_readme:
        parts.append("--write-readme")
    return " ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    stop_on_sigterm()
    names = args.only or list(SECTIONS)
    selected = [name for name in SECTIONS if name in names]
    env = machine()
    began = time.monotonic()
    rows: list[Row] = []
    seconds: dict[str, float] = {}
    failed: list[str] = []
    for i, name in enumerate(selected, start=1):
        progress(f"[{i}/{len(selected)}] {SECTIONS[name].title}")
        started = time.monotonic()
        try:
            rows += SECTIONS[name].run(args.quick)
        except Exception:  # report it, run the other sections, exit 1 at the end
            failed.append(name)
            progress(f"section {name} FAILED:\n{traceback.format_exc()}")
        seconds[name] = round(time.monotonic() - started, 1)
        progress(f"[{i}/{len(selected)}] {name}: {seconds[name]:.0f} s")
    total = round(time.monotonic() - began, 1)
    rows.sort(key=lambda r: ROW_ORDER.index(r.section))
    env["loadavg_end"] = list(os.getloadavg())
    command = command_line(args)

    print(describe(env))
    print(f"{command}: {total:.0f} s ({', '.join(f'{k} {v:.0f} s' for k, v in seconds.items())})")
    if args.quick:
        print("--quick: a smoke run; at these sizes fixed costs dominate and ratios mean little")
    print(render_table(rows))
    for what, status, missed in target_summary(rows):
        print(f"- {what}: {status}")
        for row in missed:
            print(f"    {row.configuration}: {row.cause}")
    if failed:
        print(f"FAILED sections: {', '.join(failed)} (see stderr)")

    if args.json:
        write_json(args.json, rows, machine=env, command=command, seconds=seconds, total=total)
    if rows and args.plot is not None:
        if importlib.util.find_spec("matplotlib") is None:  # optional: the `bench` extra
            progress("no plot: install matplotlib with .venv/bin/pip install -e '.[bench]'")
        else:
            from benchmarks.plot import write_plot

            write_plot(rows, args.plot, f"{env['cpu_count']} cores, {command}")
            progress(f"plot written to {args.plot}")
    if args.write_readme:
        if failed:
            progress("README not written: a section failed")
        else:
            plot = args.plot.name if args.plot.resolve() == README.parent / args.plot.name else None
            write_readme(
                README, rows, env=env, command=command, total=total, seconds=seconds, plot=plot
            )
            progress(f"results written to {README}")
    return 1 if failed else 0

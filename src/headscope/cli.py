"""The `headscope` command line.

    headscope report [--model SPEC] [--task NAME|FILE] [--task-fields prompt=COL,...] [--analyses a,b] [--out DIR] [--seed N]
                     [--device cpu|cuda] [--resume] [--force] [--quick]
    headscope heads|attribution|position|patching|mlp|kv|probes [same options]
    headscope sites [--model SPEC]       load a model and print its facts and hookable sites
    headscope zoo list | zoo train NAME  the shipped model organisms
    headscope --version                  (python -m headscope works too)

Under torchrun (`torchrun --nproc_per_node=N -m headscope report ...`) the report and analysis
commands run data-parallel: every rank computes its shard, rank 0 alone logs and writes.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

from headscope.version import __version__

log = logging.getLogger("headscope")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="headscope", description="Attention analysis and mechanistic interpretability.")
    p.add_argument("--version", action="version", version=f"headscope {__version__}")
    p.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    from headscope.analyses.core.registry import ANALYSES

    r = sub.add_parser("report", help="run every analysis (or --analyses) and write an HTML report")
    _run_options(r)
    r.add_argument("--analyses", default=None, help=f"comma-separated subset of: {','.join(ANALYSES)} (default: all)")
    for name in ANALYSES:
        _run_options(sub.add_parser(name, help=f"run the {name} analysis alone (same outputs as in the report)"))

    s = sub.add_parser("sites", help="load a model and print its facts and every hookable site")
    s.add_argument("--model", default=None,
                   help="zoo/<name>, minilm, a local HF directory or a hub name (default: the zoo default)")
    s.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")

    z = sub.add_parser("zoo", help="the shipped model organisms")
    zsub = z.add_subparsers(dest="zoo_command", metavar="ZOO_COMMAND")
    zsub.add_parser("list", help="one line per shipped model")
    t = zsub.add_parser("train", help="train a zoo model from scratch (deterministic for a seed)")
    t.add_argument("name")
    t.add_argument("--out", default=None, help="output directory (default: a new folder under ./zoo-train)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--steps", type=int, default=None, help="override the recipe's number of steps")
    return p


def _run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="zoo/<name>, minilm, a local HF directory or a hub name (default: the zoo default)")
    p.add_argument("--task", default=None, help="a zoo task (kv, induction, facts, ioi) or a .jsonl/.csv/.parquet task file")
    p.add_argument("--task-fields", default=None, metavar="FIELD=COLUMN,...",
                   help="your task file's column names, e.g. prompt=text,answer=label "
                        "(fields: prompt, answer, corrupted_prompt, wrong_answer)")
    p.add_argument("--out", default=None, help="output folder (default: ./headscope-out/<model>-<time>)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, choices=["cpu", "cuda"], help="default: cuda when available")
    p.add_argument("--n-examples", type=int, default=None, help="examples per analysis (default: each analysis's own)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run in --out, skipping finished analyses")
    p.add_argument("--force", action="store_true", help="overwrite an existing --out (only a previous headscope output)")
    p.add_argument("--quick", action="store_true", help="reduced sizes, for smoke tests")
    p.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help="no progress bars, only warnings")


def _cmd_report(args: argparse.Namespace) -> int:
    from headscope.errors import RunFailedError
    from headscope.execution import distributed
    from headscope.reports.report import build_report

    analyses = getattr(args, "analyses", None) if args.command == "report" else args.command
    distributed.init_from_env(args.device)
    try:
        out = build_report(
            args.model, out=args.out, analyses=analyses, task=args.task, task_fields=args.task_fields, seed=args.seed,
            quick=args.quick, n_examples=args.n_examples, device=args.device, force=args.force, resume=args.resume,
            progress=not args.quiet, command=["headscope", *sys.argv[1:]],
        )
    except RunFailedError as err:  # --force and an analysis failed: the old output is unchanged
        if os.environ.get("RANK", "0") == "0":
            print(f"headscope: error: {err}", file=sys.stderr)
        return 2 if err.user_mistake else 1
    finally:
        distributed.shutdown()
    if os.environ.get("RANK", "0") != "0":
        return 0  # rank 0 reports (and sets the exit status)
    from headscope.reports.io import read_json
    from headscope.reports.report import _failure_is_mistake

    status = read_json(out / "manifest.json")["status"]
    failed = [name for name, state in status.items() if state.startswith("failed")]
    print(f"wrote {out / 'report.html'}" + (f" ({len(failed)} failed: {', '.join(failed)})" if failed else ""))
    if not failed:
        return 0
    return 2 if all(_failure_is_mistake(status[name]) for name in failed) else 1  # 2: user mistakes only


def _cmd_sites(args: argparse.Namespace) -> int:
    from headscope.hooks.sites import SITES, available_sites, parse_site
    from headscope.models import load_model

    model = load_model(args.model, device=args.device)
    print(model)
    names = available_sites(model)
    print(f"{len(names)} sites:")
    for name in names:
        kind, _ = parse_site(name)
        print(f"  {name:<40} {SITES[kind].shape:<36} {SITES[kind].doc}")
    return 0


def _cmd_zoo(args: argparse.Namespace) -> int:
    from headscope.models.zoo import cli as zoo_cli

    if args.zoo_command == "list":
        zoo_cli.list_main()  # returns its lines (for Python callers), not an exit status
        return 0
    if args.zoo_command == "train":
        zoo_cli.train_main(args.name, out=args.out, seed=args.seed, steps=args.steps, quiet=args.quiet)  # returns the folder
        return 0
    print("usage: headscope zoo {list,train NAME}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    quiet = args.quiet or os.environ.get("RANK", "0") != "0"  # under torchrun only rank 0 logs progress
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from headscope.analyses.core.registry import ANALYSES
    from headscope.errors import HeadscopeError

    handlers = {"sites": _cmd_sites, "zoo": _cmd_zoo, "report": _cmd_report, **{name: _cmd_report for name in ANALYSES}}
    if args.command is None:
        _parser().print_help()
        return 2
    try:
        return handlers[args.command](args)
    except HeadscopeError as err:  # a user mistake: one line, exit 2 (anything else keeps its traceback)
        print(f"headscope: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())

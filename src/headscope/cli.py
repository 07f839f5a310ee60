"""The `headscope` command line.

    headscope report [--model SPEC] [--task NAME|FILE] [--task-fields prompt=COL,...] [--strict] [--analyses a,b]
                     [--out DIR] [--seed N] [--device cpu|cuda[:N]|mps] [--dtype float32|bfloat16|float16]
                     [--resume|--force] [--quick] [--budget MINUTES] [--n-items N]
    headscope heads|attribution|position|patching|mlp|kv|probes|circuits [same options]
                                         (position also [--n-items N]: its items a prompt, the gold one included)
    headscope sites [--model SPEC]       load a model and print its facts and hookable sites
    headscope zoo list | zoo train NAME  the shipped model organisms
    headscope compare OUT_A OUT_B [--out FILE]  two report folders side by side in one HTML page
    headscope --version                  (python -m headscope works too)

Under torchrun (`torchrun --nproc_per_node=N -m headscope report ...`) the report and analysis
commands run data-parallel: every rank computes its shard, rank 0 alone logs and writes.
"""
from __future__ import annotations

import argparse
import errno
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
    _n_items_option(r, " of position (the run must include it)")
    for name in ANALYSES:
        one = sub.add_parser(name, help=f"run the {name} analysis alone (same outputs as in the report)")
        _run_options(one)
        if name == "position":
            _n_items_option(one)

    s = sub.add_parser("sites", help="load a model and print its facts and every hookable site")
    s.add_argument("--model", default=None,
                   help="zoo/<name>, minilm, a local HF directory or a hub name (default: the zoo default)")
    s.add_argument("--device", default=None, help="cpu, cuda, cuda:N, mps (default: cuda when available)")
    _trust_option(s)

    z = sub.add_parser("zoo", help="the shipped model organisms")
    zsub = z.add_subparsers(dest="zoo_command", metavar="ZOO_COMMAND")
    zsub.add_parser("list", help="one line per shipped model")
    t = zsub.add_parser("train", help="train a zoo model from scratch (deterministic for a seed)")
    t.add_argument("name")
    t.add_argument("--out", default=None, help="output directory (default: a new folder under ./zoo-train)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--steps", type=int, default=None, help="override the recipe's number of steps")

    c = sub.add_parser("compare", help="one HTML page setting two report folders side by side")
    c.add_argument("out_a", metavar="OUT_A", help="a headscope output folder")
    c.add_argument("out_b", metavar="OUT_B", help="another one (a second checkpoint, or another model on the same task)")
    c.add_argument("--out", default=None, help="the page to write, ending in .html (default: ./compare.html)")
    c.add_argument("--force", action="store_true", help="overwrite an existing --out file")
    return p


def _n_items_option(p: argparse.ArgumentParser, whose: str = "") -> None:
    """position's --n-items (RunSettings.overrides passes it to position's config; the manifest records it)."""
    p.add_argument("--n-items", type=int, default=None, metavar="N",
                   help=f"items a prompt{whose}, the gold one included: documents of a QA records file, sentences "
                        "of retrieval records, pairs of a key-value task (default: 10 documents; every "
                        "record's distractors + 1 sentences; the pairs that fit, up to 20); the gold item "
                        "goes to every slot up to 8 items, else to the first slot and the quarters; each "
                        "record is checked to have N - 1 distractors before anything is written")


def _run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="zoo/<name>, minilm, a local HF directory or a hub name (default: the zoo default)")
    p.add_argument("--task", default=None,
                   help="a zoo task (kv, induction, facts, ioi) or a .jsonl/.csv/.tsv/.parquet task file; its prompts may "
                        "have different lengths (padded; a corrupted prompt needs its own prompt's length)")
    p.add_argument("--task-fields", default=None, metavar="FIELD=COLUMN,...",
                   help="your task file's column names, e.g. prompt=text,answer=label "
                        "(fields: prompt, answer, corrupted_prompt, wrong_answer)")
    p.add_argument("--strict", action="store_true",
                   help="stop (exit 2, nothing written) when a word of the task file becomes the tokenizer's unknown "
                        "token, or a corrupted prompt has another token length than its prompt, instead of warning "
                        "(without it such pairs are left out of patching only)")
    p.add_argument("--out", default=None, help="output folder (default: ./headscope-out/<model>-<time>)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N or mps, checked against what torch offers "
                   "(default: cuda when available)")
    p.add_argument("--dtype", default=None, metavar="DTYPE",
                   help="float32, bfloat16 or float16: the precision the model runs in (default: the checkpoint's)")
    p.add_argument("--n-examples", type=int, default=None, help="examples per analysis (default: each analysis's own)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run in --out, skipping finished analyses")
    p.add_argument("--force", action="store_true", help="overwrite an existing --out (only a previous headscope output)")
    p.add_argument("--quick", action="store_true", help="reduced sizes, for smoke tests")
    p.add_argument("--budget", type=float, default=None, metavar="MINUTES",
                   help="time for the analyses: each one's cost is estimated before it runs and its sweeps shrink to fit "
                        "(default: 10 minutes, 3 with --quick; inf: no budget); each summary records what changed")
    bos = p.add_mutually_exclusive_group()
    bos.add_argument("--no-prepend-bos", dest="prepend_bos", action="store_false", default=None,
                     help="run prompts as the tokenizer tokenizes them: no BOS put in front of a decoder's prompt where "
                          "the tokenizer adds none (default: headscope prepends the tokenizer's bos_token, as "
                          "TransformerLens does; the report header says so)")
    bos.add_argument("--prepend-bos", dest="prepend_bos", action="store_true", default=None,
                     help="put the tokenizer's bos_token in front of every prompt that does not start with it (encoders too)")
    p.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help="no progress bars, only warnings")
    _trust_option(p)


def _trust_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trust-remote-code", action="store_true",
                   help="let the model run its own Python code from its files (only for sources you trust)")


def _warn_remote_code(args: argparse.Namespace) -> None:
    """One warning line for --trust-remote-code (load_model's own warning is then not repeated)."""
    import warnings

    if getattr(args, "trust_remote_code", False):
        log.warning("--trust-remote-code: the model's own Python code from its files will run; use it only for trusted sources.")
        warnings.filterwarnings("ignore", message="trust_remote_code=True")


def _quiet_loading(args: argparse.Namespace) -> None:
    """-q: no "Loading weights" bar from transformers either (stderr keeps warnings and errors only)."""
    if args.quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


ERROR_LOG = "headscope-error.log"
DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}  # no space left, disk quota exceeded


class _OneLine(logging.Formatter):
    """Log lines without tracebacks: an exception adds its type and message, its traceback goes to the log file."""

    def format(self, record: logging.LogRecord) -> str:
        exc_info, exc_text, msg, args = record.exc_info, record.exc_text, record.msg, record.args
        if exc_info and exc_info[1] is not None:
            record.msg, record.args = f"{record.getMessage()}: {type(exc_info[1]).__name__}: {exc_info[1]}", None
        record.exc_info = record.exc_text = None
        try:
            return super().format(record)
        finally:
            record.exc_info, record.exc_text, record.msg, record.args = exc_info, exc_text, msg, args


class _Tracebacks(logging.Handler):
    """Collects the tracebacks of logged exceptions (an analysis that failed unexpectedly) for the error log."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.texts.append(self.format(record))


def _write_error_log(texts: list[str], out: str | os.PathLike | None, *, keep_out: bool = False) -> str | None:
    """The tracebacks into OUT/headscope-error.log when OUT is a folder (None when it is not, or on
    a rank other than 0: then they go to stderr). keep_out: OUT holds a previous output that a failed
    --force run must leave exactly as it was, so the log goes to a new private folder in the temp
    folder instead (tempfile.mkdtemp, 0700; the file 0600)."""
    import tempfile
    from pathlib import Path

    if not texts:
        return None
    target = Path(out) / ERROR_LOG if out is not None and Path(out).is_dir() and not Path(out).is_symlink() else None
    if target is not None and os.environ.get("RANK", "0") == "0":
        try:
            if keep_out:  # a new file (O_EXCL, 0600) in a new private folder (0700): no name anyone can plant
                fd, where = tempfile.mkstemp(prefix="headscope-error-", suffix=".log",
                                             dir=tempfile.mkdtemp(prefix="headscope-error-"))
            else:  # appended to, never through a symbolic link
                fd, where = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0),
                                    0o666), str(target)
            with os.fdopen(fd, "a", encoding="utf-8") as fh:
                fh.write("\n\n".join(texts) + "\n")
            return where
        except OSError:
            pass
    print("\n\n".join(texts), file=sys.stderr)
    return None


def _cmd_report(args: argparse.Namespace) -> int:
    from headscope.errors import RunFailedError
    from headscope.execution import distributed
    from headscope.models.loading import check_device
    from headscope.reports.outputs import check_modes
    from headscope.reports.report import ReportOptions, run_report

    analyses = getattr(args, "analyses", None) if args.command == "report" else args.command
    check_modes(force=args.force, resume=args.resume)
    check_device(args.device)  # before the process group opens (init_from_env) and anything is written
    _warn_remote_code(args)
    _quiet_loading(args)
    distributed.init_from_env(args.device)
    try:
        done = run_report(args.model, ReportOptions(
            out=args.out, analyses=analyses, task=args.task, task_fields=args.task_fields, seed=args.seed,
            quick=args.quick, n_examples=args.n_examples, device=args.device, dtype=args.dtype, force=args.force,
            resume=args.resume,
            progress=not args.quiet, command=["headscope", *sys.argv[1:]], trust_remote_code=args.trust_remote_code,
            strict=args.strict, budget=args.budget, substitute=args.command == "report", prepend_bos=args.prepend_bos,
            n_items=getattr(args, "n_items", None),
        ))
    except RunFailedError as err:  # --force and an analysis failed: the old output is unchanged
        if os.environ.get("RANK", "0") == "0":
            print(f"headscope: error: {err}", file=sys.stderr)
        return 2 if err.user_mistake else 1
    finally:
        distributed.shutdown()
    if os.environ.get("RANK", "0") != "0":
        return 0  # rank 0 reports (and sets the exit status)
    out, failed = done.out, done.failures
    args.out = out  # where the error log goes (the run chose OUT when --out was not given)
    print(f"wrote {out / 'report.html'}" + (f" ({len(failed)} failed: {', '.join(failed)})" if failed else ""))
    if not failed:
        return 0
    return 2 if all(f.mistake for f in failed.values()) else 1  # 2: user mistakes only


def _cmd_compare(args: argparse.Namespace) -> int:
    from headscope.reports.compare import compare_reports

    print(f"wrote {compare_reports(args.out_a, args.out_b, args.out, force=args.force)}")
    return 0


def _cmd_sites(args: argparse.Namespace) -> int:
    from headscope.hooks.edits import scores_hold_weights
    from headscope.hooks.post_norm import post_norms
    from headscope.hooks.sites import attn_softcap, available_sites, describe_site, parse_site
    from headscope.models import load_model

    _warn_remote_code(args)
    _quiet_loading(args)
    model = load_model(args.model, device=args.device, trust_remote_code=args.trust_remote_code)  # (checks --device)
    print(model)
    if model.facts.mla:  # review 15d A5/C4: d_head differs between q/k and v/z under multi-head latent attention
        m = model.facts.mla
        print(f"multi-head latent attention: d_head is {m['d_head_qk']} for q and k ({m['d_head_rope']} of it rotary; "
              f"rot_q, rot_k: that rotary part, rot_k one key shared by all heads) and {m['d_head_v']} for v and z")
    names = available_sites(model)
    weights = scores_hold_weights(model)  # review 17d A3: GPT-Neo's, OPT's hook_attn_scores holds the weights
    norms, cap = post_norms(model), attn_softcap(model)  # review 18d A2: what this model's hooks hold
    print(f"{len(names)} sites:")
    for name in names:
        kind, layer = parse_site(name)
        shape, doc = describe_site(kind, model.facts.mla, scores_hold_weights=weights, facts=model.facts,
                                   post_norms=norms, score_softcap=cap, layer=layer)  # layer: NoPE rot_q (19c A2)
        print(f"  {name:<40} {shape:<36} {doc}")
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


def _one_line_warnings() -> object:
    """Format Python warnings as the CLI's other lines: one line each ("WARNING Category: message"),
    each message once, without the source line under it. Returns the previous `warnings.formatwarning`
    (main restores it: the formatter is the command line's, not installed by importing headscope)."""
    import warnings

    previous, seen = warnings.formatwarning, set()

    def one_line(message, category, filename, lineno, line=None) -> str:
        text = f"WARNING {category.__name__}: {' '.join(str(message).split())}"
        if text in seen:  # Python shows a warning again after any change of the filters
            return ""
        seen.add(text)
        return text + "\n"

    warnings.formatwarning = one_line
    return previous


def main(argv: list[str] | None = None) -> int:
    import warnings

    previous = _one_line_warnings()
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C before a run began (imports, parsing): one line, exit 130
        print("headscope: interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.formatwarning = previous


def _main(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    quiet = args.quiet or os.environ.get("RANK", "0") != "0"  # under torchrun only rank 0 logs progress
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # tracebacks go to the error log, not the terminal
        if type(handler) is logging.StreamHandler and handler.stream in (sys.stderr, sys.__stderr__):
            handler.setFormatter(_OneLine("%(levelname)s %(name)s: %(message)s"))
    for noisy in ("matplotlib", "datasets", "PIL", "urllib3", "filelock", "fsspec"):  # their INFO lines are not ours
        logging.getLogger(noisy).setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")  # the CLI only writes image files: no GUI toolkit (headscope's library code never sets one)
    from headscope.analyses.core.registry import ANALYSES
    from headscope.errors import HeadscopeError, RunInterrupted
    from headscope.models.threads import configure_threads

    threads = configure_threads()  # before any work: torch's default collapses on a busy machine
    logging.getLogger("headscope").debug("torch threads: %s", threads or "torch's own setting")
    handlers = {"sites": _cmd_sites, "zoo": _cmd_zoo, "compare": _cmd_compare,
                "report": _cmd_report, **{name: _cmd_report for name in ANALYSES}}
    if args.command is None:
        _parser().print_help()
        return 2
    tracebacks = _Tracebacks()
    logging.getLogger().addHandler(tracebacks)
    try:
        code = handlers[args.command](args)
    except HeadscopeError as err:  # a user mistake: one line, exit 2
        print(f"headscope: error: {err}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt as err:  # Ctrl-C: one line (what OUT holds now: RunInterrupted), exit 130 as a shell's
        print(f"headscope: {err if isinstance(err, RunInterrupted) else 'interrupted'}", file=sys.stderr)
        return 130
    except Exception as err:  # an internal error: its traceback into the error log, one line, exit 1
        import traceback

        if isinstance(err, OSError) and err.errno in DISK_FULL:  # not a bug: one line, exit 2 (no log: no space)
            print(f"headscope: error: {err.strerror or err}" + (f" ({err.filename})" if err.filename else "")
                  + "; free some space and run again.", file=sys.stderr)
            return 2
        tracebacks.texts.append(traceback.format_exc().rstrip())
        where = _write_error_log(tracebacks.texts, getattr(args, "out", None), keep_out=getattr(args, "force", False))
        print(f"headscope: internal error: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
              f"{f'; traceback in {where}' if where else ''} (please report it).", file=sys.stderr)
        return 1
    finally:
        logging.getLogger().removeHandler(tracebacks)
    where = _write_error_log(tracebacks.texts, getattr(args, "out", None),
                             keep_out=getattr(args, "force", False) and code != 0)  # a failed --force run changes nothing
    if where:
        print(f"headscope: {len(tracebacks.texts)} internal error(s) logged; tracebacks in {where}.", file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main())

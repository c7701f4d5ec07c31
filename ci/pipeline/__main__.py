"""python3 -m ci.pipeline summary

  summary    RESULTS_DIR                           Markdown table of a self-test run

(The images' tags, build cache refs and attestations are declared in docker-bake.hcl: PUSH=1.)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m ci.pipeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("summary", help="Markdown summary of a self-test results directory")
    p.add_argument("results", type=Path)
    p.add_argument("--title", default="Self-test")
    ns = parser.parse_args(argv)
    try:
        print(summary.render(ns.results, ns.title))
        return 0
    except summary.SummaryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""python3 -m ci.pipeline summary | plan | driver | commit-tag | push-settings | tag

  summary        RESULTS_DIR                       Markdown table of a self-test run
  plan           TARGET...                         publish.sh's settings checked (PUBLISH, REGISTRY, GIT_SHA,
                                                   GIT_REF or GITHUB_REF), one value a line: the mode, the
                                                   registry, the commit, the floating tag, the movable tag,
                                                   1 or 0 (verify --strict) and the verify step's note
  driver                                           the driver named by `docker buildx inspect`'s output on
                                                   stdin, or nothing (publish.sh)
  commit-tag     GRAPH                             the commit tag the graph's targets share (publish.sh)
  push-settings  GRAPH DRIVER TAG                  bake's --set arguments that push each target by digest
                                                   (DRIVER docker: under <name>:unpublished-TAG) (publish.sh)
  tag            GRAPH METADATA                    every tag of the graph checked against the registry, then
                                                   set (tag.sh; PUBLISH_FORCE, MOVABLE_TAGS, DOCKER)

(The images' tags, build cache refs and attestations are declared in docker-bake.hcl: PUSH=1.)
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import publish, summary


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python3 -m ci.pipeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("summary", help="Markdown summary of a self-test results directory")
    p.add_argument("results", type=Path)
    p.add_argument("--title", default="Self-test")
    p = sub.add_parser("plan", help="publish.sh's settings checked, and what it runs with, one value a line")
    p.add_argument("targets", nargs="+")
    sub.add_parser("driver", help="the builder's driver named by `docker buildx inspect`'s output on stdin")
    p = sub.add_parser("commit-tag", help="the commit tag the targets of a resolved graph share")
    p.add_argument("graph")
    p = sub.add_parser("push-settings", help="bake's --set arguments that push each target by digest only")
    p.add_argument("graph")
    p.add_argument("driver")
    p.add_argument("tag")
    p = sub.add_parser("tag", help="set the graph's tags on the pushed digests, each checked first")
    p.add_argument("graph")
    p.add_argument("metadata")
    return parser


def run(ns: argparse.Namespace) -> None:
    if ns.command == "summary":
        print(summary.render(ns.results, ns.title))
    elif ns.command == "plan":
        print("\n".join(publish.run_plan(os.environ, ns.targets).lines()))
    elif ns.command == "driver":
        driver = publish.builder_driver(sys.stdin.read())
        if driver:
            print(driver)
    elif ns.command == "commit-tag":
        print(publish.commit_tag(publish.read_graph(ns.graph), ns.graph))
    elif ns.command == "push-settings":
        print(" ".join(publish.push_settings(publish.read_graph(ns.graph), ns.driver, ns.tag, ns.graph)))
    elif ns.command == "tag":
        publish.tag(ns.graph, ns.metadata)


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    try:
        run(ns)
        return 0
    except (summary.SummaryError, publish.PublishError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

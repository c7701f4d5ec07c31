"""python3 -m ci.pipeline tag | bake-file | summary

  tag        --sha SHA [--track T] [--aiter-pin NAME]   the image tag for a commit
  bake-file  --registry R --sha SHA [--track T] [--ref REF] [--cache-repo C] [--gpu-archs A] TARGET...
             a bake file (JSON) with the tags, registry cache and attestations per target
  summary    RESULTS_DIR                           Markdown table of a self-test run
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ci.pins import model
from ci.pins.model import PinError

from . import summary, tags


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m ci.pipeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--file", type=Path, default=model.VERSIONS_FILE, help="versions file")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("tag", help="image tag for a commit")
    p.add_argument("--sha", required=True)
    p.add_argument("--track", default="", help="release track (default: versions.json default_track)")
    p.add_argument("--aiter-pin", default="")
    p = sub.add_parser("bake-file", help="bake file with tags, cache and attestations")
    p.add_argument("--registry", required=True)
    p.add_argument("--sha", required=True)
    p.add_argument("--ref", default="")
    p.add_argument("--cache-repo", default="")
    p.add_argument("--gpu-archs", default="")
    p.add_argument("--track", default="", help="release track (default: versions.json default_track)")
    p.add_argument("--aiter-pin", default="")
    p.add_argument("--no-attest", action="store_true")
    p.add_argument("targets", nargs="+")
    p = sub.add_parser("summary", help="Markdown summary of a self-test results directory")
    p.add_argument("results", type=Path)
    p.add_argument("--title", default="Self-test")
    ns = parser.parse_args(argv)
    try:
        if ns.command == "summary":
            print(summary.render(ns.results, ns.title))
            return 0
        data = model.load(ns.file)
        track = model.track_name(data, ns.track or None)
        if ns.command == "tag":
            print(tags.image_tag(data, ns.sha, ns.aiter_pin or None, track))
        else:
            doc = tags.bake_override(data, ns.registry, ns.sha, ns.targets, ns.ref, ns.cache_repo,
                                     ns.gpu_archs, ns.aiter_pin or None, not ns.no_attest, track)
            print(json.dumps(doc, indent=2))
        return 0
    except (PinError, summary.SummaryError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""ci/test-machine/debian-trixie.sh says, before installing, which packages of the machine Debian
13's packages would upgrade, and DEBIAN_TRIXIE_UPGRADES=refuse declines (apt-get is a stand-in
that checks its whole argv and answers as apt's simulation does)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "ci/test-machine/debian-trixie.sh"

FAKE_APT = """#!/usr/bin/env python3
import json, os, sys
argv = sys.argv[1:]
with open(os.environ["FAKE_APT_LOG"], "a") as log:
    log.write(json.dumps(argv) + "\\n")
pkgs = os.environ["FAKE_APT_PKGS"].split()
if argv == ["update", "-qq"]:
    sys.exit(0)
if argv == ["install", "-s", "--no-install-recommends", "-t", "trixie", *pkgs]:
    print("Reading package lists...")
    print(os.environ.get("FAKE_APT_SIMULATION", "").replace("|", "\\n"))
    sys.exit(0)
if argv == ["install", "-y", "-qq", "--no-install-recommends", "-t", "trixie", *pkgs]:
    sys.exit(0 if os.environ.get("DEBIAN_FRONTEND") == "noninteractive" else 3)
print("fake apt-get: unexpected argv " + " ".join(argv), file=sys.stderr)
sys.exit(2)
"""

UPGRADING = ("Inst libc6 [2.36-9+deb12u10] (2.41-12+deb13u5 Debian:13/stable [amd64])|"
             "Inst docker.io (26.1.5+dfsg1-9 Debian:13/stable [amd64])|"
             "Inst locales [2.36-9+deb12u10] (2.41-12+deb13u5 Debian:13/stable [all])|"
             "Conf libc6 (2.41-12+deb13u5 Debian:13/stable [amd64])")
CLEAN = "Inst kubectl (1.32.4+ds-1 Debian:13/stable [amd64])|Conf kubectl (1.32.4+ds-1 Debian:13/stable [amd64])"


@pytest.fixture()
def apt(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the script runs apt-get as root (it uses sudo otherwise)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text(FAKE_APT)
    (bin_dir / "apt-get").chmod(0o755)
    etc = tmp_path / "etc-apt"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "preferences.d").mkdir()
    (etc / "sources.list.d/trixie.sources").write_text("Suites: trixie\n")
    (etc / "preferences.d/trixie-low").write_text("Pin-Priority: 100\n")
    log = tmp_path / "apt.jsonl"

    def run(packages: list[str], simulation: str, **env: str) -> tuple[subprocess.CompletedProcess, list]:
        full = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_APT_LOG": str(log),
                "FAKE_APT_PKGS": " ".join(packages), "FAKE_APT_SIMULATION": simulation,
                "DEBIAN_TRIXIE_APT_ETC": str(etc), **env}
        if "DEBIAN_TRIXIE_UPGRADES" not in env:
            full.pop("DEBIAN_TRIXIE_UPGRADES", None)
        if log.exists():
            log.unlink()
        proc = subprocess.run(["bash", str(SCRIPT), *packages], env=full, capture_output=True, text=True,
                              timeout=60)
        calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        return proc, calls

    return run


def test_upgrades_of_the_machine_are_named_in_one_line_before_installing(apt):
    proc, calls = apt(["docker.io", "docker-buildx"], UPGRADING)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "also upgrades" in line]
    assert lines == ["debian-trixie: installing docker.io docker-buildx from Debian 13 also upgrades 2 installed "
                     "package(s) of this machine: libc6 2.36-9+deb12u10 -> 2.41-12+deb13u5, locales "
                     "2.36-9+deb12u10 -> 2.41-12+deb13u5 (DEBIAN_TRIXIE_UPGRADES=refuse declines)"]
    assert calls[-1][:2] == ["install", "-y"]


def test_refuse_installs_nothing_when_anything_would_be_upgraded(apt):
    proc, calls = apt(["docker.io"], UPGRADING, DEBIAN_TRIXIE_UPGRADES="refuse")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("debian-trixie: error: DEBIAN_TRIXIE_UPGRADES=refuse")
    assert not any(c[:2] == ["install", "-y"] for c in calls)
    # nothing of the machine would change: refuse installs as usual, and says nothing
    proc, calls = apt(["kubectl"], CLEAN, DEBIAN_TRIXIE_UPGRADES="refuse")
    assert proc.returncode == 0 and "also upgrades" not in proc.stderr
    assert calls[-1] == ["install", "-y", "-qq", "--no-install-recommends", "-t", "trixie", "kubectl"]


def test_an_unknown_setting_is_one_line(apt):
    proc, calls = apt(["kubectl"], CLEAN, DEBIAN_TRIXIE_UPGRADES="maybe")
    assert proc.returncode == 1 and "DEBIAN_TRIXIE_UPGRADES=maybe" in proc.stderr and calls == []

"""Local git repositories for tests: git run with a test identity (file and git:// submodules
allowed), a new repository, and a commit of everything in a work tree."""
from __future__ import annotations

import subprocess
from pathlib import Path

IDENTITY = ("-c", "user.name=t", "-c", "user.email=t@t", "-c", "protocol.allow=always")


def git(*args: str, cwd: Path) -> str:
    """git's standard output, stripped; a failing command fails the test with its stderr."""
    proc = subprocess.run(["git", *IDENTITY, *args], cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, f"git {' '.join(args)}: {proc.stderr.strip()}"
    return proc.stdout.strip()


def new_repo(path: Path) -> Path:
    """An empty repository at path (made with its parents), branch main."""
    path.mkdir(parents=True, exist_ok=True)
    git("init", "-q", "-b", "main", cwd=path)
    return path


def commit_all(repo: Path, message: str) -> str:
    """Every change in repo's work tree committed; the new commit."""
    git("add", "-A", ".", cwd=repo)
    git("commit", "-qm", message, cwd=repo)
    return git("rev-parse", "HEAD", cwd=repo)

"""The pin tool's own environment (standard library only): where jsonschema, packaging or urllib3
is missing, or uv (the resolver of the hash locks `resolve --write` and `lock` make) is neither
beside this Python nor on PATH, `python3 -m ci.pins` makes a virtual environment from the hash lock ci/locks/pins.txt
(pip --require-hashes) in the user's cache folder, named by the lock's sha256, once, and runs
itself again in it."""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
from pathlib import Path

from .. import runtime_modules

NEEDED = ("jsonschema", "packaging", "urllib3")
# Programs the lock installs too (uv: ci/pins/locks.py uv_command looks beside this Python, then on PATH).
TOOLS = ("uv",)
ROOT = Path(__file__).resolve().parents[2]
LOCK = Path("ci/locks/pins.txt")


def ensure(argv: list[str]) -> None:
    """Return where the libraries are here; else run the tool in its environment and exit."""
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    missing += [tool for tool in TOOLS if not (Path(sys.executable).parent / tool).is_file() and not shutil.which(tool)]
    if not missing:
        return
    try:
        lock = (ROOT / LOCK).read_bytes()
    except OSError as exc:
        sys.exit(f"error: {LOCK}: cannot read the pin tool's lock ({exc.strerror}): run it from a whole checkout")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    files = runtime_modules.module("files")
    home = files.inside(cache / "rocm-vllm-pins", "env-" + hashlib.sha256(lock).hexdigest()[:16], "the lock's digest")
    python = home / "bin" / "python"
    if os.environ.get("CI_PINS_ENV") == str(home):  # already in it, and still without them
        sys.exit(f"error: {home} lacks {', '.join(missing)}: remove that folder and run again")
    done = home / "installed"
    if not done.is_file():
        children = runtime_modules.module("children")
        print(f"ci.pins: making its environment in {home} from {LOCK} (once)", file=sys.stderr, flush=True)
        if children.run([sys.executable, "-m", "venv", "--clear", str(home)]) != 0:
            sys.exit(f"error: {sys.executable} -m venv {home} failed: install Python's venv module (Debian: "
                     "apt-get install python3-venv)")
        if children.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                         "--require-hashes", "--no-deps", "-r", str(ROOT / LOCK)]) != 0:
            sys.exit(f"error: pip could not install {LOCK} into {home}: check the network, proxy or index "
                     "(PIP_INDEX_URL, PIP_CERT)")
        files.write_text(done, f"{LOCK} sha256 {hashlib.sha256(lock).hexdigest()}\n")
    os.environ["CI_PINS_ENV"] = str(home)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    os.execv(python, [str(python), "-m", "ci.pins", *argv])

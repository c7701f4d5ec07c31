"""The backend's MLA kernel table of an AITER pin, derived by `resolve aiter` from the pinned commit.

The table (backend/src/vllm_aiter_mla/kernel_tables/<tag>.json) is what
ci/docker/aiter_kernel_table.py derives from the commit's kernel lists with the dispatch rules it
encodes; the base image's aiter-check stage holds the built AITER to it. Deriving needs only the
kernel lists and the dispatch sources the rules were read from: those files of the commit are
fetched (git, bounded by PINS_TIMEOUT) into a scratch tree. When the commit's dispatch code is not
what the rules encode, no table is written and the line says what to re-read. Standard library only.
"""
from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path

from .. import runtime_modules
from . import model, resolve

files = runtime_modules.module("files")

TABLES = Path("backend/src/vllm_aiter_mla/kernel_tables")
SCRIPT = model.REPO_ROOT / "ci/docker/aiter_kernel_table.py"


def rules_module():
    """ci/docker/aiter_kernel_table.py, loaded once (a script of the build, not a package)."""
    if "aiter_kernel_table" not in sys.modules:
        spec = importlib.util.spec_from_file_location("aiter_kernel_table", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["aiter_kernel_table"]


def table_path(tag: str, root: Path = model.REPO_ROOT) -> Path:
    """The kernel table of AITER `tag` (a name from versions.json): inside TABLES, or PinError."""
    try:
        return files.inside(root / TABLES, f"{tag}.json", "the kernel table name")
    except files.RefusedError as exc:
        raise model.PinError(f"aiter tag {tag!r} cannot name a kernel table ({exc}): fix the tag in "
                             "versions.json") from None


def needed_files(rules) -> list[str]:
    return [rules.kernel_list_path(Path("."), arch).as_posix() for arch in rules.ARCHS] + list(rules.RULES_READ_FROM)


def fetch_files(repository: str, commit: str, paths: list[str], dest: Path) -> None:
    """The files of one commit (absent ones left out) under dest, fetched without a checkout."""
    repo = str(dest / ".git-scratch")
    resolve.fetch_commit(repository, commit, repo)
    for rel in paths:
        listed = resolve._git("ls-tree", "--name-only", commit, "--", rel, cwd=repo).strip()
        if not listed:
            continue
        text = resolve._git("show", f"{commit}:{rel}", cwd=repo, url=repository)
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def derive(repository: str, commit: str, tag: str, rules=None) -> tuple[str | None, str]:
    """(the table's text, '') or (None, why it cannot be derived: one line). rules: the module of
    ci/docker/aiter_kernel_table.py (default: loaded from there)."""
    rules = rules or rules_module()
    with tempfile.TemporaryDirectory(prefix="pins-kernels-") as tmp:
        source = Path(tmp)
        fetch_files(repository, commit, needed_files(rules), source)
        if not rules.read_kernel_lists(source):
            return None, (f"AITER {tag} ({commit[:12]}) has no MLA kernel lists (hsa/<arch>/mla/mla_asm.csv): "
                          "its kernel table cannot be derived")
        changed = rules.changed_dispatch_code(source)
        if changed:
            return None, (f"AITER {tag} ({commit[:12]}): its MLA dispatch code differs from what "
                          f"ci/docker/aiter_kernel_table.py encodes ({', '.join(changed)}): re-read it, update the "
                          f"rules, then derive {TABLES / (tag + '.json')}; the build stops at aiter-check until then")
        return rules.dump_table(rules.derive_table(source, tag, commit)), ""


def resolve_table(data: dict, name: str, root: Path = model.REPO_ROOT) -> tuple[dict[Path, str], str, str]:
    """({table path: text} when it is new or changed, the change line or '', a note or '') for the
    AITER pin `name`; a note says why no table was derived (the pins resolve all the same)."""
    pin = data["aiter"]["pins"][name]
    if not pin.get("commit"):
        return {}, "", f"aiter.pins.{name}: no commit yet: its kernel table is derived once it is resolved"
    text, why = derive(data["aiter"]["repository"], pin["commit"], pin["tag"])
    if text is None:
        return {}, "", f"warning: {why}"
    path = table_path(pin["tag"], root)
    if path.is_file() and path.read_text() == text:
        return {}, "", ""
    rows = len(json.loads(text)["rows"])
    return {path: text}, f"{TABLES / path.name}: derived from {pin['commit'][:12]}'s kernel lists ({rows} rows)", ""

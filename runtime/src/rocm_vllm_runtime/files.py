"""The one owner of four kinds of risky file operation (architecture tests, tests/test_one_owner.py and
tests/test_one_json_reader.py, fail on any other use). Standard library only.

* Deleting: `remove_made` removes a folder this program made (`make_dir` wrote its marker inside) within
  a root this program made, never through a symbolic link; a folder is this program's by its owner, not
  by its name (`made_problem`: folder and marker belong to the user that runs it, only that user can
  write to it, no other user can replace it); anything else is refused in one line
  (`RefusedError`). `point_link` replaces only a symbolic link, and only one that `replaceable` accepts.
  `_delete` is the one primitive behind them.
* Joining a path taken from data (a manifest's commit, a cache key, a task's dataset name): `inside`
  joins one plain name to its root and refuses anything that would leave it.
* Writing a result: `write_text` writes whole or not at all (a temporary file beside the target, then a
  rename), through a symbolic link to its target, and only to an absent path or a regular file (never a
  device, a FIFO, a socket or a stream such as /dev/stdout); `outputs_problem` checks the same before
  any work, and that no two outputs name one file.
* Reading JSON (the project's own files and answers from outside): `json_value` parses text, refusing a
  key given twice in one object (a hand merge), nesting deeper than JSON_DEPTH, text that is not UTF-8,
  an integer longer than int() reads and a lone surrogate escape;
  `read_json` reads a file of at most a given size (never a FIFO or a device), `read_bounded` at most a
  given number of bytes of a stream (an HTTP answer that never ends). Each refusal is one line
  (`DataError`) that names where the data came from and what is wrong. What shape the data must have is
  checked after, against a declared schema (`rocm_vllm_runtime.schema`).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

# The file `make_dir` writes into each folder it makes: what `remove_made` asks for.
MARKER = ".rocm-vllm-made"
# Folders of streams and devices: never a result file, whatever the node there is.
_NOT_FILES = ("/dev/", "/proc/")
_FILES_UNDER_DEV = ("/dev/shm/",)


class OutputError(OSError):
    """A result file cannot be written; the message names the option and the path."""


class DataError(ValueError):
    """Data read from a file or an answer is not what it must be; the message is one line, `where: detail`.
    `kind` says which check refused it: utf8, json, duplicate, depth, number, size, regular or schema."""

    def __init__(self, where: str, kind: str, detail: str) -> None:
        super().__init__(f"{where}: {detail}")
        self.where, self.kind, self.detail = where, kind, detail


class RefusedError(OSError):
    """A deletion or a path join this module will not do; the message is one line naming what to change."""


# ------------------------------------------------------------------------------------ deleting

def _delete(path: Path) -> None:
    """The one primitive that deletes: a folder (its tree, links inside removed, never followed) or a
    file or link itself. Only the functions of this module call it, after their checks."""
    if stat.S_ISDIR(os.lstat(path).st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _owner_problem(path: Path, info: os.stat_result, uid: int) -> str:
    if info.st_uid != uid:
        return f"{path} belongs to uid {info.st_uid}, not to uid {uid} that runs this program"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} can be changed by other users (mode {stat.S_IMODE(info.st_mode):04o})"
    return ""


def _above_problem(folder: Path, uid: int) -> str:
    """'' when no other user can replace `folder`: every folder above it, by its name and through its
    links, belongs to root or to `uid` and takes no new names from others (unless sticky, as /tmp)."""
    above = [*folder.parents, *Path(os.path.realpath(folder.parent), "x").parents]
    for step in dict.fromkeys(above):
        try:
            info = os.lstat(step)
        except OSError as exc:
            return f"cannot check {step} ({exc.strerror or exc})"
        if info.st_uid not in (0, uid):
            return f"{step} belongs to uid {info.st_uid}, neither root nor uid {uid} that runs this program"
        if stat.S_ISDIR(info.st_mode) and info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) \
                and not info.st_mode & stat.S_ISVTX:
            return f"{step} can be changed by other users (mode {stat.S_IMODE(info.st_mode):04o}, not sticky)"
    return ""


def made_problem(path: str | Path) -> str:
    """'' when `path` is a folder this program made and no one else can have changed (the module's
    rules: a real folder, its marker inside, `_above_problem`), as OpenSSH trusts a configuration file.
    Otherwise why not, in one line."""
    folder = Path(os.path.abspath(path))
    uid = os.geteuid()
    try:
        info = os.lstat(folder)
    except OSError as exc:
        return f"{folder} is not there ({exc.strerror or exc})"
    if not stat.S_ISDIR(info.st_mode):
        return f"{folder} is not a folder (a symbolic link or a file)"
    try:
        mark = os.lstat(folder / MARKER)
    except OSError:
        return f"{folder} has no {MARKER} in it"
    if not stat.S_ISREG(mark.st_mode):
        return f"{folder / MARKER} is not a regular file"
    return (_owner_problem(folder, info, uid) or
            (f"{folder / MARKER} belongs to uid {mark.st_uid}, not to uid {uid} that runs this program"
             if mark.st_uid != uid else "") or _above_problem(folder, uid))


def is_made(path: str | Path) -> bool:
    """Whether `path` is a folder this program made that no one else can have changed (made_problem)."""
    return not made_problem(path)


def make_dir(path: str | Path) -> Path:
    """Create the folder `path` (and its parents) with this program's marker inside, so that
    `remove_made` may remove it later. A folder that was there without the marker is used, never
    marked: it stays its owner's. Returns the path."""
    folder = Path(path)
    existed = os.path.lexists(folder)
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)  # writable by its user only, whatever the umask
    if not existed:
        with open(folder / MARKER, "x") as f:
            f.write("made by rocm-vllm: this folder and all in it may be removed by it\n")
    return folder


def _within(path: Path, root: Path) -> bool:
    """`path` lies strictly below `root` (both absolute, normalised) with no symbolic link between."""
    try:
        rest = path.relative_to(root)
    except ValueError:
        return False
    step = root
    for part in rest.parts[:-1]:
        step = step / part
        if os.path.islink(step):
            return False
    return bool(rest.parts) and ".." not in rest.parts


def remove_made(path: str | Path, root: str | Path) -> None:
    """Remove the folder `path`: only when it lies inside `root`, both made by this program (`make_dir`),
    with no symbolic link on the way; otherwise RefusedError, one line."""
    folder = Path(os.path.abspath(path))
    base = Path(os.path.abspath(root))
    problem = made_problem(base)
    if problem:
        raise RefusedError(f"{base} was not made by this program ({problem}): nothing under it is "
                           "removed; give a folder of its own")
    if not _within(folder, base):
        raise RefusedError(f"{folder} is outside {base}, or reached through a symbolic link: not removed")
    if os.path.islink(folder):
        raise RefusedError(f"{folder} is a symbolic link: not removed, nor what it points at")
    problem = made_problem(folder)
    if problem:
        raise RefusedError(f"{folder} was not made by this program ({problem}): not removed")
    _delete(folder)


@contextlib.contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A new folder of this program's under the temporary directory for the length of the block, then
    removed with all in it (a link inside is removed, never followed)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    (folder / MARKER).write_text("made by rocm-vllm: removed when its command ends\n")
    try:
        yield folder
    finally:
        if is_made(folder):
            _delete(folder)


def point_link(link: str | Path, target: str, replaceable: Callable[[str], bool],
               owner: tuple[int, int] | None = None, advice: str = "move it away or choose another folder") -> None:
    """Make `link` a symbolic link to `target`, atomically. Something already there is replaced only
    when it is a symbolic link whose target `replaceable` accepts (one this program made); a folder,
    a file or any other link is refused in one line (RefusedError) that ends with `advice`. Run as
    root, `owner` (uid, gid) becomes the link's owner."""
    link = Path(link)
    if os.path.islink(link):
        current = os.readlink(link)
        if current == target:
            return
        if not replaceable(current):
            raise RefusedError(f"{link} is a symbolic link to {current}, not one this program made: {advice}")
    elif os.path.lexists(link):
        kind = "a folder" if os.path.isdir(link) else "a file"
        raise RefusedError(f"{link} is {kind} this program did not make: {advice}")
    temporary = link.with_name(f".{link.name}-{os.urandom(6).hex()}")
    os.symlink(target, temporary)
    try:
        if owner:
            os.chown(temporary, *owner, follow_symlinks=False)
        os.replace(temporary, link)
    except BaseException:
        _delete(temporary)
        raise


# ------------------------------------------------------------------------------------ joining

def inside(root: str | Path, name: str, what: str = "a name") -> Path:
    """`root / name` for one plain name taken from data; RefusedError (one line naming `what`) when the
    name is empty, `.` or `..`, holds a separator or a NUL, so the result could leave `root`."""
    if not name or name in (".", "..") or "/" in name or "\0" in name or (os.altsep and os.altsep in name):
        raise RefusedError(f"{what} {name!r} is not a plain name: it cannot be a folder's or file's name "
                           "(no /, no .., not empty)")
    return Path(root) / name


# ------------------------------------------------------------------------------------ result files

def target_of(path: str | Path) -> Path:
    """The file a write to path changes: a symbolic link's target (followed to the end)."""
    return Path(os.path.realpath(path))


def _steps(path: str | Path) -> list[str]:
    """Every path a lookup of `path` passes through, link by link (its folders resolved first)."""
    seen, current = [], os.path.abspath(path)
    for _ in range(40):
        seen.append(current)
        parent = os.path.realpath(os.path.dirname(current))
        current = os.path.join(parent, os.path.basename(current))
        seen.append(current)
        if not os.path.islink(current):
            break
        current = os.path.normpath(os.path.join(parent, os.readlink(current)))
    return seen


def not_regular_problem(option: str, path: str | Path) -> str:
    """'' when `path` (through its links) is absent or a regular file; else one line. Checked before
    anything opens it: opening a FIFO waits for a reader, and a device replaced by a file is gone.
    The line starts with the option and the path (the path alone when `option` is empty)."""
    named = f"{option} {path}" if option else str(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        return f"cannot use {named} ({exc.strerror or exc}): choose a writable path"
    if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):  # a directory: check_outputs'
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a special file")
        return f"{named} is not a regular file (it is {kind}): give the path of a file"
    for step in _steps(path):  # a stream that is a file now (/dev/stdout redirected to one)
        under = step + "/" if not step.endswith("/") else step
        if under.startswith(_NOT_FILES) and not under.startswith(_FILES_UNDER_DEV):
            return f"{named} is not a regular file ({step} is a device or a stream): give the path of a file"
    return ""


def check_outputs(outputs: Mapping[str, str | None]) -> str:
    """'' when every given output (option -> path) names a file of its own; else one line."""
    seen: dict[Path, str] = {}
    for option, path in outputs.items():
        if not path:
            continue
        target = target_of(path)
        if target in seen:
            return (f"{seen[target]} and {option} name the same file ({target}): give each output a path of "
                    "its own")
        if target.is_dir():
            return f"{option} {path} is a directory: give a file path"
        seen[target] = option
    return ""


def writable_problem(option: str, path: str) -> str:
    """'' when `path` can be written as a file (its folder is created; nothing there is changed):
    write_text renames a new file into its folder, so that folder must take new files. Else one line
    naming the option. A directory there is check_outputs' to name; anything but a regular file
    not_regular_problem's."""
    folder = target_of(path).parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot write {option} {path} ({exc.strerror or exc}): choose a writable path"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot write {option} {path} (its folder {folder} takes no new files): choose a writable path"
    return ""


def directory_problem(option: str, path: str) -> str:
    """'' when `path` is (or can be made) a folder files can be written in; else one line."""
    target = Path(path)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        return f"{option} {path} is a file, not a folder: give a folder"
    except OSError as exc:
        return f"cannot make {option} {path} ({exc.strerror or exc}): choose a writable folder"
    if not os.access(target, os.W_OK | os.X_OK):
        return f"cannot write in {option} {path}: choose a writable folder"
    return ""


def outputs_problem(outputs: Mapping[str, str | None], folders: Mapping[str, str | None] | None = None) -> str:
    """'' when every result file (option -> path) can be written, each to a file of its own, and every
    output folder (option -> path) can take files; else the first problem. Checked before any work, so
    a bad path never costs a run."""
    problems = [not_regular_problem(o, p) for o, p in outputs.items() if p]
    problems += [check_outputs(outputs)]
    problems += [writable_problem(o, p) for o, p in outputs.items() if p]
    problems += [directory_problem(o, p) for o, p in (folders or {}).items() if p]
    return next((p for p in problems if p), "")


def write_text(path: str | Path, text: str) -> Path:
    """Write text to path atomically (see the module docstring); the file written."""
    problem = not_regular_problem("", path)
    if problem:
        raise OutputError(problem)
    target = target_of(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, target.stat().st_mode & 0o7777 if target.exists() else 0o644)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            _delete(Path(tmp))  # the temporary file made above, never the target
        raise
    return target


def stamp(path: str | Path) -> tuple[int, int, int] | None:
    """What tells a file written now from one that was there: inode, size, modification time."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def write_result(prog: str, option: str, path: str, text: str) -> bool:
    """write_text, with a failure said in one line (`prog: error: ...`) instead of a traceback;
    False when the file could not be written."""
    try:
        write_text(path, text)
    except OutputError as exc:
        print(f"{prog}: error: {option} {exc}", file=sys.stderr, flush=True)
        return False
    except OSError as exc:
        print(f"{prog}: error: cannot write {option} {path} ({exc.strerror or exc}): choose a writable path",
              file=sys.stderr, flush=True)
        return False
    return True


# ------------------------------------------------------------------------------------ reading JSON

# Deeper than any file or answer the project reads; past Python's recursion limit json.loads raises.
JSON_DEPTH = 64
# The most bytes read of one JSON file or answer unless its reader says otherwise.
JSON_LIMIT = 64 << 20
# The most digits of one JSON integer: Python's own limit of int() (sys.get_int_max_str_digits), which
# json.loads would otherwise hit as a bare ValueError past its one-line error.
JSON_DIGITS = 4300


def _unique_keys(where: str):
    def pairs(items: list[tuple[str, object]]) -> dict:
        out: dict = {}
        for key, value in items:
            if key in out:
                shown = key if len(key) <= 80 else key[:77] + "..."
                raise DataError(where, "duplicate", f"the key {shown!r} appears twice in one object (a merge "
                                "that kept both sides?): keep one")
            out[key] = value
        return out
    return pairs


def _integer(where: str):
    def parse(text: str) -> int:
        digits = len(text.lstrip("-"))
        if digits > JSON_DIGITS:
            raise DataError(where, "number", f"an integer of {digits} digits (more than {JSON_DIGITS}): not "
                            "what is expected there")
        return int(text)
    return parse


def _surrogate(text: str) -> int:
    """The position of the first lone surrogate in `text` (an escape such as \\ud800 that is no
    character: it cannot be written as UTF-8 or printed), -1 when none."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return -1


def _checked(value: object, where: str) -> None:
    """DataError when `value` nests deeper than JSON_DEPTH or a string (a key or a value) in it holds a
    lone surrogate."""
    todo = [(value, 1)]
    while todo:
        item, level = todo.pop()
        strings = [item] if isinstance(item, str) else list(item) if isinstance(item, dict) else []
        for text in strings:
            at = _surrogate(text)
            if at >= 0:
                shown = text[:at].encode("ascii", "backslashreplace").decode()[-40:]
                raise DataError(where, "utf8", f"a lone surrogate \\u{ord(text[at]):04x} after {shown!r} (an "
                                "escape that is no character): write the character itself")
        if isinstance(item, (dict, list)):
            if level > JSON_DEPTH:
                raise DataError(where, "depth", f"nested deeper than {JSON_DEPTH} levels")
            todo += [(v, level + 1) for v in (item.values() if isinstance(item, dict) else item)]


def json_value(text: str | bytes, where: str) -> object:
    """The one reader of JSON text: its value, or DataError (the module docstring's refusals) in one
    line starting with `where`, so no value read here fails later, where it is used or printed."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(where, "utf8", f"not UTF-8 text (byte {exc.start})") from None
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys(where), parse_int=_integer(where))
    except RecursionError:
        raise DataError(where, "depth", f"nested deeper than {JSON_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise DataError(where, "json", f"not JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from None
    _checked(value, where)
    return value


def read_bounded(stream, where: str, limit: int = JSON_LIMIT) -> bytes:
    """At most `limit` bytes of a binary stream (a file, an HTTP answer), read in chunks; DataError in one
    line naming `where` when there are more (an answer that never ends is cut off, not held whole)."""
    chunks, size = [], 0
    while True:
        chunk = stream.read(min(1 << 20, limit + 1 - size))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise DataError(where, "size", f"more than {limit} bytes: not what is expected there")


def read_json(path: str | Path, where: str = "", limit: int = JSON_LIMIT) -> object:
    """The JSON value of the file `path` (json_value), a regular file (a FIFO would wait for a writer)
    of at most `limit` bytes. DataError in one line starting with `where` (default: the path); OSError
    when it cannot be read."""
    where = where or str(path)
    problem = not_regular_problem("", path)
    if problem:
        raise DataError(where, "regular", problem)
    with open(path, "rb") as f:
        return json_value(read_bounded(f, where, limit), where)

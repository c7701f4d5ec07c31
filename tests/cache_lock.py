"""One process at a time for what the tests make once and keep (track environments, unpacked
sdists): the suite runs in several lanes (ci/test.sh), and two lanes may ask for the same one
first on a machine with nothing kept."""
from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def held(path: Path) -> Iterator[None]:
    """An exclusive lock on the file `path` (made if missing) while the block runs; another
    process asking for it waits. The kernel lets go when the holder ends, however it ends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)

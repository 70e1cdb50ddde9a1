"""One writer per output folder: an exclusive, non-blocking flock on FOLDER/.writer.lock, held for as long as
the writer runs.

The kernel drops a flock when its process dies, however it dies, so a lock left by a killed run is never stale in
the kernel's eyes: the file only remembers the last holder's process id, which is reported when a new writer takes
the folder over. A second live writer is refused at once with the holder's process id. Readers (generate, eval)
take no lock and are never blocked.
"""
from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

from errors import ConfigError

LOCK_NAME = ".writer.lock"


class FolderLock:
    def __init__(self, folder: str | Path, what: str = "run") -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.what = what
        self.handle = None

    def acquire(self) -> "FolderLock":
        self.folder.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise ConfigError(f"{self.folder} is being written by another {self.what} (process {holder}); wait for "
                              "it to finish, stop it, or choose another output folder") from None
        handle.seek(0)
        previous = handle.read().strip()
        if previous and previous != str(os.getpid()):
            print(f"note: took over {self.path} from process {previous}, which is no longer running",
                  file=sys.stderr)
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self.handle = handle
        return self

    def release(self) -> None:
        if self.handle is not None:
            self.handle.seek(0)
            self.handle.truncate()  # a clean exit leaves no holder to report
            self.handle.flush()
            fcntl.flock(self.handle.fileno(), fcntl.LOCK_UN)
            self.handle.close()
            self.handle = None

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

"""The on-disk artifact store: where artifacts live, how they are written, and how they are checked.

Directory: ``$NSA_IREE_CACHE_DIR``, else ``$XDG_CACHE_HOME/nsa_iree``, else ``~/.cache/nsa_iree``. A directory
that cannot be written (a shared, admin-installed cache on a read-only file system) is still read: its
verified artifacts are used as they are. What has to be compiled then goes to a per-user writable directory,
named in a warning: the default cache when ``NSA_IREE_CACHE_DIR`` points elsewhere, else
``<tmp>/nsa_iree-<uid>`` (created private to the user). If none can be written, :class:`ArtifactError` says so
and names ``NSA_IREE_CACHE_DIR``.

Writes: a temporary file in the same directory, flushed to disk, then renamed over the target, so a reader
never sees a torn file. Files are only ever opened for reading otherwise.

Digest: each ``<name>.vmfb`` has ``<name>.vmfb.sha256`` beside it (``sha256sum`` format, so ``sha256sum -c``
checks a cache by hand), written after the vmfb. A vmfb is loaded only from bytes that match it: a truncated,
overwritten or bit-rotted file, or one without a digest (an interrupted write, or a file written before
digests existed), is never handed to IREE, whose loader trusts the executables inside and can crash the
process (SIGILL / SIGSEGV) on garbage.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
import threading
import warnings
from pathlib import Path

DIGEST_SUFFIX = ".sha256"
ENV = "NSA_IREE_CACHE_DIR"


class ArtifactError(RuntimeError):
    """A cached artifact cannot be used or stored. The message names the file or directory and NSA_IREE_CACHE_DIR."""


def _default_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "nsa_iree"


def cache_dir() -> Path:
    """``$NSA_IREE_CACHE_DIR``, else ``$XDG_CACHE_HOME/nsa_iree``, else ``~/.cache/nsa_iree``."""
    env = os.environ.get(ENV)
    return Path(env) if env else _default_dir()


def describe_dir(directory: Path) -> str:
    """`directory`, saying where it came from (the message of every cache warning and error)."""
    if os.environ.get(ENV) and Path(os.environ[ENV]) == directory:
        return f"{directory} ({ENV})"
    if directory == _default_dir():
        return f"{directory} (the default cache; set {ENV} to choose another)"
    return str(directory)


def _user_tmp_dir() -> Path | None:
    uid = os.getuid() if hasattr(os, "getuid") else os.getpid()
    try:
        return Path(tempfile.gettempdir()) / f"nsa_iree-{uid}"
    except OSError:                                  # no writable temporary directory at all
        return None


def fallback_dirs(primary: Path) -> list[Path]:
    """Per-user directories that take the artifacts a read-only `primary` cannot, in order of preference."""
    return [d for d in (_default_dir(), _user_tmp_dir()) if d is not None and d != primary]


def _can_create_in(directory: str) -> bool:
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".probe.", suffix=".tmp")
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


@contextlib.contextmanager
def tool_tmpdir(writable: Path):
    """TMPDIR for a tool run inside the block (iree-compile writes temporary files there, else in /tmp),
    changed only when the environment's cannot be written: then Python's own choice of a temporary directory,
    else `writable` (the directory the artifact goes to)."""
    current = os.environ.get("TMPDIR")
    if _can_create_in(current or "/tmp"):
        yield
        return
    try:
        replacement = tempfile.gettempdir()
        if not _can_create_in(replacement):
            raise OSError
    except OSError:
        replacement = str(writable)
    os.environ["TMPDIR"] = replacement
    try:
        yield
    finally:
        if current is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = current


def _private_enough(directory: Path) -> bool:
    """The shared-tmp fallback must be the user's own: nobody else may plant artifacts in it."""
    if directory != _user_tmp_dir() or not hasattr(os, "getuid"):
        return True
    try:
        st = directory.stat()
    except OSError:
        return True                                  # not there yet: we create it 0700
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def probe_writable(directory: Path) -> OSError | None:
    """None if files can be created in `directory` (made if missing), else the error that prevents it."""
    if not _private_enough(directory):
        return PermissionError(f"{directory} belongs to another user or is writable by others")
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700 if directory == _user_tmp_dir() else 0o777)
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".probe.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        # Without its traceback: kept, it would tie the callers' frames (and any IREE object in them) into a
        # reference cycle that only the interpreter's last collection frees, after IREE's bindings are gone.
        return err.with_traceback(None)
    return None


_warned: set = set()
_warned_lock = threading.Lock()


def writable_dir(primary: Path, what: str) -> Path:
    """`primary` if it can be written, else the first writable fallback (with a warning, once per pair).

    Raises ArtifactError naming NSA_IREE_CACHE_DIR when none can be written. `what` is what is to be stored.
    """
    error = probe_writable(primary)
    if error is None:
        return primary
    tried = []
    for directory in fallback_dirs(primary):
        problem = probe_writable(directory)
        if problem is None:
            with _warned_lock:
                first = (primary, directory) not in _warned
                _warned.add((primary, directory))
            if first:
                warnings.warn(f"nsa_iree: the artifact cache {describe_dir(primary)} cannot be written "
                              f"({_why(error)}): {what} goes to {directory} instead. Artifacts already in {primary} "
                              f"are still used as they are.", RuntimeWarning, stacklevel=3)
            return directory
        tried.append(f"{directory} ({_why(problem)})")
    raise ArtifactError(f"nsa_iree: cannot store {what}: the artifact cache {describe_dir(primary)} cannot be "
                        f"written ({_why(error)}), nor can {', '.join(tried)}. Point {ENV} at a writable "
                        f"directory, or fill the cache with `nsa-iree compile -o DIR` where it can be written.")


def _why(err: OSError) -> str:
    return err.strerror or str(err) if isinstance(err, OSError) else str(err)


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same directory and a rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def digest_path(vmfb: Path) -> Path:
    return vmfb.with_name(vmfb.name + DIGEST_SUFFIX)


def write_artifact(vmfb: Path, data: bytes) -> None:
    """The vmfb, then its digest: a reader that finds the digest finds the bytes it describes."""
    atomic_write(vmfb, data)
    atomic_write(digest_path(vmfb), f"{hashlib.sha256(data).hexdigest()}  {vmfb.name}\n".encode())


def _check(vmfb: Path) -> tuple[bytes | None, str | None]:
    """(bytes, None) for a verified vmfb, else (None, what is wrong with it)."""
    try:
        data = vmfb.read_bytes()
    except FileNotFoundError:
        return None, "it does not exist"
    except OSError as err:
        return None, f"it cannot be read ({_why(err)})"
    try:
        expected = digest_path(vmfb).read_text().split()[0].lower()
    except FileNotFoundError:
        return None, (f"it has no digest beside it ({digest_path(vmfb).name}): an interrupted write, or a file "
                      f"written by an nsa_iree without digests")
    except (OSError, UnicodeDecodeError, IndexError) as err:
        return None, f"its digest {digest_path(vmfb).name} cannot be read ({err})"
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        return None, (f"it does not match its digest {digest_path(vmfb).name} ({len(data)} bytes, sha256 "
                      f"{actual[:16]}..., expected {expected[:16]}...): a truncated or corrupted file")
    return data, None


def problem_with(vmfb: Path) -> str | None:
    """None if `vmfb` exists and matches its digest, else what is wrong with it (for messages)."""
    return _check(vmfb)[1]


def read_verified(vmfb: Path) -> bytes:
    """The bytes of `vmfb` if they match the digest beside it; else ArtifactError naming the file."""
    data, problem = _check(Path(vmfb))
    if problem is not None:
        raise ArtifactError(f"nsa_iree: the artifact {vmfb} cannot be used: {problem}. It is compiled again "
                            f"where iree-base-compiler is installed; otherwise delete it and compile it with "
                            f"`nsa-iree compile` into {ENV} ({cache_dir()}).")
    return data

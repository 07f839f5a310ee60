"""Output folders: what a run may create, replace and delete (the lock that keeps runs apart is output_lock.py).

Ownership. headscope deletes only files it wrote. OUT/manifest.json carries "output_format" and
"files" (relative path -> sha256 of every file the run wrote, kept up to date after each
analysis). A file is headscope's when it is listed there and its bytes still hash to the listed
value; anything else in the folder (a file the user added or edited, a symbolic link, a folder
headscope did not make) is the user's and is never deleted. A folder without a valid headscope
manifest is never touched: --force refuses it (one line, exit 2), and so does --resume unless the
folder is empty. (Outputs of headscope versions before these file lists count as not headscope's.)

Three modes, chosen under the lock (`OutputSession.open`; --resume and --force together are refused):
- fresh (OUT does not exist): OUT is created and written in place, manifest.json first (an empty
  file list), then each analysis folder (staged as .NAME.partial and renamed into place, so it
  appears whole), the manifest after each analysis, and the report files and the manifest last.
  A run that fails before its first analysis is written removes what it made; after that (and
  after kill -9) the folder stays for --resume. A failed write (a full disk, Ctrl-C) never leaves
  a .NAME.partial folder (write_result removes it).
- resume (OUT exists, --resume): written in place; finished analyses are skipped.
- force (OUT exists, --force): the run writes into a staging folder beside OUT,
  `.OUT.staging-<pid>`, marked by a `.headscope-staging` file. Only when every analysis
  succeeded is it swapped in: (1) rename OUT to `.OUT.old-<pid>`, (2) rename the staging folder
  to OUT, (3) move the user's items from the old folder into OUT at the same relative paths (one
  whose name the new run also wrote is kept as NAME.user.EXT), (4) delete the old folder's
  headscope files (hash still matching), then the folders headscope made once they are empty.
  On any failure before (1) (an analysis failed, a write failed, Ctrl-C) the staging folder,
  which holds only files the run wrote, is removed, and OUT is exactly as it was.
  The swap is two renames in one folder, so OUT is missing only between them.

The lock (`.OUT.lock` beside OUT, held for the whole run) is reports/output_lock.py.

Recovery. Under the lock a run first finishes what a killed run left beside OUT: a staging
folder with its marker is removed, and so are the temporary files of atomic writes of the top-level
report files in a headscope OUT (`.manifest.json.XXXXXXXX.tmp`...); an old folder is put back when OUT is missing (killed between
the two renames), and otherwise its user items are moved into OUT and its headscope files
deleted, as in steps (3)-(4).

A symbolic link as OUT is refused with --force (the swap would replace the link, not its
target); read-only locations and other OS errors become one-line OutputErrors.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath

from headscope.errors import ConfigError, OutputError, OutputExistsError
from headscope.reports import io
from headscope.reports.manifest import OUTPUT_FORMAT, read_output_manifest
from headscope.reports.output_lock import OutputLock, os_reason

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
STAGING_MARK = ".headscope-staging"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---- ownership: which items of a folder are headscope's ------------------------------------------
def safe_relpath(rel: str) -> bool:
    p = PurePosixPath(rel)
    return bool(rel) and not p.is_absolute() and ".." not in p.parts and "\\" not in rel and rel == p.as_posix()


def _made_dirs(files: Iterable[str]) -> set[str]:
    """The folders headscope made: every ancestor of a listed file."""
    dirs: set[str] = set()
    for rel in files:
        parent = PurePosixPath(rel).parent
        while str(parent) not in (".", ""):
            dirs.add(parent.as_posix())
            parent = parent.parent
    return dirs


def split_folder(folder: Path, files: Mapping[str, str], *, transient: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """(the user's items, headscope's files and transient folders) in `folder`, as relative paths.

    Headscope's: manifest.json at the top, a listed regular file whose hash still matches, and the
    top-level `transient` folders (leftover .NAME.partial staging of a killed run). The user's:
    anything else; a folder headscope did not make counts as one item (it is never entered), a
    symbolic link is never followed.
    """
    dirs = _made_dirs(files)
    transient = set(transient)
    user: list[str] = []
    mine: list[str] = []

    def walk(rel_dir: str) -> None:
        with os.scandir(folder / rel_dir if rel_dir else folder) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            if entry.is_symlink():
                user.append(rel)
            elif entry.is_dir(follow_symlinks=False):
                if rel in dirs:
                    walk(rel)
                elif rel in transient:
                    mine.append(rel)
                else:
                    user.append(rel)
            elif entry.is_file(follow_symlinks=False) and (
                (rel == MANIFEST) or (rel in files and hash_or_none(Path(entry.path)) == files[rel])
            ):
                mine.append(rel)
            else:
                user.append(rel)

    walk("")
    return user, mine


def hash_or_none(path: Path) -> str | None:
    try:
        return sha256(path)
    except OSError:  # unreadable: not provably headscope's, so the user's
        return None


def _free_name(path: Path) -> Path:
    """NAME.user.EXT, NAME.user-2.EXT, ...: a name beside `path` that is not taken."""
    suffix = "".join(path.suffixes[-1:]) if not path.name.startswith(".") or path.name.count(".") > 1 else ""
    stem = path.name[: len(path.name) - len(suffix)] if suffix else path.name
    for i in range(1, 10_000):
        candidate = path.with_name(f"{stem}.user{'' if i == 1 else f'-{i}'}{suffix}")
        if not os.path.lexists(candidate):
            return candidate
    raise OutputError(f"No free name for your file {str(path)!r}.")  # pragma: no cover


def _remove_mine(folder: Path, mine: list[str], files: Mapping[str, str]) -> list[str]:
    """Delete headscope's items (manifest last), then the folders headscope made once empty; returns
    what could not be removed."""
    left: list[str] = []
    for rel in sorted(mine, key=lambda r: r == MANIFEST):
        path = folder / rel
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        except OSError:
            left.append(rel)
    for rel in sorted(_made_dirs(files), key=lambda r: r.count("/"), reverse=True):
        try:
            (folder / rel).rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            left.append(rel + "/")
    return left


def replace_folder(new: Path, old: Path, files: Mapping[str, str], *, transient: Iterable[str] = (),
                   mark: str | None = None) -> list[str]:
    """Put folder `new` in the place of `old`, keeping the user's items of `old`.

    `files` is what headscope wrote in `old` (relative path -> sha256). Steps: rename old aside,
    rename new into place (then drop its `mark` file), move the user's items across, delete
    headscope's; returns the user's items moved (their new relative paths).
    """
    aside = old.with_name(f".{old.name}.old-{os.getpid()}")
    old.rename(aside)
    try:
        new.rename(old)
    except BaseException:
        aside.rename(old)
        raise
    if mark:
        (old / mark).unlink(missing_ok=True)
    return finish_replace(aside, old, files, transient=transient)


def finish_replace(aside: Path, target: Path, files: Mapping[str, str], *, transient: Iterable[str] = ()) -> list[str]:
    """Steps (3)-(4) of a swap: the user's items of `aside` move into `target`, headscope's go."""
    user, mine = split_folder(aside, files, transient=transient)
    moved: list[str] = []
    for rel in user:
        dest = target / rel
        if os.path.lexists(dest):
            dest = _free_name(dest)
            log.warning("kept your %s as %s (the new run wrote a file of that name)", rel, dest.name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.rename(aside / rel, dest)
        moved.append(dest.relative_to(target).as_posix())
    left = _remove_mine(aside, mine, files)
    try:
        aside.rmdir()
    except OSError:
        log.warning("left %s (could not remove: %s)", aside, ", ".join(left) or "not empty")
    if moved:
        shown = ", ".join(moved[:5]) + (" ..." if len(moved) > 5 else "")
        log.info("kept %d file(s) of yours in %s: %s", len(moved), target, shown)
    return moved


# ---- one run's output folder ---------------------------------------------------------------------
def _error(action: str, path: Path, err: OSError) -> OutputError:
    return OutputError(f"Cannot {action} {str(path)!r}: {os_reason(err)}; choose a writable --out.")


def _make_parents(folder: Path) -> list[Path]:
    """Create `folder` and its missing ancestors; returns those created (deepest last)."""
    missing: list[Path] = []
    p = folder
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        try:
            p.mkdir()
        except FileExistsError:
            pass
        except OSError as err:
            raise _error("create folder", p, err) from None
    return list(reversed(missing))


class OutputSession:
    """One run's claim on its output folder: the lock, where to write (`root`), the files written."""

    def __init__(self, out: Path, mode: str, root: Path, lock: OutputLock, files: dict[str, str],
                 made: list[Path], old_files: dict[str, str] | None = None):
        self.out, self.mode, self.root, self.lock = out, mode, root, lock
        self.files = files  # relative path -> sha256 of every file headscope wrote in root
        self.old_files = old_files or {}  # force: the previous output's list
        self._made = made  # folders this run created (fresh mode), removed when it fails early
        self.committed = False
        self._remove_parents = False

    # -- opening ---------------------------------------------------------------------------------
    @classmethod
    def open(cls, out: str | Path, *, force: bool, resume: bool, transient: Iterable[str] = ()) -> OutputSession:
        try:
            check_out(Path(out), force=force, resume=resume)
        except OutputExistsError:  # OUT exists: does a run that started a moment ago hold it (a start-up race)?
            lock = OutputLock(Path(os.path.abspath(out)))
            if lock.held_elsewhere():
                raise lock._busy(lock._read_holder()) from None
            raise
        out = Path(os.path.abspath(out))  # ("." has no name to put a staging folder beside)
        made = _make_parents(out.parent)
        lock = OutputLock(out)
        try:
            lock.acquire()
        except BaseException:
            _rmdirs(made)
            raise
        try:
            recover(out, transient=transient)
            check_out(out, force=force, resume=resume)  # again, under the lock
            if not out.exists():
                try:
                    out.mkdir()
                except OSError as err:
                    raise _error("create folder", out, err) from None
                made = [*made, out]
                session = cls(out, "fresh", out, lock, {}, made)
                try:
                    session.write_manifest({})
                except OSError as err:  # a full disk at the first write: OUT goes again (below)
                    raise _error("write the manifest in", out, err) from None
                return session
            manifest = read_output_manifest(out / MANIFEST)
            if resume or (force and manifest is None):  # (force: check_out let only an empty folder through)
                return cls(out, "resume", out, lock, dict(manifest["files"]) if manifest else {}, [])
            _check_writable(out, manifest["files"])
            stage = out.with_name(f".{out.name}.staging-{os.getpid()}")
            try:
                stage.mkdir()
                (stage / STAGING_MARK).write_text("headscope staging folder; removed when the run ends\n")
            except OSError as err:
                shutil.rmtree(stage, ignore_errors=True)
                raise _error("create the staging folder", stage, err) from None
            return cls(out, "force", stage, lock, {}, [], old_files=dict(manifest["files"]))
        except BaseException:
            lock.release()
            _rmdirs(made)
            raise

    # -- writing ---------------------------------------------------------------------------------
    def record(self, rel: str) -> str:
        digest = sha256(self.root / rel)
        self.files[rel] = digest
        return digest

    def record_folder(self, name: str, hashes: Mapping[str, str]) -> None:
        """An analysis folder written whole: its old entries go, its new files come."""
        for rel in [r for r in self.files if r.startswith(f"{name}/")]:
            del self.files[rel]
        self.files.update({f"{name}/{fname}": digest for fname, digest in hashes.items()})

    def adopt_folder(self, name: str) -> None:
        """A finished analysis folder (resume) whose files the manifest does not list yet (killed
        between its rename and the manifest write): list its regular files."""
        if any(r.startswith(f"{name}/") for r in self.files):
            return
        folder = self.root / name
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            if entry.is_file(follow_symlinks=False):
                self.files[f"{name}/{entry.name}"] = sha256(Path(entry.path))

    def write_manifest(self, data: Mapping) -> None:
        io.write_json(self.root / MANIFEST, {**data, "output_format": OUTPUT_FORMAT, "files": dict(sorted(self.files.items()))})

    # -- ending ----------------------------------------------------------------------------------
    def commit(self, transient: Iterable[str] = ()) -> None:
        """Force mode: swap the staging folder in (see the module docstring); else nothing."""
        if self.mode == "force":
            try:
                replace_folder(self.root, self.out, self.old_files, transient=transient, mark=STAGING_MARK)
            except OSError as err:
                raise OutputError(
                    f"Could not finish replacing {str(self.out)!r}: {os_reason(err)}; nothing of yours was deleted "
                    f"(look beside it for .{self.out.name}.old-{os.getpid()})."
                ) from None
            self.root = self.out
        self.committed = True

    def abort(self, *, keep_partial: bool) -> None:
        """After a failure: force mode drops its staging folder; a fresh run that has written no
        analysis removes what it made (unless keep_partial); resume keeps everything."""
        if self.mode == "force" and not self.committed:
            shutil.rmtree(self.root, ignore_errors=True)
        elif self.mode == "fresh" and not keep_partial:
            left = _remove_mine(self.root, [r for r in self.files] + [MANIFEST], self.files)
            for partial in self.root.glob(".*.partial"):
                shutil.rmtree(partial, ignore_errors=True)
            _rmdirs(self._made[-1:])  # OUT; its new parents go after the lock file (close)
            self._remove_parents = True
            if left and self.root.exists():
                log.warning("left %s: %s", self.root, ", ".join(left))

    def close(self) -> None:
        self.lock.release()
        if self._remove_parents:
            _rmdirs(self._made[:-1])


def _rmdirs(folders: list[Path]) -> None:
    for folder in reversed(folders):
        try:
            folder.rmdir()
        except OSError:
            return


def _check_writable(out: Path, files: Mapping[str, str]) -> None:
    """--force moves and deletes inside OUT and the folders headscope made: all must be writable."""
    for rel in ["", *sorted(_made_dirs(files))]:
        folder = out / rel if rel else out
        if folder.is_dir() and not folder.is_symlink() and not os.access(folder, os.W_OK | os.X_OK):
            raise OutputError(f"{str(folder)!r} is not writable, so --force cannot replace {str(out)!r}; choose another --out.")


def check_modes(*, force: bool, resume: bool) -> None:
    """--resume finishes OUT, --force replaces it: both at once is refused (ConfigError)."""
    if force and resume:
        raise ConfigError("--resume and --force exclude each other: --resume finishes the run in --out, "
                          "--force replaces it with a new run; pass one of them.")


def check_out(out: Path, *, force: bool, resume: bool) -> None:
    """Refuse what no run may write into; touches nothing."""
    check_modes(force=force, resume=resume)
    if out.is_symlink():
        if not out.exists():
            raise OutputError(f"--out {str(out)!r} is a broken symbolic link; remove it or choose another --out.")
        if force and not resume:
            raise OutputError(
                f"--out {str(out)!r} is a symbolic link; --force replaces folders, not links: "
                f"pass its target {str(out.resolve())!r} or choose another --out."
            )
    if not os.path.lexists(out):
        return
    if not out.is_dir():
        raise OutputExistsError(f"{str(out)!r} exists and is not a folder; choose another --out.")
    if force and not resume:
        here, real = Path.cwd().resolve(), out.resolve()
        if here == real or real in here.parents:
            raise OutputError(
                f"--out {str(out)!r} is the folder you are working in; --force cannot replace it: run from elsewhere."
            )
    if not (force or resume):
        raise OutputExistsError(
            f"Output folder {str(out)!r} already exists; pass --force to overwrite it, --resume to finish it, "
            "or choose another --out."
        )
    try:
        empty = _only_stray(out)  # (a run killed while writing its first manifest leaves only its temporary file)
    except OSError as err:
        raise _error("read folder", out, err) from None
    if empty:
        return
    manifest_file = out / MANIFEST
    if read_output_manifest(manifest_file) is None:
        what = ("holds no headscope manifest.json" if not os.path.lexists(manifest_file)
                else "has a manifest.json that headscope did not write")
        flag = "--resume" if resume else "--force"
        raise OutputExistsError(
            f"{str(out)!r} is not empty and {what}; refusing to touch it even with {flag}: choose another --out."
        )


_STAGING = re.compile(r"^\.(?P<name>.+)\.staging-(?P<pid>\d+)$")
# the temporary file of an atomic write (reports/io.py, tempfile.mkstemp) of a top-level report file,
# left when a run is killed mid-write: headscope's by its name
_STRAY_TMP = re.compile(r"^\.(?:manifest\.json|report\.html|report\.md|explorer\.json|task_examples\.csv)\.[a-z0-9_]{8}\.tmp$")
_OLD = re.compile(r"^\.(?P<name>.+)\.old-(?P<pid>\d+)$")


def _only_stray(folder: Path) -> bool:
    """Whether `folder` holds nothing but temporary files of headscope's atomic writes (or nothing)."""
    return all(_STRAY_TMP.match(p.name) and p.is_file() and not p.is_symlink() for p in folder.iterdir())


def recover(out: Path, *, transient: Iterable[str] = ()) -> None:
    """Under the lock: finish or undo what a killed run left beside OUT (see the module docstring)."""
    parent = out.parent
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    for entry in entries:
        m = _STAGING.match(entry.name)
        if m and m["name"] == out.name and entry.is_dir(follow_symlinks=False) and (Path(entry.path) / STAGING_MARK).exists():
            log.info("removing %s, left by an interrupted run", entry.path)
            shutil.rmtree(entry.path, ignore_errors=True)
    if (out / STAGING_MARK).is_file() and not (out / STAGING_MARK).is_symlink():  # killed just after its swap
        (out / STAGING_MARK).unlink(missing_ok=True)
    if out.is_dir() and not out.is_symlink() and (read_output_manifest(out / MANIFEST) is not None or _only_stray(out)):
        for entry in os.scandir(out):
            if _STRAY_TMP.match(entry.name) and entry.is_file(follow_symlinks=False):
                log.info("removing %s, a temporary file left by an interrupted run", entry.path)
                Path(entry.path).unlink(missing_ok=True)
    for entry in entries:
        m = _OLD.match(entry.name)
        if not (m and m["name"] == out.name and entry.is_dir(follow_symlinks=False)):
            continue
        aside = Path(entry.path)
        manifest = read_output_manifest(aside / MANIFEST)
        if not os.path.lexists(out):
            log.warning("restoring %s from %s (a run was interrupted while replacing it)", out, aside)
            aside.rename(out)
        elif manifest is not None:
            log.info("finishing the replacement of %s that an interrupted run began", out)
            finish_replace(aside, out, manifest["files"], transient=transient)
        else:
            log.warning("%s was left by an interrupted run; it may hold files of yours", aside)

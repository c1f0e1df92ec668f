"""A series of -p1 patches: read it, and apply it to a copy of the files it touches.

Nothing here writes into the tree a series is meant for. Each function works in a
staging folder that holds only the files the series touches (copied from the tree,
or from an archive); applying there costs milliseconds whatever the size of the
tree, and what to do with the result is the caller's business.

GNU patch is used where it is installed (it reports offsets and fuzz), git apply
otherwise (offsets only: it never applies with fuzz).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Iterable, Optional

_HUNK = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class SeriesError(Exception):
    """The series file or one of its patches cannot be read."""


@dataclasses.dataclass(frozen=True)
class Hunk:
    header: str  # its @@ line
    old_start: int


@dataclasses.dataclass(frozen=True)
class FileDiff:
    old: Optional[str]  # a path in the tree (-p1), None when the patch creates the file
    new: Optional[str]  # None when the patch deletes the file
    hunks: tuple[Hunk, ...]

    @property
    def path(self) -> str:
        return self.new or self.old or ""


@dataclasses.dataclass(frozen=True)
class Patch:
    name: str
    path: Path
    files: tuple[FileDiff, ...]

    def touched(self) -> set[str]:
        return {p for f in self.files for p in (f.old, f.new) if p}


def _strip1(name: bytes) -> Optional[str]:
    """The tree path of a ---/+++ header's file name (-p1); None for /dev/null."""
    name = name.split(b"\t", 1)[0].rstrip(b"\r\n")
    if name.startswith(b'"'):  # (git quotes unusual names; none of ours are)
        raise SeriesError(f"quoted file names are not supported: {name!r}")
    if name == b"/dev/null":
        return None
    text = name.decode("utf-8", "surrogateescape")
    parts = text.split("/", 1)
    if len(parts) != 2 or not parts[1] or ".." in parts[1].split("/") or parts[1].startswith("/"):
        raise SeriesError(f"{text!r} is not an a/... or b/... path inside the tree")
    return parts[1]


def parse_patch(path: Path) -> Patch:
    """The files and hunks of a unified diff (text before the first file header is
    its explanation and is skipped, as patch and git apply skip it)."""
    lines = path.read_bytes().splitlines(keepends=True)
    files: list[FileDiff] = []
    i = 0
    while i < len(lines):
        if (lines[i].startswith(b"--- ") and i + 2 < len(lines) and lines[i + 1].startswith(b"+++ ")
                and _HUNK.match(lines[i + 2])):
            old, new = _strip1(lines[i][4:]), _strip1(lines[i + 1][4:])
            i += 2
            hunks = []
            while i < len(lines) and (m := _HUNK.match(lines[i])):
                hunks.append(Hunk(lines[i].decode("utf-8", "surrogateescape").rstrip("\r\n"), int(m.group(1))))
                n_old = int(m.group(2)) if m.group(2) is not None else 1
                n_new = int(m.group(4)) if m.group(4) is not None else 1
                i += 1
                # the hunk's body: count its lines, so that a body line that looks like
                # a header (a removed "-- x" line reads "--- x") is not taken for one
                while (n_old > 0 or n_new > 0) and i < len(lines):
                    tag = lines[i][:1]
                    if tag == b" " or lines[i] in (b"\n", b"\r\n"):  # (an empty context line)
                        n_old, n_new = n_old - 1, n_new - 1
                    elif tag == b"-":
                        n_old -= 1
                    elif tag == b"+":
                        n_new -= 1
                    elif tag != b"\\":
                        raise SeriesError(f"{path.name}: a hunk of {old or new} ends early: {lines[i]!r}")
                    i += 1
                while i < len(lines) and lines[i].startswith(b"\\"):  # "\ No newline at end of file"
                    i += 1
            files.append(FileDiff(old, new, tuple(hunks)))
        else:
            i += 1
    if not files:
        raise SeriesError(f"{path} holds no unified diff")
    return Patch(path.name, path.resolve(), tuple(files))


def read_series(series: Path) -> list[Patch]:
    """The patches a series file names, in its order: one file name per line (in the
    series file's folder); blank lines and lines starting with # are skipped."""
    try:
        text = series.read_text()
    except OSError as e:
        raise SeriesError(f"cannot read the series file {series}: {e}") from None
    names = [line.strip() for line in text.splitlines()]
    names = [n for n in names if n and not n.startswith("#")]
    if len(set(names)) != len(names):
        raise SeriesError(f"{series} names a patch twice")
    patches = []
    for name in names:
        if "/" in name or name.startswith("."):
            raise SeriesError(f"{series}: {name!r} is not a file name in {series.parent}")
        path = series.parent / name
        if not path.is_file():
            raise SeriesError(f"{series} names {name}, which is not in {series.parent}")
        patches.append(parse_patch(path))
    return patches


def digest(series: Path, patches: Iterable[Patch]) -> str:
    """sha256 over the series file and every patch it names, in order."""
    h = hashlib.sha256(series.read_bytes())
    for p in patches:
        body = p.path.read_bytes()
        h.update(b"\0%s\0%d\0" % (p.name.encode(), len(body)))
        h.update(body)
    return h.hexdigest()


def touched(patches: Iterable[Patch]) -> set[str]:
    return set().union(*(p.touched() for p in patches))


# ---------------------------------------------------------------------------
# Applying
# ---------------------------------------------------------------------------

@dataclasses.dataclass
class Outcome:
    patch: str
    status: str  # "applies", "offsets", "fuzz" or "fails"
    detail: str = ""  # where: the first failing file and hunk, or the hunks that moved

    @property
    def ok(self) -> bool:
        return self.status != "fails"

    def describe(self) -> str:
        words = {"applies": "applies", "offsets": "applies with offsets", "fuzz": "applies with fuzz",
                 "fails": "fails"}[self.status]
        return f"{words} ({self.detail})" if self.detail else words


def tool() -> list[str]:
    """The command that applies patches here: GNU patch, else git apply."""
    if shutil.which("patch"):
        return ["patch"]
    if shutil.which("git"):
        return ["git", "apply"]
    raise SeriesError("neither patch nor git is installed: one of them is needed to apply patches")


def _hunk_at(patch: Patch, path: str, number: Optional[int] = None, line: Optional[int] = None) -> str:
    """'path: hunk #N (@@ ... @@ ...)', by the hunk's number or by its old start line."""
    for f in patch.files:
        if path in (f.new, f.old):
            for n, h in enumerate(f.hunks, 1):
                if n == number or (number is None and h.old_start == line):
                    return f"{path}: hunk #{n} of {len(f.hunks)}, {h.header}"
    if number is not None:
        return f"{path}: hunk #{number}"
    return f"{path}: at line {line}" if line is not None else path


def _run_patch(patch: Patch, where: Path, fuzz: Optional[int], dry_run: bool) -> Outcome:
    cmd = ["patch", "-p1", "--forward", "--batch", "--no-backup-if-mismatch", "--reject-file=-",
           "-d", str(where), "-i", str(patch.path)]
    if fuzz is not None:
        cmd.append(f"--fuzz={fuzz}")
    if dry_run:
        cmd.append("--dry-run")
    env = {k: v for k, v in os.environ.items() if k != "POSIXLY_CORRECT"}  # (it changes patch's rules)
    env["LC_ALL"] = "C"  # (its messages are parsed)
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            errors="replace")
    current, moved, fuzzed = "", [], []
    for line in result.stdout.splitlines():
        if m := re.match(r"(?:patching|checking) file (.*)", line):
            current = m.group(1).strip("'\"")
        elif m := re.match(r"Hunk #(\d+) FAILED at (\d+)", line):
            return Outcome(patch.name, "fails", _hunk_at(patch, current, int(m.group(1))) + " does not apply")
        elif "Reversed (or previously applied) patch detected" in line:
            return Outcome(patch.name, "fails", f"{current}: already applied, or reversed")
        elif "can't find file to patch" in line or line.startswith("No file to patch"):
            first = next((f.path for f in patch.files if f.old and not (where / f.old).exists()), current)
            return Outcome(patch.name, "fails", f"{first}: no such file")
        elif m := re.match(r"Hunk #(\d+) succeeded at (\d+)(?: with fuzz (\d+))?(?: \(offset (-?\d+) lines?\))?",
                           line):
            label = f"{current} #{m.group(1)}"
            if m.group(3):
                fuzzed.append(f"{label} fuzz {m.group(3)}")
            if m.group(4):
                moved.append(f"{label} {int(m.group(4)):+d} lines")
    if result.returncode != 0:
        tail = " / ".join(result.stdout.strip().splitlines()[-3:])
        return Outcome(patch.name, "fails", f"{current or patch.name}: {tail}")
    if fuzzed:
        return Outcome(patch.name, "fuzz", ", ".join(fuzzed + moved))
    if moved:
        return Outcome(patch.name, "offsets", ", ".join(moved))
    return Outcome(patch.name, "applies")


def _run_git_apply(patch: Patch, where: Path, dry_run: bool) -> Outcome:
    cmd = ["git", "apply", "-v", "-p1"] + (["--check"] if dry_run else []) + [str(patch.path)]
    # never let git find a repository above the staging folder: it would apply
    # relative to that repository's root
    env = dict(os.environ, LC_ALL="C", GIT_CEILING_DIRECTORIES=str(where.resolve().parent))
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        env.pop(var, None)
    result = subprocess.run(cmd, cwd=where, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            errors="replace")
    current, moved = "", []
    for line in result.stdout.splitlines():
        if m := re.match(r"Checking patch (.*)\.\.\.$", line):
            current = m.group(1)
        elif m := re.match(r"error: patch failed: (.*):(\d+)$", line):
            return Outcome(patch.name, "fails", _hunk_at(patch, m.group(1), line=int(m.group(2))) + " does not apply")
        elif m := re.match(r"error: (.*): (No such file or directory|does not exist in index)$", line):
            return Outcome(patch.name, "fails", f"{m.group(1)}: no such file")
        elif m := re.match(r"error: (.*): already exists in working directory$", line):
            return Outcome(patch.name, "fails", f"{m.group(1)}: already exists")
        elif m := re.match(r"Hunk #(\d+) succeeded at (\d+) \(offset (-?\d+) lines?\)", line):
            moved.append(f"{current} #{m.group(1)} {int(m.group(3)):+d} lines")
    if result.returncode != 0:
        tail = " / ".join(result.stdout.strip().splitlines()[-3:])
        return Outcome(patch.name, "fails", f"{current or patch.name}: {tail}")
    return Outcome(patch.name, "offsets", ", ".join(moved)) if moved else Outcome(patch.name, "applies")


def _git_apply_reversed(patch: Patch, where: Path) -> bool:
    """Whether the patch is in ``where`` already (it can be taken back out whole)."""
    env = dict(os.environ, LC_ALL="C", GIT_CEILING_DIRECTORIES=str(where.resolve().parent))
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        env.pop(var, None)
    return subprocess.run(["git", "apply", "-p1", "--check", "--reverse", str(patch.path)], cwd=where, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0


def apply(patch: Patch, where: Path, fuzz: Optional[int] = None, command: Optional[list[str]] = None) -> Outcome:
    """Apply one patch in folder ``where``, all of it or nothing: it is checked first
    and applied only if every hunk fits. ``fuzz``: the most context lines GNU patch may
    ignore (None: its default, 2; git apply never does)."""
    command = command or tool()
    if command[0] == "patch":
        checked = _run_patch(patch, where, fuzz, dry_run=True)
        if checked.ok:
            done = _run_patch(patch, where, fuzz, dry_run=False)
            if not done.ok:
                return done
        return checked
    checked = _run_git_apply(patch, where, dry_run=True)
    if not checked.ok and _git_apply_reversed(patch, where):
        return Outcome(patch.name, "fails", f"{patch.files[0].path}: already applied, or reversed")
    if checked.ok:
        done = _run_git_apply(patch, where, dry_run=False)
        if not done.ok:
            return done
    return checked


def stage(paths: Iterable[str], read: Callable[[str], Optional[bytes]], where: Path) -> None:
    """Write into ``where`` each path's content as ``read`` gives it (None: the path
    does not exist, and is left out)."""
    for rel in sorted(paths):
        data = read(rel)
        if data is None:
            continue
        dest = where / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)


def apply_series(patches: list[Patch], where: Path, fuzz: Optional[int] = None, stop_at_failure: bool = False,
                 report: Optional[Callable[[Outcome], None]] = None) -> list[Outcome]:
    """Apply the patches in order in ``where`` (a staged folder). A patch that fails
    is left out and the next ones are tried on what is there, unless ``stop_at_failure``."""
    command = tool()
    outcomes = []
    for patch in patches:
        outcome = apply(patch, where, fuzz, command)
        outcomes.append(outcome)
        if report:
            report(outcome)
        if not outcome.ok and stop_at_failure:
            break
    return outcomes

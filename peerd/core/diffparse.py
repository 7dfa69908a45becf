"""A unified diff (git's, with `a/` and `b/` prefixes) split file by file, pure: each file's path
(and the old one when renamed), what happened to it, its added and removed line counts and its
patch text, capped (`MAX_FILE_PATCH_CHARS` a file, `MAX_FILES` files). The thread diff
(`GET /v1/threads/{id}/diff`) answers with it; the console shows it file by file."""

from __future__ import annotations

from dataclasses import dataclass

MAX_FILES = 500
MAX_FILE_PATCH_CHARS = 100_000


@dataclass
class FilePatch:
    path: str
    old_path: str | None
    change: str  # added | deleted | modified | renamed
    added: int
    removed: int
    binary: bool
    patch: str
    truncated: bool = False


def _unquote(path: str) -> str:
    """A path as git prints it in a header: C-quoted when it has unusual bytes."""
    if len(path) >= 2 and path[0] == '"' and path[-1] == '"':
        raw = path[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
        try:
            return raw.encode("latin-1").decode("utf-8")
        except (UnicodeEncodeError, UnicodeDecodeError):
            return raw
    return path


def _strip(path: str, prefix: str) -> str:
    path = _unquote(path.strip())
    return path[len(prefix) :] if path.startswith(prefix) else path


def _header_paths(line: str) -> tuple[str, str]:
    """`diff --git a/x b/x` -> (x, x); the `---`/`+++` lines refine it when present."""
    rest = line[len("diff --git ") :]
    if rest.startswith('"'):
        end = rest.index('"', 1) + 1
        return _strip(rest[:end], "a/"), _strip(rest[end + 1 :], "b/")
    half = len(rest) // 2  # "a/p b/p" for an unchanged name: split in the middle
    if rest[half : half + 3] == " b/":
        return _strip(rest[:half], "a/"), _strip(rest[half + 1 :], "b/")
    old, _, new = rest.partition(" b/")
    return _strip(old, "a/"), new


def split(text: str) -> tuple[list[FilePatch], bool]:
    """The files of a unified diff, in its order, and whether some were left out (past MAX_FILES)."""
    chunks: list[list[str]] = []
    for line in text.splitlines(keepends=True):
        if line.startswith("diff --git "):
            chunks.append([line])
        elif chunks:
            chunks[-1].append(line)
    files = [_one(chunk) for chunk in chunks[:MAX_FILES]]
    return files, len(chunks) > MAX_FILES


def _one(lines: list[str]) -> FilePatch:
    old, new = _header_paths(lines[0].rstrip("\n"))
    change = "modified"
    added = removed = 0
    binary = False
    in_hunks = False
    for line in lines[1:]:
        if in_hunks:
            if line.startswith("+"):
                added += 1
            elif line.startswith("-"):
                removed += 1
            continue
        if line.startswith("@@"):
            in_hunks = True
        elif line.startswith("new file mode"):
            change = "added"
        elif line.startswith("deleted file mode"):
            change = "deleted"
        elif line.startswith("rename from "):
            change, old = "renamed", _unquote(line[len("rename from ") :].rstrip("\n"))
        elif line.startswith("rename to "):
            new = _unquote(line[len("rename to ") :].rstrip("\n"))
        elif line.startswith("Binary files ") or line.startswith("GIT binary patch"):
            binary = True
        elif line.startswith("--- ") and not line.startswith("--- /dev/null"):
            old = _strip(line[4:].rstrip("\n"), "a/")
        elif line.startswith("+++ ") and not line.startswith("+++ /dev/null"):
            new = _strip(line[4:].rstrip("\n"), "b/")
    patch = "".join(lines)
    cut = len(patch) > MAX_FILE_PATCH_CHARS
    if cut:
        patch = patch[:MAX_FILE_PATCH_CHARS]
    path = old if change == "deleted" else new
    return FilePatch(
        path=path,
        old_path=old if change == "renamed" else None,
        change=change,
        added=added,
        removed=removed,
        binary=binary,
        patch=patch,
        truncated=cut,
    )

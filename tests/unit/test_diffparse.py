"""A unified diff split file by file (peerd/core/diffparse.py): paths, renames, counts, caps."""

from __future__ import annotations

from peerd.core import diffparse

DIFF = (
    "diff --git a/calc.py b/calc.py\n"
    "index 1..2 100644\n"
    "--- a/calc.py\n"
    "+++ b/calc.py\n"
    "@@ -1,2 +1,2 @@\n"
    "-a - b\n"
    "--- not a header, a removed line\n"
    "+a + b\n"
    " same\n"
    "diff --git a/new file.txt b/new file.txt\n"
    "new file mode 100644\n"
    "--- /dev/null\n"
    "+++ b/new file.txt\n"
    "@@ -0,0 +1,2 @@\n"
    "+one\n"
    "+two\n"
    "diff --git a/gone.txt b/gone.txt\n"
    "deleted file mode 100644\n"
    "--- a/gone.txt\n"
    "+++ /dev/null\n"
    "@@ -1 +0,0 @@\n"
    "-bye\n"
    "diff --git a/old.txt b/renamed.txt\n"
    "similarity index 100%\n"
    "rename from old.txt\n"
    "rename to renamed.txt\n"
    "diff --git a/logo.png b/logo.png\n"
    "Binary files a/logo.png and b/logo.png differ\n"
)


def test_files_their_changes_and_counts() -> None:
    files, more = diffparse.split(DIFF)
    assert not more
    got = [(f.path, f.old_path, f.change, f.added, f.removed, f.binary) for f in files]
    assert got == [
        ("calc.py", None, "modified", 1, 2, False),
        ("new file.txt", None, "added", 2, 0, False),
        ("gone.txt", None, "deleted", 0, 1, False),
        ("renamed.txt", "old.txt", "renamed", 0, 0, False),
        ("logo.png", None, "modified", 0, 0, True),
    ]
    assert files[0].patch.startswith("diff --git a/calc.py") and files[0].patch.endswith(" same\n")


def test_caps() -> None:
    many = "".join(f"diff --git a/f{n} b/f{n}\n@@ -0,0 +1 @@\n+x\n" for n in range(diffparse.MAX_FILES + 2))
    files, more = diffparse.split(many)
    assert len(files) == diffparse.MAX_FILES and more
    big = "diff --git a/b b/b\n@@ -0,0 +1 @@\n" + "+x\n" * diffparse.MAX_FILE_PATCH_CHARS
    (one,), _ = diffparse.split(big)
    assert one.truncated and len(one.patch) == diffparse.MAX_FILE_PATCH_CHARS
    assert one.added == diffparse.MAX_FILE_PATCH_CHARS  # counted in full
    assert diffparse.split("") == ([], False)

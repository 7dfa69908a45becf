from __future__ import annotations

import pytest

from peerd.core.repo_identity import canonical_repo_key

SAME_GITHUB_REPO = [
    "git@github.com:o/r.git",
    "git@github.com:o/r",
    "https://github.com/o/r",
    "https://github.com/o/r.git",
    "https://github.com/o/r.git/",
    "https://github.com/o/r/",
    "http://github.com/o/r.git",
    "ssh://git@github.com/o/r.git",
    "ssh://git@github.com:22/o/r",
    "git+ssh://git@github.com/o/r.git",
    "git://github.com/o/r.git",
    "git://github.com:9418/o/r.git",
    "https://github.com:443/o/r",
    "http://github.com:80/o/r",
    "https://user:token@github.com/O/R",
    "https://x-access-token:ghp_secret@github.com/o/r.git",
    "HTTPS://GitHub.COM/o/r",
    "  https://github.com/o/r\n",
    "ssh://git@ssh.github.com:443/o/r.git",
    "https://github.com//o//r.git",
]


@pytest.mark.parametrize("url", SAME_GITHUB_REPO)
def test_every_form_of_one_github_repository_has_one_key(url: str) -> None:
    assert canonical_repo_key(url) == "github.com/o/r"


@pytest.mark.parametrize(
    ("url", "key"),
    [
        # Non-default ports are kept; default ones dropped.
        ("https://gitlab.example.com:8443/g/sub/r.git", "gitlab.example.com:8443/g/sub/r"),
        ("ssh://git@gitlab.example.com:2222/g/sub/r.git", "gitlab.example.com:2222/g/sub/r"),
        ("ssh://git@gitlab.example.com:22/g/sub/r.git", "gitlab.example.com/g/sub/r"),
        ("http://git.example.com:8080/r", "git.example.com:8080/r"),
        ("http://git.example.com:443/r", "git.example.com:443/r"),
        ("[git.example.com:2222]:g/r.git", "git.example.com:2222/g/r"),
        # Nested groups are kept.
        ("git@gitlab.com:g/sub/r.git", "gitlab.com/g/sub/r"),
        ("https://gitlab.com/g/sub/r", "gitlab.com/g/sub/r"),
        # Path case is kept except on hosts known to ignore it.
        ("https://git.example.com/Team/Repo.git", "git.example.com/Team/Repo"),
        ("git@Git.Example.com:Team/Repo.git", "git.example.com/Team/Repo"),
        ("https://gitlab.com/G/Sub/R", "gitlab.com/g/sub/r"),
        ("git@bitbucket.org:Team/Repo.git", "bitbucket.org/team/repo"),
        # scp-like form with another user; credentials and users never appear in a key.
        ("deploy@git.example.com:team/repo.git", "git.example.com/team/repo"),
        ("git.example.com:team/repo.git", "git.example.com/team/repo"),
        ("https://alice:s3cr3t@git.example.com/team/repo", "git.example.com/team/repo"),
        ("ssh://alice@git.example.com/srv/git/repo.git", "git.example.com/srv/git/repo"),
        ("git.example.com:/srv/git/repo.git", "git.example.com/srv/git/repo"),
        # IPv6 hosts.
        ("ssh://git@[::1]:2222/o/r.git", "[::1]:2222/o/r"),
        ("git@[::1]:o/r.git", "[::1]/o/r"),
        # A repository path ending in `/.git` (the git dir of a non-bare repository).
        ("ssh://git@git.example.com/o/r/.git", "git.example.com/o/r"),
    ],
)
def test_remote_keys(url: str, key: str) -> None:
    assert canonical_repo_key(url) == key


@pytest.mark.parametrize(
    ("url", "key"),
    [
        ("/srv/git/origin.git", "file:/srv/git/origin"),
        ("/srv/git/origin.git/", "file:/srv/git/origin"),
        ("/srv/git/./origin.git/", "file:/srv/git/origin"),
        ("/srv/git/x/../origin", "file:/srv/git/origin"),
        ("/srv/git/origin/.git", "file:/srv/git/origin"),
        ("//srv/git/origin.git", "file:/srv/git/origin"),
        ("file:///srv/git/origin.git", "file:/srv/git/origin"),
        ("file://localhost/srv/git/origin.git", "file:/srv/git/origin"),
        ("file:///srv/git/my%20origin.git", "file:/srv/git/my origin"),
        ("/srv/a:b/origin.git", "file:/srv/a:b/origin"),
    ],
)
def test_local_keys(url: str, key: str) -> None:
    assert canonical_repo_key(url) == key


def test_relative_local_path_needs_a_base() -> None:
    assert canonical_repo_key("../origin.git") is None
    assert canonical_repo_key("../origin.git", base="/home/u/clone") == "file:/home/u/origin"
    assert canonical_repo_key("./a:b", base="/home/u") == "file:/home/u/a:b"


@pytest.mark.parametrize(
    "url",
    [
        "",
        "   ",
        "not a url",
        "github.com",
        "https://",
        "https://github.com",
        "https://github.com/",
        "https://github.com/.git",
        "git@github.com:",
        "git@github.com:.git",
        "https://github.com:notaport/o/r",
        "https://github.com:99999/o/r",
        "https://github.com/o/../r",
        "https://github.com/o/r extra",
        "https://bad host/o/r",
        "ftp://github.com/o/r",
        "file://otherhost/srv/r.git",
        "[git.example.com:2222:o/r",
        "git@[git.example.com:x]:o/r",
        "https://github.com/o/r\x00",
        "C:\\Users\\me\\repo",
    ],
)
def test_garbage_has_no_key(url: str) -> None:
    assert canonical_repo_key(url) is None


def test_keys_never_contain_credentials() -> None:
    for url in (
        "https://user:ghp_tok3n@github.com/o/r",
        "https://ghp_tok3n@git.example.com/o/r",
        "ssh://user:ghp_tok3n@git.example.com:2222/o/r",
        "http://user:ghp_tok3n@git.example.com:8080/o/r",
    ):
        key = canonical_repo_key(url)
        assert key is not None
        assert "ghp_tok3n" not in key
        assert "user" not in key

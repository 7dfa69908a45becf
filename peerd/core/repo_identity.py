"""One key per repository, whatever remote URL form a clone was made with.

Two checkouts are "the same project" when their origins canonicalize to the same key, so the ssh,
https and git forms of one repository must agree:

    git@github.com:o/r.git            -> github.com/o/r
    https://user:token@github.com/O/R -> github.com/o/r      (credentials are never part of a key)
    ssh://git@gitlab.example.com:2222/g/sub/r.git -> gitlab.example.com:2222/g/sub/r
    /srv/git/origin.git               -> file:/srv/git/origin

Choices, so that equal keys mean one repository and a key is safe to log or send to a peer:

* The scheme and user are dropped: ssh, https, http and git reach the same repository on a host.
* The host is lowercased (DNS is case-insensitive) and a trailing dot dropped.
* The scheme's default port is dropped (22 ssh, 443 https, 80 http, 9418 git); any other port is
  kept, because a non-default port may be a different server. The cost: a self-hosted server that
  serves ssh on 2222 and https on 443 yields two keys for one repository.
* The path keeps its case, since most servers (e.g. self-hosted Gitea or cgit) are case-sensitive;
  only for hosts known to ignore path case (``_CASE_INSENSITIVE_HOSTS``) is it lowercased.
* The scp-like form ``host:o/r`` is relative to the ssh user's home, ``ssh://host/o/r`` is absolute;
  both become ``host/o/r``. Hosting services ignore the difference and the key must match the
  https form, so the distinction is given up.
* Local paths and ``file://`` URLs become ``file:<absolute normalized path>``. The path is
  normalized as a string only (no symlink resolution: this module does no I/O), and a relative
  path needs ``base`` (git resolves it against the checkout's top level).
* A trailing ``.git`` and trailing slashes are dropped everywhere, so ``/srv/r.git``, ``/srv/r/``
  and ``/srv/r/.git`` (the git dir of a non-bare origin) all give ``file:/srv/r``.
"""

from __future__ import annotations

import posixpath
import re
from urllib.parse import unquote, urlsplit

__all__ = ["canonical_repo_key"]

_DEFAULT_PORTS: dict[str, int] = {"ssh": 22, "https": 443, "http": 80, "git": 9418}

# Spellings git accepts for ssh URLs.
_SCHEME_ALIASES: dict[str, str] = {"git+ssh": "ssh", "ssh+git": "ssh"}

# Hosting services whose owner/repository names are case-insensitive: `github.com/O/R` and
# `github.com/o/r` are one repository there, and users do type both.
_CASE_INSENSITIVE_HOSTS = frozenset({"github.com", "gitlab.com", "bitbucket.org"})

# The services' documented "ssh over port 443" endpoints reach the same repositories as the main
# host; without this a clone made behind a firewall would look like another project.
_SSH_HOST_ALIASES: dict[str, str] = {
    "ssh.github.com": "github.com",
    "altssh.gitlab.com": "gitlab.com",
    "altssh.bitbucket.org": "bitbucket.org",
}

_HOSTNAME = re.compile(r"[a-z0-9](?:[a-z0-9._-]*[a-z0-9_])?")
_IPV6 = re.compile(r"[0-9a-f:.]+(?:%[a-z0-9._~-]+)?")
# Control characters, whitespace and backslashes never appear in a real repository path; seeing one means
# the input is not a URL (or is several things pasted together).
_BAD_PATH_CHARS = re.compile(r"[\x00-\x20\x7f\\]")


def canonical_repo_key(remote_url: str, *, base: str | None = None) -> str | None:
    """The canonical key of the repository `remote_url` points at, or None if it is not a git URL.

    `base` is the absolute directory a relative local path is relative to (git uses the top
    level of the checkout); without it a relative path has no key, because this function does
    not read the current directory.
    """
    url = remote_url.strip()
    if not url or "\x00" in url or "\n" in url:
        return None
    if "://" in url:
        return _url_key(url)
    if _is_scp_like(url):
        return _scp_key(url)
    return _local_key(url, base)


def _is_scp_like(url: str) -> bool:
    # git's own rule (connect.c): `[user@]host:path` is ssh when a colon comes before any slash;
    # otherwise it is a local path (so `./a:b` and `/x:y` stay local).
    colon = url.find(":")
    if colon <= 0:
        return False
    slash = url.find("/")
    return slash == -1 or colon < slash


def _url_key(url: str) -> str | None:
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError on a non-numeric or out-of-range port
    except ValueError:
        return None
    scheme = _SCHEME_ALIASES.get(parts.scheme.lower(), parts.scheme.lower())
    if scheme == "file":
        # Only `file:///path` and `file://localhost/path` name a local repository.
        if parts.netloc not in ("", "localhost"):
            return None
        return _local_key(unquote(parts.path), None)
    if scheme not in _DEFAULT_PORTS:
        return None
    # `.hostname` drops any `user:password@` and lowercases; credentials must never reach a key.
    host = _host(parts.hostname or "")
    if host is None:
        return None
    if scheme == "ssh" and host in _SSH_HOST_ALIASES:
        host, port = _SSH_HOST_ALIASES[host], None
    if port == _DEFAULT_PORTS[scheme]:
        port = None
    return _remote_key(host, port, unquote(parts.path))


def _scp_key(url: str) -> str | None:
    port: int | None = None
    if url.startswith("[") or "@[" in url:
        # A bracketed host: `git@[::1]:o/r` (IPv6) or `[host:2222]:o/r` (git's port syntax).
        close = url.find("]:")
        if close == -1:
            return None
        bracketed, path = url[: close + 1], url[close + 2 :]
        host_text = bracketed.rpartition("@")[2].strip("[]")
        if host_text.count(":") == 1:
            host_text, _, port_text = host_text.partition(":")
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                return None
            port = int(port_text)
    else:
        user_host, _, path = url.partition(":")
        host_text = user_host.rpartition("@")[2]
    host = _host(host_text)
    if host is None:
        return None
    if host in _SSH_HOST_ALIASES:
        host, port = _SSH_HOST_ALIASES[host], None
    if port == _DEFAULT_PORTS["ssh"]:
        port = None
    return _remote_key(host, port, path)


def _host(text: str) -> str | None:
    host = text.lower().rstrip(".")
    if _HOSTNAME.fullmatch(host):
        return host
    if ":" in host and _IPV6.fullmatch(host):
        return f"[{host}]"
    return None


def _remote_key(host: str, port: int | None, path: str) -> str | None:
    segments = [s for s in path.split("/") if s]
    if segments:
        segments[-1] = segments[-1].removesuffix(".git")
        if not segments[-1]:
            segments.pop()  # `o/r/.git`
    if not segments or any(s in (".", "..") or _BAD_PATH_CHARS.search(s) for s in segments):
        return None
    joined = "/".join(segments)
    if host in _CASE_INSENSITIVE_HOSTS:
        joined = joined.lower()
    authority = host if port is None else f"{host}:{port}"
    return f"{authority}/{joined}"


def _local_key(path: str, base: str | None) -> str | None:
    if not path:
        return None
    if not path.startswith("/"):
        if base is None or not base.startswith("/"):
            return None
        path = posixpath.join(base, path)
    # normpath collapses `.`, `..` and doubled slashes textually, as git does for local remotes.
    normalized = posixpath.normpath(path).removesuffix(".git").rstrip("/")
    # POSIX lets normpath keep a leading `//`; both spellings name the same directory here.
    normalized = "/" + normalized.lstrip("/")
    return f"file:{normalized}"

"""No absolute path of the machine the repository was built on, anywhere in it (code, configs, docs, results).

The pattern matches a path that starts at a root directory holding machine- or user-specific places
(``work``, ``root``, ``home``, ``tmp``, ``mnt``, ``Users``, ``scratch``) when nothing that would make it part of
something else comes right before the slash: a word character, ``.``, ``:`` or ``/`` (a URL's host or scheme,
a relative path such as ``runs/tmp/x`` or ``../home/x``) or ``~`` (a home-relative path, the same for every
user). System paths that are the same on every machine (``/usr/bin/env``, ``/dev/null``, ``/proc/...``) are not
matched. The directory above this checkout is searched for as well (when it is not a top-level directory),
whatever its name.
"""

import re
import subprocess

import pytest

from tests.conftest import ROOT

MACHINE_PATH = re.compile(r"(?<![\w.:/~-])/(?:work|root|home|tmp|mnt|Users|scratch)/")


def _tracked_text_files():
    try:
        names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout (git ls-files failed)")
    for name in filter(None, names.decode().split("\0")):
        path = ROOT / name
        if not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" not in data:  # text, not an image or an archive
            yield name, data.decode("utf-8", errors="replace")


def test_the_pattern_tells_machine_paths_from_others():
    # written in pieces, so that this file holds no machine path itself
    hits = ["cache_dir=/work" + "/cache/x", '"/root' + '/.cache"', " /home" + "/me/data", "--out /tmp" + "/bench",
            "(/mnt" + "/d/x)"]
    misses = ["#!/usr/bin/env python", "https://example.org/home/page", "runs/tmp/x", "../shared/data",
              "~/work/notes", "/dev/null", "file:///tmp/x", "a/work/b"]
    assert all(MACHINE_PATH.search(s) for s in hits)
    assert not any(MACHINE_PATH.search(s) for s in misses)


def test_no_absolute_machine_paths_in_the_repository():
    parent = str(ROOT.parent)
    found = []
    for name, text in _tracked_text_files():
        for number, line in enumerate(text.splitlines(), 1):
            if MACHINE_PATH.search(line) or (parent.count("/") >= 2 and parent + "/" in line):
                found.append(f"{name}:{number}: {line.strip()[:120]}")
    assert not found, "absolute machine paths (use paths relative to the repository, ../shared/data or an " \
                      "environment variable):\n" + "\n".join(found)

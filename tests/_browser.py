"""Where the browser tests find Chromium, and what happens when it is not installed.

A user's ``make test`` needs no root and no browser: the browser tests are skipped with the reason
shown in pytest's summary (``-rs``). CI (``.ci/run``, as root) installs ``chromium`` and
``chromium-driver`` first and sets ``ATTNFLOW_REQUIRE_BROWSER=1``: there a missing browser fails.
"""

from __future__ import annotations

import os
import shutil

import pytest

REQUIRE_ENV = "ATTNFLOW_REQUIRE_BROWSER"
INSTALL_HINT = "as root: apt-get install chromium chromium-driver (CI does this in .ci/run)"


def browser_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "").strip() not in ("", "0")


def require_binary(*names: str) -> str:
    """The path of the first of ``names`` on PATH; otherwise skip the test, or fail it under CI."""
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    message = f"browser test: none of {', '.join(names)} is installed ({INSTALL_HINT})"
    if browser_required():
        pytest.fail(f"{message}; {REQUIRE_ENV}=1 makes a missing browser a failure", pytrace=False)
    pytest.skip(message)

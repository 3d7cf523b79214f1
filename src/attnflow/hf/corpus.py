"""The prompt corpus that ships with attnflow, and reading a user's corpus file safely.

The shipped corpus (``attnflow/hf/data/corpus.txt``, package data) holds 228 English sentences
of 3 to 23 words written for this project, licence MIT (the project's) and CC0 1.0. A corpus file is
plain UTF-8 text, one prompt per line; blank lines are skipped, and a line whose first non-blank
character is ``#`` is a comment (the shipped corpora carry their licence so). :func:`corpus_lines`
returns the line numbers of the comments it dropped, and ``attnflow hf study`` reports them: no line
is dropped silently.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from attnflow.core.errors import Hint, InputError, UnsafeInputError
from attnflow.io.safety import read_regular

#: Licence of the shipped corpus.
CORPUS_LICENSE = "MIT (the project's licence) and CC0 1.0"

#: Bounds checked before a corpus file is read: its size in bytes and one prompt's length in characters.
MAX_CORPUS_BYTES = 4 * 2**20
MAX_PROMPT_CHARS = 2000


def default_corpus() -> Path:
    """The path of the shipped corpus (package data)."""
    return Path(str(resources.files("attnflow.hf").joinpath("data", "corpus.txt")))


def heldout_corpus() -> Path:
    """The path of the held-out corpus (package data; written for the project, never used in development)."""
    return Path(str(resources.files("attnflow.hf").joinpath("data", "heldout.txt")))


def read_corpus(path: str | os.PathLike | None = None, *, limit: int | None = None) -> list[str]:
    """The prompts of a corpus file (default: the shipped corpus), at most ``limit`` of them
    (:func:`corpus_lines` without the dropped comment lines)."""
    return corpus_lines(path, limit=limit)[0]


def corpus_lines(path: str | os.PathLike | None = None, *, limit: int | None = None) -> tuple[list[str], list[int]]:
    """``(prompts, comments)``: the prompts of a corpus file (default: the shipped corpus), at most
    ``limit`` of them, and the numbers of the comment lines (``#``) that were dropped.

    Refuses (one sentence, :class:`~attnflow.core.errors.InputError`) a missing file, a folder, a
    symbolic link, a file over :data:`MAX_CORPUS_BYTES`, text that is not UTF-8, a prompt longer than
    :data:`MAX_PROMPT_CHARS` characters, and a corpus without prompts.
    """
    p = default_corpus() if path is None else Path(path)
    if limit is not None and int(limit) < 1:
        raise InputError(f"limit must be a positive number of prompts; got {limit}", hint=Hint("limit", limit))
    if p.is_symlink():
        raise UnsafeInputError(f"the corpus {str(p)!r} is a symbolic link; give the file itself")
    if not p.is_file():
        raise InputError(f"the corpus {str(p)!r} is not a file", hint=Hint("corpus", str(p)))
    size = p.stat().st_size
    if size > MAX_CORPUS_BYTES:
        raise UnsafeInputError(f"the corpus {str(p)!r} has {size} bytes, more than the {MAX_CORPUS_BYTES} accepted")
    try:
        text = read_regular(p, max_bytes=MAX_CORPUS_BYTES).decode("utf-8")  # the checked file itself
    except UnicodeDecodeError as e:
        raise InputError(f"the corpus {str(p)!r} is not UTF-8 text (byte {e.start})") from None
    prompts = []
    comments = []
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if s.startswith("#"):
            comments.append(n)
        if not s or s.startswith("#"):
            continue
        if len(s) > MAX_PROMPT_CHARS:
            raise InputError(f"line {n} of the corpus has {len(s)} characters, more than {MAX_PROMPT_CHARS}")
        prompts.append(s)
    if not prompts:
        raise InputError(f"the corpus {str(p)!r} holds no prompts (one per line; '#' lines are comments)")
    return (prompts[: int(limit)] if limit is not None else prompts), comments

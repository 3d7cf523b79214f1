"""A model folder is data too (issue 41, item 1): no code from it runs, no link in it is followed,
no pipe in it is waited on.

Every tiny model is built here (:func:`attnflow.hf.tiny.save_tiny`). Each attack keeps its negative
control: the planted file really would create the sentinel when imported, and the old call
(transformers without ``trust_remote_code=False``, with ``yes`` on stdin) really did import it; a
link really resolves to loadable weights; the plain open of a pipe really waits.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from typer.testing import CliRunner

from attnflow.cli.main import app
from attnflow.core.errors import UnsafeInputError
from attnflow.hf.importer import SAFE_LOAD, check_model_folder, resolve_folder
from attnflow.hf.tiny import save_tiny
from hostile_child import assert_refused, cli_timed

runner = CliRunner()


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    return save_tiny("bert", tmp_path_factory.mktemp("models") / "bert", seed=3)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def evil_folder(root: Path, sentinel: Path, *, model_type: str = "evilnet") -> Path:
    """A folder whose config.json names custom code (auto_map) in evil.py, which writes ``sentinel``
    when imported."""
    root.mkdir(parents=True)
    (root / "evil.py").write_text(
        f"from pathlib import Path\nPath({str(sentinel)!r}).write_text('imported')\n"
        "from transformers import PretrainedConfig\n"
        "class EvilConfig(PretrainedConfig):\n    model_type = 'evilnet'\n"
    )
    (root / "config.json").write_text(
        json.dumps(
            {
                "model_type": model_type,
                "auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"},
                "num_hidden_layers": 2,
                "hidden_size": 32,
                "num_attention_heads": 4,
            }
        )
    )
    return root


def refused_in_process(*args: object) -> str:
    res = runner.invoke(app, [str(a) for a in args])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and res.output.count("error:") == 1, res.output
    return " ".join(res.output.split())


def test_the_planted_file_would_write_the_sentinel_if_imported(tmp_path):
    sentinel = tmp_path / "sentinel"
    folder = evil_folder(tmp_path / "evil", sentinel)
    sys.path.insert(0, str(folder))
    try:
        __import__("evil")
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("evil", None)
    assert sentinel.read_text() == "imported"  # negative control: importing it does run it


OLD_CALL = r"""
import sys
from transformers import AutoConfig
try:
    AutoConfig.from_pretrained(sys.argv[1], local_files_only=True)
except Exception as e:
    print(type(e).__name__)
"""


@pytest.mark.integration
def test_the_old_call_runs_the_folders_code_when_yes_is_piped_in(tmp_path):
    sentinel = tmp_path / "sentinel"
    folder = evil_folder(tmp_path / "evil", sentinel)
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    yes = subprocess.Popen(["yes"], stdout=subprocess.PIPE)
    try:
        subprocess.run([sys.executable, "-c", OLD_CALL, str(folder)], stdin=yes.stdout, env=env, timeout=300)
    finally:
        yes.kill()
        yes.wait()
    assert sentinel.exists()  # negative control: what attnflow called before did import the file


def test_trust_remote_code_false_refuses_without_importing(tmp_path):
    from transformers import AutoConfig

    sentinel = tmp_path / "sentinel"
    folder = evil_folder(tmp_path / "evil", sentinel)
    with pytest.raises(ValueError):
        AutoConfig.from_pretrained(str(folder), **SAFE_LOAD)
    assert not sentinel.exists()


@pytest.mark.integration
def test_custom_code_is_refused_before_transformers_sees_the_folder_even_with_yes_piped_in(tmp_path, monkeypatch):
    sentinel = tmp_path / "sentinel"
    folder = evil_folder(tmp_path / "evil", sentinel)
    out = tmp_path / "out"
    env_modules = tmp_path / "modules"
    monkeypatch.setenv("HF_MODULES_CACHE", str(env_modules))
    yes = subprocess.Popen(["yes"], stdout=subprocess.PIPE)
    try:
        code, text, seconds = cli_timed(
            "hf", "run", folder, "--ids", "1,2,3", "--out", out, stdin=yes.stdout, warm=("transformers",)
        )
    finally:
        yes.kill()
        yes.wait()
    msg = assert_refused(code, text, seconds)
    assert "auto_map" in msg and "custom code" in msg, msg
    assert not sentinel.exists() and not out.exists()
    assert not env_modules.exists() or not any(env_modules.rglob("evil*"))  # transformers never copied it


@pytest.mark.parametrize("where", ["config.json", "tokenizer_config.json"])
def test_auto_map_in_any_settings_file_of_a_known_model_type_is_refused(bert, tmp_path, where):
    folder = _copy(bert, tmp_path / "m")
    assert check_model_folder(folder) == folder  # negative control: the clean folder passes
    f = folder / where
    raw = json.loads(f.read_text()) if f.exists() else {}
    f.write_text(json.dumps({**raw, "auto_map": {"AutoTokenizer": ["evil.Tok", None]}}))
    with pytest.raises(UnsafeInputError, match="auto_map"):
        check_model_folder(folder)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("key", "value", "said"),
    [("architectures", 1, "'architectures' as 1, not a list"), ("architectures", [7], "'architectures' as [7]")],
)
def test_a_config_field_of_the_wrong_kind_is_one_sentence_not_a_traceback(bert, tmp_path, key, value, said):
    """The slow fuzzer's case: config.json's ``architectures`` set to ``1`` (transformers loads it) crashed
    ``hf run`` with a TypeError; now a damaged folder, said once. Control: a list of names runs."""
    folder = _copy(bert, tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, key: value}))
    msg = refused_in_process("hf", "run", folder, "--ids", "1,2,3", "--out", tmp_path / "out", "--no-figures")
    assert said in msg and "damaged" in msg, msg
    assert not (tmp_path / "out").exists()
    (folder / "config.json").write_text(json.dumps({**cfg, "architectures": ["SomethingElse"]}))
    r = CliRunner().invoke(
        app, ["hf", "run", str(folder), "--ids", "1,2,3", "--out", str(tmp_path / "ok"), "--no-figures"]
    )
    assert r.exit_code == 0, r.output


@pytest.mark.integration
def test_weights_that_overflow_the_forward_pass_are_one_sentence(bert, tmp_path):
    """The slow fuzzer's case: one flipped bit made a value weight 6e37; the forward pass overflowed and
    ``hf run`` crashed in an SVD. Now refused before anything is measured; control: the clean copy runs."""
    from safetensors.torch import load_file, save_file

    folder = _copy(bert, tmp_path / "m")
    r = CliRunner().invoke(
        app, ["hf", "run", str(folder), "--ids", "1,2,3", "--out", str(tmp_path / "ok"), "--no-figures"]
    )
    assert r.exit_code == 0, r.output
    weights = load_file(folder / "model.safetensors")
    name = next(k for k in weights if k.endswith("layer.1.attention.self.value.weight"))
    weights[name][0, 0] = 6e37
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "out"
    msg = refused_in_process("hf", "run", folder, "--ids", "1,2,3", "--out", out, "--no-figures")
    assert "non-finite hidden states from layer 2" in msg and "6e+37" in msg, msg
    assert not out.exists()


def test_config_counts_must_be_positive_whole_numbers():
    from types import SimpleNamespace

    from attnflow.core.errors import InputError
    from attnflow.hf.importer import _config_count

    assert _config_count(SimpleNamespace(num_key_value_heads=None), "num_key_value_heads", 4, "m") == 4
    assert _config_count(SimpleNamespace(), "num_key_value_heads", 4, "m") == 4
    assert _config_count(SimpleNamespace(num_attention_heads=12), "num_attention_heads", None, "m") == 12
    for bad in ("4", 4.0, 0, -2, True, None, [4]):
        with pytest.raises(InputError, match="not a positive whole number"):
            _config_count(SimpleNamespace(num_attention_heads=bad), "num_attention_heads", None, "m")


@pytest.mark.integration
def test_a_linked_weights_file_is_refused_and_nothing_is_written(bert, tmp_path):
    from transformers import AutoModel

    folder = tmp_path / "m"
    folder.mkdir()
    shutil.copy(bert / "config.json", folder / "config.json")
    (folder / "model.safetensors").symlink_to(bert / "model.safetensors")
    # Negative control: transformers itself follows the link and loads the weights from elsewhere.
    assert AutoModel.from_pretrained(str(folder), **SAFE_LOAD) is not None
    out = tmp_path / "out"
    msg = refused_in_process("hf", "run", folder, "--ids", "1,2,3", "--out", out, "--no-figures")
    assert "symbolic link" in msg and "model.safetensors" in msg, msg
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


@pytest.mark.integration
@pytest.mark.parametrize("layout", ["bare", "modules.json"])
def test_a_linked_sentence_transformers_sub_folder_is_refused_and_nothing_is_written(bert, tmp_path, layout):
    st = tmp_path / "st"
    st.mkdir()
    (st / "0_Transformer").symlink_to(bert, target_is_directory=True)
    (st / "1_Pooling").mkdir()
    if layout == "modules.json":
        mods = [{"idx": 0, "name": "0", "path": "0_Transformer", "type": "sentence_transformers.models.Transformer"}]
        (st / "modules.json").write_text(json.dumps(mods))
    else:  # negative control: the old resolution of a bare layout went through the link
        assert resolve_folder(st) == st / "0_Transformer" and (st / "0_Transformer" / "config.json").is_file()
    out = tmp_path / "out"
    msg = refused_in_process("hf", "run", st, "--ids", "1,2,3", "--out", out, "--no-figures")
    assert "symbolic link" in msg and "0_Transformer" in msg, msg
    assert not out.exists()
    msg = refused_in_process("hf", "verify", st)
    assert "symbolic link" in msg


def test_a_clean_sentence_transformers_folder_passes_the_scan(bert, tmp_path):
    st = tmp_path / "st"
    st.mkdir()
    _copy(bert, st / "0_Transformer")
    mods = [{"idx": 0, "name": "0", "path": "0_Transformer", "type": "sentence_transformers.models.Transformer"}]
    (st / "modules.json").write_text(json.dumps(mods))
    assert check_model_folder(st) == st / "0_Transformer"


def _blocks(path: Path, seconds: float = 1.0) -> bool:
    done = threading.Event()
    threading.Thread(target=lambda: (open(path, "rb").close(), done.set()), daemon=True).start()
    waiting = not done.wait(seconds)
    if waiting:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        done.wait(5)
    return waiting


@pytest.mark.integration
@pytest.mark.parametrize("name", ["tokenizer.json", "model.safetensors", "extra/notes.txt"])
def test_a_named_pipe_in_a_model_folder_is_refused_within_seconds(bert, tmp_path, name):
    folder = _copy(bert, tmp_path / "m")
    fifo = folder / name
    fifo.parent.mkdir(exist_ok=True)
    if fifo.exists():
        fifo.unlink()
    os.mkfifo(fifo)
    assert _blocks(fifo)  # negative control: a plain open of it waits for a writer
    out = tmp_path / "out"
    code, text, seconds = cli_timed("hf", "run", folder, "--ids", "1,2,3", "--out", out, warm=("transformers",))
    msg = assert_refused(code, text, seconds)
    assert "pipe" in msg and name.split("/")[-1] in msg, msg
    assert not out.exists()


def test_too_many_entries_are_refused(bert, tmp_path, monkeypatch):
    import attnflow.hf.importer as importer

    folder = _copy(bert, tmp_path / "m")
    monkeypatch.setattr(importer, "MAX_MODEL_ENTRIES", 50)
    assert check_model_folder(folder) == folder  # negative control: a few files pass
    (folder / "junk").mkdir()
    for i in range(60):
        (folder / "junk" / f"{i}").write_text("x")
    with pytest.raises(UnsafeInputError, match="more than 50"):
        check_model_folder(folder)


def test_a_folder_larger_than_memory_is_refused(bert, tmp_path, monkeypatch):
    import attnflow.hf.importer as importer

    folder = _copy(bert, tmp_path / "m")
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    monkeypatch.setattr(importer, "memory_budget", lambda: float(size))
    assert check_model_folder(folder) == folder  # negative control: exactly the budget passes
    monkeypatch.setattr(importer, "memory_budget", lambda: float(size - 1))
    with pytest.raises(UnsafeInputError, match="more than"):
        check_model_folder(folder)


def test_no_answers_leaves_any_question_at_end_of_file(monkeypatch):
    import io

    from attnflow.hf.importer import no_answers

    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    assert input() == "y"  # negative control: an answer piped in is read by a plain question
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    with no_answers(), pytest.raises(EOFError):
        input()
    assert sys.stdin.readline() == "y\n"  # the real stdin is back, unread

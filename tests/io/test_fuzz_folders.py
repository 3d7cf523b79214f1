"""A fuzzer in the suite (issue 41, item 5): hypothesis mutates a finished run folder (bytes,
truncation, JSON and YAML values, Zarr codecs and shapes, links, pipes, sparse sizes, optionally
resealing the manifest as the folder's author can) and runs ``show``, ``report`` or ``plot`` on each
mutant in a child forked by the zygote of ``test_hostile_folders`` (10 s of CPU, 1 GiB more address
space than it started with, a wall-clock alarm).

Every outcome must be one of two classes: success with the same output as the pristine folder
(``show``'s table; ``report``/``plot`` exit 0), or exactly one ``error:`` sentence with exit code 2,
no traceback; never a hang, a crash or a write outside the folder (a victim file stays
byte-identical). The default run is derandomized (the same examples in CI every time); the large
count is behind ``slow``. Counts of outcomes by class are printed (``-s``) and kept in
``OUTCOMES``.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import test_hostile_folders as _harness
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from attnflow.io.store import MANIFEST, write_manifest

zygote, _use_zygote, finished = _harness.zygote, _harness._use_zygote, _harness.finished

#: The wall-clock alarm of one command on a mutant (seconds): it catches a hang (a pipe read blocks
#: without using CPU); the work itself is bounded by the zygote's 10 s CPU limit, the wall clock is
#: looser so that a loaded CI machine does not fail a correct command.
WALL = 30
DEFAULT_EXAMPLES = int(os.environ.get("ATTNFLOW_FUZZ_EXAMPLES", "200"))
SLOW_EXAMPLES = 1000
OUTCOMES: collections.Counter[str] = collections.Counter()

JSON_FILES = [
    "provenance.json",
    "manifest.json",
    "dataset.zarr/.zmetadata",
    "dataset.zarr/.zattrs",
    "dataset.zarr/x/.zarray",
]
ANY_FILES = [
    *JSON_FILES,
    "config.yaml",
    "dataset.zarr/x/0.0.0",
    "dataset.zarr/A/0.0.0.0",
    "dataset.zarr/time/0",
    "dataset.zarr/energy/0",
    "dataset.zarr/.zgroup",
]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=12)
    | st.sampled_from(["../../etc/passwd", "os.system", "\x1b[31m", "zarr.json", "zlib", "<f8", "|O"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)

mutations = st.one_of(
    st.tuples(st.just("flip"), st.sampled_from(ANY_FILES), st.integers(0, 10**6), st.integers(0, 255)),
    st.tuples(st.just("truncate"), st.sampled_from(ANY_FILES), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("json"), st.sampled_from(JSON_FILES), st.integers(0, 10**6), json_values),
    st.tuples(st.just("yaml"), st.just("config.yaml"), st.integers(0, 10**6), json_values),
    st.tuples(
        st.just("zarray"),
        st.sampled_from(["x", "A", "time", "energy"]),
        st.sampled_from(["compressor", "filters", "dtype", "shape", "chunks", "order", "zarr_format"]),
        json_values,
    ),
    st.tuples(
        st.just("link"), st.sampled_from(ANY_FILES), st.sampled_from(["victim", "/etc/hostname", "."]), st.just(0)
    ),
    st.tuples(st.just("sparse"), st.sampled_from(ANY_FILES), st.integers(2**28, 2**36), st.just(0)),
    st.tuples(st.just("v3"), st.sampled_from(["", "x", "time"]), st.just(0), st.just(0)),
)


def _set_path(obj: object, key_seed: int, value: object) -> object:
    """``obj`` with one value (picked by ``key_seed``, at any depth) replaced by ``value``."""
    nodes: list[tuple[object, object]] = []

    def walk(o: object) -> None:
        if isinstance(o, dict):
            for k, v in o.items():
                nodes.append((o, k))
                walk(v)
        elif isinstance(o, list):
            for i, v in enumerate(o):
                nodes.append((o, i))
                walk(v)

    walk(obj)
    if not nodes:
        return value
    parent, key = nodes[key_seed % len(nodes)]
    parent[key] = value  # type: ignore[index]
    return obj


def mutate(folder: Path, victim: Path, m: tuple) -> None:
    kind, target, a, b = m
    p = folder / target if kind != "zarray" else folder / "dataset.zarr" / ".zmetadata"
    if kind == "flip" and p.stat().st_size:
        data = bytearray(p.read_bytes())
        data[a % len(data)] ^= b or 1
        p.write_bytes(bytes(data))
    elif kind == "truncate":
        os.truncate(p, a % (p.stat().st_size + 1))
    elif kind in ("json", "yaml"):
        import yaml

        text = p.read_text()
        obj = json.loads(text) if kind == "json" else yaml.safe_load(text)
        obj = _set_path(obj, a, b)
        p.write_text(json.dumps(obj) if kind == "json" else yaml.safe_dump(obj))
    elif kind == "zarray":
        meta = json.loads(p.read_text())
        meta["metadata"][f"{target}/.zarray"][a] = b
        p.write_text(json.dumps(meta))
    elif kind == "link":
        p.unlink()
        p.symlink_to(victim if a == "victim" else a)
    elif kind == "fifo":
        p.unlink()
        os.mkfifo(p)
    elif kind == "sparse":
        os.truncate(p, a)
    elif kind == "v3":
        where = folder / "dataset.zarr" / target
        (where / "zarr.json").write_text(
            json.dumps({"zarr_format": 3, "node_type": "group" if not target else "array"})
        )


def run_limited(args: list[str], tmp: Path, proc=None, wall: int = WALL) -> tuple[int, str, float]:
    """``attnflow ARGS`` in a child forked by a zygote (default: the run-folder one), limited."""
    proc = proc or _harness._zygote[0]
    out_file = tmp / "cli.txt"
    req = {"args": args, "out": str(out_file), "cpu": _harness.CPU_SECONDS, "extra_memory": _harness.EXTRA_MEMORY}
    proc.stdin.write(json.dumps({**req, "wall": wall}) + "\n")  # type: ignore[union-attr]
    proc.stdin.flush()  # type: ignore[union-attr]
    res = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
    text = out_file.read_text(errors="replace")
    out_file.unlink()
    return res["code"], text, res["cpu"]


@pytest.fixture(scope="module")
def baseline(zygote, finished, tmp_path_factory) -> dict[str, str]:
    """What each command prints on the pristine folder (paths replaced by ``RUN``)."""
    _harness._zygote[:] = [zygote]
    work = tmp_path_factory.mktemp("fuzz-base")
    shutil.copytree(finished, work / "run")
    out: dict[str, str] = {}
    for command in ("show", "report", "plot"):
        code, text, _ = run_limited(_args(command, work / "run", work), work, wall=300)
        assert code == 0, text
        out[command] = text.replace(str(work / "run"), "RUN").replace(str(work), "TMP")
    return out


def _table(text: str) -> str:
    """``show``'s output from its table on (the title holds the folder's path, wrapped by rich)."""
    return text[text.find("┏") :]


def _args(command: str, run: Path, tmp: Path) -> list[str]:
    if command == "report":
        return ["report", str(run), "--out", str(tmp / "report.html"), "--force"]
    if command == "plot":
        return ["plot", str(run), "--out", str(tmp / "figs")]
    return ["show", str(run)]


def check_one(finished: Path, baseline: dict[str, str], root: Path, m: tuple, reseal: bool, command: str) -> str:
    """Mutate a fresh copy, run the command limited; return the outcome class (asserting it is allowed)."""
    work = root / f"case-{len(list(root.iterdir()))}"
    work.mkdir()
    victim = work / "victim.txt"
    victim.write_text("the user's own file\n")
    run = work / "run"
    shutil.copytree(finished, run)
    try:
        mutate(run, victim, m)
    except (OSError, ValueError, KeyError, TypeError):
        return "not applicable"
    if reseal and not (run / MANIFEST).is_symlink() and (run / MANIFEST).is_file():
        (run / MANIFEST).unlink()
        write_manifest(run)
    code, text, cpu = run_limited(_args(command, run, work), work)
    assert victim.read_text() == "the user's own file\n"
    assert cpu < _harness.CPU_SECONDS, (m, cpu)
    label = f"{m[0]}: {command}"
    if code == 0:
        same = command != "show" or _table(text) == _table(baseline["show"])
        # A value edited consistently by the folder's author (manifest resealed) may be shown: a
        # folder is data, and data can lie (docs/robustness.md); anything else must show the same.
        assert same or (reseal and m[0] in ("json", "yaml", "zarray")), (m, text)
        outcome = "success, same output" if same else "success, a resealed edit shown"
    else:
        assert code == 2, (label, m, code, text[-2000:])
        assert "Traceback" not in text, (label, m, text[-2000:])
        assert text.count("error:") == 1, (label, m, text)
        outcome = "one error line, exit 2"
    shutil.rmtree(work, ignore_errors=True)
    return outcome


def _fuzz(finished, baseline, tmp_path_factory, m, reseal, command):
    root = tmp_path_factory.getbasetemp() / "fuzz"
    root.mkdir(exist_ok=True)
    outcome = check_one(finished, baseline, root, m, reseal, command)
    OUTCOMES[outcome] += 1
    OUTCOMES[f"mutation {m[0]}"] += 1


@pytest.mark.integration
@settings(
    max_examples=DEFAULT_EXAMPLES,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: each example costs a command
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(m=mutations, reseal=st.booleans(), command=st.sampled_from(["show", "report", "plot"]))
def test_fuzz_run_folder(finished, baseline, tmp_path_factory, m, reseal, command):
    _fuzz(finished, baseline, tmp_path_factory, m, reseal, command)


#: A pipe in a run folder: ``report`` opens provenance.json before its folder scan and blocks (issue
#: 41 item 2, the open-then-check helper: branch w41a); expected to fail until that lands.
pipe_mutations = st.tuples(st.just("fifo"), st.sampled_from(ANY_FILES), st.just(0), st.just(0))


@pytest.mark.integration
@settings(
    max_examples=8,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(m=pipe_mutations, command=st.sampled_from(["show", "report", "plot"]))
def test_fuzz_run_folder_pipes(finished, baseline, tmp_path_factory, m, command):
    _fuzz(finished, baseline, tmp_path_factory, m, False, command)


@pytest.mark.slow
@settings(
    max_examples=SLOW_EXAMPLES,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(m=mutations, reseal=st.booleans(), command=st.sampled_from(["show", "report", "plot"]))
def test_fuzz_run_folder_many(finished, baseline, tmp_path_factory, m, reseal, command):
    _fuzz(finished, baseline, tmp_path_factory, m, reseal, command)


# --- The model folder: a tiny BERT built by the test, mutated, run through `hf run` ----------------------

#: Mutation kinds of a model folder whose refusal is issue 41's model-folder scan (links, pipes and
#: custom code named by ``auto_map``): fuzzed in their own test, expected to fail until that lands.
SCAN_KINDS = ("link", "fifo", "auto_map")
MODEL_FILES = ["config.json", "model.safetensors"]

model_mutations = st.one_of(
    st.tuples(st.just("flip"), st.sampled_from(MODEL_FILES), st.integers(0, 10**6), st.integers(0, 255)),
    st.tuples(st.just("truncate"), st.sampled_from(MODEL_FILES), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("json"), st.just("config.json"), st.integers(0, 10**6), json_values),
    st.tuples(st.just("sparse"), st.sampled_from(MODEL_FILES), st.integers(2**28, 2**36), st.just(0)),
)
scan_mutations = st.one_of(
    st.tuples(st.just("link"), st.sampled_from(MODEL_FILES), st.sampled_from(["other", "victim"]), st.just(0)),
    st.tuples(st.just("fifo"), st.sampled_from(MODEL_FILES), st.just(0), st.just(0)),
    st.tuples(st.just("auto_map"), st.just("config.json"), st.sampled_from(["unknown", "bert"]), st.just(0)),
)


@pytest.fixture(scope="module")
def hf_zygote():
    """A zygote with transformers imported once (each forked ``hf run`` would spend its CPU on it)."""
    pytest.importorskip("transformers")
    code = _harness.ZYGOTE.replace(
        'print("ready"', 'import transformers, attnflow.cli.hf, attnflow.hf.importer\nprint("ready"'
    )
    env = {
        **os.environ,
        "PYTHONPATH": _harness.SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield proc
    proc.stdin.close()  # type: ignore[union-attr]
    proc.wait(timeout=60)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    pytest.importorskip("transformers")
    from attnflow.hf.tiny import save_tiny

    root = tmp_path_factory.mktemp("fuzz-model")
    save_tiny("bert", root / "other", seed=1)
    return save_tiny("bert", root / "bert", seed=0)


def mutate_model(folder: Path, victim: Path, m: tuple) -> None:
    kind, target, a, b = m
    p = folder / target
    if kind == "link":
        p.unlink()
        p.symlink_to((folder.parent.parent / "other" / target) if a == "other" else victim)
    elif kind == "auto_map":
        cfg = json.loads(p.read_text())
        cfg["auto_map"] = {"AutoModel": "evil.EvilModel"}
        if a == "unknown":
            cfg["model_type"] = "evil"
        p.write_text(json.dumps(cfg))
        (folder / "evil.py").write_text(
            f"open({str(folder.parent / 'SENTINEL')!r}, 'w').write('imported')\nclass EvilModel: pass\n"
        )
    else:
        mutate(folder, victim, m)


def check_model(tiny_bert: Path, root: Path, m: tuple, proc) -> str:
    work = root / f"case-{len(list(root.iterdir()))}"
    work.mkdir()
    victim = work / "victim.txt"
    victim.write_text("the user's own file\n")
    model = work / "m" / "bert"
    model.parent.mkdir()
    shutil.copytree(tiny_bert, model)
    try:
        mutate_model(model, victim, m)
    except (OSError, ValueError, KeyError, TypeError):
        return "not applicable"
    args = ["hf", "run", str(model), "--ids", "1,2,3", "--out", str(work / "out"), "--no-figures"]
    code, text, cpu = run_limited(args, work, proc)
    assert victim.read_text() == "the user's own file\n"
    assert not (work / "m" / "SENTINEL").exists(), (m, "code from the model folder was imported")
    assert cpu < _harness.CPU_SECONDS, (m, cpu)
    if code == 0:
        assert m[0] not in SCAN_KINDS, (m, "a link, pipe or auto_map was accepted", text[-500:])
        outcome = "success"
    else:
        assert code == 2, (m, code, text[-2000:])
        assert "Traceback" not in text and text.count("error:") == 1, (m, text[-2000:])
        outcome = "one error line, exit 2"
    shutil.rmtree(work, ignore_errors=True)
    return outcome


def _fuzz_model(tiny_bert, hf_zygote, tmp_path_factory, m):
    root = tmp_path_factory.getbasetemp() / "fuzz-model-cases"
    root.mkdir(exist_ok=True)
    outcome = check_model(tiny_bert, root, m, hf_zygote)
    OUTCOMES[f"model {outcome}"] += 1
    OUTCOMES[f"model mutation {m[0]}"] += 1


MODEL_SETTINGS = {
    "database": None,
    "deadline": None,
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
}


@pytest.mark.integration
@settings(max_examples=max(1, DEFAULT_EXAMPLES // 4), derandomize=True, **MODEL_SETTINGS)
@given(m=model_mutations)
def test_fuzz_model_folder(tiny_bert, hf_zygote, tmp_path_factory, m):
    _fuzz_model(tiny_bert, hf_zygote, tmp_path_factory, m)


@pytest.mark.integration
@settings(max_examples=12, derandomize=True, **MODEL_SETTINGS)
@given(m=scan_mutations)
def test_fuzz_model_folder_links_pipes_and_custom_code(tiny_bert, hf_zygote, tmp_path_factory, m):
    _fuzz_model(tiny_bert, hf_zygote, tmp_path_factory, m)


@pytest.mark.slow
@settings(max_examples=SLOW_EXAMPLES // 4, **MODEL_SETTINGS)
@given(m=model_mutations)
def test_fuzz_model_folder_many(tiny_bert, hf_zygote, tmp_path_factory, m):
    _fuzz_model(tiny_bert, hf_zygote, tmp_path_factory, m)


def test_zz_fuzz_counts():
    """Prints the outcome counts of the fuzz tests that ran in this session (``-s``)."""
    print(f"FUZZ OUTCOMES {dict(sorted(OUTCOMES.items()))}")

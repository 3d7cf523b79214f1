"""A run folder from a stranger is data, never code (issue 27).

Every tampered folder below goes through the real CLI in a forked child process with resource
limits (address space: what the child has mapped at the fork plus 1 GiB; CPU time: 10 s; wall
clock: an alarm), and must end in exit code 2 with one ``error:`` sentence, no traceback, nothing
executed (a sentinel file stays absent) and nothing outside the folder read or written (a victim
file stays byte-identical). Each case keeps a negative control: the attack is really in the input,
or the naive operation really would have changed the victim.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from attnflow.cli.main import app
from attnflow.config import parse_config
from attnflow.core.errors import UnsafeInputError
from attnflow.io.lock import lock_path, output_lock
from attnflow.io.store import MANIFEST, clean_leftovers, folder_kind, write_manifest
from attnflow.io.trajectory import load
from attnflow.runs.runner import run_to_folder
from helpers import SMALL_RUN

SMALL = SMALL_RUN
CPU_SECONDS = 10
EXTRA_MEMORY = 2**30
SENTINEL_NAME = "attnflow-pwned"
SRC = str(Path(__file__).resolve().parents[2] / "src")


# --- The harness: the CLI in a forked, limited child ------------------------------------------------

#: A "zygote": a process that imports the CLI once and, per request, forks a child that sets its
#: limits and runs one command. Forking the test process itself is unsafe (zarr's I/O thread would
#: be missing in the child); the zygote starts no threads, and a fresh interpreter per case would
#: spend most of the CPU budget importing torch.
ZYGOTE = r"""
import json, os, resource, signal, sys
from attnflow.cli.main import app
import attnflow.cli.view, attnflow.cli.edi, attnflow.cli.sweep, attnflow.viz.report, attnflow.viz.movie
print("ready", flush=True)
for line in sys.stdin:
    req = json.loads(line)
    with open("/proc/self/statm") as fh:
        mapped = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            limit = mapped + req["extra_memory"]
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            resource.setrlimit(resource.RLIMIT_CPU, (req["cpu"], req["cpu"] + 1))
            signal.alarm(req["wall"])
            fd = os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            try:
                app(req["args"], prog_name="attnflow", standalone_mode=True)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 71
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status, usage = os.wait4(pid, 0)
    print(json.dumps({"code": os.waitstatus_to_exitcode(status), "cpu": usage.ru_utime + usage.ru_stime,
                      "maxrss_kib": usage.ru_maxrss}), flush=True)
"""


@pytest.fixture(scope="module")
def zygote():
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield proc
    proc.stdin.close()  # type: ignore[union-attr]
    proc.wait(timeout=60)


_zygote: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _use_zygote(zygote):
    _zygote[:] = [zygote]
    yield


def cli_limited(*args: object, tmp: Path) -> tuple[int, str, float, float]:
    """Run ``attnflow ARGS`` in a child forked by the zygote, limited to 10 s of CPU and 1 GiB more
    address space than it started with; returns ``(exit code, output, cpu seconds, peak MiB)``. A
    child killed by a limit returns the negative signal number."""
    proc = _zygote[0]
    out_file = tmp / f".cli-{len(list(tmp.iterdir()))}.txt"
    req = {"args": [str(a) for a in args], "out": str(out_file), "cpu": CPU_SECONDS, "extra_memory": EXTRA_MEMORY}
    proc.stdin.write(json.dumps({**req, "wall": 300}) + "\n")  # type: ignore[union-attr]
    proc.stdin.flush()  # type: ignore[union-attr]
    res = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
    text = out_file.read_text(errors="replace")
    out_file.unlink()
    return res["code"], text, res["cpu"], res["maxrss_kib"] / 1024


def refused(*args: object, tmp: Path, needle: str | None = None) -> str:
    """The CLI call is refused: exit 2, one ``error:`` paragraph, no traceback, within the limits."""
    code, text, cpu, _ = cli_limited(*args, tmp=tmp)
    assert code == 2, (code, text)
    assert "Traceback" not in text, text
    body = text.strip()
    assert body.count("error:") == 1 and "\n\n" not in body.split("error:", 1)[1], text
    assert "\x1b" not in text, repr(text)  # nothing from a folder reaches the terminal raw
    assert cpu < CPU_SECONDS, cpu
    if needle is not None:
        assert needle in " ".join(body.split()), body
    return " ".join(body.split())


def snapshot(p: Path) -> dict[str, bytes]:
    if p.is_file():
        return {"": p.read_bytes()}
    return {str(q.relative_to(p)): q.read_bytes() for q in sorted(p.rglob("*")) if q.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hostile") / "run"
    run_to_folder(parse_config(SMALL), out, figures=False)
    return out


@pytest.fixture
def run(finished: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(finished, dst)
    return dst


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    v = tmp_path / "outside" / "victim.txt"
    v.parent.mkdir()
    v.write_text("the user's own file; it must stay byte-identical\n")
    return v


def set_attrs(folder: Path, **attrs: object) -> None:
    """Tamper with the dataset's attributes (both copies of the metadata) and rewrite the manifest, as
    the folder's author can."""
    store = folder / "dataset.zarr"
    meta = json.loads((store / ".zmetadata").read_text())
    meta["metadata"][".zattrs"].update(attrs)
    for k, v in attrs.items():
        if v is None:
            meta["metadata"][".zattrs"].pop(k)
    (store / ".zmetadata").write_text(json.dumps(meta))
    zattrs = json.loads((store / ".zattrs").read_text())
    zattrs.update({k: v for k, v in attrs.items() if v is not None})
    (store / ".zattrs").write_text(json.dumps(zattrs))
    (folder / MANIFEST).unlink()
    write_manifest(folder)


def drop_variable(folder: Path, name: str) -> None:
    store = folder / "dataset.zarr"
    meta = json.loads((store / ".zmetadata").read_text())
    meta["metadata"] = {k: v for k, v in meta["metadata"].items() if not k.startswith(f"{name}/")}
    (store / ".zmetadata").write_text(json.dumps(meta))
    shutil.rmtree(store / name)


# --- 1. No code named by data ---------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("command", ["show", "report", "plot", "movie", "edi"])
def test_a_code_naming_attribute_runs_nothing(run, tmp_path, command):
    sentinel = tmp_path / SENTINEL_NAME
    # A reader that would create the sentinel if imported and called: pathlib.Path.touch on the dataset
    # fails, but os:system would not; both are refused by name, never imported.
    attack = "os:system"
    drop_variable(run, "A")
    set_attrs(run, heads_reader=attack, method=f"touch {sentinel}")
    set_attrs(run, method="rk4")  # the attack is the reader; every other string stays valid
    assert attack in (run / "dataset.zarr" / ".zmetadata").read_text()  # negative control: the attack is there
    args = {"movie": ["--out", tmp_path / "m.mp4"], "edi": []}.get(command, [])
    refused(command, run, *args, tmp=tmp_path)
    assert not sentinel.exists()
    with pytest.raises(UnsafeInputError):
        load(run)


def test_a_registered_reader_name_still_reads_and_an_unknown_one_is_refused(run):
    from attnflow.io.readers import FACTORED, heads_reader

    assert callable(heads_reader(FACTORED))  # negative control: the registry does answer
    for bad in ("subprocess:run", "attnflow.hf.folder:dense_heads ", 7, "x" * 10_000):
        with pytest.raises(UnsafeInputError):
            heads_reader(bad)


# --- 2. Confinement: links and traversal ---------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("where", ["config.yaml", "dataset.zarr/x/0.0.0", "provenance.json", "dataset.zarr"])
def test_links_inside_a_folder_are_never_followed(run, tmp_path, victim, where):
    target = run / where
    if target.is_dir():
        shutil.copytree(target, victim.parent / "elsewhere")
        shutil.rmtree(target)
        target.symlink_to(victim.parent / "elsewhere", target_is_directory=True)
    else:
        shutil.copy(target, victim)
        target.unlink()
        target.symlink_to(victim)
    before = snapshot(victim.parent)
    assert (run / where).is_symlink() and (run / where).exists()  # negative control: the link resolves
    refused("show", run, tmp=tmp_path, needle="symbolic link")
    refused("report", run, tmp=tmp_path)
    assert snapshot(victim.parent) == before


@pytest.mark.integration
@pytest.mark.parametrize("entry", ["../outside/victim.txt", "/etc/hostname", "dataset.zarr/../../outside/victim.txt"])
def test_manifest_entries_outside_the_folder_are_refused_unread(run, tmp_path, victim, entry):
    manifest = json.loads((run / MANIFEST).read_text())
    manifest["files"][entry] = "0" * 64
    (run / MANIFEST).write_text(json.dumps(manifest))
    assert (run / entry).exists() or Path(entry).exists()  # negative control: the path does name a file
    msg = refused("show", run, tmp=tmp_path)
    assert "outside" in msg or "'..'" in msg


@pytest.mark.integration
def test_a_lock_file_planted_as_a_link_leaves_its_target_alone(tmp_path, victim):
    out = tmp_path / "out"
    before = victim.read_bytes()
    # Negative control: the naive open the lock used to do truncates what the link points to.
    decoy = tmp_path / "decoy.txt"
    decoy.write_bytes(before)
    naive = tmp_path / ".naive.lock"
    naive.symlink_to(decoy)
    fd = os.open(naive, os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, 0)
    os.close(fd)
    assert decoy.read_bytes() == b""
    lock_path(out).symlink_to(victim)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(SMALL))
    refused("run", cfg, "--out", out, "--no-figures", tmp=tmp_path, needle="symbolic link")
    with pytest.raises(UnsafeInputError):
        with output_lock(out):
            pass
    assert victim.read_bytes() == before


def test_a_hard_linked_lock_file_is_refused(tmp_path, victim):
    out = tmp_path / "out"
    before = victim.read_bytes()
    os.link(victim, lock_path(out))
    with pytest.raises(UnsafeInputError):
        with output_lock(out):
            pass
    assert victim.read_bytes() == before


@pytest.mark.integration
def test_plot_through_a_linked_figures_folder_or_file_is_refused(run, tmp_path, victim):
    (run / "figures").symlink_to(victim.parent, target_is_directory=True)
    before = snapshot(victim.parent)
    refused("plot", run, tmp=tmp_path, needle="symbolic link")
    assert snapshot(victim.parent) == before
    (run / "figures").unlink()
    # --out a link to another folder, and --out a folder whose figure file is a link
    link = tmp_path / "figs"
    link.symlink_to(victim.parent, target_is_directory=True)
    refused("plot", run, "--out", link, tmp=tmp_path, needle="symbolic link")
    figs = tmp_path / "figs2"
    figs.mkdir()
    (figs / "snapshots.png").symlink_to(victim)
    refused("plot", run, "--out", figs, "--force", tmp=tmp_path, needle="symbolic link")
    assert snapshot(victim.parent) == before
    # Negative control: a naive savefig through the link does write into the victim's folder.
    import matplotlib.pyplot as plt

    fig = plt.figure()
    fig.savefig(link / "naive.png")
    plt.close(fig)
    assert (victim.parent / "naive.png").exists()


@pytest.mark.integration
def test_resume_refuses_a_linked_provenance_and_keeps_its_target(tmp_path, victim):
    cfg = parse_config({**SMALL, "integration": {**SMALL["integration"], "t_end": 0.4}})
    out = tmp_path / "unfinished"
    run_to_folder(cfg, out, figures=False)
    (out / "provenance.json").unlink()
    (out / MANIFEST).unlink()
    shutil.copy(out / "config.yaml", tmp_path / "cfg-copy.yaml")
    (out / "provenance.json").symlink_to(victim)
    before = victim.read_bytes()
    assert folder_kind(out) == "unfinished"  # negative control: a folder resume would write into
    refused("run", "--resume", out, "--no-figures", tmp=tmp_path, needle="symbolic link")
    assert victim.read_bytes() == before


@pytest.mark.integration
def test_sweep_never_writes_into_the_users_own_files(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "sweep.yaml").write_text("my notes\n")
    (out / "results.parquet").write_bytes(b"my own table")
    before = snapshot(out)
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"base": SMALL, "grid": {"product": {"heads.beta": [1.0, 2.0]}}}))
    assert folder_kind(out) == "foreign"  # negative control: the old check took it for a sweep
    refused("sweep", sweep, "--out", out, "--workers", "1", tmp=tmp_path, needle="not an attnflow sweep folder")
    assert snapshot(out) == before


@pytest.mark.integration
def test_a_sweep_folder_with_a_planted_link_is_refused(tmp_path, victim):
    from attnflow.io.store import mark_folder

    out = tmp_path / "sw"
    (out / "points").mkdir(parents=True)
    (out / "sweep.yaml").write_text("name: x\n")
    mark_folder(out, "sweep")
    (out / "points" / "abc.json").symlink_to(victim)
    assert folder_kind(out) == "sweep"
    before = victim.read_bytes()
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"base": SMALL, "grid": {"product": {"heads.beta": [1.0]}}}))
    refused("sweep", sweep, "--out", out, "--workers", "1", tmp=tmp_path, needle="symbolic link")
    assert victim.read_bytes() == before


# --- 3. Only our own files are replaced ---------------------------------------------------------------


def test_the_leftover_cleaner_touches_only_what_it_can_prove_is_ours(tmp_path, finished):
    out = tmp_path / "run"
    mine = [tmp_path / ".run.old-notes", tmp_path / ".run.tmp-12345678", tmp_path / ".run.force-deadbeef.txt"]
    mine[0].mkdir()
    (mine[0] / "thesis.tex").write_text("mine")
    mine[1].mkdir()
    (mine[1] / "data.csv").write_text("mine")
    mine[2].write_text("mine")
    ours = tmp_path / ".run.tmp-0badc0de"
    ours.mkdir()
    (ours / ".attnflow-writing").touch()
    old = tmp_path / ".run.old-00c0ffee"
    shutil.copytree(finished, old)
    removed = clean_leftovers(out)
    assert all(p.exists() for p in mine)
    assert not ours.exists() and ours in removed
    assert out.is_dir() and folder_kind(out) == "run"  # the old run is put back (out was missing)
    assert not old.exists()


@pytest.mark.integration
def test_report_out_never_replaces_a_file_of_the_user(run, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    refused("report", run, "--out", notes, tmp=tmp_path, needle="not an attnflow report")
    refused("report", run, "--out", notes, "--force", tmp=tmp_path, needle="not an attnflow report")
    assert notes.read_text() == "my notes"
    page = tmp_path / "r.html"
    code, text, _, _ = cli_limited("report", run, "--out", page, tmp=tmp_path)
    assert code == 0, text
    refused("report", run, "--out", page, tmp=tmp_path, needle="--force")  # ours, but --force is required
    code, text, _, _ = cli_limited("report", run, "--out", page, "--force", tmp=tmp_path)
    assert code == 0, text
    movie = tmp_path / "m.mp4"
    movie.write_text("not a movie")
    refused("movie", run, "--out", movie, "--force", tmp=tmp_path, needle="not a movie")


def test_hf_run_and_reproduce_folders_have_a_manifest(tmp_path, finished):
    """Every folder written through :func:`attnflow.io.store.atomic_folder` gets a manifest, also
    when its writer (an experiment, ``hf run``) does not write one itself."""
    import warnings

    from attnflow.io.store import DataWarning, atomic_folder

    out = tmp_path / "exp"
    with atomic_folder(out) as tmp:
        shutil.copytree(finished / "dataset.zarr", tmp / "dataset.zarr")
        (tmp / "provenance.json").write_text((finished / "provenance.json").read_text())
    assert (out / MANIFEST).is_file()
    assert not (out / ".attnflow-writing").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)
        load(out)  # no "written by an older attnflow" warning


# --- 4. Bounded everything -----------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize(
    "text",
    ["a: &a [*a]\n", "name: &n {x: *n}\n", "tokens: &t {n: 16, d: *t}\n"],
)
def test_cyclic_yaml_is_refused_at_once(tmp_path, text):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    refused("run", cfg, "--out", tmp_path / "o", tmp=tmp_path, needle="cycle")
    refused(
        "run",
        "--preset",
        "ou",
        "--out",
        tmp_path / "o",
        "--set",
        f"tokens={text.split(': ', 1)[1].strip()}",
        tmp=tmp_path,
    )


@pytest.mark.integration
def test_cyclic_yaml_in_a_finished_folder(run, tmp_path):
    (run / "config.yaml").write_text("a: &a [*a]\n")
    (run / MANIFEST).unlink()
    write_manifest(run)
    refused("show", run, tmp=tmp_path, needle="not valid YAML")


def _zip_bomb(path: Path, inflated: int) -> None:
    """An ``.npz`` whose one member inflates to ``inflated`` bytes of zeros (written streaming)."""
    header = {"descr": "<f8", "fortran_order": False, "shape": (inflated // 8,)}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        with zf.open("x.npy", "w", force_zip64=True) as fh:
            np.lib.format.write_array_header_1_0(fh, header)
            block = bytes(2**24)
            for _ in range(inflated // len(block)):
                fh.write(block)


@pytest.mark.integration
def test_a_checkpoint_zip_bomb_is_refused_before_it_inflates(finished, tmp_path):
    out = tmp_path / "unfinished"
    out.mkdir()
    shutil.copy(finished / "config.yaml", out / "config.yaml")
    _zip_bomb(out / "checkpoint.npz", 2 * EXTRA_MEMORY)
    assert (out / "checkpoint.npz").stat().st_size < 2**24  # negative control: small on disk, 2 GiB inflated
    with zipfile.ZipFile(out / "checkpoint.npz") as zf:
        assert zf.infolist()[0].file_size > 2 * EXTRA_MEMORY
    refused("show", out, tmp=tmp_path, needle="decompress")


@pytest.mark.integration
def test_a_sparse_file_in_a_manifest_is_refused_unhashed(run, tmp_path):
    sparse = run / "dataset.zarr" / "big"
    with open(sparse, "wb") as fh:
        fh.truncate(200 * 2**30)
    assert sparse.stat().st_size == 200 * 2**30  # negative control: 200 GB to hash
    (run / MANIFEST).unlink()
    write_manifest_without = json.loads(json.dumps({"format": "attnflow-manifest/1", "files": {}}))
    write_manifest_without["files"]["dataset.zarr/big"] = "0" * 64
    (run / MANIFEST).write_text(json.dumps(write_manifest_without))
    refused("show", run, tmp=tmp_path, needle="sparse")


@pytest.mark.integration
def test_a_declared_shape_of_a_trillion_rows_is_refused(run, tmp_path):
    store = run / "dataset.zarr"
    meta = json.loads((store / ".zmetadata").read_text())
    meta["metadata"]["x/.zarray"]["shape"][0] = 10**12
    (store / ".zmetadata").write_text(json.dumps(meta))
    (run / MANIFEST).unlink()
    write_manifest(run)
    refused("show", run, tmp=tmp_path, needle="chunks")
    refused("report", run, tmp=tmp_path)


@pytest.mark.integration
@pytest.mark.parametrize(
    "option,value,needle",
    [
        ("--frames", "1000000000", "frames"),
        ("--trails", "1000000", "trails"),
        ("--resolution", "100000x100000", "pixels"),
        ("--rotate", "nan", "rotate"),
    ],
)
def test_movie_options_are_bounded_before_any_work(run, tmp_path, option, value, needle):
    refused("movie", run, "--out", tmp_path / "m.mp4", option, value, tmp=tmp_path, needle=needle)
    assert not (tmp_path / "m.mp4").exists()


@pytest.mark.integration
def test_weights_layers_and_sweep_points_are_bounded(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({**SMALL, "model": "usa", "weights": {"process": "layers", "layers": 1000000}}))
    refused("run", cfg, "--out", tmp_path / "o", tmp=tmp_path, needle="less than or equal to 10000 (got 1000000)")
    sweep = tmp_path / "s.yaml"
    grid = {"heads.beta": [float(i) for i in range(1000)], "integration.dt": [0.05 / (i + 1) for i in range(1000)]}
    sweep.write_text(yaml.safe_dump({"base": SMALL, "grid": {"product": grid}}))
    assert sweep.stat().st_size < 100_000  # negative control: a small file of a million points
    refused("sweep", sweep, "--out", tmp_path / "sw", tmp=tmp_path, needle="1,000,000 points")
    assert not (tmp_path / "sw").exists()


@pytest.mark.integration
def test_hf_config_and_modules_json_are_bounded_and_confined(tmp_path):
    from attnflow.hf.importer import check_config_sizes, resolve_folder

    with pytest.raises(UnsafeInputError, match="100,000 layers"):
        check_config_sizes({"num_hidden_layers": 100_000, "hidden_size": 64}, "config.json")
    check_config_sizes({"num_hidden_layers": 6, "hidden_size": 384}, "config.json")  # negative control
    model = tmp_path / "st"
    model.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "config.json").write_text("{}")
    for path in ("../elsewhere", str(tmp_path / "elsewhere")):
        (model / "modules.json").write_text(
            json.dumps([{"path": path, "type": "sentence_transformers.models.Transformer"}])
        )
        with pytest.raises(UnsafeInputError):
            resolve_folder(model)
    (model / "0_Transformer").mkdir()
    (model / "modules.json").write_text(
        json.dumps([{"path": "0_Transformer", "type": "sentence_transformers.models.Transformer"}])
    )
    assert resolve_folder(model) == model / "0_Transformer"  # negative control: a sub-folder is fine


# --- 5. Escaping and strings ---------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize(
    "attrs",
    [
        {"model": "gf\x1b[2J\x1b]0;pwned\x07ALL TESTS PASSED"},
        {"method": "rk4\x1b[31m"},
        {"steps_method": "x\x1b[2J"},
        {"seed": "zero"},
        {"dt": "0.05"},
    ],
)
def test_escape_sequences_and_wrong_types_in_attributes(run, tmp_path, attrs):
    set_attrs(run, **attrs)
    assert any(isinstance(v, str) for v in attrs.values())  # negative control: the tampered value is in place
    refused("show", run, tmp=tmp_path)
    refused("report", run, tmp=tmp_path)


@pytest.mark.integration
def test_a_config_attribute_of_the_wrong_type(run, tmp_path):
    set_attrs(run, config="[1, 2]", beta=[1, 2])
    code, text, _, _ = cli_limited("show", run, tmp=tmp_path)  # config.yaml is there: the attribute is not needed
    assert code == 0 and "Traceback" not in text, text
    (run / "config.yaml").unlink()
    (run / MANIFEST).unlink()
    write_manifest(run)
    refused("show", run, tmp=tmp_path, needle="not a mapping")  # negative control: then it is needed, and refused


@pytest.mark.integration
def test_escape_sequences_in_provenance_and_folder_names_never_reach_the_terminal(run, tmp_path):
    prov = json.loads((run / "provenance.json").read_text())
    prov["git_commit"] = "\x1b]0;owned\x07"
    (run / "provenance.json").write_text(json.dumps(prov))
    refused("show", run, tmp=tmp_path)
    odd = tmp_path / "run\x1b[2J"
    code, text, _, _ = cli_limited("show", odd, tmp=tmp_path)
    assert code == 2 and "\x1b" not in text and "\\x1b" in text  # shown escaped, not acted on


@pytest.mark.integration
def test_garbage_and_huge_npy_token_files(tmp_path):
    garbage = tmp_path / "x.npy"
    garbage.write_bytes(b"\x00garbage bytes, not numpy" * 4)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({**SMALL, "tokens": {"n": 16, "d": 3, "init": "file", "path": str(garbage)}}))
    msg = refused("run", cfg, "--out", tmp_path / "o", tmp=tmp_path)
    assert "pickle" not in msg.lower() and "not a .npy" in msg
    huge = tmp_path / "h.npy"
    with open(huge, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": "<f8", "fortran_order": False, "shape": (2**38, 1)})
        fh.write(bytes(64))
    cfg.write_text(yaml.safe_dump({**SMALL, "tokens": {"n": 16, "d": 3, "init": "file", "path": str(huge)}}))
    refused("run", cfg, "--out", tmp_path / "o", tmp=tmp_path, needle="2,199,023,255,552 bytes")


@pytest.mark.integration
def test_hf_verify_tol_nan_is_refused(tmp_path):
    pytest.importorskip("transformers")
    refused("hf", "verify", tmp_path / "nomodel", "--tol", "nan", tmp=tmp_path, needle="--tol")


@pytest.mark.integration
@pytest.mark.parametrize("err", [errno.EROFS, errno.EACCES])
def test_a_read_only_or_unwritable_out_parent_is_one_sentence(tmp_path, monkeypatch, err):
    """What a non-root user meets on a read-only disk or a folder of someone else (root, running the
    tests, may write anywhere: the refusal of the operating system is simulated at mkdir)."""
    from typer.testing import CliRunner

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(SMALL))
    parent = tmp_path / "ro"
    real_mkdir = Path.mkdir

    def mkdir(self, *a, **k):
        if str(self).startswith(str(parent)):
            raise OSError(err, os.strerror(err), str(self))
        return real_mkdir(self, *a, **k)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    monkeypatch.setattr(os, "access", lambda *a, **k: True)  # the pre-check passes; the write itself fails
    r = CliRunner().invoke(app, ["run", str(cfg), "--out", str(parent / "sub" / "run"), "--no-figures"])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and r.output.strip().startswith("error:"), r.output
    assert os.strerror(err) in r.output
    # negative control: the same error outside the CLI is an exception (a traceback if not caught)
    with pytest.raises(OSError):
        (parent / "x").mkdir(parents=True)


@pytest.mark.integration
def test_a_file_size_limit_is_one_sentence(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(SMALL))
    pid = os.fork()
    if pid == 0:
        fd = os.open(tmp_path / "out.txt", os.O_WRONLY | os.O_CREAT, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        code = 70
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        try:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))
            app(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-figures"], prog_name="attnflow")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        finally:
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    text = (tmp_path / "out.txt").read_text()
    assert os.waitstatus_to_exitcode(status) == 2, text
    assert "Traceback" not in text and "too large" in text, text


@pytest.mark.integration
def test_an_hf_run_folder_has_a_manifest_and_its_reader_is_chosen_by_name(tmp_path):
    """``hf run`` folders had no manifest (every load warned "written by an older attnflow") and named
    their heads reader as code; now they carry a manifest and a registered reader name."""
    import warnings

    pytest.importorskip("transformers")
    from typer.testing import CliRunner

    from attnflow.hf.tiny import save_tiny
    from attnflow.io.readers import HEADS_READERS
    from attnflow.io.store import DataWarning

    model = save_tiny("gpt2", tmp_path / "gpt2", tokenizer=True)
    out = tmp_path / "hfrun"
    res = CliRunner().invoke(app, ["hf", "run", str(model), "--ids", "1,2,3", "--out", str(out), "--no-figures"])
    assert res.exit_code == 0, res.output
    assert json.loads((out / MANIFEST).read_text())["kind"] == "run"
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)
        traj = load(out)
    meta = json.loads((out / "dataset.zarr" / ".zmetadata").read_text())["metadata"][".zattrs"]
    assert meta["heads_reader"] in HEADS_READERS and traj.A.shape[0] == len(traj.t)
    set_attrs(out, heads_reader="attnflow.hf.folder:save_hf_run")  # a real function of attnflow, still refused
    with pytest.raises(UnsafeInputError, match="heads reader"):
        load(out)

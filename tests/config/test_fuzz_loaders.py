"""Bad input everywhere a user hands us data: each is a clean one-paragraph error, exit code 2,
no traceback, nothing written; ``--debug`` shows the traceback. Hypothesis fuzzes the loaders."""

from __future__ import annotations

import string
import warnings

import numpy as np
import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from attnflow.cli.main import app
from attnflow.config import ConfigError, RunConfig, apply_overrides, load_config, parse_config, preset_config
from attnflow.config.validation import load_weight_file
from attnflow.core.tokens import from_file
from attnflow.io.store import is_complete
from helpers import skip_without_sweep_extra

torch.set_num_threads(1)
runner = CliRunner()
TINY = "integration: {t_end: 0.04, dt: 0.02, method: euler, save_every: 1}\ntokens: {n: 6, d: 3}\n"


def run_cli(tmp_path, text: str | bytes, *extra: str):
    cfg = tmp_path / "bad.yaml"
    cfg.write_bytes(text if isinstance(text, bytes) else text.encode())
    out = tmp_path / "out"
    res = runner.invoke(app, ["run", str(cfg), "--out", str(out), "--no-figures", *extra])
    return res, out


def assert_clean_error(res, out, *needles: str):
    text = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and res.exception is None or isinstance(res.exception, SystemExit)
    assert text.startswith("error:") and text.count("error:") == 1, text
    assert not out.exists(), "nothing may be written for bad input"
    for n in needles:
        assert n in text, (n, text)


@pytest.fixture
def weight_files(tmp_path):
    rng = np.random.default_rng(0)
    files = {}
    G = rng.standard_normal((2, 3, 3))
    np.save(tmp_path / "nonsym.npy", G)
    np.save(tmp_path / "d4.npy", np.broadcast_to(np.eye(4), (2, 4, 4)).copy())
    np.save(tmp_path / "three.npy", np.broadcast_to(np.eye(3), (3, 3, 3)).copy())
    nan = np.broadcast_to(np.eye(3), (2, 3, 3)).copy()
    nan[1, 2, 2] = np.inf
    np.savez(tmp_path / "nan.npz", A=nan)
    np.savez(tmp_path / "noA.npz", B=nan)
    np.savez(tmp_path / "vdiff.npz", A=np.broadcast_to(np.eye(3), (2, 3, 3)), V=-np.broadcast_to(np.eye(3), (2, 3, 3)))
    (tmp_path / "text.npy").write_text("not numpy")
    files.update({p.stem: p for p in tmp_path.iterdir()})
    return files


BAD_CONFIGS = [
    ("tokens: {n: 6, dd: 3}\n", ["tokens.dd", "Extra inputs"]),  # unknown key
    ("tokens: {n: six}\n", ["tokens.n", "'six'"]),  # wrong type
    ("integration: {dt: -0.1}\n", ["integration.dt", "-0.1"]),  # negative step
    ("integration: {t_end: 1, dt: 0.3}\n", ["t_end = 1", "dt = 0.3"]),  # not whole steps
    ("model: gf\nheads: {preset: gaussian}\n", ["gf", "'gaussian'", "symmetric"]),  # gf needs symmetric A
    ("model: gf\nheads: {value: identity}\n", ["V = A", "'identity'"]),
    ("tokens: {n: 2, masses: [0.7, 0.7]}\n", ["tokens.masses", "1.4"]),  # masses do not sum to 1
    ("heads: {count: 2, masses: [0.5, -0.5]}\n", ["heads.masses", "-0.5"]),
    ("tokens: {n: 2, masses: [1.0]}\n", ["tokens.masses", "1 entries", "tokens.n = 2"]),
    ("weights: {process: brownian}\n", ["'brownian'"]),
    ("seed: -3\n", ["seed", "-3"]),
    ("- 1\n- 2\n", ["top level must be a mapping", "list"]),
    ("tokens: [1, 2\n", ["not valid YAML", "line 2"]),
    ("dtype: float16\n", ["dtype", "float16"]),
    ("tokens: {init: file}\n", ["tokens.path"]),
    ("heads: {preset: file}\n", ["heads.path"]),
]


@pytest.mark.integration
@pytest.mark.parametrize("text,needles", BAD_CONFIGS)
def test_bad_config_is_one_clean_paragraph(tmp_path, text, needles):
    res, out = run_cli(tmp_path, text)
    assert_clean_error(res, out, *needles)


@pytest.mark.integration
def test_binary_config_file(tmp_path):
    res, out = run_cli(tmp_path, bytes(range(128, 256)))
    assert_clean_error(res, out, "not a text (UTF-8) file")


@pytest.mark.integration
@pytest.mark.parametrize(
    "stem,model,needles",
    [
        ("nonsym", "gf", ["symmetric A_h", "head 1", "max |A - A^T|"]),
        ("d4", "mha", ["d = 4", "tokens.d = 3"]),
        ("three", "mha", ["3 heads", "heads.count = 2"]),
        ("nan", "mha", ["NaN or inf", "head 1"]),
        ("noA", "mha", ["no array 'A'", "'B'"]),
        ("vdiff", "gf", ["V = A"]),
        ("text", "mha", ["could not read weight file"]),
    ],
)
def test_bad_weight_file(tmp_path, weight_files, stem, model, needles):
    text = (
        TINY
        + f"model: {model}\nheads: {{count: 2, preset: file, path: {weight_files[stem]}}}\nweights: {{process: constant}}\n"
    )
    res, out = run_cli(tmp_path, text)
    assert_clean_error(res, out, "heads.path", *needles)


@pytest.mark.integration
def test_good_weight_file_runs_with_its_matrices(tmp_path):
    A = np.stack([2.0 * np.eye(3), np.diag([1.0, 2.0, 3.0])])
    np.save(tmp_path / "w.npy", A)
    out = tmp_path / "run"
    cfg = tmp_path / "w.yaml"
    cfg.write_text(
        TINY + f"heads: {{count: 2, preset: file, path: {tmp_path / 'w.npy'}}}\nweights: {{process: constant}}\n"
    )
    res = runner.invoke(app, ["run", str(cfg), "--out", str(out), "--no-figures"])
    assert res.exit_code == 0, res.output
    from attnflow import load

    assert np.array_equal(load(out).A[-1], A)


@pytest.mark.integration
@pytest.mark.parametrize(
    "content,suffix,needles",
    [
        (np.full((6, 3), np.nan), ".npy", ["row 0", "NaN"]),
        (np.zeros((6, 3)), ".npy", ["row 0", "zero vector"]),
        (np.ones((6, 3, 1)), ".npy", ["shape (N, d)"]),
        (np.eye(4)[[0, 1, 2, 3, 0, 1]], ".npy", ["shape (6, 4)", "n=6, d=3"]),
        (None, ".txt", ["must end in .npy or .csv"]),
    ],
)
def test_bad_token_file(tmp_path, content, suffix, needles):
    p = tmp_path / f"tok{suffix}"
    if content is None:
        p.write_text("1,2,3\n")
    else:
        np.save(p, content)
    res, out = run_cli(tmp_path, TINY.replace("d: 3}", f"d: 3, init: file, path: {p}}}"))
    assert_clean_error(res, out, *needles)


@pytest.mark.integration
def test_off_sphere_tokens_are_normalised_with_a_warning(tmp_path):
    p = tmp_path / "tok.csv"
    np.savetxt(p, 2.5 * np.eye(3)[[0, 1, 2, 0, 1, 2]], delimiter=",")
    out = tmp_path / "run"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(TINY.replace("d: 3}", f"d: 3, init: file, path: {p}}}"))
    res = runner.invoke(app, ["run", str(cfg), "--out", str(out), "--no-figures"])
    assert res.exit_code == 0 and "warning:" in res.output and "projected onto the unit sphere" in res.output
    with pytest.raises(ValueError, match="not on the unit sphere"):
        from_file(p, normalise=False)


@pytest.mark.integration
@pytest.mark.parametrize(
    "args,needles",
    [
        (["--preset", "nope", "--out", "OUT"], ["unknown preset 'nope'"]),
        (["--preset", "ou", "--out", "OUT", "--set", "integration.dt=abc"], ["integration.dt", "'abc'"]),
        (["--preset", "ou", "--out", "OUT", "--set", "tokens.n.x=1"], ["'n' is not a section"]),
        (["--preset", "ou", "--out", "OUT", "--set", "novalue"], ["key.subkey=value"]),
        (["--preset", "ou"], ["--out DIR"]),
        (["--resume", "OUT"], ["no such run folder"]),
        (["--resume", "OUT", "--preset", "ou"], ["drop CONFIG"]),
    ],
)
def test_bad_command_line(tmp_path, args, needles):
    out = tmp_path / "out"
    res = runner.invoke(app, ["run", *[str(out) if a == "OUT" else a for a in args]])
    assert_clean_error(res, out, *needles)


@pytest.mark.integration
def test_debug_flag_shows_the_traceback(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("tokens: {n: six}\n")
    res = runner.invoke(app, ["--debug", "run", str(cfg), "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and isinstance(res.exception, ConfigError)


# ----------------------------------------------------------------------------------------------
# Fuzzing: malformed input must give the documented error type, never anything else.
# ----------------------------------------------------------------------------------------------

FIELDS = {
    "name": None,
    "model": None,
    "seed": None,
    "dtype": None,
    "tokens": ["n", "d", "init", "angle", "components", "kappa", "inner_product", "path", "masses"],
    "heads": ["count", "preset", "beta", "value", "masses", "path"],
    "weights": ["process", "rate", "sigma", "init_spread", "symmetric", "amplitude", "omega", "phase", "layers"],
    "integration": ["t_end", "dt", "method", "save_every"],
    "diagnostics": ["cluster_eps"],
}
junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(string.printable, max_size=12),
    st.lists(st.floats(-2, 2), max_size=4),
    st.sampled_from(
        [
            "gf",
            "mha",
            "usa",
            "ou",
            "constant",
            "layers",
            "oscillating",
            "rk4",
            "euler",
            "file",
            "goe",
            "identity",
            "gaussian",
            "float32",
            "random",
            "A",
            "-A",
        ]
    ),
)


@st.composite
def mutated_configs(draw):
    data = preset_config(draw(st.sampled_from(["ou", "oscillating", "autonomous"]))).model_dump(mode="json")
    for _ in range(draw(st.integers(1, 4))):
        section = draw(st.sampled_from(sorted(FIELDS)))
        keys = FIELDS[section]
        if keys is None:
            data[section] = draw(junk)
        elif draw(st.booleans()) and isinstance(data.get(section), dict):
            data[section][draw(st.sampled_from(keys + ["unknown_key"]))] = draw(junk)
        else:
            data[section] = draw(st.one_of(junk, st.dictionaries(st.text(max_size=5), junk, max_size=3)))
    return data


@settings(max_examples=150, deadline=None)
@given(mutated_configs())
def test_fuzz_parse_config(data):
    try:
        cfg = parse_config(data, "fuzz")
    except ConfigError as e:
        msg = str(e)
        assert msg.startswith("invalid config fuzz") and "\n" not in msg
    else:
        assert isinstance(cfg, RunConfig)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.binary(max_size=300)
    | st.text(max_size=300).map(str.encode)
    | mutated_configs().map(lambda d: yaml.safe_dump(d).encode())
)
def test_fuzz_load_config_file(tmp_path, raw):
    p = tmp_path / "fuzz.yaml"
    p.write_bytes(raw)
    try:
        load_config(p)
    except ConfigError as e:
        assert str(e)


@settings(max_examples=40, deadline=None)
@given(mutated_configs(), st.lists(st.text(string.printable, max_size=20), max_size=3))
def test_fuzz_overrides(data, overrides):
    cfg = preset_config("ou")
    try:
        apply_overrides(cfg, overrides)
    except ConfigError as e:
        assert str(e)


arrays = st.one_of(
    st.integers(0, 3)
    .flatmap(lambda nd: st.lists(st.integers(0, 5), min_size=nd, max_size=nd))
    .flatmap(
        lambda shape: st.builds(
            lambda vals: np.resize(np.array(vals, dtype=np.float64), shape),
            st.lists(st.sampled_from([0.0, 1.0, -1.0, 2.5, np.nan, np.inf, 1e-300, 1e300]), min_size=1, max_size=8),
        )
    ),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arrays, st.sampled_from([".npy", ".csv", ".npz", ""]), st.booleans())
def test_fuzz_token_and_weight_files(tmp_path, arr, suffix, corrupt):
    p = tmp_path / f"f{suffix}"
    if corrupt:
        p.write_bytes(arr.tobytes()[:17] + b"\x93NUMPY garbage")
    elif suffix == ".csv":
        flat = arr.reshape(-1)
        cols = arr.shape[-1] if arr.ndim >= 1 and arr.shape[-1] > 0 else 1
        p.write_text("\n".join(",".join(repr(float(v)) for v in flat[i : i + cols]) for i in range(0, flat.size, cols)))
    elif suffix == ".npz":
        np.savez(p, A=arr)
    else:
        with open(p, "wb") as fh:
            np.save(fh, arr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            x = from_file(p)
        except ValueError as e:
            assert str(e)
        else:
            assert x.ndim == 2 and np.allclose(np.linalg.norm(x, axis=1), 1.0)
    try:
        A, V = load_weight_file(p, d=None, count=None, model="gf")
    except ConfigError as e:
        assert str(e).startswith("heads.path:")
    else:
        assert (
            A.ndim == 3
            and np.isfinite(A).all()
            and np.allclose(A, A.transpose(0, 2, 1), atol=1e-9 * max(1, np.abs(A).max()))
        )


@pytest.mark.integration
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutated_configs())
def test_fuzz_cli_never_shows_a_traceback(tmp_path, data):
    """Whatever the config, `attnflow run` either runs (kept tiny here) or exits 2 in one paragraph."""
    if isinstance(data.get("integration"), dict):
        data["integration"].update({"t_end": 0.04, "dt": 0.02})
    if isinstance(data.get("tokens"), dict) and isinstance(data["tokens"].get("n"), int) and data["tokens"]["n"] > 8:
        data["tokens"]["n"] = 8
    if isinstance(data.get("tokens"), dict) and isinstance(data["tokens"].get("d"), int) and data["tokens"]["d"] > 6:
        data["tokens"]["d"] = 6
    if (
        isinstance(data.get("heads"), dict)
        and isinstance(data["heads"].get("count"), int)
        and data["heads"]["count"] > 4
    ):
        data["heads"]["count"] = 4
    if isinstance(data.get("weights"), dict) and isinstance(data["weights"].get("layers"), int):
        data["weights"]["layers"] = min(data["weights"]["layers"], 3)
    out = tmp_path / "fuzzrun"
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    cfg = tmp_path / "fuzz.yaml"
    cfg.write_text(yaml.safe_dump(data))
    res = runner.invoke(app, ["run", str(cfg), "--out", str(out), "--no-figures"])
    assert res.exit_code in (0, 2), res.output + repr(res.exception)
    if res.exit_code == 2:
        assert "Traceback" not in res.output
        text = " ".join(res.output.split())
        if "last good state is saved" in text:
            # A run that started and then blew up (beta 712, say) keeps its last good state on purpose,
            # in a folder marked incomplete; every other refusal writes nothing.
            assert out.is_dir() and not is_complete(out) and (out / "checkpoint.npz").is_file()
        else:
            assert not out.exists()


# --- sweep files (attnflow sweep): the same contract as configs -------------------------------------

QUICK_SWEEP = {
    "name": "fz",
    "base": "ou",
    "set": {"tokens.n": 8, "integration.t_end": 0.1, "integration.dt": 0.05},
    "grid": {"product": {"heads.beta": [1.0, 2.0], "heads.count": [1, 2]}},
    "seeds": 2,
}


@st.composite
def mutated_sweeps(draw):
    import copy

    data = copy.deepcopy(QUICK_SWEEP)
    junk = st.one_of(
        st.none(),
        st.integers(-5, 5),
        st.floats(allow_nan=True),
        st.text(max_size=8),
        st.lists(st.integers(-3, 3), max_size=3),
        st.dictionaries(st.text(max_size=6), st.integers(), max_size=2),
    )
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(["top", "set", "grid", "product", "drop"]))
        key = draw(
            st.sampled_from(
                [
                    "name",
                    "base",
                    "set",
                    "grid",
                    "seeds",
                    "zip",
                    "tokens.n",
                    "heads.beta",
                    "heads.count",
                    "weights.rate",
                    "nope",
                    "integration.dt",
                ]
            )
        )
        if where == "drop":
            data.pop(draw(st.sampled_from(sorted(data))), None)
        elif where == "top":
            data[key] = draw(junk)
        elif where == "set" and isinstance(data.get("set"), dict):
            data["set"][key] = draw(junk)
        elif where == "grid" and isinstance(data.get("grid"), dict):
            data["grid"][draw(st.sampled_from(["product", "zip", "other"]))] = draw(junk)
        elif isinstance(data.get("grid"), dict) and isinstance(data["grid"].get("product"), dict):
            data["grid"]["product"][key] = draw(st.lists(junk, max_size=3))
    return data


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutated_sweeps().map(lambda d: yaml.safe_dump(d).encode()) | st.binary(max_size=200))
def test_fuzz_sweep_files(tmp_path, raw):
    """Loading and expanding a malformed sweep file either works or raises one ConfigError."""
    from attnflow.sweep.spec import load_sweep, sweep_points

    f = tmp_path / "sweep.yaml"
    f.write_bytes(raw)
    try:
        spec, root = load_sweep(f)
        points = sweep_points(spec, root)
    except ConfigError as e:
        msg = str(e)
        assert msg and "\n" not in msg.strip() and "Traceback" not in msg
        return
    assert len(points) >= 1


@pytest.mark.integration
@pytest.mark.parametrize(
    "text,needles",
    [
        (b"\xff\xfe\x00 not text", ["UTF-8"]),
        (b"base: ou\ngrid: {product: {heads.beta: [1.0, x]}}\n", ["heads.beta"]),
        (b"base: ou\ngrid: {product: {heads.nope: [1, 2]}}\n", ["heads.nope"]),
        (b"base: nowhere\n", ["nowhere"]),
        (b"base: ou\nseeds: -1\n", ["seeds"]),
        (b"grid: [1, 2\n", ["YAML"]),
    ],
)
def test_bad_sweep_file_is_one_clean_paragraph(tmp_path, text, needles):
    skip_without_sweep_extra()
    f = tmp_path / "bad.yaml"
    f.write_bytes(text)
    out = tmp_path / "out"
    res = runner.invoke(app, ["sweep", str(f), "--out", str(out)])
    assert_clean_error(res, out, *needles)

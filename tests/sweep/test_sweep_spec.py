"""The sweep file: grid expansion, validation errors, point identity (no Dask needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from attnflow.cli.main import app
from attnflow.config import ConfigError
from attnflow.sweep.spec import load_sweep, parse_sweep, point_id, sweep_points
from helpers import skip_without_sweep_extra

ROOT = Path(__file__).resolve().parents[2]


def test_product_zip_and_seeds_expand_to_every_combination():
    spec = parse_sweep(
        {
            "base": "ou",
            "set": {"tokens.n": 8},
            "grid": {
                "product": {"heads.beta": [1.0, 2.0, 3.0], "heads.count": [1, 4]},
                "zip": {"weights.rate": [0.5, 2.0], "weights.sigma": [0.1, 0.3]},
            },
            "seeds": [5, 9],
        }
    )
    points = sweep_points(spec)
    assert len(points) == 3 * 2 * 2 * 2
    seen = {(p.params["heads.beta"], p.params["heads.count"], p.params["weights.rate"], p.seed) for p in points}
    assert len(seen) == 24
    for p in points:
        c = p.config
        assert c["tokens"]["n"] == 8
        assert c["heads"]["beta"] == p.params["heads.beta"]
        assert c["heads"]["count"] == p.params["heads.count"]
        # zip keys advance together: rate 0.5 always with sigma 0.1
        assert c["weights"]["sigma"] == {0.5: 0.1, 2.0: 0.3}[c["weights"]["rate"]]
        assert c["seed"] == p.seed
    assert [p.index for p in points] == list(range(24))
    assert len({p.id for p in points}) == 24


def test_point_id_is_a_content_hash_of_the_config():
    spec = parse_sweep({"grid": {"product": {"heads.beta": [1.0, 2.0]}}, "seeds": 2})
    a, b = sweep_points(spec), sweep_points(spec)
    assert [p.id for p in a] == [p.id for p in b]
    assert a[0].id == point_id(dict(a[0].config))
    # Same config reached through a different sweep file (a longer grid) keeps its id: resumable after edits.
    wider = sweep_points(parse_sweep({"grid": {"product": {"heads.beta": [1.0, 2.0, 4.0]}}, "seeds": 3}))
    assert {p.id for p in a} <= {p.id for p in wider}


def test_seed_count_means_range():
    assert parse_sweep({"seeds": 3}).seed_list == [0, 1, 2]
    assert parse_sweep({"seeds": [4, 2]}).seed_list == [4, 2]


@pytest.mark.parametrize(
    "data, words",
    [
        ({"grid": {"zip": {"heads.beta": [1, 2], "heads.count": [1]}}}, ["grid.zip", "equal lengths"]),
        ({"grid": {"product": {"heads.beta": []}}}, ["heads.beta", "empty"]),
        ({"grid": {"product": {"seed": [1, 2]}}}, ["seeds"]),
        ({"grid": {"cartesian": {"heads.beta": [1]}}}, ["grid.cartesian"]),
        ({"seeds": []}, ["seeds", "empty"]),
        ({"seeds": -1}, ["seeds"]),
        ({"batch": 0}, ["batch"]),
        ({"summary": {"window": 2}}, ["summary.window"]),
        ({"bsae": "ou"}, ["bsae"]),
    ],
)
def test_schema_errors_name_the_field(data, words):
    with pytest.raises(ConfigError) as e:
        parse_sweep(data, "test")
    for w in words:
        assert w in str(e.value)


def test_bad_grid_values_name_the_point():
    spec = parse_sweep({"grid": {"product": {"heads.beta": [1.0], "heads.count": [2, -1]}}})
    with pytest.raises(ConfigError) as e:
        sweep_points(spec)
    assert "heads.count" in str(e.value) and "-1" in str(e.value)
    spec = parse_sweep({"base": "ou", "grid": {"product": {"weights.omega": [1.0]}}})
    with pytest.raises(ConfigError, match="weights.omega"):
        sweep_points(spec)


def test_duplicate_points_are_rejected():
    with pytest.raises(ConfigError, match="same config"):
        sweep_points(parse_sweep({"grid": {"product": {"heads.beta": [1.0, 1.0]}}}))


def test_base_from_file_relative_to_the_sweep_file_and_inline(tmp_path):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "base.yaml").write_text(yaml.safe_dump({"model": "gf", "tokens": {"n": 5, "d": 4}}))
    (tmp_path / "s.yaml").write_text(
        yaml.safe_dump({"base": "cfg/base.yaml", "grid": {"product": {"heads.beta": [2.0]}}})
    )
    spec, root = load_sweep(tmp_path / "s.yaml")
    (p,) = sweep_points(spec, root)
    assert (p.config["tokens"]["n"], p.config["tokens"]["d"], p.config["heads"]["beta"]) == (5, 4, 2.0)
    inline = parse_sweep({"base": {"tokens": {"n": 7}, "weights": {"process": "constant"}}})
    (q,) = sweep_points(inline)
    assert q.config["tokens"]["n"] == 7 and q.config["weights"]["process"] == "constant"
    with pytest.raises(ConfigError, match="neither a preset"):
        sweep_points(parse_sweep({"base": "nope.yaml"}), tmp_path)


def test_quick_example_is_two_parameters_times_seeds_with_at_least_12_points():
    spec, root = load_sweep(ROOT / "examples" / "sweep_quick.yaml")
    points = sweep_points(spec, root)
    assert len(points) >= 12
    assert len(spec.grid.product) + len(spec.grid.zip) == 2 and len(spec.seed_list) >= 2


@pytest.mark.integration
def test_cli_rejects_a_bad_sweep_file_with_exit_2(tmp_path):
    skip_without_sweep_extra()
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"grid": {"zip": {"heads.beta": [1, 2], "heads.count": [1]}}}))
    r = CliRunner().invoke(app, ["sweep", str(bad), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2
    assert "equal lengths" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["sweep", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2 and "does not exist" in r.output
    ok = tmp_path / "ok.yaml"
    ok.write_text(yaml.safe_dump({"grid": {"product": {"heads.beta": [1.0]}}}))
    r = CliRunner().invoke(
        app, ["sweep", str(ok), "--out", str(tmp_path / "o"), "--scheduler", "tcp://x:1", "--workers", "2"]
    )
    assert r.exit_code == 2 and "--workers" in r.output

"""Zarr as data (issue 41, item 3): what zarr will actually read is checked before it reads it.

Each hostile store goes through the real CLI in a forked child limited to 10 s of CPU and 1 GiB more
address space than it started with (the harness of ``test_hostile_folders``), and ends in one
``error:`` sentence, exit 2. Each case has its negative control: zarr (or numcodecs) alone really
reads the planted metadata or really inflates the planted chunk.
"""

from __future__ import annotations

import json
import shutil
import struct
import warnings
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import test_hostile_folders as _harness
import xarray as xr

from attnflow.core.errors import UnsafeInputError
from attnflow.io.store import MANIFEST, write_manifest
from attnflow.io.zarr_guard import check_store, open_store

# The limited-child harness and the finished run folder of the hostile-folder tests.
zygote, _use_zygote, finished, run = _harness.zygote, _harness._use_zygote, _harness.finished, _harness.run
cli_limited, refused = _harness.cli_limited, _harness.refused


def plant_v3(store: Path, n_time: int) -> None:
    """Write the store's data again as Zarr format 3 (``zarr.json`` files) into the same folder, with
    ``n_time`` declared time steps (one missing chunk per array: zarr fills it), as an attacker can."""
    ds = xr.open_zarr(store).load()
    for v in ds.variables:
        ds[v].encoding = {}
    tmp = store.parent / "v3-staging"
    ds.to_zarr(tmp, zarr_format=3, consolidated=False, mode="w")
    for zj in tmp.rglob("zarr.json"):
        meta = json.loads(zj.read_text())
        if meta.get("node_type") == "array" and "time" in (meta.get("dimension_names") or []):
            i = meta["dimension_names"].index("time")
            meta["shape"][i] = n_time
            meta["chunk_grid"]["configuration"]["chunk_shape"][i] = n_time
        target = store / zj.relative_to(tmp)
        target.parent.mkdir(exist_ok=True)
        target.write_text(json.dumps(meta))
    shutil.rmtree(tmp)


def reseal(folder: Path) -> None:
    """Rewrite the manifest, as the author of a hostile folder can."""
    (folder / MANIFEST).unlink()
    write_manifest(folder)


@pytest.mark.integration
def test_planted_v3_metadata_beside_v2_is_refused(run, tmp_path):
    store = run / "dataset.zarr"
    code, _, _, base_mib = cli_limited("show", run, tmp=tmp_path)
    assert code == 0
    plant_v3(store, 3_000_000)
    # Negative control: zarr alone reads the planted format-3 metadata (3 million time steps).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert xr.open_zarr(store).sizes["time"] == 3_000_000
    assert xr.open_zarr(store, zarr_format=2, consolidated=True).sizes["time"] == 3  # what attnflow checks
    text = refused("show", run, tmp=tmp_path, needle="format-3 metadata")
    _, _, cpu, peak_mib = cli_limited("show", run, tmp=tmp_path)
    print(f"PASS v3 planted: refused, peak {peak_mib:.0f} MiB vs {base_mib:.0f} MiB clean, {cpu:.1f} s: {text[:80]}")
    assert peak_mib < base_mib + 100  # 3e6 x 16 x 3 doubles would be 1.15 GB for x alone
    for command in ("report", "plot"):
        refused(command, run, tmp=tmp_path, needle="format-3 metadata")


def _bomb(chunk: Path, inflated: int) -> int:
    """Replace ``chunk`` by a Blosc chunk of ``inflated`` zero bytes (valid, as zarr writes them)."""
    data = numcodecs.Blosc(cname="zstd", clevel=9, shuffle=numcodecs.Blosc.NOSHUFFLE).encode(
        np.zeros(inflated, np.uint8)
    )
    chunk.write_bytes(data)
    return len(data)


@pytest.mark.integration
def test_a_chunk_inflating_beyond_its_shape_is_refused_undecoded(run, tmp_path):
    chunk = run / "dataset.zarr" / "x" / "0.0.0"
    declared = struct.unpack("<I", chunk.read_bytes()[4:8])[0]
    assert declared == 3 * 16 * 3 * 8  # time x token x dim doubles: the header states the chunk's size
    _, _, _, base_mib = cli_limited("show", run, tmp=tmp_path)
    inflated = 150 * 2**20  # the 1.5 GB bomb scaled down 10x (same kind: a valid Blosc frame)
    size = _bomb(chunk, inflated)
    reseal(run)
    # Negative control: the planted chunk really inflates (1000x and more), as zarr would decode it.
    assert len(numcodecs.Blosc().decode(chunk.read_bytes())) == inflated and inflated > 1000 * size
    text = refused("show", run, tmp=tmp_path, needle=f"inflates to {inflated:,} bytes")
    _, _, cpu, peak_mib = cli_limited("show", run, tmp=tmp_path)
    print(f"PASS chunk bomb {size:,} -> {inflated:,} B: refused, peak {peak_mib:.0f} MiB (clean {base_mib:.0f})")
    assert peak_mib < base_mib + 50 < base_mib + inflated / 2**20
    assert "x/0.0.0" in text


@pytest.mark.integration
def test_a_codec_outside_the_allow_list_is_refused(run, tmp_path):
    store = run / "dataset.zarr"
    ds = xr.open_zarr(store).load()
    shutil.rmtree(store)
    for v in ds.variables:
        ds[v].encoding = {"compressors": (numcodecs.Zlib(level=1),)} if v == "x" else {}
    ds.to_zarr(store, zarr_format=2, consolidated=True, write_empty_chunks=True)
    reseal(run)
    # Negative control: the store is valid and reads in plain xarray (zarr decodes zlib).
    assert float(xr.open_zarr(store)["x"].sum()) == pytest.approx(float(ds["x"].sum()))
    refused("show", run, tmp=tmp_path, needle="compressed with 'zlib'")


def _meta(store: Path) -> dict:
    return json.loads((store / ".zmetadata").read_text())


def _set_meta(store: Path, name: str, **fields: object) -> None:
    meta = _meta(store)
    meta["metadata"][f"{name}/.zarray"].update(fields)
    (store / ".zmetadata").write_text(json.dumps(meta))


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"filters": [{"id": "delta", "dtype": "<f8"}]}, "declares filters"),
        ({"dtype": "|O"}, "declares the dtype"),
        ({"compressor": {"id": "blosc", "cname": "snappy"}}, "outside the codecs"),
        ({"compressor": None}, "not the 1,152 its uncompressed chunk declares"),
        ({"chunks": [2**40, 16, 3]}, "more than the"),
        ({"shape": [3, 16, -1]}, "impossible shape"),
    ],
)
def test_metadata_outside_the_allow_lists(finished, tmp_path, fields, needle):
    store = tmp_path / "dataset.zarr"
    shutil.copytree(finished / "dataset.zarr", store)
    check_store(store)  # the clean store passes (the negative control of each refusal)
    assert float(open_store(store)["x"].sum()) == pytest.approx(float(xr.open_zarr(store)["x"].sum()))
    _set_meta(store, "x", **fields)
    with pytest.raises(UnsafeInputError) as err:
        check_store(store)
    assert needle in str(err.value), str(err.value)


def test_a_zarr_json_anywhere_and_a_lying_compressed_size(finished, tmp_path):
    store = tmp_path / "dataset.zarr"
    shutil.copytree(finished / "dataset.zarr", store)
    (store / "time" / "zarr.json").write_text("{}")
    with pytest.raises(UnsafeInputError, match="format-3"):
        check_store(store)
    (store / "time" / "zarr.json").unlink()
    chunk = store / "time" / "0"
    chunk.write_bytes(chunk.read_bytes() + b"\0" * 10)  # cbytes no longer the file's size
    with pytest.raises(UnsafeInputError, match="from a file of"):
        check_store(store)

"""``study.zarr`` is written with consolidated metadata (issue 43): one ``.zmetadata`` read opens it."""

import numpy as np
import xarray as xr
import zarr

from attnflow.hf.study import STUDY_STORE, load_study, save_study


def test_study_store_is_consolidated(tmp_path):
    ds = xr.Dataset({"cos": (("prompt",), np.array([0.5, 0.25]))})
    save_study(ds, [], tmp_path / "study", figures=False)
    store = tmp_path / "study" / STUDY_STORE
    assert (store / ".zmetadata").is_file()
    zarr.open_consolidated(str(store), mode="r")  # opens from the consolidated record alone
    assert np.array_equal(load_study(tmp_path / "study")["cos"].values, [0.5, 0.25])
    # control: the same dataset written the old way has no consolidated record
    ds.to_zarr(tmp_path / "plain.zarr", mode="w-", zarr_format=2, consolidated=False)
    assert not (tmp_path / "plain.zarr" / ".zmetadata").exists()

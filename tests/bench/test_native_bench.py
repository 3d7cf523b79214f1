"""The native-speed rows' verdicts can fail (issue 43): a ratio above its bound FAILs, a control the
bound does not reject is called out, and the bottom line counts both."""

from __future__ import annotations

from attnflow.bench.small import native_bottom_line, native_markdown, native_rows


def _native(ratio: float, control_ratio: float) -> dict:
    rows = []
    for r, control in ((ratio, False), (control_ratio, True)):
        rows.append(
            {"case": "c", "attnflow_s": r, "reference": "numpy", "reference_s": 1.0, "ratio": r, "bound": 3.0,
             "control": control, "pass": r < 3.0, "margin": 3.0 / r}
        )  # fmt: skip
    return {"rows": rows, "load_average": 0.5, "diffrax": "diffrax not timed", "repeats": 3}


def test_verdicts() -> None:
    good = native_rows(_native(0.5, 30.0))
    assert good[0][-1] == "PASS (margin 6.00x)" and good[1][-1] == "rejected (as it must)"
    assert native_bottom_line(_native(0.5, 30.0)).startswith("native speed: 1/1 PASS, 1/1 controls rejected")
    # negative controls: a slow run fails, and a control inside the bound is reported, not hidden
    bad = native_rows(_native(3.5, 2.0))
    assert bad[0][-1].startswith("FAIL (3.50 >= 3)") and bad[1][-1].startswith("NOT REJECTED")
    assert "0/1 PASS, 0/1 controls rejected" in native_bottom_line(_native(3.5, 2.0))
    assert "load average 0.50" in native_markdown(_native(0.5, 30.0))


def test_a_row_for_information_is_shown_not_counted() -> None:
    """SciPy at its own default atol (a looser tolerance) is timed for information: its verdict says so,
    the bottom line gives its ratio and does not count it; the same row as a criterion would FAIL
    (the control: the information row is not a hidden failure)."""
    nat = _native(0.5, 30.0)
    slow = {**nat["rows"][0], "ratio": 1.6, "bound": 1.5, "pass": False, "margin": 1.5 / 1.6,
            "reference": "scipy DOP853 rtol 1e-8, its default atol 1e-6, default output"}  # fmt: skip
    nat["rows"].append({**slow, "info": True})
    rows = native_rows(nat)
    assert rows[-1][-1].startswith("for information (1.60x")
    line = native_bottom_line(nat)
    assert line.startswith("native speed: 1/1 PASS, 1/1 controls rejected")
    assert "for information: 1.60x against scipy DOP853 rtol 1e-8, its default atol 1e-6" in line
    nat["rows"][-1] = slow
    assert native_rows(nat)[-1][-1].startswith("FAIL (1.60 >= 1.5)")
    assert native_bottom_line(nat).startswith("native speed: 1/2 PASS")


def test_the_diagnostics_read_row_says_what_it_times() -> None:
    """The row that also reads every saved state's diagnostics (made on first read) is for information and says so."""
    nat = _native(0.5, 30.0)
    nat["rows"].append({**nat["rows"][0], "case": "N = 32, ..., diagnostics of every state read", "ratio": 0.9,
                        "info": True, "reference": "scipy DOP853 rtol 1e-8, atol 1e-9 (the same), default output"})  # fmt: skip
    assert native_rows(nat)[-1][-1] == "for information (0.90x: the diagnostics' bulk pass)"
    assert "for information: with every diagnostic read 0.90x against scipy DOP853" in native_bottom_line(nat)

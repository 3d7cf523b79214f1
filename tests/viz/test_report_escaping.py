"""Every string of a run reaches ``report.html`` escaped (issue 27): a ``<script>`` and an
``onerror`` planted in each string field are found escaped, never raw; a tampered folder cannot even
carry markup in its names (they are validated on load)."""

from __future__ import annotations

import dataclasses

import pytest

from attnflow.core.errors import UnsafeInputError
from attnflow.core.text import html_text, plain_label, terminal_text
from attnflow.io.trajectory import load
from attnflow.viz.report import report_html

SCRIPT = "<script>window.__attnflow_pwned = 1</script>"
IMG = '<img src=x onerror="window.__attnflow_pwned = 2">'


def poisoned(traj, payload: str):
    """``traj`` with ``payload`` in every string field: method, config (name, values, keys), provenance
    (values, keys) and the per-step series' notes (the model stays ``gf`` so that the EDI paragraph,
    which printed the method raw, is written; :func:`test_the_model_is_escaped_too` covers the model)."""
    return dataclasses.replace(
        traj,
        method=f"euler{payload}",
        config={**traj.config, "name": payload, "notes": {payload: [payload]}},
        provenance={**traj.provenance, "git_commit": payload, payload: "key"},
        steps_info={**traj.steps_info, "method": payload},
    )


@pytest.mark.parametrize("payload", [SCRIPT, IMG])
def test_every_string_field_is_escaped_in_the_report(traj3, payload):
    bad = poisoned(traj3, payload)
    assert bad.method.endswith(payload) and bad.steps  # negative control: the payload is in the input, EDI is on
    page = report_html(bad, max_frames=4)
    assert payload not in page
    assert "window.__attnflow_pwned" in page  # the text is there, escaped (&lt;script&gt; / &quot;)
    assert html_text(payload) in page
    assert f"Energy-dissipation budget ({html_text(bad.method)}" in page  # the paragraph that was raw
    # the same page without escaping would carry the payload: the check can fail
    assert payload in page.replace(html_text(payload), payload)


def test_the_model_is_escaped_too(traj3):
    page = report_html(dataclasses.replace(traj3, model=f"gf{SCRIPT}"), max_frames=4)
    i = page.find(SCRIPT)
    assert i < 0, page[i - 300 : i + 50]
    assert "window.__attnflow_pwned" in page  # negative control: the model is on the page (in the plotly title)


def test_a_folder_cannot_carry_markup_in_its_names(traj3, tmp_path):
    bad = dataclasses.replace(traj3, method=f"euler{IMG}")
    bad.save(tmp_path / "r", figures=False)
    with pytest.raises(UnsafeInputError, match="not a name"):
        load(tmp_path / "r")
    traj3.save(tmp_path / "ok", figures=False)
    assert load(tmp_path / "ok").method == "euler"  # negative control: a plain name loads


def test_the_escaping_helpers():
    assert html_text("<a href='x'>&</a>") == "&lt;a href=&#x27;x&#x27;&gt;&amp;&lt;/a&gt;"
    assert terminal_text("ok\x1b[2J\x07\u202eevil\n\tfine") == "ok\\x1b[2J\\x07\\u202eevil\n\tfine"
    assert plain_label("cost $5 and $x$") == r"cost \$5 and \$x\$"


def test_a_dollar_in_a_model_name_draws(traj3, tmp_path):
    from attnflow.viz.plotting import plot_run

    bad = dataclasses.replace(traj3, model="gpt$^$2", method="a$^$b")
    paths = plot_run(bad, tmp_path / "figs")
    assert all(p.stat().st_size > 1000 for p in paths)
    import matplotlib.pyplot as plt

    fig = plt.figure()
    fig.suptitle("model gpt$^$2")  # negative control: the raw label fails in mathtext
    with pytest.raises(ValueError):
        fig.savefig(tmp_path / "raw.png")
    plt.close(fig)

"""A committed notebook rendered as a report on the CPU, as ``make report`` renders it: papermill
runs ``gdn_conv`` (the cheapest) on the quick preset with its grid cut to two points, nbconvert
renders the HTML without input cells. The report must open with the answer (the verdict, then
the headline table as its first table) and hold no traceback, raw dict, warning, machine path
or issue number; a bad preset name stops the first cell that reads it with the valid names.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

import pmll_lab  # noqa: F401  (backend first)
from pmll_lab.report_notebooks import REPO_ROOT, kernel_environment, render_html

NOTEBOOK = REPO_ROOT / "notebooks" / "gdn_conv.ipynb"
TINY = {"quick": [{"K": [2], "B": [1, 2], "shape": ["hk2-hv4-32"], "dtype": ["bfloat16"],
                   "pending": [2]}]}


def _execute(tmp_path: Path, **parameters):
    import papermill

    out = tmp_path / "out.ipynb"
    with kernel_environment("cpu"):
        papermill.execute_notebook(str(NOTEBOOK), str(out), kernel_name="python3",
                                   language="python", cwd=str(NOTEBOOK.parent),
                                   progress_bar=False, log_output=False,
                                   parameters=dict(device="cpu", **parameters))
    return out


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("render")
    results = tmp / "results"
    results.mkdir()
    executed = _execute(tmp, preset="quick", results_dir=str(results), grids=TINY)
    page = tmp / "gdn_conv.html"
    render_html(executed, page)
    return page.read_text(encoding="utf-8"), json.loads(executed.read_text()), results


def _outputs(nb: dict) -> str:
    """The text of every output of the executed notebook."""
    parts = []
    for cell in nb["cells"]:
        for o in cell.get("outputs", []):
            if o["output_type"] == "stream":
                parts.append("".join(o["text"]))
            elif o["output_type"] == "error":
                parts.append("\n".join(o["traceback"]))
            else:
                parts += ["".join(v) if isinstance(v, list) else str(v)
                          for k, v in o.get("data", {}).items() if k.startswith("text/")]
    return "\n".join(parts)


def test_report_opens_with_the_verdict_and_the_headline_table(report):
    page, nb, results = report
    body = page[page.index("<body"):]
    first_table = re.search(r"<table[^>]*>", body).group(0)
    assert "headline" in first_table, f"the first table is not the headline: {first_table}"
    verdict = body.index("no speed verdict on the CPU")
    assert verdict < body.index(first_table), "the verdict line comes before the headline"
    before = re.sub(r"<[^>]+>|\s+", " ", body[body.index("</h1>"):verdict])
    assert len(before.split()) < 40, f"the report opens with an introduction, not the verdict: {before}"
    head = body[body.index(first_table):body.index("</table>", body.index(first_table))]
    columns = re.findall(r"<th>([^<]*)</th>", head)
    assert columns[:2] == ["status", "kernel"]
    assert re.findall(r"<td>(passed|failed)</td>", head), "the headline holds the checks"
    assert (results / "headline.csv").is_file()


def test_report_holds_no_traceback_raw_dict_warning_path_or_issue_number(report):
    page, nb, results = report
    text = _outputs(nb)
    assert text, "the executed notebook has outputs"
    for bad in ("Traceback", "{'device'", "Warning", str(results), str(REPO_ROOT), sys.prefix,
                "sweep gdn_conv:"):
        assert bad not in text, f"report output holds {bad!r}"
        assert bad not in page[page.index("<body"):], f"report HTML holds {bad!r}"
    assert not re.search(r"(?i)\bissues?\s*#?\d+", page), "an issue number in the report"


def test_every_plot_carries_its_cells_alt_text(report):
    """Each plot of the report has the alt text its notebook cell names (``metadata["alt"]``),
    not nbconvert's placeholder."""
    page, nb, results = report
    imgs = re.findall(r"<img[^>]*>", page)
    assert imgs, "the report has no plot"
    alts = [re.search(r'alt="([^"]*)"', i).group(1) for i in imgs]
    wanted = {c["metadata"]["alt"] for c in nb["cells"] if "alt" in c["metadata"]}
    assert set(alts) <= wanted, set(alts) - wanted


def test_alt_text_goes_to_its_own_image_only():
    """``image_alts`` keys alt text by the image's data (output metadata before cell metadata);
    ``with_alts`` sets it on that image and leaves an image without one as nbconvert left it."""
    import nbformat
    from pmll_lab.report_notebooks import with_alts, image_alts

    nb = nbformat.v4.new_notebook()
    png = lambda d, md=None: nbformat.v4.new_output(  # noqa: E731
        "display_data", data={"image/png": d}, metadata=md or {})
    nb.cells = [nbformat.v4.new_code_cell("a", metadata={"alt": "cell a"},
                                          outputs=[png("QUFB\n"), png("QkJC", {"image/png": {"alt": "own"}})]),
                nbformat.v4.new_code_cell("b", outputs=[png("Q0ND")])]
    alts = image_alts(nb)
    assert alts == {"QUFB": "cell a", "QkJC": "own"}
    body = ('<p><img src="data:image/png;base64,QUFB" alt="x"><img src="data:image/png;base64,QkJC">'
            '<img src="data:image/png;base64,Q0ND" alt="placeholder"></p>')
    out = with_alts(body, alts)
    assert re.findall(r'alt="([^"]*)"', out) == ["cell a", "own", "placeholder"]


def test_bad_preset_names_the_valid_ones(tmp_path):
    import papermill

    with pytest.raises(papermill.PapermillExecutionError) as info:
        _execute(tmp_path, preset="Quick", results_dir=str(tmp_path))
    err = info.value
    assert err.ename == "ValueError"
    assert "preset: 'Quick' is not one of ['full', 'quick']" in err.evalue

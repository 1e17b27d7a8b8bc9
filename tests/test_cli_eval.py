"""`cdsjax eval`: config loading, overrides, and a tiny end-to-end run."""

import csv

import pytest

from cdsjax import cli
from tests.conftest import ROOT

CONFIG = str(ROOT / "configs" / "hotpotqa.py")


def test_eval_cli_tiny_run(data_root, tmp_path, capsys):
    out_dir = tmp_path / "ev"
    code = cli.main(["eval", "--config", CONFIG, "--max-queries", "3", "--output-dir", str(out_dir),
                     "--set", "selectors=cosine,cds", "--set", "budgets=(2,)", "--set", f"data_root={data_root}",
                     "--set", f"cache_dir={tmp_path / 'cache'}", "--no-progress"])
    assert code == 0, capsys.readouterr().err
    rows = list(csv.DictReader(open(out_dir / "summary.csv")))
    assert {r["selector"] for r in rows} == {"cosine", "cds"}
    assert all(r["n"] == "3" for r in rows if r["metric"].startswith("paragraph_recall"))
    assert (out_dir / "records.jsonl").read_text().count("\n") == 6


@pytest.mark.parametrize("argv, word", [
    (["eval", "--config", "configs/nope.py"], "no such config"),
    (["eval", "--config", CONFIG, "--set", "nonsense"], "KEY=VALUE"),
    (["eval", "--config", CONFIG, "--set", "no_such_field=1"], "no such config field"),
])
def test_eval_cli_bad_input(capsys, argv, word):
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2 and word in err and len(err.strip().splitlines()) == 1

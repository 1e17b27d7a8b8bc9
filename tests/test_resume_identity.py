"""Resuming by identity: a record on disk is reused only when everything that decided it matches, and
``run.json`` records where the numbers came from (commit, library versions, device, resolved config)."""

import json

import pytest

from cdsjax.eval import evaluate
from cdsjax.eval.records import RECORDS_FILE, read_records
from cdsjax.eval.settings import identity_changes, record_identity


def _config(out_dir, cache_dir, data_root, **fields):
    from configs import hotpotqa

    config = hotpotqa.get_config()
    config.output_dir = str(out_dir)
    config.cache_dir = str(cache_dir)
    config.data_root = str(data_root)
    config.num_resamples = 200
    config.max_queries = 3
    config.budgets = (2,)
    config.selectors = "cosine,cds"
    for k, v in fields.items():
        config[k] = v
    return config


def test_record_identity_names_what_decides_a_record():
    from configs import hotpotqa

    config = hotpotqa.get_config()
    base = record_identity(config, "cds", {"beta": 0.7})
    assert record_identity(config, "cds", {"beta": 0.7}) == base
    assert identity_changes(base, record_identity(config, "cds", {"beta": 5.0})) == ["selector_options"]
    config.output_dir, config.max_queries, config.num_resamples = "elsewhere", 7, 11  # decide no record
    assert record_identity(config, "cds", {"beta": 0.7}) == base
    config.reader.evidence_tokens = 900  # a field of any section decides
    assert identity_changes(base, record_identity(config, "cds", {"beta": 0.7})) == ["reader.evidence_tokens"]
    config.link_window = 3
    assert "link_window" in identity_changes(base, record_identity(config, "cds", {"beta": 0.7}))


def test_beta_then_other_beta_into_one_folder_gives_the_second_records(data_root, tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    lines = []
    first = _config(out, cache, data_root, selector_options={"cds": {"beta": 0.7}})
    records, _ = evaluate(first, progress=False, log=lines.append)
    assert {round(r["diagnostics"]["beta"], 5) for r in records if r["selector"] == "cds"} == {0.7}

    lines.clear()
    second = _config(out, cache, data_root, selector_options={"cds": {"beta": 5.0}})
    records, _ = evaluate(second, progress=False, log=lines.append)
    cds = [r for r in records if r["selector"] == "cds"]
    assert len(cds) == 3 and {round(r["diagnostics"]["beta"], 5) for r in cds} == {5.0}
    assert any(line.startswith("cds: 3 records") and "selector_options" in line for line in lines), lines
    on_disk = read_records(out / RECORDS_FILE)
    assert {round(r["diagnostics"]["beta"], 5) for r in on_disk if r["selector"] == "cds"} == {5.0}
    # cosine's records were decided by nothing that changed: resumed, not recomputed
    assert sum(r["selector"] == "cosine" for r in on_disk) == 3
    assert any("resuming: 3 of 6" in line for line in lines), lines

    run = json.loads((out / "run.json").read_text())
    assert run["code"] and run["versions"]["jax"] and run["versions"]["numpy"] and run["device"]
    assert run["config"]["selectors"] == "cosine,cds"
    assert run["config"]["selector_options"]["cds"] == {"beta": 5.0}
    assert run["records"]["cds"]["options"]["beta"] == 5.0
    summary = (out / "summary.md").read_text()  # each selector's paired difference to cosine, with W/T/L
    assert "Paired difference to cosine" in summary and "| cds | " in summary and "W/T/L" in summary
    assert run["versions"]["jax"] in summary

    # --fresh starts over; a changed data-level setting is refused in one line naming it
    evaluate(second, progress=False, log=lines.append, fresh=True)
    assert len(read_records(out / RECORDS_FILE)) == 6
    with pytest.raises(ValueError, match="link_window"):
        evaluate(_config(out, cache, data_root, link_window=2), progress=False, log=lines.append)

"""Jobs files (JSONL and CSV) are read and checked whole: every bad line is named, with its field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.batch.jobs_file import prepare_jobs, read_jobs_file
from runner.errors import WorkflowError

WORKFLOW = {
    "1": {"class_type": "KSampler", "inputs": {"seed": 1, "steps": 5}, "_meta": {"title": "Sample"}},
}
OBJECT_INFO = {
    "KSampler": {
        "input": {
            "required": {"seed": ["INT", {"min": 0, "max": 100}], "steps": ["INT", {"min": 1, "max": 50}]}
        },
        "output": [],
        "output_node": True,
    }
}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "wf.api.json").write_text(json.dumps(WORKFLOW), encoding="utf-8")
    return tmp_path


def write_lines(path: Path, *lines: str) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_good_jsonl_file_gives_its_jobs_with_ids_overrides_and_priorities(folder: Path) -> None:
    jobs_file = write_lines(
        folder / "jobs.jsonl",
        '{"id": "a", "workflow": "wf.api.json", "set": {"Sample.seed": 7}, "priority": 3}',
        "",
        '{"workflow": "wf.api.json", "set": {"1.steps": 9, "Sample.seed": 8}}',
    )
    jobs = read_jobs_file(jobs_file)
    assert [(j.job_id, j.line, j.priority) for j in jobs] == [("a", 1, 3), ("3", 3, None)]
    assert jobs[1].overrides == ("1.steps=9", "Sample.seed=8")
    prepared = prepare_jobs(jobs_file, jobs, OBJECT_INFO)
    assert [p.prompt["1"]["inputs"] for p in prepared] == [{"seed": 7, "steps": 5}, {"seed": 8, "steps": 9}]
    assert WORKFLOW["1"]["inputs"] == {"seed": 1, "steps": 5}  # each job works on its own copy


def test_every_bad_line_is_named_with_its_field_in_one_error(folder: Path) -> None:
    jobs_file = write_lines(
        folder / "jobs.jsonl",
        '{"id": "a", "workflow": "wf.api.json"}',
        '{"id": "b", "workflow": "wf.api.json",}',
        '{"id": "a", "workflow": "wf.api.json"}',
        '{"id": "c", "workflow": "missing.api.json"}',
        '{"id": "d", "workflow": "wf.api.json", "colour": "red"}',
        '{"id": "e", "workflow": "wf.api.json", "priority": 0}',
        '{"id": "../f", "workflow": "wf.api.json"}',
        '{"id": "g", "workflow": "wf.api.json", "set": {"seed": 1}}',
        "[1, 2]",
        '{"id": "h", "workflow": "wf.api.json", "set": {"1.steps": 1, "1.steps": 2}}',
        '{"id": "i", "workflow": "wf.api.json", "set": {"1.text": [[1]]}}',
        '{"id": "j", "workflow": "wf.api.json", "priority": [1]}',
        '{"id": true, "workflow": "wf.api.json"}',
        '{"id": "k", "workflow": "wf.api.json", "set": {"1.text": null}}',
    )
    with pytest.raises(WorkflowError) as caught:
        read_jobs_file(jobs_file)
    message = str(caught.value)
    assert "13 problem(s); nothing was queued" in message
    for expected in (
        "line 2: not valid JSON",
        "line 3: id 'a' is already used on line 1",
        "line 4: workflow: workflow file",
        "missing.api.json does not exist",
        "line 5: unknown field 'colour'",
        "line 6: priority 0 must be an integer",
        "line 7: id '../f' must be",
        "line 8: set 'seed': expected NODE.input",
        "line 9: expected a JSON object, got list",
        "line 10: key '1.steps' appears twice in one object",
        "line 11: set '1.text': [[1]] is no input value (a text goes in quotes)",
        "line 12: priority [1] must be an integer from 1 to",
        "line 13: id True must be",
        "line 14: set '1.text': null is no input value",
    ):
        assert expected in message


def test_overrides_are_checked_against_object_info_naming_line_and_input(folder: Path) -> None:
    jobs_file = write_lines(
        folder / "jobs.jsonl",
        '{"id": "ok", "workflow": "wf.api.json", "set": {"Sample.seed": 100}}',
        '{"id": "high", "workflow": "wf.api.json", "set": {"Sample.seed": 101}}',
        '{"id": "typo", "workflow": "wf.api.json", "set": {"Sample.sede": 1}}',
        '{"id": "nonode", "workflow": "wf.api.json", "set": {"Sampler.seed": 1}}',
    )
    with pytest.raises(WorkflowError) as caught:
        prepare_jobs(jobs_file, read_jobs_file(jobs_file), OBJECT_INFO)
    message = str(caught.value)
    assert "3 problem(s)" in message
    assert (
        "line 2: set 'Sample.seed': node 1 (KSampler) input 'seed': 101 is above the maximum 100" in message
    )
    assert "line 3: set 'Sample.sede'" in message and "has no input 'sede'; close inputs: seed" in message
    assert "line 4: set 'Sampler.seed': no node 'Sampler'" in message


def test_a_csv_file_takes_set_columns_and_leaves_empty_cells_alone(folder: Path) -> None:
    jobs_file = write_lines(
        folder / "jobs.csv",
        "id,workflow,set:Sample.seed,set:1.steps,priority",
        "x,wf.api.json,5,,",
        "y,wf.api.json,6,12,2",
    )
    jobs = read_jobs_file(jobs_file)
    assert [(j.job_id, j.line, j.overrides, j.priority) for j in jobs] == [
        ("x", 2, ("Sample.seed=5",), None),
        ("y", 3, ("Sample.seed=6", "1.steps=12"), 2),
    ]
    prepared = prepare_jobs(jobs_file, jobs, OBJECT_INFO)
    assert prepared[1].prompt["1"]["inputs"] == {"seed": 6, "steps": 12}


def test_a_csv_file_with_a_bad_column_or_row_is_refused_naming_them(folder: Path) -> None:
    jobs_file = write_lines(folder / "jobs.csv", "id,workflow,seed", "x,wf.api.json,5", "y,wf.api.json")
    with pytest.raises(WorkflowError) as caught:
        read_jobs_file(jobs_file)
    assert "line 1: column 'seed' is not one of" in str(caught.value)
    assert "line 3: 2 cells, the header has 3" in str(caught.value)


def test_an_empty_file_is_refused(folder: Path) -> None:
    with pytest.raises(WorkflowError, match="no jobs in the file"):
        read_jobs_file(write_lines(folder / "jobs.jsonl", ""))


def test_a_workflow_given_as_the_jobs_file_is_said_to_be_one(folder: Path) -> None:
    workflow = folder / "wf.api.json"
    workflow.write_text(json.dumps(WORKFLOW, indent=2), encoding="utf-8")  # many lines, none a job
    with pytest.raises(WorkflowError) as raised:
        read_jobs_file(workflow)
    assert str(raised.value).startswith(f"jobs file {workflow}: this is a workflow, not a jobs file")
    assert '{"workflow": "wf.api.json"' in str(raised.value)
    ui = write_lines(folder / "ui.json", json.dumps({"nodes": [], "links": []}))
    with pytest.raises(WorkflowError, match="this is a workflow, not a jobs file"):
        read_jobs_file(ui)
    (job,) = read_jobs_file(write_lines(folder / "one.jsonl", '{"workflow": "wf.api.json"}'))
    assert job.workflow == workflow


def test_a_spreadsheets_csv_with_a_byte_order_mark_and_crlf_is_read(folder: Path) -> None:
    jobs_file = folder / "jobs.csv"
    jobs_file.write_bytes(b"\xef\xbb\xbfid,workflow,set:Sample.seed\r\nb1,wf.api.json,7\r\n")
    (job,) = read_jobs_file(jobs_file)
    assert (job.job_id, job.overrides) == ("b1", ("Sample.seed=7",))
    jsonl = folder / "jobs.jsonl"
    jsonl.write_bytes(b'\xef\xbb\xbf{"id": "j1", "workflow": "wf.api.json"}\n')
    assert [j.job_id for j in read_jobs_file(jsonl)] == ["j1"]


def test_a_csv_column_given_twice_is_refused(folder: Path) -> None:
    jobs_file = write_lines(
        folder / "jobs.csv", "id,workflow,set:Sample.seed,set:Sample.seed", "x,wf.api.json,1,2"
    )
    with pytest.raises(WorkflowError, match=r"line 1: column 'set:Sample\.seed' appears 2 times"):
        read_jobs_file(jobs_file)


def test_both_passes_are_listed_together_by_line(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad field on line 1 does not hide line 2's value out of range, nor a duplicate of a bad line."""
    from runner.batch import jobs_file

    monkeypatch.setattr(jobs_file, "fetch_object_info", lambda servers, **_: OBJECT_INFO)
    path = write_lines(
        folder / "jobs.jsonl",
        '{"id": "a", "workflow": "wf.api.json", "sett": {}}',
        '{"id": "b", "workflow": "wf.api.json", "set": {"Sample.seed": -1}}',
        '{"id": "a", "workflow": "wf.api.json"}',
    )
    with pytest.raises(WorkflowError) as caught:
        jobs_file.load_batch(path, ["http://127.0.0.1:1"])
    lines = str(caught.value).splitlines()[1:]
    assert [line.split(":")[0].strip() for line in lines] == ["line 1", "line 2", "line 3"]
    assert "unknown field 'sett'" in lines[0] and "below the minimum 0" in lines[1]
    assert "id 'a' is already used on line 1" in lines[2]


def test_a_csv_quote_left_open_is_named_and_nothing_is_read_past_it(folder: Path) -> None:
    jobs_file = write_lines(
        folder / "jobs.csv",
        "id,workflow,set:Sample.seed",
        'a,"wf.api.json,1',  # the quote would swallow the lines after it into one cell
        "b,wf.api.json,2",
    )
    with pytest.raises(WorkflowError, match=r"1 problem\(s\); nothing was queued") as caught:
        read_jobs_file(jobs_file)
    assert 'line 2: a quote (") opened on this line is never closed' in str(caught.value)
    stray = write_lines(folder / "stray.csv", "id,workflow", "a,wf.api.json", 'b,"wf.api.json"x')
    with pytest.raises(WorkflowError, match=r"line 3: not valid CSV: ',' expected after '\"'"):
        read_jobs_file(stray)


def test_a_quoted_csv_cell_may_span_lines_and_its_job_keeps_the_line_it_starts_on(folder: Path) -> None:
    jobs_file = write_lines(
        folder / "jobs.csv",
        "id,workflow,set:Sample.seed",
        'a,"wf.api.json",1',
        'b,wf.api.json,"2',
        '"',
        "c,wf.api.json,3",
    )
    jobs = read_jobs_file(jobs_file)
    assert [(j.job_id, j.line, j.overrides) for j in jobs] == [
        ("a", 2, ("Sample.seed=1",)),
        ("b", 3, ("Sample.seed=2",)),
        ("c", 5, ("Sample.seed=3",)),
    ]


def test_every_problem_of_one_line_is_listed_across_both_passes(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A duplicate id does not hide the same line's unknown field, nor a bad priority its bad value:
    each would have come up only once the other was fixed."""
    from runner.batch import jobs_file

    monkeypatch.setattr(jobs_file, "fetch_object_info", lambda servers, **_: OBJECT_INFO)
    path = write_lines(
        folder / "jobs.jsonl",
        '{"id": "x", "workflow": "wf.api.json"}',
        '{"id": "x", "workflow": "wf.api.json", "sett": {}}',
        '{"id": "y", "workflow": "wf.api.json", "set": {"Sample.seed": 500}, "priority": 0}',
    )
    with pytest.raises(WorkflowError, match=r"4 problem\(s\); nothing was queued") as caught:
        jobs_file.load_batch(path, ["http://127.0.0.1:1"])
    lines = [line.strip() for line in str(caught.value).splitlines()[1:]]
    assert lines[0] == "line 2: id 'x' is already used on line 1"
    assert lines[1].startswith("line 2: unknown field 'sett'")
    assert lines[2].startswith("line 3: priority 0 must be an integer from 1")
    assert lines[3].startswith("line 3: set 'Sample.seed':") and "above the maximum 100" in lines[3]

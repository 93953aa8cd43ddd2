"""`Analyst.from_task_file`: the analyst from the files `dpcdf task` writes (TASK and TASK.token), and a
`TaskFileError` (a ParameterError) naming the file for each mistake; the CLI reads them the same way."""
from __future__ import annotations

import pytest

import dpcdf
from dpcdf.service.task import TaskConfig
from dpcdf.service.files import TaskFileError
from test_task_config import BASE


def _files(tmp_path, token="tok-123\n"):
    config = TaskConfig(**BASE, relation="substitution")
    (tmp_path / "task.json").write_text(config.to_json())
    if token is not None:
        (tmp_path / "task.json.token").write_text(token)
    return config, str(tmp_path / "task.json")


def test_the_analyst_of_the_files_dpcdf_task_writes(tmp_path):
    config, task = _files(tmp_path)
    analyst = dpcdf.Analyst.from_task_file(task)
    assert isinstance(analyst, dpcdf.Analyst) and analyst.config == config and analyst.token == "tok-123"
    assert analyst.token_file == task + ".token"
    (tmp_path / "other").write_text("tok-456")
    assert dpcdf.Analyst.from_task_file(task, str(tmp_path / "other")).token == "tok-456"


@pytest.mark.parametrize("mistake, message", [
    ("no task", "task file .*task.json: no such file"),
    ("no token", "analyst token file .*task.json.token: no such file"),
    ("empty token", "analyst token file .*task.json.token is empty"),
    ("not a config", "task file .*task.json is not a task config"),
    ("a directory", "task file .*task.json is a directory"),
])
def test_each_mistake_names_its_file(tmp_path, mistake, message):
    _, task = _files(tmp_path, token=None if mistake == "no token" else " \n" if mistake == "empty token" else "t")
    if mistake == "no task":
        (tmp_path / "task.json").unlink()
    elif mistake == "not a config":
        (tmp_path / "task.json").write_text('{"grid": 3}')
    elif mistake == "a directory":
        (tmp_path / "task.json").unlink()
        (tmp_path / "task.json").mkdir()
    with pytest.raises(TaskFileError, match=message) as info:
        dpcdf.Analyst.from_task_file(task)
    assert isinstance(info.value, dpcdf.ParameterError)

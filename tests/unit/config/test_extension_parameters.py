"""nereid.config.extension_parameters: the parameter names a group's ``isolation`` and
``processes`` travel under in the JSON form, and the group read back from a name."""

from __future__ import annotations

import pytest

from nereid.config.extension_parameters import PROCESSES_SUFFIX, isolation_group_name, isolation_parameter

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("group", ["add_one_0", "gpu.group", "x"])
def test_a_groups_parameter_names_give_the_group_back(group: str) -> None:
    assert isolation_parameter(group) == f"instance_group.{group}.isolation"
    assert isolation_group_name(isolation_parameter(group)) == group
    assert isolation_parameter(group, PROCESSES_SUFFIX) == f"instance_group.{group}.processes"
    assert isolation_group_name(isolation_parameter(group, PROCESSES_SUFFIX), PROCESSES_SUFFIX) == group


@pytest.mark.parametrize(
    "parameter",
    ["instance_group..isolation", "instance_group.g.processes", "group.g.isolation", "instance_group.g"],
)
def test_other_names_name_no_group(parameter: str) -> None:
    assert isolation_group_name(parameter) is None

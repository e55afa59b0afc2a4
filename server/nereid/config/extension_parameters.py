"""The names under which nereid's extensions of Triton's model config travel in the JSON
form: as ``parameters`` (never invented top-level fields), so stock clients parse the
JSON. Rendered by triton_json.py, read back by triton_json_reader.py; load.py refuses user
parameters with these names.
"""

from __future__ import annotations

__all__ = [
    "EXECUTION_TIMEOUT_MS",
    "INPUT_TENSORS",
    "ISOLATION_PREFIX",
    "ISOLATION_SUFFIX",
    "MAX_CONCURRENT_BATCHES",
    "PAD_VALUE_PREFIX",
    "PROCESSES_SUFFIX",
    "isolation_group_name",
    "isolation_parameter",
]

MAX_CONCURRENT_BATCHES = "max_concurrent_batches"
PAD_VALUE_PREFIX = "pad_value."
EXECUTION_TIMEOUT_MS = "execution_timeout_ms"
INPUT_TENSORS = "input_tensors"
#: ``instance_group.<group name>.isolation`` and ``...processes``, present for groups that
#: set them.
ISOLATION_PREFIX = "instance_group."
ISOLATION_SUFFIX = ".isolation"
PROCESSES_SUFFIX = ".processes"


def isolation_parameter(group_name: str, suffix: str = ISOLATION_SUFFIX) -> str:
    """The parameter that carries a group's ``isolation`` (or, with PROCESSES_SUFFIX, its
    ``processes``) in the JSON form."""
    return ISOLATION_PREFIX + group_name + suffix


def isolation_group_name(parameter: str, suffix: str = ISOLATION_SUFFIX) -> str | None:
    """The group an ``instance_group.<name>.isolation`` parameter (or ``<suffix>``) names,
    else None."""
    if (
        parameter.startswith(ISOLATION_PREFIX)
        and parameter.endswith(suffix)
        and len(parameter) > len(ISOLATION_PREFIX) + len(suffix)
    ):
        return parameter[len(ISOLATION_PREFIX) : -len(suffix)]
    return None

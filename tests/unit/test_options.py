"""``nereid.serve``'s keywords are ``nereid serve``'s flags: the same parsers build the same
ServerOptions, and refuse the same values."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from nereid.cli import _FLAGS, build_parser, options_from_args, options_from_keywords
from nereid.options import ServerOptions


def test_keywords_and_flags_make_the_same_options() -> None:
    flags = ["serve", "--model-repository", "models", "--http-port", "9000", "--grpc-port", "9001",
             "--allow-metrics", "false", "--model-control-mode", "explicit", "--load-model", "a", "b",
             "--exit-timeout-secs", "2.5", "--log-verbose", "1", "--http-server", "uvicorn",
             "--max-request-size", "1024", "--ray-replica-cpus", "0.5"]
    keywords = dict(http_port=9000, grpc_port="9001", allow_metrics=False, model_control_mode="explicit",
                    load_model=["a", "b"], exit_timeout_secs=2.5, log_verbose=1, http_server="uvicorn",
                    max_request_size=1024, ray_replica_cpus=0.5)
    assert options_from_keywords(Path("models"), keywords) == options_from_args(build_parser().parse_args(flags))


@pytest.mark.parametrize("row", _FLAGS, ids=[row.field for row in _FLAGS])
def test_every_flag_is_a_keyword_that_takes_its_default(row) -> None:  # type: ignore[no-untyped-def]
    default = getattr(ServerOptions(), row.field)
    built = options_from_keywords("models", {row.field: default} if row.field != "model_repository" else {})
    assert built == dataclasses.replace(ServerOptions(), model_repository=Path("models"))


@pytest.mark.parametrize(
    ("keywords", "error", "message"),
    [
        ({"http_port": 70000}, ValueError, "nereid.serve(): http_port: expected a port 0..65535, got '70000'"),
        ({"http_port": True}, ValueError, "nereid.serve(): http_port: expected a port 0..65535, got 'True'"),
        ({"exit_timeout_secs": "soon"}, ValueError, "nereid.serve(): exit_timeout_secs: expected a number, got 'soon'"),
        ({"allow_grpc": "maybe"}, ValueError, "nereid.serve(): allow_grpc: expected true or false, got 'maybe'"),
        ({"grpc_server": "tonic"}, ValueError, "nereid.serve(): grpc_server: expected one of native, grpcio, got 'tonic'"),
        ({"load_model": 3}, ValueError, "nereid.serve(): load_model: expected a name or a list of names, got 3"),
        ({"http_prot": 1}, TypeError, "nereid.serve() got an unexpected keyword argument 'http_prot' (did you mean 'http_port'?)"),
    ],
    ids=["port-range", "bool-as-port", "not-a-number", "not-a-bool", "not-a-choice", "not-names", "unknown"],
)
def test_values_the_command_refuses_are_refused_with_its_words(keywords: dict[str, object], error: type,
                                                                message: str) -> None:
    with pytest.raises(error) as raised:
        options_from_keywords("models", keywords)
    assert str(raised.value) == message

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


@pytest.mark.parametrize(("cores", "workers"), [(1, 1), (2, 1), (7, 1), (8, 2), (12, 3), (16, 4), (32, 8), (128, 8)])
def test_auto_http_workers_is_one_below_8_cores_then_one_per_4_cores_up_to_8(cores: int, workers: int) -> None:
    from nereid.cli import auto_http_workers

    assert auto_http_workers(cores) == workers


def test_http_workers_auto_resolves_from_the_usable_cores_for_flags_and_keywords() -> None:
    from nereid.cli import auto_http_workers, usable_cores

    expected = auto_http_workers(usable_cores())
    args = build_parser().parse_args(["serve", "--model-repository", "models", "--http-workers", "auto"])
    assert options_from_args(args).http_workers == expected
    assert options_from_keywords("models", {"http_workers": "AUTO"}).http_workers == expected


@pytest.mark.parametrize("flags", [["--http-server", "uvicorn"], ["--ray-replicas", "2"]], ids=["asgi-engine", "ray"])
def test_http_workers_auto_is_one_where_workers_cannot_serve(flags: list[str]) -> None:
    args = build_parser().parse_args(["serve", "--model-repository", "models", "--http-workers", "auto", *flags])
    assert options_from_args(args).http_workers == 1


def test_http_workers_refuses_what_is_neither_a_count_nor_auto() -> None:
    with pytest.raises(ValueError, match=r"http_workers: expected a whole number >= 1 or auto, got '0'"):
        options_from_keywords("models", {"http_workers": 0})

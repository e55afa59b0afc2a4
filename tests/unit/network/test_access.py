"""Restricted groups: Triton's flag syntax, the checks of a presented key, and what never
shows (the key's value in a repr or an error)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nereid.network.access import GROUPS, GRPC_KEY_PREFIX, Refusals, parse_key, parse_restriction, restriction_table
from nereid.cli import build_parser, options_from_args


def test_groups_and_key_parse_as_triton_writes_them() -> None:
    restriction = parse_restriction("model-repository,shared-memory:Admin-Key=s3cr:et=x")
    assert restriction.groups == ("model-repository", "shared-memory")
    assert restriction.header == "Admin-Key"  # as given, for the refusal's message (as Triton's)
    assert restriction.name == "admin-key"  # header names compare in lower case
    assert restriction.allows(b"s3cr:et=x") and restriction.allows("s3cr:et=x")


def test_grpc_key_gets_triton_metadata_prefix() -> None:
    restriction = parse_restriction("inference:k=v", GRPC_KEY_PREFIX)
    assert restriction.header == "triton-grpc-protocol-k"
    assert restriction.grpc_message() == "This protocol is restricted, expecting header 'triton-grpc-protocol-k'"


@pytest.mark.parametrize("presented", [None, b"", b"v", b"value ", b"VALUE", "valu"], ids=repr)
def test_anything_but_the_exact_value_is_refused(presented: bytes | str | None) -> None:
    assert not parse_restriction("health:k=value").allows(presented)


@pytest.mark.parametrize("spec, message", [
    ("model-repository", "got no ':'"),
    ("model-reposit:k=v", "unknown restricted group 'model-reposit'"),
    ("health:k", "expected <key>=<value>"),
    ("health:=v", "expected <key>=<value>"),
    ("health:k=", "the value for key 'k' is empty"),
])
def test_bad_specs_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_restriction(spec)


def test_a_group_in_two_restrictions_is_refused_as_triton_does() -> None:
    restrictions = (parse_restriction("model-repository,health:k1=v1"), parse_restriction("metadata,health:k2=v2"))
    with pytest.raises(ValueError, match="group 'health' can not be specified in multiple config groups"):
        restriction_table(restrictions, "--http-restricted-api")


def test_table_maps_each_group_to_its_restriction() -> None:
    admin, infer = parse_restriction("model-repository,logging:a=1"), parse_restriction("inference:b=2")
    table = restriction_table((admin, infer), "--http-restricted-api")
    assert table == {"model-repository": admin, "logging": admin, "inference": infer}
    assert set(table) <= set(GROUPS)


def test_the_value_never_shows_in_a_repr_or_an_error() -> None:
    restriction = parse_restriction("health:k=TOPSECRET")
    assert "TOPSECRET" not in repr(restriction)
    args = build_parser().parse_args(["serve", "--model-repository", "x", "--http-restricted-api", "health:k=TOPSECRET",
                                      "--metrics-restricted-api", "m=TOPSECRET"])
    assert "TOPSECRET" not in repr(options_from_args(args))
    with pytest.raises(ValueError) as error:
        parse_restriction("nosuch:k=TOPSECRET")
    assert "TOPSECRET" not in str(error.value)


def test_metrics_key_alone() -> None:
    restriction = parse_key("Scrape-Key=abc")
    assert (restriction.groups, restriction.name) == (("metrics",), "scrape-key")


def test_refusals_count_by_protocol_and_group() -> None:
    refusals = Refusals()
    refusals.count("http", "inference")
    refusals.count("http", "inference")
    refusals.count("grpc", "health")
    assert refusals.counts == {("http", "inference"): 2, ("grpc", "health"): 1}


def test_nereid_serve_keywords_take_the_same_specs() -> None:
    from nereid.cli import options_from_keywords

    options = options_from_keywords("x", {
        "http_restricted_api": ["model-repository:k=v", "inference:i=w"], "grpc_restricted_protocol": "health:k=v",
        "metrics_restricted_api": "m=v", "grpc_use_ssl": True, "grpc_server_cert": "c.pem",
    })
    assert [r.groups for r in options.http_restricted_api] == [("model-repository",), ("inference",)]
    assert options.grpc_restricted_protocol[0].header == "triton-grpc-protocol-k"
    assert options.metrics_restricted_api is not None and options.metrics_restricted_api.allows("v")
    assert options.grpc_use_ssl and str(options.grpc_server_cert) == "c.pem"
    with pytest.raises(ValueError, match="unknown restricted group 'nope'"):
        options_from_keywords("x", {"http_restricted_api": "nope:k=v"})


def test_tls_and_restrictions_are_refused_on_ray(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from nereid.cli import main

    status = main(["serve", "--model-repository", str(tmp_path), "--ray-replicas", "2", "--http-use-ssl", "true",
                   "--http-restricted-api", "health:k=TOPSECRET"])
    assert status == 2
    error = capsys.readouterr().err
    assert "--http-use-ssl, --http-restricted-api: not available with --ray-replicas" in error
    assert "TOPSECRET" not in error

"""deploy/kserve agrees with the CLI: the Dockerfile's command and the InferenceService's
args are the same valid `nereid serve` flags (the manifest adds the restriction of the
admin APIs, whose key comes from a Secret), the ports and probes match them, and a real
server started with those flags answers the probes and refuses the repository API without
the key. (The recipe is not run on a cluster here: there is none.)"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from nereid.cli import build_parser, options_from_args
from tests.conftest import ROOT, RepoBuilder, free_port, start_server

KSERVE = ROOT / "deploy" / "kserve"
#: what the manifest adds to the Dockerfile's command: the admin APIs need a key
RESTRICTION = ["--http-restricted-api", "model-repository,shared-memory,logging,trace:nereid-admin-key=$(NEREID_ADMIN_KEY)"]


def dockerfile() -> tuple[list[str], list[int], list[str]]:
    """(ENTRYPOINT + CMD, EXPOSEd ports, COPY sources) of the recipe's Dockerfile."""
    text = (KSERVE / "Dockerfile").read_text()
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M).group(1))  # type: ignore[union-attr]
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))  # type: ignore[union-attr]
    exposed = [int(port) for line in re.findall(r"^EXPOSE (.*)$", text, re.M) for port in line.split()]
    copied = [line.split()[1] for line in re.findall(r"^COPY .*$", text, re.M)]
    return entrypoint + cmd, exposed, copied


def container() -> dict[str, Any]:
    manifest = yaml.safe_load((KSERVE / "inferenceservice.yaml").read_text())
    assert manifest["kind"] == "InferenceService"
    [spec] = manifest["spec"]["predictor"]["containers"]
    return spec  # type: ignore[no-any-return]


def test_the_dockerfile_and_the_manifest_run_the_same_valid_command() -> None:
    command, exposed, copied = dockerfile()
    assert command[:2] == ["nereid", "serve"]
    args = command[2:]
    assert container()["args"] == args + RESTRICTION
    options = options_from_args(build_parser().parse_args(["serve", *args, *RESTRICTION]))
    [restriction] = options.http_restricted_api
    assert not {"health", "inference"} & set(restriction.groups)  # the probes and clients need no key
    [key_env] = [env for env in container()["env"] if env["name"] == "NEREID_ADMIN_KEY"]
    assert "secretKeyRef" in key_env["valueFrom"]  # the key is not in the manifest
    assert str(options.model_repository) == "/mnt/models"  # where KServe's storage initializer puts it
    spec = container()
    assert [port["containerPort"] for port in spec["ports"]] == [options.http_port]
    assert spec["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": options.http_port}
    assert spec["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": options.http_port}
    assert set(exposed) == {options.http_port, options.metrics_port}
    assert not options.allow_grpc  # one port per predictor container: HTTP
    for source in copied:
        assert (ROOT / source).exists(), source


def test_a_server_started_with_the_recipes_flags_answers_its_probes(repo: RepoBuilder, tmp_path: Path) -> None:
    repo.add("identity", """
        max_batch_size = 8
        [[input]]
        name = "INPUT0"
        data_type = "TYPE_FP32"
        dims = [4]
        [[output]]
        name = "OUTPUT0"
        data_type = "TYPE_FP32"
        dims = [4]
    """)
    args = container()["args"]
    options = options_from_args(build_parser().parse_args(["serve", *args]))
    # the same flags, on this machine's free ports and the test repository
    key = "test-admin-key-value"
    local = {"/mnt/models": str(repo.root), "0.0.0.0": "127.0.0.1",
             str(options.http_port): "HTTP", str(options.metrics_port): str(free_port()),
             RESTRICTION[1]: RESTRICTION[1].replace("$(NEREID_ADMIN_KEY)", key)}  # as Kubernetes expands it
    mapped = [local.get(arg, arg) for arg in args]
    http_index = mapped.index("HTTP")
    del mapped[http_index - 1:http_index + 1]  # start_server chooses the HTTP port
    server = start_server(repo.root, *mapped[2:], log_dir=tmp_path)
    try:
        spec = container()
        for probe in ("readinessProbe", "livenessProbe"):
            with urllib.request.urlopen(server.http + spec[probe]["httpGet"]["path"], timeout=10) as response:
                assert response.status == 200
        index = server.http + "/v2/repository/index"
        try:
            urllib.request.urlopen(urllib.request.Request(index, method="POST"), timeout=10)
            raise AssertionError("the repository index answered without the admin key")
        except urllib.error.HTTPError as refused:
            assert refused.code == 403
        with_key = urllib.request.Request(index, method="POST", headers={"nereid-admin-key": key})
        with urllib.request.urlopen(with_key, timeout=10) as response:
            assert response.status == 200
    finally:
        server.stop()

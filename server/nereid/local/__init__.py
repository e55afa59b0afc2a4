"""The in-process surface: infer on a served model from Python, without HTTP.

``InProcessServer`` (in_process.py) loads a repository and runs the models, the base of
``nereid.Server``; requests enter through a ``LocalEndpoint`` (endpoint.py), whose Python
values become a checked InferRequest (python_inputs.py); its Triton models reach its other
models through ``ServerBls`` (bls_target.py). Goes through the same ModelManager and
batchers as HTTP; knows nothing about HTTP or JSON.
"""

from nereid.local.bls_target import ServerBls
from nereid.local.endpoint import LocalEndpoint, RequestOptions
from nereid.local.in_process import InProcessServer
from nereid.local.python_inputs import build_request

__all__ = ["InProcessServer", "LocalEndpoint", "RequestOptions", "ServerBls", "build_request"]
